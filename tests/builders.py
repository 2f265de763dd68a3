"""Small models and data sets built by the tests themselves (no downloads)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from PIL import Image
from torch import nn

NUM_CLASSES = 43
ROI_PAD = 2  # images are written with a 2-pixel border around a 32x32 ROI


class TinyNet(nn.Module):
    """A small CNN over [N, 3, 32, 32] inputs in [0, 1]."""

    def __init__(self, num_classes: int = NUM_CLASSES, reshape_fixed: bool = False) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Linear(16 * 16, num_classes)
        self.reshape_fixed = reshape_fixed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.features(x)
        # view(1, -1) bakes the batch of 1 into a Reshape: the graph cannot be made symbolic.
        f = f.view(1, -1) if self.reshape_fixed else f.flatten(1)
        return self.head(f)


class WholeInput(nn.Module):
    """Wraps a net to centre its input on the mean over the whole input tensor: legal for one
    image at a time, and another function on a batch (each image would be centred on the
    batch's mean)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - x.mean()) * 2 + 0.5)


class Convention(nn.Module):
    """Wraps a TinyNet to take NHWC and/or 0-255 input and/or return probabilities."""

    def __init__(self, net: nn.Module, nhwc: bool, scale255: bool, probs: bool) -> None:
        super().__init__()
        self.net, self.nhwc, self.scale255, self.probs = net, nhwc, scale255, probs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.nhwc:
            x = x.permute(0, 3, 1, 2)
        if self.scale255:
            x = x / 255.0
        out = self.net(x)
        return torch.softmax(out, dim=1) if self.probs else out


def make_net(seed: int = 0, reshape_fixed: bool = False) -> TinyNet:
    """A seeded, randomly initialised TinyNet in eval mode."""
    torch.manual_seed(seed)
    return TinyNet(reshape_fixed=reshape_fixed).eval()


def export(module: nn.Module, path: Path, *, nhwc: bool = False, fixed_batch: bool = False,
           probs: bool = False, scale255: bool = False) -> Path:
    """Export to ONNX with the legacy exporter (needs only the onnx package)."""
    wrapped = Convention(module, nhwc, scale255, probs).eval()
    shape = (1, 32, 32, 3) if nhwc else (1, 3, 32, 32)
    dummy = torch.rand(shape)
    dynamic = None if fixed_batch else {"input": {0: "batch"}, "output": {0: "batch"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapped, (dummy,), str(path), input_names=["input"],
                          output_names=["output"], dynamic_axes=dynamic, dynamo=False,
                          opset_version=17)
    return path


def predict_net(net: nn.Module, x: np.ndarray) -> np.ndarray:
    """Labels predicted by a torch net for uint8 [N, H, W, 3] images."""
    with torch.no_grad():
        t = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).float() / 255.0
        return net(t).argmax(1).numpy()


def make_images(n: int, seed: int) -> np.ndarray:
    """Smooth random uint8 images [n, 32, 32, 3] (upsampled noise, so models disagree less)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(n, 8, 8, 3), dtype=np.uint8)
    return np.stack([np.asarray(Image.fromarray(s).resize((32, 32), Image.BILINEAR))
                     for s in small])


def make_labels(net: nn.Module, x: np.ndarray, seed: int, wrong: float = 0.3) -> np.ndarray:
    """Labels that agree with ``net`` except for a seeded ``wrong`` fraction."""
    rng = np.random.default_rng(seed + 1)
    pred = predict_net(net, x)
    y = pred.copy()
    flip = rng.random(len(y)) < wrong
    y[flip] = (pred[flip] + rng.integers(1, NUM_CLASSES, size=flip.sum())) % NUM_CLASSES
    return y.astype(np.int64)


def _padded(img: np.ndarray) -> np.ndarray:
    return np.pad(img, ((ROI_PAD, ROI_PAD), (ROI_PAD, ROI_PAD), (0, 0)), mode="edge")


def write_gtsrb_official(root: Path, x: np.ndarray, y: np.ndarray) -> Path:
    """The official test layout: GT-final_test.csv (;-separated) with .ppm images beside it."""
    root.mkdir(parents=True, exist_ok=True)
    lines = ["Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2;ClassId"]
    for i, (img, label) in enumerate(zip(x, y, strict=True)):
        name = f"{i:05d}.ppm"
        p = _padded(img)
        Image.fromarray(p).save(root / name)
        h, w = p.shape[:2]
        lines.append(f"{name};{w};{h};{ROI_PAD};{ROI_PAD};{w - ROI_PAD - 1};{h - ROI_PAD - 1};"
                     f"{label}")
    (root / "GT-final_test.csv").write_text("\n".join(lines) + "\n")
    return root


def write_gtsrb_csv(root: Path, x: np.ndarray, y: np.ndarray) -> Path:
    """The common CSV layout: Test.csv (comma-separated) with Path like Test/00000.png."""
    (root / "Test").mkdir(parents=True, exist_ok=True)
    lines = ["Width,Height,Roi.X1,Roi.Y1,Roi.X2,Roi.Y2,ClassId,Path"]
    for i, (img, label) in enumerate(zip(x, y, strict=True)):
        p = _padded(img)
        Image.fromarray(p).save(root / "Test" / f"{i:05d}.png")
        h, w = p.shape[:2]
        lines.append(f"{w},{h},{ROI_PAD},{ROI_PAD},{w - ROI_PAD - 1},{h - ROI_PAD - 1},{label},"
                     f"Test/{i:05d}.png")
    (root / "Test.csv").write_text("\n".join(lines) + "\n")
    return root


def reference_accuracy(model_path: Path, images: np.ndarray, y: np.ndarray, *, nhwc: bool,
                       scale255: bool) -> float:
    """Accuracy computed with a bare onnxruntime session, one image at a time."""
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    x = images.astype(np.float32) / 255.0
    if scale255:
        x = x * 255.0
    if not nhwc:
        x = x.transpose(0, 3, 1, 2)
    name = sess.get_inputs()[0].name
    preds = [int(np.argmax(sess.run(None, {name: np.ascontiguousarray(x[i : i + 1])})[0]))
             for i in range(len(x))]
    return float(np.mean(np.array(preds) == y))


def run_cli(*args: str | Path, timeout: float = 300, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    """Run certify's CLI in this process (click's ``CliRunner``) and capture its output.

    Same result shape as :func:`run_cli_process` (exit code, stdout, stderr apart) without a
    new interpreter's 1.5-2 s of torch import. ``env`` is set only while the command runs.
    ``timeout`` is accepted for symmetry and not enforced: use :func:`run_cli_process` where
    the test is about the process (signals, a hang, the real executable).
    """
    from click.testing import CliRunner

    from certify.cli import main

    argv = [str(a) for a in args]
    result = CliRunner().invoke(main, argv, env={"COLUMNS": "200", **_log_state(env),
                                                 **(env or {})}, catch_exceptions=False)
    return subprocess.CompletedProcess(["certify", *argv], result.exit_code, result.stdout,
                                       result.stderr)


def interruptible() -> None:
    """``preexec_fn`` of a child a test stops with SIGINT: its default disposition back. A test
    run started in the background (``cmd &`` in a non-interactive shell) ignores SIGINT, the
    children inherit that, and Python then installs no KeyboardInterrupt handler: the run would
    finish instead of stopping."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cli_process(*args: str | Path, timeout: float = 300, env: dict[str, str] | None = None
                    ) -> subprocess.CompletedProcess[str]:
    """Run the installed ``certify`` console script in a subprocess and capture its output."""
    exe = Path(sys.executable).parent / "certify"
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200",
                                                **_log_state(env), **(env or {})})


