"""Throughput of a certify run through an HTTP endpoint vs the same model in-process, one run.

The demo's standard model (a GTSRB CNN, 32x32) and a query-bound suite (clean accuracy and
Gaussian noise with 3 tries at 4 intensities) on generated signs, runner batch 256 everywhere:

1. in-process: the ONNX file through onnxruntime (certify's ONNX adapter);
2. a threaded loopback server (tests/servers.py, onnxruntime behind ``http.server``) speaking
   KServe v2 with the binary tensor data extension, which certify uses when ``GET /v2`` lists it;
3. the same server with the extension switched off (JSON tensors);
4. MLServer 1.7.1 (``.venv-mlserver``) with a small ONNX runtime: JSON tensors only.

Throughput = model queries / time spent in the checks (model loading and the report excluded).
Client and server share the machine's cores, as they would on one host.

Run: ``.venv/bin/python benchmarks/endpoint.py [--images 1024] [--repeats 2]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from certify.api import RunOptions, certify_model, demo_model_path  # noqa: E402
from certify.demo.synthetic import generate  # noqa: E402
from certify.models.http import HttpOptions  # noqa: E402

from servers import OnnxHttpServer, mlserver  # noqa: E402

SUITE = {
    "name": "http-bench", "seed": 1, "classes": [f"c{i}" for i in range(43)],
    "checks": [
        {"id": "clean", "kind": "clean_accuracy"},
        {"id": "noise", "kind": "corruption",
         "params": {"property": "gaussian_noise", "bound": 0.08, "steps": 4, "tries": 3}},
    ],
}


def _throughput(model: str, suite: Path, data: Path, n: int, out: Path,
                http: HttpOptions | None) -> tuple[float, dict[str, Any]]:
    results, _ = certify_model(RunOptions(model=model, suite=str(suite), data=str(data),
                                          out=out, samples=n, pdf=False, http=http,
                                          batch_size=256))
    busy = sum(results.provenance.timings["checks"].values())
    metrics = {c.id: c.metrics.model_dump() for c in results.checks}
    return results.measurement.queries.total / busy, metrics


def main() -> None:
    """Run all configurations and print a markdown table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    model = demo_model_path("standard")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        suite = d / "suite.yaml"
        suite.write_text(yaml.safe_dump(SUITE))
        x, y = generate(max(1, args.images // 43 + 1), seed=77)
        data = d / "data.npz"
        np.savez(data, x=x[:args.images], y=y[:args.images])
        n = min(args.images, len(y))
        rows: list[tuple[str, str, float, bool]] = []
        runs = 0

        def best(label: str, encoding: str, spec: str, http: HttpOptions | None) -> None:
            nonlocal runs
            figures = []
            for _ in range(args.repeats):
                runs += 1
                tput, metrics = _throughput(spec, suite, data, n, d / f"run{runs}", http)
                figures.append(tput)
            same = metrics == reference[0] if reference else True
            rows.append((label, encoding, max(figures), same))
            if not reference:
                reference.append(metrics)

        reference: list[dict[str, Any]] = []
        best("in-process onnxruntime", "-", str(model), None)
        for binary in (True, False):
            server = OnnxHttpServer(model, binary=binary)
            try:
                for batch, conc in ((64, 4), (256, 1)):
                    best(f"loopback server, {batch} img/request, {conc} in flight",
                         "binary" if binary else "JSON", server.v2_url,
                         HttpOptions(batch=batch, concurrency=conc))
            finally:
                server.stop()
        with mlserver(model, d / "mlserver") as url:
            for batch, conc in ((64, 4), (256, 1)):
                best(f"MLServer 1.7.1, {batch} img/request, {conc} in flight", "JSON", url,
                     HttpOptions(batch=batch, concurrency=conc))
    base = rows[0][2]
    print(f"{n} images, {SUITE['checks'][1]['params']} + clean; runner batch 256; "
          f"best of {args.repeats}")
    print("| model served by | tensors | queries/s | vs in-process | same metrics |")
    print("|---|---|---|---|---|")
    for label, enc, tput, same in rows:
        print(f"| {label} | {enc} | {tput:,.0f} | {tput / base:.2f} | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
