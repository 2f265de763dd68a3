"""The transparency log's tree head at 100,000 entries, and ``/health`` under anonymous load.

Fills a service home with ``--entries`` log entries (inserted straight into SQLite, in a
subprocess of the code under test, so its own migrations make the schema), starts a real
``certify serve --workers 0`` on 127.0.0.1 and measures:

- ``GET /api/v1/log`` one request at a time: the first request (a new process reads the
  log once) and the next ``--requests``;
- ``/health`` latency while ``--clients`` anonymous clients call ``GET /api/v1/log`` back to
  back for ``--seconds`` (the issue: 8 clients pushed ``/health`` p99 to 696 ms), with the
  heads' throughput.

``--pythonpath DIR`` runs the server (and the fill) from another checkout of certify, e.g. the
commit before the change extracted with ``git archive``: the before and after figures come
from the same script on the same machine.

Run: ``.venv/bin/python benchmarks/log_head.py [--entries 100000] [--pythonpath DIR]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from service_fixture import Service  # noqa: E402

FILL = textwrap.dedent("""
    import hashlib, sys
    from pathlib import Path
    from certify.service import merkle
    from certify.service.db import LogEntry, make_engine, migrate, sqlite_url, utcnow
    home, n = Path(sys.argv[1]), int(sys.argv[2])
    home.mkdir(parents=True, exist_ok=True)
    engine = make_engine(sqlite_url(home))
    migrate(engine)
    rows = []
    for i in range(n):
        digest = hashlib.sha256(i.to_bytes(8, "big")).hexdigest()
        rows.append({"idx": i, "leaf_hash": merkle.leaf_hash(bytes.fromhex(digest)),
                     "statement_digest": "sha256:" + digest, "run_id": f"{i:032x}",
                     "statement": {"schema": "bench", "measurement": digest},
                     "created": utcnow()})
    with engine.begin() as conn:
        conn.execute(LogEntry.__table__.insert(), rows)
    engine.dispose()
""")


def _pct(ms: list[float]) -> str:
    a = np.asarray(ms)
    return (f"n={len(a)} p50 {np.percentile(a, 50):.1f} / p99 {np.percentile(a, 99):.1f} / "
            f"max {a.max():.1f} ms")


def main() -> None:
    """Run the benchmark and print its figures."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--pythonpath", default=None)
    args = ap.parse_args()
    if args.pythonpath:
        os.environ["PYTHONPATH"] = str(Path(args.pythonpath).resolve())
    home = Path(tempfile.mkdtemp(prefix="certify-loghead-")) / "home"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", FILL, str(home), str(args.entries)], check=True,
                   cwd=home.parent)  # not this folder: -c puts the working folder first
    print(f"filled {args.entries} entries in {time.perf_counter() - t0:.1f} s "
          f"(code: {args.pythonpath or 'this checkout'})")
    svc = Service(home, "--workers", "0").start()
    try:
        url = f"{svc.url}/api/v1"
        one = requests.Session()
        t0 = time.perf_counter()
        head = one.get(f"{url}/log", timeout=120).json()
        print(f"first GET /log: {(time.perf_counter() - t0) * 1000:.1f} ms "
              f"(tree size {head['tree_size']})")
        single = []
        for _ in range(args.requests):
            t0 = time.perf_counter()
            one.get(f"{url}/log", timeout=120).raise_for_status()
            single.append((time.perf_counter() - t0) * 1000)
        print(f"GET /log one at a time: {_pct(single)}")
        idle = []
        for _ in range(200):
            t0 = time.perf_counter()
            one.get(f"{url}/health", timeout=60).raise_for_status()
            idle.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.01)
        print(f"/health idle: {_pct(idle)}")

        stop = threading.Event()
        heads: list[float] = []
        lock = threading.Lock()

        def client() -> None:
            s = requests.Session()
            while not stop.is_set():
                t0 = time.perf_counter()
                s.get(f"{url}/log", timeout=120).raise_for_status()
                with lock:
                    heads.append((time.perf_counter() - t0) * 1000)

        threads = [threading.Thread(target=client) for _ in range(args.clients)]
        for t in threads:
            t.start()
        health = []
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            one.get(f"{url}/health", timeout=60).raise_for_status()
            health.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.01)
        stop.set()
        for t in threads:
            t.join()
        print(f"/health under {args.clients} /log clients: {_pct(health)}")
        print(f"GET /log under load: {_pct(heads)}, {len(heads) / args.seconds:.1f} heads/s")
    finally:
        svc.stop()


if __name__ == "__main__":
    main()
