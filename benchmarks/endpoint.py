"""Auditing a deployed model: certify against a real serving stack, beside the same model
in-process and a minimal client on the same server, in one run (issue 61).

The demo's standard model (a GTSRB CNN, 32x32) on the demo's 430 generated signs, the packaged
gtsrb suite's ``sanity``, ``clean``, ``gaussian_noise`` and ``square_linf`` (30 samples),
``--http-batch 64 --concurrency 4``:

- ``inproc``: the ONNX file through onnxruntime in this process (the reference metrics);
- ``rest``: MLServer 1.7.1 (``.venv-mlserver``; a 20-line runtime running onnxruntime on the
  batch) over the Open Inference Protocol's REST binding (JSON tensors: MLServer advertises no
  binary extension);
- ``grpc``: the same MLServer over the protocol's gRPC binding (raw tensor bytes);
- ``minimal``: a bare ``requests.Session`` client posting the same number of images to the same
  server, 64 per request, 4 in flight: what the server costs when the client costs nothing;
- ``faults``: REST through a proxy that injects 15% faults (500, 429 with Retry-After: 1, a
  garbage 200, a request accepted and never answered), seeded;
- ``latency``: REST through a proxy that adds 20 ms to every round trip (a far-away endpoint),
  with the share of the wall that is sequential round trips.

Per way: wall seconds, certify's CPU seconds, the server's CPU seconds, requests and images
(the client's counts and the server's own record), mean images per request, and the requests'
bound: ``1.5 × ⌈images / 64⌉ + Σ over the attack's rounds of that round's iterations``
(iterations: the most queries any sample of the round took). Metrics must equal in-process.
The reference workload runs right after, on the same machine.

Run: ``.venv/bin/python benchmarks/endpoint.py [--ways inproc,rest,grpc,minimal,faults,latency]``
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from certify.api import (  # noqa: E402
    DEMO_PER_CLASS,
    DEMO_SEED,
    RunOptions,
    certify_model,
    demo_model_path,
)
from certify.demo.synthetic import generate  # noqa: E402
from certify.models.http import HttpOptions  # noqa: E402

from servers import Faults, MLServer, Proxy, mlserver_process  # noqa: E402

CHECKS = ("sanity", "clean", "gaussian_noise", "square_linf")
BATCH, CONCURRENCY = 64, 4
FAULTS = Faults(seed=11, p_500=0.05, p_429=0.04, p_garbage=0.03, p_hang=0.03, retry_after=1)


def write_inputs(folder: Path, square_samples: int) -> tuple[Path, Path]:
    """The packaged gtsrb suite cut to :data:`CHECKS` (square_linf on ``square_samples``) and
    the demo's 430 signs as an .npz."""
    doc = yaml.safe_load((ROOT / "suites" / "gtsrb.yaml").read_text())
    doc["checks"] = [c for c in doc["checks"] if c["id"] in CHECKS]
    for c in doc["checks"]:
        if c["id"] == "square_linf":
            c["samples"] = square_samples
    suite = folder / "suite.yaml"
    suite.write_text(yaml.safe_dump(doc, sort_keys=False))
    x, y = generate(DEMO_PER_CLASS, seed=DEMO_SEED)
    data = folder / "data.npz"
    np.savez(data, x=x, y=y)
    return suite, data


def iterations(run_dir: Path) -> dict[str, int]:
    """Per attack round: the most queries any of its samples took (one request per iteration
    carries every active sample of the round at best)."""
    most: dict[str, int] = defaultdict(int)
    for line in (run_dir / "records.jsonl").read_text().splitlines():
        r = json.loads(line)
        if str(r["check"]).split("#")[0] == "square_linf":
            most[r["check"]] = max(most[r["check"]], int(r.get("queries", 0)))
    return dict(most)