def loaded_after(argvs: list[list[str]], heavy: tuple[str, ...],
                 env: dict[str, str] | None = None) -> tuple[list[str], str]:
    """Run each ``certify`` argv in turn in one fresh interpreter; the ``heavy`` modules loaded
    after them, and the output (which says after each command what was loaded by then).
    ``env`` is added to this process's environment for the interpreter."""
    code = ("import sys, json\nfrom certify.cli import main\n"
            f"heavy = {heavy!r}\n"
            f"for args in {argvs!r}:\n"
            "    try:\n        main(args)\n    except SystemExit as e:\n"
            "        print('EXIT', args[0], e.code)\n"
            "    print('AFTER', ' '.join(args[:2]), sorted(m for m in heavy if m in sys.modules))\n"
            "print('LOADED', json.dumps(sorted(m for m in heavy if m in sys.modules)))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **_log_state(env), **(env or {})})
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("LOADED "), proc.stdout
    return json.loads(last.removeprefix("LOADED ")), proc.stdout + proc.stderr


_LOG_STATES: list[Path] = []


def _log_state(env: dict[str, str] | None) -> dict[str, str]:
    """A fresh ``CERTIFY_LOG_STATE`` for one command, unless ``env`` names one: the keys a
    client pins and the log heads it remembers stay with the command (never the user's
    ``~/.config/certify/logs.json``, and no pin from a server that once had the same port)."""
    if env and "CERTIFY_LOG_STATE" in env:
        return {}
    if not _LOG_STATES:
        import tempfile

        _LOG_STATES.append(Path(tempfile.mkdtemp(prefix="certify-test-log-state-")))
    import uuid

    return {"CERTIFY_LOG_STATE": str(_LOG_STATES[0] / f"{uuid.uuid4().hex}.json")}


def write_labelled_npz(net: nn.Module, path: Path, n: int, seed: int) -> Path:
    """``n`` images with labels that are 10% wrong by construction, as an .npz file."""
    x = make_images(n, seed=seed)
    np.savez(path, x=x, y=make_labels(net, x, seed=seed, wrong=0.1))
    return path


def check_metrics(out: Path) -> dict[str, dict]:
    """Each check's metrics from a run directory's results.json.

    Refuses a run in which a check errored or measured nothing: two such runs would compare
    equal (``{} == {}``) whatever the code under test did.
    """
    r = json.loads((out / "results.json").read_text())
    broken = {c["id"]: c.get("error") for c in r["measurement"]["checks"]
              if c["status"] == "ERROR" or not c["metrics"]}
    assert not broken, f"checks without a measurement in {out}: {broken}"
    return {c["id"]: c["metrics"] for c in r["measurement"]["checks"]}


class NanWhenBright(nn.Module):
    """Wraps a net to answer NaN for images whose mean pixel exceeds ``threshold`` (all NaN
    when ``threshold`` is None): a planted defect for the non-finite output handling."""

    def __init__(self, net: nn.Module, threshold: float | None) -> None:
        super().__init__()
        self.net, self.threshold = net, threshold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        nan = torch.full_like(out, float("nan"))
        if self.threshold is None:
            return nan
        bright = x.mean(dim=(1, 2, 3)) > self.threshold
        return torch.where(bright.unsqueeze(1), nan, out)


def bright_and_dark_npz(net: nn.Module, path: Path, n: int, seed: int) -> tuple[Path, np.ndarray]:
    """``n`` images, every other one brightened (mean pixel about 0.75, the others about 0.5),
    labelled by ``net``; returns the path and a mask of the bright ones."""
    x = make_images(n, seed=seed)
    bright = np.arange(n) % 2 == 1
    x[bright] = (128 + x[bright].astype(np.int64) // 2).astype(np.uint8)
    np.savez(path, x=x, y=predict_net(net, x).astype(np.int64))
    return path, bright


def measurement(out: Path) -> bytes:
    """The canonical bytes of a run's signed ``measurement`` part (what must be reproducible)."""
    from certify.canonical import canonical_json

    return canonical_json(json.loads((out / "results.json").read_text())["measurement"])


#: Check ids of the packaged gtsrb suite kept by :func:`write_demo_small_suite`: one check of
#: every kind the demo runs (the reference model's brittleness, an attack with budget rounds and
#: the binarization test, the spatial grid, a pair), shrunk to run in seconds (the corruption
#: and pair checks on 86 of the demo's 430 samples, 2 per class: most of the run otherwise).
DEMO_SMALL = {"sanity": {"samples": 43}, "clean": {}, "coverage": {},
              "gaussian_noise": {"samples": 86, "params": {"steps": 2, "max_draws": 128}},
              "square_linf": {"samples": 24, "params": {
                  "initial_queries": 40, "query_cap": 160, "confident_queries": 10,
                  "binarization": {"samples": 2}}},
              "spatial_grid": {"samples": 16, "params": {
                  "max_queries": 44, "attack_params": {"rotation_steps": 2,
                                                       "translation_steps": 1}}},
              "brittleness": {"samples": 6, "params": {"num_masks": 60}},
              "translation+scaling": {"samples": 86}}


#: Kinds the packaged suite leaves out by default, added to the default small suite so that it
#: has one check of every kind (the certified floor: IBP, cheap on the demo model).
DEMO_SMALL_EXTRA = [{"id": "certified_linf", "kind": "certified", "samples": 12,
                     "params": {"norm": "linf", "epsilon": 0.0314, "methods": ["ibp"]}}]


def write_demo_small_suite(path: Path, cut: dict[str, dict] | None = None,
                           name: str = "gtsrb-small") -> Path:
    """The packaged gtsrb suite cut to ``cut`` (check id -> what changes in it; default
    :data:`DEMO_SMALL` and :data:`DEMO_SMALL_EXTRA`, for ``certify demo --suite``), named
    ``name``."""
    import yaml

    from certify.suite import resolve_suite_path

    cut = DEMO_SMALL if cut is None else cut
    raw = yaml.safe_load(resolve_suite_path("gtsrb").read_text())
    checks = []
    for c in raw["checks"]:
        if c["id"] not in cut:
            continue
        change = cut[c["id"]]
        c = {**c, **{k: v for k, v in change.items() if k != "params"}}
        c["params"] = {**c.get("params", {}), **change.get("params", {})}
        if not c["params"]:
            del c["params"]
        checks.append(c)
    if cut is DEMO_SMALL:
        checks += [dict(c) for c in DEMO_SMALL_EXTRA]
    raw["name"], raw["checks"] = name, checks
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


#: Class names for suites on the tiny model.
CLASSES = [f"c{i}" for i in range(NUM_CLASSES)]


def write_small_suite(path: Path, name: str, extra: list[dict] | None = None) -> Path:
    """A fast suite for the tiny model: clean accuracy and one noise property (thresholds at 0,
    so only a comparison decides), plus ``extra`` checks."""
    import yaml

    checks = [
        {"id": "clean", "kind": "clean_accuracy",
         "threshold": {"metric": "accuracy", "min": 0.0}},
        {"id": "noise", "kind": "corruption",
         "params": {"property": "gaussian_noise", "bound": 0.08, "steps": 2, "max_draws": 128},
         "threshold": {"min": 0.0}},
        *(extra or []),
    ]
    path.write_text(yaml.safe_dump({"name": name, "classes": CLASSES, "seed": 0,
                                    "checks": checks}))
    return path



def demo_module(name: str = "standard") -> nn.Module:
    """The bundled demo model as a torch module: the ONNX graph's layers (batch norm folded into
    the convolutions, as exported) with its weights, to save as a PyTorch program."""
    import onnx
    import onnx.numpy_helper

    from certify.api import demo_model_path

    proto = onnx.load(str(demo_model_path(name)))
    weights = {i.name: torch.from_numpy(onnx.numpy_helper.to_array(i).copy())
               for i in proto.graph.initializer}
    layers: list[nn.Module] = []
    for node in proto.graph.node:
        if node.op_type == "Conv":
            w, b = weights[node.input[1]], weights[node.input[2]]
            conv = nn.Conv2d(w.shape[1], w.shape[0], w.shape[2], padding=w.shape[2] // 2)
            conv.weight.data, conv.bias.data = w, b
            layers.append(conv)
        elif node.op_type == "Gemm":
            w, b = weights[node.input[1]], weights[node.input[2]]
            lin = nn.Linear(w.shape[1], w.shape[0])
            lin.weight.data, lin.bias.data = w, b
            layers.append(lin)
        else:
            layers.append({"Relu": nn.ReLU(), "MaxPool": nn.MaxPool2d(2),
                           "Flatten": nn.Flatten()}[node.op_type])
    return nn.Sequential(*layers).eval()


def save_programs(module: nn.Module, folder: Path, batch: int = 1) -> tuple[Path, Path]:
    """``module`` saved as a ``torch.export`` archive and as a TorchScript file (scripted)."""
    folder.mkdir(parents=True, exist_ok=True)
    sample = torch.rand(batch, 3, 32, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pt2 = folder / "model.pt2"
        torch.export.save(torch.export.export(module, (sample,)), str(pt2))
        ts = folder / "model.pt"
        torch.jit.save(torch.jit.script(module), str(ts))
    return pt2, ts


def in_lanes(lane: Callable[[], AbstractContextManager[Any]], calls: list[Callable[[], Any]],
             timeout: float) -> list[Any]:
    """Each of ``calls`` in its own thread, inside its own ``lane()``, all started at once
    (a barrier); their results, or the exception each raised."""
    out: list[Any] = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def run(k: int) -> None:
        with lane():
            start.wait()
            try:
                out[k] = calls[k]()
            except BaseException as exc:  # noqa: BLE001 - the test reads it
                out[k] = exc

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return out


def docs_extension() -> Any:
    """docs/_ext/certify_docs.py, which generates the documentation's references, loaded as
    a module (it is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "certify_docs", Path(__file__).resolve().parents[1] / "docs" / "_ext" / "certify_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
