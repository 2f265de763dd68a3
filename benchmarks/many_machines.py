"""``/health`` latency and wall time of 20 small runs: one machine against many (issue 39).

Issue 39's acceptance puts ``/health`` p99 during the many-machines scenario in a benchmark,
not a timed test. This script runs two scenarios, one after the other, on 127.0.0.1:

- **A, the peer**: one ``certify serve`` as a single machine runs it (SQLite and the local
  store in its home, ``--workers 2``);
- **B, many machines**: PostgreSQL (a throwaway cluster, ``tests/pg.py``), moto's S3 server
  (``tests/s3server.py``), two API nodes (``--workers 0``, each its own ``--home``) and two
  ``certify worker`` processes (``--workers 1``), sharing the database, the store and one
  signing key. Once a worker holds a run it is SIGKILLed and a replacement worker started,
  as ``tests/test_many_machines.py`` does; its run is resumed elsewhere after its lease
  (3 s) runs out.

In each, ``--runs`` (default 20) runs of the demo model on the small suite (``samples=12``,
seeds ``i % 5``, as in the acceptance test) are submitted (in B alternately to both APIs)
while a thread per API GETs ``/api/v1/health`` every 50 ms (5 s timeout; a timeout or an
error counts as a failure, not as a latency) until every run has ended. Both scenarios use
the same ``--lease 3 --heartbeat 0.5`` and the same signing key. Reported: ``/health`` p50,
p95, p99 and max per API and pooled, failures, the wall time from the first submission to
the last run's end, and B's p99 and wall time as ratios to A's.

Everything runs on this one machine, so B's "machines" share its cores with each other, with
PostgreSQL and with moto (an in-memory S3 emulator, not a real object store).

Run: ``.venv/bin/python benchmarks/many_machines.py [--runs 20]`` (several minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from pg import postgres_cluster  # noqa: E402
from s3server import create_bucket, moto_server  # noqa: E402
from service_fixture import Service, post_run, small_inputs  # noqa: E402

from certify.report.sign import keygen  # noqa: E402

#: same lease and heartbeat in both scenarios (the acceptance test's: a killed worker's run
#: goes back to the queue within seconds)
LEASE = ("--lease", "3", "--heartbeat", "0.5")
ENDED = ("done", "error", "cancelled")


class Probe(threading.Thread):
    """GET ``/api/v1/health`` of one API every ``period`` s; latencies in ms, failures."""

    def __init__(self, svc: Service, period: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.url = f"{svc.url}/api/v1/health"
        self.period = period
        self.stop = threading.Event()
        self.ms: list[float] = []
        self.failures = 0

    def run(self) -> None:  # noqa: D102
        s = requests.Session()
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                s.get(self.url, timeout=5).raise_for_status()
                self.ms.append((time.perf_counter() - t0) * 1000)
            except requests.RequestException:
                self.failures += 1
            self.stop.wait(self.period)


def submit_and_wait(apis: list[Service], token: str, suite: Path, runs: int,
                    timeout: float = 1800.0, on_poll: Any = None) -> tuple[dict[str, Any], float]:
    """Submit ``runs`` small runs (alternately to ``apis``), poll until all ended; their last
    documents and the wall time from the first submission to the last end."""
    t0 = time.monotonic()
    ids: list[tuple[str, Service]] = []
    for i in range(runs):
        api = apis[i % len(apis)]
        r = post_run(api, token, suite, samples="12", seed=str(i % 5))
        if r.status_code != 202:
            raise SystemExit(f"submission {i} refused: {r.status_code} {r.text}")
        ids.append((r.json()["id"], api))
    docs: dict[str, Any] = {}
    deadline = t0 + timeout
    while len(docs) < len(ids):
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(ids) - len(docs)} runs not ended after {timeout} s")
        if on_poll is not None:
            on_poll()
        for run_id, api in ids:
            if run_id in docs:
                continue
            doc = api.get(f"/runs/{run_id}", token).json()
            if doc["state"] in ENDED:
                docs[run_id] = doc
        time.sleep(0.25)
    return docs, time.monotonic() - t0


def start_timed(svc: Service, since: float, out: dict[str, Any]) -> None:
    """Start ``svc``; ``out["replacement_up_s"]``: seconds from ``since`` until it is up."""
    svc.start()
    out["replacement_up_s"] = time.monotonic() - since


def stats(ms: list[float]) -> dict[str, float]:
    """p50/p95/p99/max of latencies in ms."""
    a = np.asarray(ms) if ms else np.asarray([np.nan])
    return {"n": len(ms), "p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)), "max": float(np.max(a))}


def scenario_a(work: Path, suite: Path, data: Path, key: Path, runs: int,
               env: dict[str, str]) -> dict[str, Any]:
    """One machine: SQLite, the local store, ``--workers 2``."""
    svc = Service(work / "a-home", "--workers", "2", "--dataset", f"small={data}",
                  "--sign-key", str(key), *LEASE, env=env).start()
    try:
        token = svc.token("submit", "--max-concurrent", str(runs + 10))
        probe = Probe(svc)
        probe.start()
        docs, wall = submit_and_wait([svc], token, suite, runs)
        probe.stop.set()
        probe.join()
    finally:
        svc.stop()
    return {"probes": {"api": probe}, "docs": docs, "wall": wall, "killed": None}


def scenario_b(work: Path, suite: Path, data: Path, key: Path, runs: int,
               env: dict[str, str]) -> dict[str, Any]:
    """Many machines: PostgreSQL, moto S3, two API nodes, two workers (one SIGKILLed)."""
    from sqlalchemy import select

    from certify.service.db import Run, make_engine, sessions

    with moto_server() as s3, s3.credentials(), postgres_cluster() as pg:
        create_bucket(s3, "certify-bench")
        store = s3.url("certify-bench", f"mm-{uuid.uuid4().hex[:8]}")
        common = ("--store", store, "--sign-key", str(key), "--dataset", f"small={data}",
                  *LEASE)
        apis = [Service(work / f"b-api-{n}", "--workers", "0", *common, db=pg, env=env)
                for n in "ab"]
        workers = [Service(work / f"b-worker-{n}", "--workers", "1", *common, db=pg, env=env,
                           command="worker") for n in (1, 2)]
        nodes = [*apis, *workers]
        engine = make_engine(pg)
        factory = sessions(engine)
        killed: dict[str, Any] = {}
        try:
            for node in nodes:
                node.start()
            token = apis[0].token("submit", "--max-concurrent", str(runs + 10))
            probes = {f"api-{n}": Probe(api) for n, api in zip("ab", apis, strict=True)}
            for p in probes.values():
                p.start()

            def kill_once() -> None:
                """SIGKILL the first worker seen holding a run; start a replacement."""
                if killed:
                    return
                with factory() as s:
                    held = s.execute(select(Run.id, Run.lease_owner)
                                     .where(Run.state == "running")).all()
                for run_id, owner in held:
                    pid = int(owner.split(":")[1]) if owner else -1
                    victim = next((w for w in workers if w.proc is not None
                                   and w.proc.pid == pid and w.proc.poll() is None), None)
                    if victim is None:
                        continue
                    t = time.monotonic()
                    victim.kill()
                    killed.update(run=run_id, worker=victim.home.name, at=t)
                    repl = Service(work / "b-worker-3", "--workers", "1", *common, db=pg,
                                   env=env, command="worker")
                    nodes.append(repl)

                    # started beside the polling loop, which goes on seeing runs end
                    killed["thread"] = threading.Thread(target=start_timed,
                                                        args=(repl, t, killed), daemon=True)
                    killed["thread"].start()
                    return

            t_start = time.monotonic()
            docs, wall = submit_and_wait(apis, token, suite, runs, on_poll=kill_once)
            if killed:
                killed["at"] -= t_start
                killed.pop("thread").join()
            for p in probes.values():
                p.stop.set()
                p.join()
        finally:
            engine.dispose()
            for node in nodes:
                node.stop()
            for w in workers:  # the killed worker's job process, if it outlived it
                if w.proc is not None and w.proc.returncode == -signal.SIGKILL:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(w.proc.pid, signal.SIGKILL)
    return {"probes": probes, "docs": docs, "wall": wall, "killed": killed}


def main() -> None:
    """Run both scenarios and print a Markdown table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20, help="small runs per scenario")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="certify-many-machines-"))
    suite, data = small_inputs(work / "in", per_class=4)
    key, _ = keygen(work / "keys", "service")
    env = {"CERTIFY_SESSION_SECRET": os.urandom(32).hex()}
    load0 = os.getloadavg()
    t0 = time.monotonic()
    res = {"A": scenario_a(work, suite, data, key, args.runs, env),
           "B": scenario_b(work, suite, data, key, args.runs, env)}
    total = time.monotonic() - t0
    load1 = os.getloadavg()

    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}; {args.runs} runs per scenario (samples=12); "
          f"1-min load {load0[0]:.1f} before, {load1[0]:.1f} after; benchmark {total:.0f} s; "
          f"work folder {work}\n")
    print("| scenario | API | /health probes | failed | p50 ms | p95 ms | p99 ms | max ms |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    pooled: dict[str, dict[str, float]] = {}
    for name, r in res.items():
        every: list[float] = []
        for api, p in r["probes"].items():
            st = stats(p.ms)
            every += p.ms
            print(f"| {name} | {api} | {st['n']} | {p.failures} | {st['p50']:.1f} | "
                  f"{st['p95']:.1f} | {st['p99']:.1f} | {st['max']:.1f} |")
        pooled[name] = stats(every)
        if len(r["probes"]) > 1:
            st = pooled[name]
            fails = sum(p.failures for p in r["probes"].values())
            print(f"| {name} | both | {st['n']} | {fails} | {st['p50']:.1f} | "
                  f"{st['p95']:.1f} | {st['p99']:.1f} | {st['max']:.1f} |")
    print()
    print("| scenario | runs done / error / cancelled | attempts > 1 | wall time s |")
    print("|---|---|---:|---:|")
    for name, r in res.items():
        states = [d["state"] for d in r["docs"].values()]
        retried = sum(1 for d in r["docs"].values() if d.get("attempts", 1) > 1)
        print(f"| {name} | {states.count('done')} / {states.count('error')} / "
              f"{states.count('cancelled')} | {retried} | {r['wall']:.1f} |")
    for name, r in res.items():
        for run_id, d in r["docs"].items():
            if d["state"] != "done":
                print(f"{name}: run {run_id} {d['state']}: {d.get('error')}")
    k = res["B"]["killed"]
    if k:
        doc = res["B"]["docs"].get(k["run"], {})
        print(f"\nB: {k['worker']} SIGKILLed at {k['at']:.1f} s holding run {k['run'][:8]} "
              f"(ended {doc.get('state')}, attempts {doc.get('attempts')}); replacement up "
              f"in {k.get('replacement_up_s', float('nan')):.1f} s")
    else:
        print("\nB: no worker was seen holding a run: none was killed")
    a, b = pooled["A"], pooled["B"]
    print(f"\nratios B/A: /health p99 {b['p99'] / a['p99']:.2f} ({b['p99']:.1f} / "
          f"{a['p99']:.1f} ms, B pooled over both APIs); wall time "
          f"{res['B']['wall'] / res['A']['wall']:.2f} ({res['B']['wall']:.1f} / "
          f"{res['A']['wall']:.1f} s)")


if __name__ == "__main__":
    main()