class Phases:
    """A progress reporter that notes, as each step starts, how many requests the server has
    logged: the requests (and images) of each check, from the server's own record."""

    def __init__(self, server: MLServer | None) -> None:
        self.server = server
        self.starts: list[tuple[str, int]] = []

    def start(self, label: str, total: int) -> None:  # noqa: D102
        if self.server is not None:
            self.starts.append((label.split()[0], len(self.server.batches())))

    def advance(self, n: int) -> None:  # noqa: D102
        pass

    def finish(self) -> None:  # noqa: D102
        pass

    def per_check(self) -> dict[str, tuple[int, int]]:
        """(requests, images) per check, from the server's log."""
        if self.server is None:
            return {}
        sizes = self.server.batches()
        out: dict[str, tuple[int, int]] = defaultdict(lambda: (0, 0))
        bounds = [*self.starts, ("end", len(sizes))]
        for (label, a), (_next, b) in zip(bounds, bounds[1:], strict=False):
            check = label.split("#")[0].split(":")[0]
            r, i = out[check]
            out[check] = (r + b - a, i + sum(sizes[a:b]))
        return dict(out)


def run_certify(spec: str, suite: Path, data: Path, out: Path,
                http: HttpOptions | None, server: MLServer | None = None) -> dict[str, Any]:
    """One certify run; its wall and CPU seconds, metrics and traffic (and with ``server``,
    each check's requests and images as the server logged them)."""
    phases = Phases(server)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    results, _ = certify_model(RunOptions(model=spec, suite=str(suite), data=str(data),
                                          out=out, pdf=False, http=http), phases)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    traffic = (results.provenance.traffic or {}).get("model") or {}
    return {"wall": wall, "cpu": cpu, "images": results.measurement.queries.total,
            "metrics": {c.id: c.metrics.model_dump() for c in results.measurement.checks},
            "traffic": traffic, "iterations": iterations(out), "per_check": phases.per_check()}


