"""A Vision Transformer's white-box row against a plain-torch PGD on the module itself (issue 52).

A ViT-style classifier (``transformers``' ``ViTForImageClassification``, 4 layers of width 64,
4×4 patches, random initialisation, nothing downloaded) is trained for a fixed number of steps
(a few CPU minutes) on the demo's generated signs, then exported as users export it, with each
of torch's exporters at their defaults (batch 1; the dynamo exporter's weights kept in the
file). certify runs APGD-CE and APGD-T at L∞ 2/255 (100 iterations, 2 restarts each) on 100
held-out signs of each export, through its own torch copy of the ONNX graph; the threat-model
row (a sample is robust only if both attacks failed) is compared with the yardstick PGD of
``tests/pgd_oracle.py`` run on the **original torch module** (100 steps, a zero and a random
start, margin and cross-entropy losses), every candidate judged by onnxruntime on the export,
on the same samples. The acceptance: within 1 point.

``.venv/bin/python benchmarks/vit_white_box.py [--steps 1500] [--samples 100]``: prints JSON
rows and a table. CPU seconds are the process's own.
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
import onnx
import torch
import yaml

from certify.api import RunOptions, certify_model
from certify.demo.synthetic import generate
from certify.models.batching import opset_of
from certify.results import unpack_bits

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from batch1_export import Judge  # noqa: E402  (onnxruntime one image per call)
from corpus import Logits  # noqa: E402

from pgd_oracle import oracle_candidates  # noqa: E402

EPSILON = 2 / 255
SEED = 0


def vit() -> torch.nn.Module:
    """The benchmark's ViT (random weights, seeded)."""
    import transformers as tr

    torch.manual_seed(SEED)
    return Logits(tr.ViTForImageClassification(tr.ViTConfig(
        num_labels=43, image_size=32, num_channels=3, patch_size=4, hidden_size=64,
        num_hidden_layers=4, num_attention_heads=4, intermediate_size=128)))


def train(net: torch.nn.Module, steps: int) -> dict[str, float]:
    """``steps`` of AdamW on 80 generated signs per class (seed 11), with random shifts."""
    xn, yn = generate(80, seed=11)
    x = torch.from_numpy(xn).permute(0, 3, 1, 2).float() / 255
    y = torch.from_numpy(yn).long()
    gen = torch.Generator().manual_seed(SEED)
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps)
    net.train()
    c0 = time.process_time()
    for _ in range(steps):
        idx = torch.randint(len(x), (64,), generator=gen)
        shift = torch.randint(-2, 3, (2,), generator=gen).tolist()
        xb = torch.roll(x[idx], shifts=shift, dims=(2, 3))
        loss = torch.nn.functional.cross_entropy(net(xb), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    net.eval()
    return {"train_cpu_s": time.process_time() - c0, "final_loss": loss.item()}


def export(net: torch.nn.Module, path: Path, dynamo: bool) -> Path:
    """``torch.onnx.export`` at its defaults: one example image (batch 1)."""
    kwargs: dict[str, Any] = {"dynamo": dynamo, "input_names": ["input"],
                              "output_names": ["output"]}
    if dynamo:
        kwargs["external_data"] = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.rand(1, 3, 32, 32),), str(path), **kwargs)
    return path


def suite(path: Path, samples: int) -> Path:
    """APGD-CE and APGD-T at L∞ 2/255, 100 iterations and 2 restarts each."""
    params = {"norm": "linf", "epsilon": EPSILON, "eps_sweep": False,
              "attack_params": {"iterations": 100, "restarts": 2}}
    checks = [{"id": f"{a}_linf", "kind": "attack", "samples": samples,
               "params": {"attack": a, **params},
               "threshold": {"metric": "robust_accuracy", "min": 0.0}}
              for a in ("apgd_ce", "apgd_t")]
    path.write_text(yaml.safe_dump({"name": "vit-white-box", "seed": SEED, "checks": checks}))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--samples", type=int, default=100)
    args = ap.parse_args()
    torch.manual_seed(SEED)
    net = vit()
    trained = train(net, args.steps)
    xn, yn = generate(3, seed=12)  # held out: 129 signs, certify picks --samples of them
    x = torch.from_numpy(xn).permute(0, 3, 1, 2).float() / 255
    y = torch.from_numpy(yn).long()
    with torch.no_grad():
        trained["clean_accuracy"] = float((net(x).argmax(1) == y).float().mean())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        np.savez(root / "signs.npz", x=xn, y=yn)
        spec = suite(root / "suite.yaml", args.samples)
        for name, dynamo in (("TorchScript exporter", False), ("dynamo exporter", True)):
            path = export(net, root / f"vit-{int(dynamo)}.onnx", dynamo)
            c0 = time.process_time()
            result, _ = certify_model(RunOptions(model=str(path), suite=str(spec),
                                                 data=str(root / "signs.npz"),
                                                 out=root / f"run-{int(dynamo)}", pdf=False))
            cpu = time.process_time() - c0
            m = json.loads(json.dumps(result.to_json()))["measurement"]
            per = {c["id"]: c for c in m["checks"]}
            (row,) = m["attack_worst_case"]
            sel = np.ones(len(yn), dtype=bool)
            for cid in row["attacks"]:
                sel &= unpack_bits(per[cid]["outcomes"]["selected"], len(yn))
            idx = torch.from_numpy(np.flatnonzero(sel))
            xs, ys = x[idx], y[idx]
            judge = Judge(path)
            correct = judge.labels(xs) == ys
            c0 = time.process_time()
            broken = torch.zeros(int(correct.sum()), dtype=torch.bool)
            for cand in oracle_candidates(net, xs[correct], ys[correct], "linf", EPSILON):
                broken |= judge.labels(cand) != ys[correct]
            oracle = int((~broken).sum()) / len(idx)
            rows.append({
                "export": name, "onnx_opset": opset_of(onnx.load(str(path))),
                "batch": m["model"]["batch"], "white_box": m["model"]["white_box"],
                "status": row["status"], "n": len(idx),
                "clean": int(correct.sum()) / len(idx),
                "certify": row["robust_accuracy"], "oracle": oracle,
                "gap_points": round(100 * abs(row["robust_accuracy"] - oracle), 2),
                "attack_status": {i: per[i]["status"] for i in row["attacks"]},
                "run_cpu_s": round(cpu, 1), "oracle_cpu_s": round(time.process_time() - c0, 1)})
    print(json.dumps({"training": trained, "rows": rows}))
    print(f"trained {args.steps} steps in {trained['train_cpu_s']:.0f} CPU s; clean accuracy on "
          f"the held-out signs {trained['clean_accuracy']:.3f}")
    print(f"{'export':<22} {'batch':<8} {'n':>4} {'clean':>6} {'certify':>8} {'oracle':>7} "
          f"{'gap pt':>7} {'run CPU s':>10}")
    for r in rows:
        print(f"{r['export']:<22} {r['batch']:<8} {r['n']:>4} {r['clean']:>6.3f} "
              f"{r['certify']:>8.3f} {r['oracle']:>7.3f} {r['gap_points']:>7.2f} "
              f"{r['run_cpu_s']:>10.1f}")


if __name__ == "__main__":
    main()
