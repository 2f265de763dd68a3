"""certify's LIME explanations vs lime's LimeImageExplainer vs the bare forward-pass floor.

Models on 32x32 signs (43 classes, random weights where not the demo's: timing does not depend
on them):

- ``gtsrb``: a 3-convolution GTSRB CNN (8-16-32 channels, 3x3, about 0.8 M multiply-adds per
  image), near the issue's third-party GTSRB CNN (15 ms for 1,000 bare forward passes in one
  batch on a quiet 2-core machine): the smallest model here, where certify's own work around
  the model shows most;
- ``small``: a 3-convolution GTSRB-style CNN (16-32-64 channels, about 2.8 M multiply-adds);
- ``demo``: the demo's standard model (5 convolutions, about 7.6 M multiply-adds), where the
  forward passes dominate every method.

30 generated signs. Per image and k = 1,000 masks on the same SLIC segmentation (n_segments
64, compactness 20, sigma 0):

- **certify**: SLIC, the masks, and :meth:`Brittleness.explain_many` on all 30 images (masked
  images built by bit operations into one reused buffer per hand-off, model calls that span
  images, built in line on a CPU model, one weighted ridge solve per image), with onnxruntime
  calls sized by the model's own timed calls (``CallSizer``, issue 42);
- **certify, calls of N** (``--fixed-calls``, default 256: the size before issue 42): the same
  with every onnxruntime call of N images;
- **lime**: ``LimeImageExplainer(feature_selection="none").explain_instance`` with the same
  model function (softmax of the same ONNX session), the same segmentation function,
  ``hide_color=None`` (superpixel mean colour, as certify), ``num_samples=1000``,
  ``top_labels=1``, at each ``batch_size`` of ``--lime-batch`` (default 10, lime's default,
  100 and 1,000): "lime (best)" is the fastest of them;
- **floor**: one onnxruntime ``run`` on 1,000 pre-built 32x32 images (no masking, no fit).

**The per-image path** (issue 66): what a sample costs when it is explained on its own, as a
``--samples all`` run's batches of one do: :meth:`Brittleness.run_batch` on one image (SLIC
and the grid, their masks, 2 x 1,000 masked images through the model, the fits and the
record), image after image. Its floor is 2 x the floor above (the same 1,000-image call, once
per segmentation); lime's figure per image is 2 x its own (one segmentation per
``explain_instance``). The targets: at most 1.2x that floor, at least 3x faster than lime.
It is also timed **paired**: each image's ``run_batch`` right after its own floor (the two
1,000-image calls), the median of those ratios over every image and round; on a shared
machine whose speed drifts from one second to the next, the pairs see the same load where
the medians of whole rounds do not.

certify's stages are also timed one at a time (no overlap): segmentation (SLIC), masks,
masked-image building (on the threads of a model call, as the check), model calls (``predict``,
softmax and argmax on the built images, in
the hand-offs ``explain_many`` uses), ridge fits; each is reported in ms per image and as a
share of the floor. Their sum exceeds the pipelined total by what the overlap of building with
the model calls saves.

Each method runs ``--rounds`` times, interleaved; the tables give the median and the best
round (other work on a shared machine slows single runs) and every round's figure, with the
1-minute load average around the rounds, and the call size certify chose. The verdict against
issue 42's targets is on the medians. Needs ``lime`` (``pip install -e '.[bench]'``).

Run: ``.venv/bin/python benchmarks/brittleness.py [--images 30] [--rounds 3]
[--model gtsrb small demo] [--lime-batch 10 100 1000] [--fixed-calls 256]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from certify.api import demo_model_path
from certify.checks import brittleness as bt
from certify.checks.base import CheckContext
from certify.checks.brittleness import Brittleness, CallSizer, segment
from certify.demo.synthetic import generate
from certify.device import choose_device
from certify.models.onnx import OnnxModel

K = 1000
N_SEGMENTS, COMPACTNESS = 64, 20.0
#: Channels of the three 3x3 convolutions of each random-weight CNN.
CNNS = {"gtsrb": (8, 16, 32), "small": (16, 32, 64)}
STAGES = ("segmentation", "masks", "building", "model calls", "ridge fits")


def cnn(path: Path, channels: tuple[int, int, int]) -> Path:
    """Export a 3-convolution GTSRB-style CNN (43 classes, seeded random weights) to ONNX."""
    from torch import nn

    a, b, c = channels
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, a, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(a, b, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(b, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(c * 16, 128), nn.ReLU(), nn.Linear(128, 43)).eval()
    with warnings.catch_warnings():  # the legacy exporter is the one that needs no onnxscript
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(net, (torch.rand(1, 3, 32, 32),), str(path), input_names=["input"],
                          output_names=["logits"], dynamic_axes={"input": {0: "batch"}},
                          dynamo=False)
    return path


def _timed(fn: Callable[[], object], n: int) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) / n * 1000


def main() -> None:
    """Run the methods on each model and print markdown tables of ms per image and ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", nargs="+", choices=("gtsrb", "small", "demo"),
                    default=["gtsrb", "small", "demo"])
    ap.add_argument("--lime-batch", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--fixed-calls", type=int, nargs="*", default=[256],
                    help="also time certify with every onnxruntime call of this many images")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.model:
            path = (demo_model_path("standard") if name == "demo"
                    else cnn(Path(tmp) / f"{name}.onnx", CNNS[name]))
            bench(OnnxModel(path, choose_device("cpu")), name, args.images, args.rounds,
                  args.lime_batch, args.fixed_calls)
            print()


