"""certify's LIME explanations vs lime's LimeImageExplainer vs the bare forward-pass floor.

Two models on 32x32 signs: the demo's standard model (5 convolutions, about 7.6 M
multiply-adds per image; its floor, 68 ms at load 1.6, is about 3x the issue's "real GTSRB
CNN", so the model dominates every method), and ``small``, a 3-convolution GTSRB-style
CNN (about 2.8 M multiply-adds, random weights: timing does not depend on them), nearer the
issue's model, so the work around the model shows more. 30 generated signs.
Per image and k = 1,000 masks on the same SLIC segmentation (n_segments 64, compactness 20,
sigma 0):

- **certify**: SLIC, the masks, and :meth:`Brittleness.explain_many` on all 30 images (masked
  images built with one ``where`` over the mask matrix, sent in model calls that span images,
  one weighted ridge solve per image);
- **lime**: ``LimeImageExplainer(feature_selection="none").explain_instance`` with the same
  model function (softmax of the same ONNX session), the same segmentation function,
  ``hide_color=None`` (superpixel mean colour, as certify), ``num_samples=1000``,
  ``top_labels=1``, at lime's default ``batch_size=10`` (what a new user runs) and at
  ``batch_size=1000`` (lime's best case);
- **floor**: one onnxruntime ``run`` on 1,000 pre-built 32x32 images (no masking, no fit).

Each method runs ``--rounds`` times, interleaved; the table gives the best round (other work on
a shared machine slows single runs) and every round's figure. Needs ``lime``
(``pip install -e '.[bench]'``).

Run: ``.venv/bin/python benchmarks/brittleness.py [--images 30] [--rounds 3] [--model demo small]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from certify.api import demo_model_path
from certify.checks.brittleness import Brittleness, segment
from certify.demo.synthetic import generate
from certify.device import choose_device
from certify.models.onnx import OnnxModel

K = 1000
N_SEGMENTS, COMPACTNESS = 64, 20.0


def small_cnn(path: Path) -> Path:
    """Export a 3-convolution GTSRB-style CNN (43 classes, seeded random weights) to ONNX."""
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 16, 128), nn.ReLU(), nn.Linear(128, 43)).eval()
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
    ap.add_argument("--model", nargs="+", choices=("demo", "small"), default=["demo", "small"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.model:
            path = (demo_model_path("standard") if name == "demo"
                    else small_cnn(Path(tmp) / "small.onnx"))
            bench(OnnxModel(path, choose_device("cpu")), name, args.images, args.rounds)
            print()


def bench(model: OnnxModel, label: str, images: int, rounds: int) -> None:
    """Time certify, lime and the floor on one model; print the table."""
    from lime.lime_image import LimeImageExplainer

    xu8, _ = generate(1, seed=4242)
    x = torch.from_numpy(xu8.transpose(0, 3, 1, 2).copy()).float()[:images] / 255
    n = len(x)
    check = Brittleness(num_masks=K, n_segments=N_SEGMENTS, compactness=COMPACTNESS)

    def certify_run() -> None:
        segs = [segment(img, N_SEGMENTS, COMPACTNESS) for img in x]
        masks = [check.masks(int(s.max()) + 1, i) for i, s in enumerate(segs)]
        check.explain_many(model, list(x), segs, masks)

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

    methods: dict[str, Callable[[], None]] = {
        "certify": certify_run, "lime (batch_size 10)": lime_run(10),
        "lime (batch_size 1000)": lime_run(1000), "floor (1 ORT run of 1,000)": floor_run}
    floor_run()  # warm-up
    certify_run()
    times: dict[str, list[float]] = {k: [] for k in methods}
    loads = [os.getloadavg()[0]]
    for _ in range(rounds):
        for name, fn in methods.items():
            times[name].append(_timed(fn, n))
        loads.append(os.getloadavg()[0])
    best = {k: min(v) for k, v in times.items()}
    floor = best["floor (1 ORT run of 1,000)"]
    print(f"**{label}** ({model.path.name}): {n} images, k = {K}, SLIC n_segments "
          f"{N_SEGMENTS}; {os.cpu_count()} CPUs; 1-min load average during the run: "
          + ", ".join(f"{v:.2f}" for v in loads))
    print()
    print("| method | ms/image (best) | every round | × floor | certify speed-up |")
    print("|---|---:|---|---:|---:|")
    for name, v in best.items():
        print(f"| {name} | {v:.1f} | {', '.join(f'{t:.1f}' for t in times[name])} | "
              f"{v / floor:.2f} | {v / best['certify']:.2f}× |")


if __name__ == "__main__":
    main()
