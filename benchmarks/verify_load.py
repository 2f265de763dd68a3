"""Card verification under hostile uploads (issue 28, item 1).

Starts a real ``certify serve`` on 127.0.0.1 and sends the issue's upload: about 300 KB of
unclosed ``<script type="application/json" id="certify-results">`` tags, which took 8.7 s on
the landed code with ``/api/v1/health`` unanswered meanwhile. Reports the upload's answer time
(target under 1 s) and ``/api/v1/health``'s latency while 4 such uploads are sent back to back
(target under 100 ms), and, in the same run, the extraction alone against the peer: the
regular expression certify used before (same page, same process).

Run: ``.venv/bin/python benchmarks/verify_load.py [--seconds 10]``
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path
from threading import Event, Thread

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from service_fixture import Service  # noqa: E402

from certify.report.sign import embedded_parts  # noqa: E402

BOMB = '<script type="application/json" id="certify-results">' * 6000
#: The extraction before issue 28 (the peer): a lazy match retried from every opening tag.
OLD = re.compile(r'<script type="application/json" id="certify-(results|signature)">'
                 r"(.*?)</script>", re.S)


def _ms(f: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()  # type: ignore[operator]
        times.append((time.perf_counter() - t0) * 1000)
    return float(np.median(times))


def main() -> None:
    """Run the benchmark and print a Markdown table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    new_ms = _ms(lambda: embedded_parts(BOMB), 20)
    old_ms = _ms(lambda: dict(OLD.findall(BOMB)), 1)
    tmp = Path(tempfile.mkdtemp(prefix="certify-verify-"))
    svc = Service(tmp / "home", "--workers", "0", "--verify-per-minute", "100000").start()
    try:
        url = f"{svc.url}/api/v1/verify"

        def upload() -> float:
            t0 = time.perf_counter()
            r = requests.post(url, files={"file": ("x.html", BOMB.encode())}, timeout=120)
            r.raise_for_status()
            return (time.perf_counter() - t0) * 1000

        single = [upload() for _ in range(5)]
        stop = Event()
        sent: list[float] = []

        def hammer() -> None:
            while not stop.is_set():
                sent.append(upload())

        threads = [Thread(target=hammer) for _ in range(4)]
        for t in threads:
            t.start()
        health: list[float] = []
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            requests.get(f"{svc.url}/api/v1/health", timeout=30).raise_for_status()
            health.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join()
    finally:
        svc.stop()
    h = np.asarray(health)
    print(f"| page | {len(BOMB):,} bytes of unclosed tags |")
    print("|---|---|")
    print(f"| extraction, regex before issue 28 (peer) | {old_ms:,.0f} ms |")
    print(f"| extraction, certify now | {new_ms:.2f} ms ({old_ms / new_ms:,.0f}× faster) |")
    print(f"| upload answered (median of 5, HTTP included) | {np.median(single):.0f} ms "
          f"(max {max(single):.0f}) |")
    print(f"| /health under 4 uploads back to back ({len(sent)} uploads, {len(h)} probes) | "
          f"p50 {np.percentile(h, 50):.1f} ms, p99 {np.percentile(h, 99):.1f} ms, "
          f"max {h.max():.1f} ms |")


if __name__ == "__main__":
    main()