def stage_times(check: Brittleness, model: OnnxModel, x: torch.Tensor) -> dict[str, float]:
    """certify's stages one after the other (ms per image): what ``explain_many`` does, with
    the building of the masked images taken out of the model-call loop."""
    n = len(x)
    out: dict[str, float] = {}
    t = time.perf_counter()
    segs = [segment(img, N_SEGMENTS, COMPACTNESS) for img in x]
    out["segmentation"] = time.perf_counter() - t
    t = time.perf_counter()
    masks = [check.masks(int(s.max()) + 1, i) for i, s in enumerate(segs)]
    out["masks"] = time.perf_counter() - t
    out["building"] = out["model calls"] = 0.0
    t = time.perf_counter()
    jobs = [bt._Job(img, s, m) for img, s, m in zip(x, segs, masks, strict=True)]
    pieces = list(bt._chunks(jobs, bt._CHUNK))  # as explain_many: in line, no overlap
    buffers = [np.empty((bt._CHUNK, *jobs[0]._fill.shape), dtype=np.uint32) for _ in range(2)]
    out["building"] += time.perf_counter() - t
    preds = []
    sizer = bt.call_sizer(model)  # the model's own, as explain_many's
    parts = bt.build_threads([model])  # as predict_jobs builds in line: on the call's threads
    with ThreadPoolExecutor(max_workers=max(1, parts - 1)) as pool:
        for i, piece in enumerate(pieces):
            t = time.perf_counter()
            imgs = bt._build(jobs, piece, buffers[i % 2], pool, parts)
            out["building"] += time.perf_counter() - t
            t = time.perf_counter()
            preds.append(bt.predict_handoff(model, imgs, sizer))
            out["model calls"] += time.perf_counter() - t
    per_job: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in jobs]
    for piece, (p, lab) in zip(pieces, preds, strict=True):
        at = 0
        for j, a, b in piece:
            per_job[j].append((p[at:at + b - a], lab[at:at + b - a]))
            at += b - a
    t = time.perf_counter()
    with bt._one_blas_thread():
        for job, parts in zip(jobs, per_job, strict=True):
            pred = bt.Predictions(np.concatenate([p for p, _ in parts]),
                                  np.concatenate([lab for _, lab in parts]))
            check.fit(job.masks, [pred.targets(int(pred.labels[0]))[0]])
    out["ridge fits"] = time.perf_counter() - t
    return {k: v / n * 1000 for k, v in out.items()}


