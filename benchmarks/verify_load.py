"""Card verification under hostile uploads (issue 38 point 2; issue 28 item 1 before it).

Starts a real ``certify serve`` on 127.0.0.1 with the default verification limits (1 GB of
memory beyond the verifier's code, 30 s, 2 at once, 10 s of waiting), measures the API
process's idle RSS, then sends hostile uploads without a token, several at once, while a
thread polls ``/api/v1/health``:

- PDF inflation bombs: a results.json attachment that inflates to 1 GB (two deflates, 3 KB),
  the issue's (75 MB of JSON in one deflate, 77 KB), and 15 MB of wide JSON (under the
  inflation limit, so it is parsed);
- deep JSON (15 MB of ``[``) as results.json and in an HTML card's embedded script;
- wide JSON (15 MB of ``[{},{},...``: about 25 bytes of heap a byte) in both;
- a PDF whose page tree has 2 million leaves, and one whose catalog holds 10 million numbers
  in nested arrays (20 KB, about 90 s of CPU for pypdf to parse: the time limit's case);
- a genuine card.html, payload and signature untouched, with a 9,400 x 9,400 PNG added to its
  visible part (258 KB; the visible-layer check decodes it: the memory limit's case);
- issue 28's page of unclosed script tags.

Every JSON and HTML upload carries a genuine signature of the older statement type made with
the service's key (any card the service signed before issue 38 has one), so the verifier gets
as far as parsing the payload. Three genuine cards (PDF, HTML, results.json) are verified
alongside and must stay valid. A 503 (every slot busy past ``--verify-wait``) is retried after
its ``Retry-After``, as a client would.

Sampled every 10 ms (psutil): the API process's RSS and every verification child's RSS (the
children of the verifier process); the server log gives each child's exact peak (``wait4``).
Targets: API peak RSS within idle + 300 MB, no child over its limit, ``/health`` p99 under
100 ms. The per-address rate limit (``--verify-per-minute``, default 30) would refuse most of
these uploads; the server here runs with ``--verify-per-minute 100000`` so that the
verification path itself is measured.

Run: ``.venv/bin/python benchmarks/verify_load.py [--parallel 6]`` (about 1-2 minutes).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from queue import Empty, Queue
from typing import Any

import numpy as np
import psutil
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import hostile_cards as hc  # noqa: E402
from service_fixture import CERTIFY, Service, small_inputs  # noqa: E402

from certify.report.sign import fingerprint, keygen, load_private_key  # noqa: E402

#: kind -> how many of the uploads are of it (50 in all)
MIX = {"bomb-1g.pdf": 6, "bomb-75m.pdf": 6, "wide-15m.pdf": 5, "deep.json": 5, "deep.html": 5,
       "wide.json": 5, "wide.html": 5, "pagetree.pdf": 4, "pngbomb.html": 3, "tags.html": 3,
       "nested.pdf": 3}
MB = 2**20


def hostile(sig: bytes) -> dict[str, tuple[bytes, bytes | None]]:
    """Each hostile kind: (the upload, its detached signature or None)."""
    deep, wide = hc.deep_json(15 * MB), hc.wide_json(15)
    return {
        "bomb-1g.pdf": (hc.inflation_bomb_pdf(1024, sig), None),
        "bomb-75m.pdf": (hc.inflation_bomb_pdf(75, sig, layers=1), None),
        "wide-15m.pdf": (hc.inflation_bomb_pdf(15, sig, layers=1), None),
        "deep.json": (deep, sig),
        "deep.html": (hc.html_card(deep, sig), None),
        "wide.json": (wide, sig),
        "wide.html": (hc.html_card(wide, sig), None),
        "pagetree.pdf": (hc.page_tree_pdf(2_000_000, sig), None),
        "tags.html": (hc.unclosed_tags_html(), None),
        "nested.pdf": (hc.nested_array_pdf(100, sig), None),
    }


def genuine_card(home: Path, work: Path) -> dict[str, tuple[bytes, bytes | None]]:
    """A card the service's key signed (``certify run`` of the demo model, 20 samples)."""
    from certify.api import demo_model_path

    suite, data = small_inputs(work / "inputs")
    out = work / "card"
    r = subprocess.run([CERTIFY, "run", str(demo_model_path()), "--suite", str(suite),
                        "--data", str(data), "--samples", "20", "--out", str(out),
                        "--sign-key", str(home / "keys" / "service.key")],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"certify run failed:\n{r.stderr}")
    html = (out / "card.html").read_bytes()
    return {"genuine.pdf": ((out / "card.pdf").read_bytes(), None),
            "genuine.html": (html, None), "pngbomb.html": (hc.with_png_bomb(html), None),
            "results.json": ((out / "results.json").read_bytes(),
                             (out / "results.json.sig").read_bytes())}