def minimal_client(url: str, x: np.ndarray, images: int) -> dict[str, Any]:
    """Post ``images`` images (cycling through ``x``, NCHW floats) to ``url``'s /infer, 64 per
    request, 4 in flight, with one requests.Session per thread; JSON tensors as certify
    sends them to a server without the binary extension."""
    import orjson
    import requests

    chunks = [(i, min(BATCH, images - i)) for i in range(0, images, BATCH)]
    lock = threading.Lock()
    sent = {"requests": 0}

    def worker(mine: list[tuple[int, int]]) -> None:
        s = requests.Session()
        for start, n in mine:
            idx = np.arange(start, start + n) % len(x)
            body = orjson.dumps({"inputs": [{"name": "input", "shape": [n, 3, 32, 32],
                                             "datatype": "FP32", "data": x[idx].reshape(-1)}]},
                                option=orjson.OPT_SERIALIZE_NUMPY)
            r = s.post(url + "/infer", data=body, headers={"Content-Type": "application/json"},
                       timeout=60)
            r.raise_for_status()
            np.asarray(orjson.loads(r.content)["outputs"][0]["data"])
            with lock:
                sent["requests"] += 1

    cpu0, wall0 = time.process_time(), time.perf_counter()
    threads = [threading.Thread(target=worker, args=(chunks[k::CONCURRENCY],))
               for k in range(CONCURRENCY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"wall": time.perf_counter() - wall0, "cpu": time.process_time() - cpu0,
            "images": images, "requests": sent["requests"]}


def reference_workload() -> float:
    """``benchmarks/reference_workload.py``'s best round, seconds, run now."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "reference_workload.py")],
                         capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["best_s"])


def main() -> None:  # noqa: C901 - one table, one function
    """Run the ways asked for and print a markdown table and the figures as JSON."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--ways", default="inproc,rest,grpc,minimal,faults,latency")
    ap.add_argument("--square-samples", type=int, default=30)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    args = ap.parse_args()
    ways = args.ways.split(",")
    model = demo_model_path("standard")
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        suite, data = write_inputs(d, args.square_samples)
        base = run_certify(str(model), suite, data, d / "inproc", None)
        rows["inproc"] = base
        http = HttpOptions(batch=BATCH, concurrency=CONCURRENCY)
        with mlserver_process(model, d / "mlserver") as served:
            def measured(name: str, spec: str, opts: HttpOptions, server: MLServer,
                         proxy: Proxy | None = None) -> None:
                cpu0, n0 = server.cpu_seconds(), len(server.batches())
                row = run_certify(spec, suite, data, d / name, opts, server)
                row["server_cpu"] = server.cpu_seconds() - cpu0
                served_batches = server.batches()[n0:]
                row["server_requests"], row["server_images"] = (len(served_batches),
                                                                sum(served_batches))
                row["same_metrics"] = row["metrics"] == base["metrics"]
                row["differs"] = {k: {m: (v, base["metrics"][k].get(m))
                                      for m, v in row["metrics"][k].items()
                                      if base["metrics"][k].get(m) != v}
                                  for k in row["metrics"]
                                  if row["metrics"][k] != base["metrics"].get(k)}
                if proxy is not None:
                    row["proxy"] = {"requests": proxy.requests,
                                    "faults": dict(proxy.faults_injected)}
                rows[name] = row

            if "rest" in ways:
                measured("rest", served.url, http, served)
            if "grpc" in ways:
                measured("grpc", f"grpc://{served.grpc}/v2/models/{served.name}", http, served)
            if "minimal" in ways:
                x, _ = generate(DEMO_PER_CLASS, seed=DEMO_SEED)
                nchw = (x.astype(np.float32) / 255).transpose(0, 3, 1, 2).copy()
                cpu0 = served.cpu_seconds()
                row = minimal_client(served.url, nchw, rows.get("rest", base)["images"])
                row["server_cpu"] = served.cpu_seconds() - cpu0
                rows["minimal"] = row
            for name, proxy_args in (("faults", {"faults": FAULTS}),
                                     ("latency", {"latency_s": args.latency_ms / 1000})):
                if name not in ways:
                    continue
                upstream = served.url.split("/v2/")[0]
                proxy = Proxy(upstream, **proxy_args)  # type: ignore[arg-type]
                try:
                    opts = http if name == "latency" else HttpOptions(
                        batch=BATCH, concurrency=CONCURRENCY, timeout=10.0)
                    measured(name, proxy.url(served.url), opts, served, proxy)
                finally:
                    proxy.stop()
    ref = reference_workload()
    print(f"demo standard model, 430 demo signs, {', '.join(CHECKS)} (square on "
          f"{args.square_samples}); --http-batch {BATCH} --concurrency {CONCURRENCY}; "
          f"reference workload {ref:.2f} s")
    print("| way | wall s | vs in-process | certify CPU s | server CPU s | requests | images | "
          "images/request | request bound | same metrics |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    summary: dict[str, Any] = {"reference_workload_s": ref}
    for name, r in rows.items():
        t = r.get("traffic") or {}
        requests_ = t.get("requests", r.get("requests", 0))
        images = r["images"]
        per = images / requests_ if requests_ else float("nan")
        bound = ""
        if r.get("iterations") is not None and requests_:
            attack = sum(r["iterations"].values())
            bound = f"{1.5 * math.ceil(images / BATCH) + attack:,.0f}"
        print(f"| {name} | {r['wall']:.1f} | {r['wall'] / base['wall']:.2f} | {r['cpu']:.1f} | "
              f"{r.get('server_cpu', 0):.1f} | {requests_:,} | {images:,} | {per:.1f} | "
              f"{bound} | {'yes' if r.get('same_metrics', True) else 'NO'} |")
        summary[name] = {k: v for k, v in r.items() if k not in ("metrics",)}
    lat = rows.get("latency")
    if lat is not None:
        trips = (lat["traffic"].get("round_trip_ms") or {}).get("p50") or 0.0
        chain = sum(lat["iterations"].values())
        seq = chain * trips / 1000
        print(f"\nlatency run: {chain:,} sequential attack iterations x {trips:.1f} ms median "
              f"round trip = {seq:.0f} s of {lat['wall']:.0f} s wall "
              f"({seq / lat['wall']:.0%} sequential round trips)")
        summary["latency_sequential_share"] = seq / lat["wall"]
    print("\nper check, from the server's log (requests, images, images per request):")
    for name, r in rows.items():
        for check, (n_req, n_img) in (r.get("per_check") or {}).items():
            print(f"  {name:8} {check:16} {n_req:7,} {n_img:9,} "
                  f"{n_img / max(1, n_req):6.1f}")
    print(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