@contextlib.contextmanager
def fixed_calls(size: int) -> Iterator[None]:
    """Within the block, the check gives every model onnxruntime calls of ``size`` images."""
    sizer = bt.call_sizer
    bt.call_sizer = lambda model: CallSizer((size,))
    try:
        yield
    finally:
        bt.call_sizer = sizer


def bench(model: OnnxModel, label: str, images: int, rounds: int,
          lime_batches: list[int], fixed: list[int]) -> None:
    """Time certify, lime and the floor on one model; print the tables."""
    from lime.lime_image import LimeImageExplainer

    xu8, _ = generate(1, seed=4242)
    x = torch.from_numpy(xu8.transpose(0, 3, 1, 2).copy()).float()[:images] / 255
    n = len(x)
    check = Brittleness(num_masks=K, n_segments=N_SEGMENTS, compactness=COMPACTNESS)

    def certify_run() -> None:
        segs = [segment(img, N_SEGMENTS, COMPACTNESS) for img in x]
        masks = [check.masks(int(s.max()) + 1, i) for i, s in enumerate(segs)]
        check.explain_many(model, list(x), segs, masks)

    ctx = CheckContext(check_seed=0, device=torch.device("cpu"), class_names=[])
    y = torch.zeros(1, dtype=torch.long)

    def certify_per_image() -> None:
        for i in range(n):
            check.run_batch(model, x[i:i + 1], y, [i], ctx)

    def certify_fixed(size: int) -> Callable[[], None]:
        def run() -> None:
            with fixed_calls(size):
                certify_run()
        return run

    def classifier_fn(imgs: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(imgs.transpose(0, 3, 1, 2))).float()
        return torch.softmax(model.predict(t), dim=1).numpy()

    def seg_fn(img: np.ndarray) -> np.ndarray:
        return segment(torch.from_numpy(img.transpose(2, 0, 1).copy()), N_SEGMENTS, COMPACTNESS)

    hwc = [img.permute(1, 2, 0).numpy().astype(np.float64) for img in x]

    def lime_run(batch: int) -> Callable[[], None]:
        def run() -> None:
            explainer = LimeImageExplainer(feature_selection="none", random_state=0)
            with contextlib.redirect_stderr(io.StringIO()):  # lime's progress bar
                for img in hwc:
                    explainer.explain_instance(img, classifier_fn, hide_color=None,
                                               top_labels=1, num_samples=K, batch_size=batch,
                                               segmentation_fn=seg_fn, random_seed=0)
        return run

    feed = model._to_model_input(torch.rand(K, 3, 32, 32))  # noqa: SLF001 - the model's input

    def floor_run() -> None:
        for _ in range(n):
            model.session.run([model.output_name], {model.input_name: feed})

    def paired() -> list[float]:
        """Per image, ``run_batch`` ÷ its floor (two 1,000-image calls) timed right before it:
        the two are tens of milliseconds apart, so they see the same load on the machine."""
        ratios = []
        for i in range(n):
            t = time.perf_counter()
            for _ in range(2):
                model.session.run([model.output_name], {model.input_name: feed})
            f = time.perf_counter() - t
            t = time.perf_counter()
            check.run_batch(model, x[i:i + 1], y, [i], ctx)
            ratios.append((time.perf_counter() - t) / f)
        return ratios

    floor_name = "floor (1 ORT run of 1,000)"
    per_image_name = "certify, per image (2 segmentations)"
    methods: dict[str, Callable[[], None]] = {"certify": certify_run,
                                              per_image_name: certify_per_image}
    methods.update({f"certify, calls of {s}": certify_fixed(s) for s in fixed})
    methods.update({f"lime (batch_size {b})": lime_run(b) for b in lime_batches})
    methods[floor_name] = floor_run
    floor_run()  # warm-up
    certify_run()
    times: dict[str, list[float]] = {k: [] for k in methods}
    stages: dict[str, list[float]] = {k: [] for k in STAGES}
    loads = [os.getloadavg()[0]]
    pairs: list[float] = []
    for _ in range(rounds):
        for name, fn in methods.items():
            times[name].append(_timed(fn, n))
        pairs.extend(paired())
        for k, v in stage_times(check, model, x).items():
            stages[k].append(v)
        loads.append(os.getloadavg()[0])
    best = {k: min(v) for k, v in times.items()}
    med = {k: float(np.median(v)) for k, v in times.items()}
    floor = med[floor_name]
    lime_names = [k for k in best if k.startswith("lime")]
    lime_best = min(lime_names, key=lambda k: med[k])
    sizer = bt.call_sizer(model)
    assert sizer is not None
    print(f"**{label}** ({model.path.name}): {n} images, k = {K}, SLIC n_segments "
          f"{N_SEGMENTS}; {os.cpu_count()} CPUs; 1-min load average around the rounds: "
          + ", ".join(f"{v:.2f}" for v in loads))
    print()
    print(f"certify's onnxruntime calls: {sizer.size} images at the end ({sizer.handoffs} "
          "hand-offs; recent µs per image by call size: "
          + "; ".join(f"{s}: " + ", ".join(f"{1e6 * t:.1f}" for t in v)
                      for s, v in sizer.times.items()) + ")")
    print()
    print("| method | ms/image (median) | best | every round | median × floor | "
          "median ÷ certify's |")
    print("|---|---:|---:|---|---:|---:|")
    for name, mid in med.items():
        print(f"| {name} | {mid:.1f} | {best[name]:.1f} | "
              f"{', '.join(f'{t:.1f}' for t in times[name])} | {mid / floor:.2f} | "
              f"{mid / med['certify']:.2f}× |")
    print()
    print("| certify stage (one at a time) | ms/image (median) | every round | ÷ floor |")
    print("|---|---:|---|---:|")
    total = 0.0
    for k, per_round in stages.items():
        mid = float(np.median(per_round))
        total += mid
        print(f"| {k} | {mid:.2f} | {', '.join(f'{t:.2f}' for t in per_round)} | "
              f"{mid / floor:.3f} |")
    print(f"| sum of stages | {total:.2f} | | {total / floor:.3f} |")
    print(f"| certify, pipelined (above) | {med['certify']:.2f} | | "
          f"{med['certify'] / floor:.3f} |")
    print()
    per_image = med[per_image_name]
    print(f"per image (issue 66): certify {per_image:.1f} ms for 2 x 1,000 masked images, "
          f"÷ floor (2 runs of 1,000, {2 * floor:.1f} ms) **{per_image / (2 * floor):.2f}** "
          f"(target ≤ 1.2); lime at its best batch size, 2 segmentations "
          f"({2 * med[lime_best]:.1f} ms) ÷ certify **{2 * med[lime_best] / per_image:.2f}×** "
          "(target ≥ 3)")
    q1, q2, q3 = np.percentile(pairs, [25, 50, 75])
    print()
    print(f"per image, paired (issue 66): each image's `run_batch` ÷ its floor timed just before "
          f"it, {len(pairs)} pairs: median **{q2:.2f}** (quartiles {q1:.2f}–{q3:.2f}; "
          "target ≤ 1.2)")
    print()
    ratio = np.array(times[lime_best]) / np.array(times["certify"])
    print(f"medians: certify ÷ floor **{med['certify'] / floor:.2f}** (target ≤ 1.5); "
          f"lime at its best batch size ({lime_best.split()[-1].rstrip(')')}) ÷ certify "
          f"**{med[lime_best] / med['certify']:.2f}×** (target ≥ 3; per round: "
          + ", ".join(f"{r:.2f}" for r in ratio) + ")"
          + "".join(f"; calls of {s}: ÷ floor {med[f'certify, calls of {s}'] / floor:.2f}, "
                    f"lime ÷ {med[lime_best] / med[f'certify, calls of {s}']:.2f}×"
                    for s in fixed))


if __name__ == "__main__":
    main()
