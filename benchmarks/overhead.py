"""Overhead of certify's clean-accuracy path over a bare onnxruntime loop, in one run.

Two comparisons, both at batch 256 on the same preloaded images:

1. A GTSRB-sized CNN with a symbolic batch: certify (runner, query counting, durable records)
   vs a bare ``session.run`` loop that computes the same accuracy.
2. The same CNN exported with its batch fixed to 1: certify rewrites the batch to symbolic;
   compared with a bare loop over the rewritten model, and with the bare fixed-1 model run one
   image per call (what a user gets without the rewrite).

Run: ``.venv/bin/python benchmarks/overhead.py [--images 8192] [--repeats 5]``
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from certify.data.loaders import from_arrays
from certify.device import choose_device
from certify.engine import run_suite
from certify.models.onnx import OnnxModel
from certify.rundir import RunDir
from certify.suite import load_suite, parse_suite


class GtsrbCnn(nn.Module):
    """A GTSRB-sized CNN (about 270k parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1),
            nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1),
            nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
            nn.Flatten(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 43),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def export(net: nn.Module, path: Path, fixed: bool) -> None:
    """Export with a symbolic or a fixed batch of 1."""
    dyn = None if fixed else {"input": {0: "batch"}, "logits": {0: "batch"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.rand(1, 3, 32, 32),), str(path), input_names=["input"],
                          output_names=["logits"], dynamic_axes=dyn, dynamo=False,
                          opset_version=17)


def bare_accuracy(sess: ort.InferenceSession, x: np.ndarray, y: np.ndarray, batch: int) -> float:
    """The peer: a plain onnxruntime loop computing top-1 accuracy."""
    name = sess.get_inputs()[0].name
    correct = 0
    for s in range(0, len(x), batch):
        out = sess.run(None, {name: x[s : s + batch]})[0]
        correct += int((out.argmax(1) == y[s : s + batch]).sum())
    return correct / len(x)


def certify_accuracy(model: OnnxModel, data, suite, device, batch: int) -> float:
    """certify's clean-accuracy check through the runner, records written to a temp dir."""
    with tempfile.TemporaryDirectory() as d:
        run = RunDir(Path(d), {"bench": 1}, resume=False)
        try:
            r = run_suite(model, data, suite, run, device, batch_size=batch)
        finally:
            run.close()
    return r.result.checks[0].metrics.accuracy


def best_rate(fn, n: int, repeats: int) -> tuple[float, float]:
    """Best images/s over ``repeats`` calls, and the value the call returned."""
    best, value = 0.0, 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        best = max(best, n / (time.perf_counter() - t0))
    return best, value


def main() -> None:
    """Run both comparisons and print a JSON summary."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    net = GtsrbCnn().eval()
    rng = np.random.default_rng(0)
    xu8 = rng.integers(0, 256, size=(args.images, 32, 32, 3), dtype=np.uint8)
    y = rng.integers(0, 43, size=args.images)
    data = from_arrays(xu8, y, [str(i) for i in range(args.images)],
                       [f"c{i}" for i in range(43)], "bench", "npz")
    x = np.ascontiguousarray(data.x.numpy())
    # the packaged suite's classes with its clean-accuracy check only
    raw = dict(load_suite("gtsrb").raw)
    raw["checks"] = [c for c in raw["checks"] if c["kind"] == "clean_accuracy"]
    suite = parse_suite(raw, "gtsrb-clean")
    device = choose_device("cpu")
    n, b, rep = args.images, args.batch, args.repeats
    res: dict[str, float | str] = {"images": n, "batch": b, "repeats": rep,
                                   "onnxruntime": ort.__version__,
                                   "params": sum(p.numel() for p in net.parameters())}
    with tempfile.TemporaryDirectory() as d:
        dyn, fixed = Path(d) / "dyn.onnx", Path(d) / "fixed1.onnx"
        export(net, dyn, fixed=False)
        export(net, fixed, fixed=True)
        opts = ort.SessionOptions()
        bare = ort.InferenceSession(str(dyn), opts, providers=["CPUExecutionProvider"])
        m_dyn = OnnxModel(dyn, device)
        m_fixed = OnnxModel(fixed, device)
        assert m_fixed.batch_mode.startswith("symbolic"), m_fixed.batch_mode
        bare_fixed = ort.InferenceSession(str(fixed), opts, providers=["CPUExecutionProvider"])

        r_bare, a_bare = best_rate(lambda: bare_accuracy(bare, x, y, b), n, rep)
        r_cert, a_cert = best_rate(lambda: certify_accuracy(m_dyn, data, suite, device, b),
                                   n, rep)
        # the bare peer on the rewritten model is onnxruntime on the same rewritten session
        r_bare_rw, _ = best_rate(lambda: bare_accuracy(m_fixed.session, x, y, b), n, rep)
        r_cert_fx, a_fx = best_rate(lambda: certify_accuracy(m_fixed, data, suite, device, b),
                                    n, rep)
        r_one, _ = best_rate(lambda: bare_accuracy(bare_fixed, x, y, 1), n, max(1, rep // 2))
    assert abs(a_bare - a_cert) < 1e-12 and abs(a_bare - a_fx) < 1e-12
    res.update({
        "bare_dynamic_img_s": round(r_bare), "certify_dynamic_img_s": round(r_cert),
        "certify_overhead_pct": round(100 * (r_bare / r_cert - 1), 1),
        "bare_rewritten_img_s": round(r_bare_rw), "certify_fixed1_img_s": round(r_cert_fx),
        "fixed1_vs_bare_rewritten": round(r_cert_fx / r_bare_rw, 3),
        "bare_fixed1_one_per_call_img_s": round(r_one),
        "fixed1_speedup_over_one_per_call": round(r_cert_fx / r_one, 2),
    })
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
