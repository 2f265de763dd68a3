"""The run-time estimate against the run (issue 62): "at most" never below the actual, and
"expected" within 0.67-1.5x of it, on five runs in one session.

- ``demo``: ``certify demo`` (the packaged gtsrb suite, the standard model, 430 signs);
- ``onnx``, ``pt2``, ``traced``: one small CNN (``tests/builders.TinyNet``, trained for
  :data:`EPOCHS` epochs on 1,290 generated signs of another seed) exported as a team does: the
  default ``torch.onnx.export`` (dynamo) at batch 1, ``torch.export`` to ``.pt2`` and
  ``torch.jit.trace``; the packaged gtsrb suite on the demo's 430 signs, ``--samples``
  :data:`FORMAT_SAMPLES`;
- ``endpoint``: the demo's standard model behind MLServer (REST), with the endpoint
  benchmark's suite (sanity, clean, gaussian_noise, square_linf on 30 samples),
  ``--http-batch 64 --concurrency 4``.

Actual: the evaluation's seconds (``provenance.timings.total_s``: from the run's start, the
pilot included, to the assembled result; loading the model and writing the card are outside
it, as the estimate says). The reference workload runs right after, on the same machine.

Run: ``.venv/bin/python benchmarks/plan.py [--runs demo,onnx,pt2,traced,endpoint]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from endpoint import BATCH, CONCURRENCY, write_inputs  # noqa: E402

from certify.api import (  # noqa: E402
    DEMO_PER_CLASS,
    DEMO_SEED,
    RunOptions,
    certify_model,
    demo_model_path,
)
from certify.demo.synthetic import generate  # noqa: E402
from certify.models.http import HttpOptions  # noqa: E402

import builders  # noqa: E402
from servers import mlserver_process  # noqa: E402

EPOCHS = 15
FORMAT_SAMPLES = 150
TRAIN_SEED = 7


def trained_net() -> torch.nn.Module:
    """TinyNet trained briefly on generated signs (another seed than the demo's test set)."""
    x, y = generate(30, seed=TRAIN_SEED)
    xt = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).float() / 255
    yt = torch.from_numpy(np.asarray(y)).long()
    net = builders.make_net(seed=0).train()
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(EPOCHS):
        for idx in torch.randperm(len(xt), generator=g).split(64):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(xt[idx]), yt[idx]).backward()
            opt.step()
    return net.eval()


def export_all(net: torch.nn.Module, folder: Path) -> dict[str, Path]:
    """The network as the default ONNX export (batch 1), a .pt2 and traced TorchScript."""
    x = torch.rand(1, 3, 32, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (x,), str(folder / "net.onnx"), dynamo=True)
        torch.export.save(torch.export.export(net, (x,)), str(folder / "net.pt2"))
        torch.jit.save(torch.jit.trace(net, x), str(folder / "net.pt"))
    return {"onnx": folder / "net.onnx", "pt2": folder / "net.pt2",
            "traced": folder / "net.pt"}


def figures(results_json: Path) -> dict[str, Any]:
    """Actual, expected and at-most seconds of one run's results.json."""
    t = json.loads(results_json.read_text())["provenance"]["timings"]
    e = t.get("estimate") or {}
    actual = float(t["total_s"])
    checks = {k: {"actual_s": round(v, 2), **e.get("checks", {}).get(k, {})}
              for k, v in t["checks"].items()}
    return {"actual_s": actual, "expected_s": e.get("expected_s"), "checks": checks,
            "at_most_s": e.get("at_most_s"), "pilot_s": e.get("pilot_s"),
            "kept": e.get("pilot_records_kept"),
            "expected_ratio": e["expected_s"] / actual if e else None,
            "at_most_holds": bool(e) and e["at_most_s"] >= actual}


def reference_workload() -> float:
    """``benchmarks/reference_workload.py``'s best round, seconds, run now."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "reference_workload.py")],
                         capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["best_s"])


def main() -> None:
    """Run the runs asked for; print a markdown table and the figures as JSON."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="demo,onnx,pt2,traced,endpoint")
    args = ap.parse_args()
    runs = args.runs.split(",")
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        if "demo" in runs:
            subprocess.run([sys.executable, "-m", "certify.cli", "demo", "--out",
                            str(d / "demo"), "--no-pdf", "-q"], check=True)
            rows["demo"] = figures(d / "demo" / "results.json")
        x, y = generate(DEMO_PER_CLASS, seed=DEMO_SEED)
        data = d / "signs.npz"
        np.savez(data, x=x, y=y)
        files = export_all(trained_net(), d) if {"onnx", "pt2", "traced"} & set(runs) else {}
        for name, path in files.items():
            if name in runs:
                certify_model(RunOptions(model=str(path), suite="gtsrb", data=str(data),
                                         out=d / name, pdf=False, samples=FORMAT_SAMPLES,
                                         estimate=True))
                rows[name] = figures(d / name / "results.json")
        if "endpoint" in runs:
            (d / "endpoint-inputs").mkdir()
            suite, signs = write_inputs(d / "endpoint-inputs", 30)
            model = demo_model_path("standard")
            with mlserver_process(model, d / "mlserver") as served:
                certify_model(RunOptions(model=served.url, suite=str(suite), data=str(signs),
                                         out=d / "endpoint", pdf=False, estimate=True,
                                         http=HttpOptions(batch=BATCH,
                                                          concurrency=CONCURRENCY)))
            rows["endpoint"] = figures(d / "endpoint" / "results.json")
    ref = reference_workload()
    print(f"reference workload {ref:.2f} s")
    print("| run | actual s | expected s | expected / actual | at most s | at most >= actual "
          "| pilot s | pilot records kept |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['actual_s']:.1f} | {r['expected_s']:.1f} | "
              f"{r['expected_ratio']:.2f} | {r['at_most_s']:.1f} | {r['at_most_holds']} | "
              f"{r['pilot_s']:.1f} | {r['kept']} |")
    print(json.dumps({"reference_workload_s": ref, "runs": rows}))


if __name__ == "__main__":
    main()
