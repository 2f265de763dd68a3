"""The demo's standard network exported the way teams export it (issue 49): certify's white-box
rows on each export against an independent plain-torch PGD, and what running a graph one image
at a time costs.

Four ONNX files of the same weights: a dynamic batch (the reference), ``torch.onnx.export``'s
default batch of 1 with the TorchScript-based exporter and with the dynamo exporter (both
proven batchable by certify), and the network wrapped to centre each input on its own mean
over the whole input tensor (legal at batch 1 only: certify runs it one image at a time, the
torch copy mapped over images with ``torch.func.vmap``). For each file, certify's packaged
APGD-CE and APGD-T rows (L∞ 8/255, L2 0.5) on the demo's signs and the threat-model rows they
decide, and the oracle of ``tests/pgd_oracle.py``
(100 steps, zero and random starts, margin and cross-entropy losses) on an ``nn.Sequential``
rebuilt from the weights, run one image at a time where the graph is, every candidate judged
by onnxruntime one image at a time. CPU seconds are the process's own (both cores).

``.venv/bin/python benchmarks/batch1_export.py [--samples 100]``: prints JSON rows and a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
import yaml
from torch import nn

from certify.api import DEMO_PER_CLASS, DEMO_SEED, RunOptions, certify_model, demo_model_path
from certify.demo.synthetic import generate
from certify.results import unpack_bits
from certify.suite import resolve_suite_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from builders import WholeInput  # noqa: E402
from pgd_oracle import oracle_candidates, oracle_net  # noqa: E402

ROWS = ("apgd_linf", "apgd_t_linf", "apgd_l2", "apgd_t_l2")
EPSILON = {"linf": 8 / 255, "l2": 0.5}


class OneAtATime(nn.Module):
    """A module run on each image alone (the oracle's view of a graph legal at batch 1)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.net(x[i:i + 1]) for i in range(len(x))])


class Judge:
    """onnxruntime on the file, one image per call (every graph here takes that)."""

    def __init__(self, path: Path) -> None:
        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.name = self.session.get_inputs()[0].name

    def labels(self, x: torch.Tensor) -> torch.Tensor:
        arr = x.detach().numpy().astype(np.float32)
        return torch.tensor([int(self.session.run(None, {self.name: arr[i:i + 1]})[0].argmax())
                             for i in range(len(arr))])


def export(net: nn.Module, path: Path, dynamo: bool, dynamic: bool) -> Path:
    """``torch.onnx.export`` with one example image; ``dynamic`` names a dynamic batch."""
    kwargs: dict[str, Any] = {"dynamo": dynamo, "input_names": ["input"],
                              "output_names": ["output"]}
    if dynamic:
        kwargs["dynamic_axes"] = {"input": {0: "batch"}, "output": {0: "batch"}}
    if dynamo:
        kwargs["external_data"] = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net.eval(), (torch.rand(1, 3, 32, 32),), str(path), **kwargs)
    return path


def run_certify(model: Path, data: Path, out: Path, samples: int
                ) -> tuple[dict[str, Any], dict[str, float], float]:
    """certify's measurement on the packaged APGD rows, their seconds, and CPU seconds."""
    raw = yaml.safe_load(resolve_suite_path("gtsrb").read_text(encoding="utf-8"))
    raw["checks"] = [{**c, "samples": samples} for c in raw["checks"] if c["id"] in ROWS]
    suite = out.parent / f"{out.name}.yaml"
    suite.write_text(yaml.safe_dump({**raw, "name": "batch1"}))
    c0 = time.process_time()
    result, _ = certify_model(RunOptions(model=str(model), suite=str(suite), data=str(data),
                                         out=out, pdf=False))
    doc = json.loads(json.dumps(result.to_json()))
    return doc["measurement"], doc["provenance"]["timings"]["checks"], time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=100)
    args = ap.parse_args()
    xn, yn = generate(DEMO_PER_CLASS, seed=DEMO_SEED)
    x = torch.from_numpy(xn).permute(0, 3, 1, 2).float() / 255
    y = torch.from_numpy(yn).long()
    net = oracle_net(demo_model_path("standard"))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        np.savez(root / "demo.npz", x=xn, y=yn)
        files = {
            "dynamic": (export(net, root / "dynamic.onnx", False, True), net),
            "batch 1 (TorchScript exporter)": (export(net, root / "b1.onnx", False, False), net),
            "batch 1 (dynamo)": (export(net, root / "b1dy.onnx", True, False), net),
            "whole input, batch 1": (export(WholeInput(net), root / "whole.onnx", False, False),
                                     OneAtATime(WholeInput(net))),
        }
        for name, (path, oracle) in files.items():
            m, seconds, cpu = run_certify(path, root / "demo.npz", root / path.stem,
                                          args.samples)
            judge = Judge(path)
            per = {c["id"]: c for c in m["checks"]}
            for row in m["attack_worst_case"]:
                norm = row["norm"]
                sel = np.ones(len(yn), dtype=bool)
                for cid in row["attacks"]:
                    sel &= unpack_bits(per[cid]["outcomes"]["selected"], len(yn))
                idx = torch.from_numpy(np.flatnonzero(sel))
                xs, ys = x[idx], y[idx]
                correct = judge.labels(xs) == ys
                t0 = time.process_time()
                broken = torch.zeros(int(correct.sum()), dtype=torch.bool)
                for cand in oracle_candidates(oracle, xs[correct], ys[correct], norm,
                                              EPSILON[norm]):
                    broken |= judge.labels(cand) != ys[correct]
                ce = per[f"apgd_{norm}"]
                rows.append({
                    "model": name, "batch": m["model"]["batch"], "norm": norm,
                    "status": row["status"], "n": len(idx),
                    "certify": row["robust_accuracy"],
                    "apgd_ce": ce["metrics"]["robust_accuracy"],
                    "oracle": int((~broken).sum()) / len(idx),
                    "gradients": sum(per[i]["metrics"]["gradient_evaluations"]
                                     for i in row["attacks"]),
                    "check_s": sum(seconds.get(i) or 0.0 for i in row["attacks"]),
                    "run_cpu_s": cpu, "oracle_cpu_s": time.process_time() - t0})
    print(json.dumps(rows))
    print(f"{'model':<31} {'threat':<6} {'n':>4} {'certify':>8} {'APGD-CE':>8} {'oracle':>7} "
          f"{'grads':>7} {'APGD s':>7} {'run CPU s':>10}")
    for r in rows:
        print(f"{r['model']:<31} {r['norm']:<6} {r['n']:>4} {r['certify']:>8.3f} "
              f"{r['apgd_ce']:>8.3f} {r['oracle']:>7.3f} {r['gradients']:>7} "
              f"{r['check_s']:>7.1f} {r['run_cpu_s']:>10.1f}")


if __name__ == "__main__":
    main()