def start_costs(svc: Service) -> dict[str, float]:
    """What starting a verification's process costs: a fork of the verifier (trivial uploads
    through the API; the first one also starts the verifier) against a fresh interpreter that
    imports the verification code (the least a ``python -m`` per verification would pay)."""
    def trivial() -> float:
        t0 = time.perf_counter()
        requests.post(f"{svc.url}/api/v1/verify", timeout=300, files={
            "file": ("trivial.json", b"{}"), "signature": ("trivial.json.sig", b"{}")})
        return time.perf_counter() - t0

    start = trivial()
    fork_http = float(np.median([trivial() for _ in range(10)]))
    fresh, rss = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", "import resource; from certify.service."
                              "verify_sandbox import _preload; _preload(); print(resource."
                              "getrusage(resource.RUSAGE_SELF).ru_maxrss)"],
                             check=True, capture_output=True, text=True).stdout
        fresh.append(time.perf_counter() - t0)
        rss.append(int(out.split()[-1]) / 1024)
    return {"verifier_start": start, "fork_http": fork_http,
            "fresh_s": float(np.median(fresh)), "fresh_rss_mb": max(rss)}


class Sampler(threading.Thread):
    """RSS of the API process and of every verification child, every ``period`` s."""

    def __init__(self, api_pid: int, period: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.api = psutil.Process(api_pid)
        self.period = period
        self.stop = threading.Event()
        self.api_rss: list[int] = []
        self.child_peak: dict[int, int] = {}
        #: each child's own pages (USS: not the verifier's pages it shares until it writes)
        self.child_uss: dict[int, int] = {}
        self.verifier_vms = 0
        self.most_children = 0

    def _verifier(self) -> psutil.Process | None:
        for c in self.api.children():
            try:
                if "certify.service.verify_sandbox" in " ".join(c.cmdline()):
                    return c
            except psutil.Error:
                pass
        return None

    def run(self) -> None:  # noqa: D102
        verifier: psutil.Process | None = None
        cmd: list[str] = []
        while not self.stop.is_set():
            self.api_rss.append(self.api.memory_info().rss)
            if verifier is None or not verifier.is_running():
                verifier = self._verifier()
                cmd = verifier.cmdline() if verifier is not None else []
            if verifier is not None:
                try:
                    self.verifier_vms = max(self.verifier_vms, verifier.memory_info().vms)
                    kids = verifier.children()
                except psutil.Error:
                    kids = []
                forks = []
                for k in kids:  # forks of the verifier: its command line (not ldconfig &c.)
                    try:
                        if k.cmdline() == cmd:
                            full = k.memory_full_info()
                            forks.append((k.pid, full.rss, full.uss))
                    except psutil.Error:
                        continue
                self.most_children = max(self.most_children, len(forks))
                for pid, rss, uss in forks:
                    self.child_peak[pid] = max(self.child_peak.get(pid, 0), rss)
                    self.child_uss[pid] = max(self.child_uss.get(pid, 0), uss)
            time.sleep(self.period)


def main() -> None:
    """Run the benchmark and print Markdown tables."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--parallel", type=int, default=6, help="uploads in flight at once")
    args = ap.parse_args()
    t_start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="certify-verify-load-"))
    home = work / "home"
    key_path, _ = keygen(home / "keys", "service")
    key = load_private_key(key_path)
    sig = hc.legacy_signature(key, fingerprint(key.public_key()))
    kinds = hostile(sig)
    svc = Service(home, "--workers", "0", "--verify-per-minute", "100000").start()
    try:
        kinds.update(genuine_card(home, work))
        assert svc.proc is not None
        api = psutil.Process(svc.proc.pid)
        idle = []
        for _ in range(20):
            idle.append(api.memory_info().rss)
            time.sleep(0.1)
        idle_rss = max(idle)
        overhead = start_costs(svc)
        jobs: Queue[str] = Queue()
        order = [k for k, n in MIX.items() for _ in range(n)]
        rng = np.random.default_rng(38)
        rng.shuffle(order)
        # the genuine cards go in early, middle and late
        for i, g in zip((2, 25, 45), ("genuine.pdf", "genuine.html", "results.json"),
                        strict=True):
            order.insert(i, g)
        for k in order:
            jobs.put(k)
        sampler = Sampler(api.pid)
        sampler.start()
        health: list[float] = []
        health_errors = 0
        stop = threading.Event()

        def poll() -> None:
            nonlocal health_errors
            s = requests.Session()
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    s.get(f"{svc.url}/api/v1/health", timeout=10).raise_for_status()
                    health.append((time.perf_counter() - t0) * 1000)
                except requests.RequestException:
                    health_errors += 1
                time.sleep(0.05)

        results: list[tuple[str, int, dict[str, Any], float, int]] = []

        def send() -> None:
            while True:
                try:
                    kind = jobs.get_nowait()
                except Empty:
                    return
                data, detached = kinds[kind]
                files: dict[str, Any] = {"file": (kind, data)}
                if detached is not None:
                    files["signature"] = (kind + ".sig", detached)
                busy = 0
                t0 = time.perf_counter()
                while True:
                    r = requests.post(f"{svc.url}/api/v1/verify", files=files, timeout=300)
                    if r.status_code != 503:
                        break
                    busy += 1
                    time.sleep(int(r.headers.get("Retry-After", "1")))
                results.append((kind, r.status_code, r.json(), time.perf_counter() - t0, busy))

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        t0 = time.monotonic()
        senders = [threading.Thread(target=send) for _ in range(args.parallel)]
        for t in senders:
            t.start()
        for t in senders:
            t.join()
        elapsed = time.monotonic() - t0
        time.sleep(1.0)
        stop.set()
        sampler.stop.set()
        sampler.join()
        poller.join()
        after_rss = api.memory_info().rss
        log = svc.log()
    finally:
        svc.stop()
    report(results, log, idle_rss, sampler, health, health_errors, after_rss, elapsed,
           args.parallel, time.monotonic() - t_start,
           {k: len(data) for k, (data, _) in kinds.items()})
    trivial = [float(m.group(1)) for m in re.finditer(
        r"verify trivial\.json: \S+ in ([\d.]+) s", log)]
    print()
    print("| how a verification's process starts | per verification | peak RSS |")
    print("|---|---|---|")
    print(f"| fork of the verifier (this service; the verifier's own start, once: "
          f"{overhead['verifier_start']:.1f} s) | {1000 * float(np.median(trivial[1:])):.0f} ms "
          f"job to answer, {1000 * overhead['fork_http']:.0f} ms HTTP round trip (median of "
          f"{len(trivial) - 1}, a trivial upload) | shares the verifier's pages |")
    print(f"| fresh interpreter (`python -m`, the imports alone; median of 3) | "
          f"{overhead['fresh_s']:.2f} s | {overhead['fresh_rss_mb']:.0f} MB |")


def report(results: list[tuple[str, int, dict[str, Any], float, int]], log: str,
           idle_rss: int, sampler: Sampler, health: list[float], health_errors: int,
           after_rss: int, elapsed: float, parallel: int, total: float,
           sizes: dict[str, int]) -> None:
    """Print the tables."""
    # each child's exact peak (wait4), from the server's log line per verification
    exact: dict[str, list[int]] = defaultdict(list)
    for m in re.finditer(r"verify (\S+): \S+ in [\d.]+ s \(child: peak RSS (\d+) MB", log):
        exact[m.group(1)].append(int(m.group(2)))
    by_kind: dict[str, list[tuple[int, dict[str, Any], float, int]]] = defaultdict(list)
    for kind, status, doc, secs, busy in results:
        by_kind[kind].append((status, doc, secs, busy))
    limit_mb = 1024
    base_mb = sampler.verifier_vms / MB
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}"
          f"; {len(results)} uploads, {parallel} at once, in {elapsed:.1f} s "
          f"(benchmark {total:.0f} s in all)\n")
    print("| upload | n | bytes | answers | seconds (median / max) | 503s retried | "
          "child peak RSS MB (wait4, max) |")
    print("|---|---:|---:|---|---|---:|---:|")
    for kind in [*MIX, "genuine.pdf", "genuine.html", "results.json"]:
        rows = by_kind.get(kind, [])
        if not rows:
            continue
        said: dict[str, int] = defaultdict(int)
        for status, doc, _, _ in rows:
            if status != 200:
                said[f"HTTP {status}"] += 1
            elif doc.get("valid"):
                said["valid"] += 1
            elif doc.get("limit"):
                said[f"invalid: {doc['limit']} limit"] += 1
            else:
                said["invalid"] += 1
        took = [r[2] for r in rows]
        size = sizes.get(kind, 0)
        print(f"| {kind} | {len(rows)} | {size:,} | "
              f"{', '.join(f'{v} {k}' for k, v in said.items())} | "
              f"{np.median(took):.2f} / {max(took):.2f} | {sum(r[3] for r in rows)} | "
              f"{max(exact.get(kind, [0]))} |")
    h = np.asarray(health)
    api_peak = max(sampler.api_rss)
    child_peak = max(sampler.child_peak.values(), default=0)
    child_uss = max(sampler.child_uss.values(), default=0)
    exact_peak = max((max(v) for v in exact.values()), default=0)
    cap = base_mb + limit_mb

    def met(ok: bool) -> str:
        return "**met**" if ok else "**not met**"

    print()
    print("| figure | measured | target |")
    print("|---|---|---|")
    print(f"| API process RSS idle → peak (sampled every 10 ms) | {idle_rss / MB:.0f} → "
          f"{api_peak / MB:.0f} MB (+{(api_peak - idle_rss) / MB:.0f} MB) | within idle + "
          f"300 MB: {met(api_peak - idle_rss <= 300 * MB)} |")
    print(f"| API process RSS after the last upload | {after_rss / MB:.0f} MB | – |")
    print(f"| verification children at once (most) | {sampler.most_children} | "
          f"--verify-concurrency 2: {met(sampler.most_children <= 2)} |")
    print(f"| child peak RSS: psutil, every 10 ms ({len(sampler.child_peak)} children) / "
          f"wait4 ({sum(len(v) for v in exact.values())} children) | {child_peak / MB:.0f} / "
          f"{exact_peak} MB | under its address-space limit (the verifier's {base_mb:.0f} MB + "
          f"{limit_mb} MB = {cap:.0f} MB): {met(max(child_peak / MB, exact_peak) < cap)} |")
    print(f"| child peak USS (its own pages, beyond those it shares with the verifier) | "
          f"{child_uss / MB:.0f} MB | within --verify-memory-mb {limit_mb}: "
          f"{met(child_uss <= limit_mb * MB)} |")
    print(f"| /health during the uploads ({len(h)} probes, {health_errors} failed) | p50 "
          f"{np.percentile(h, 50):.1f} ms, p99 {np.percentile(h, 99):.1f} ms, max "
          f"{h.max():.1f} ms | p99 under 100 ms: {met(float(np.percentile(h, 99)) < 100)} |")

if __name__ == "__main__":
    main()
