"""Where `certify demo`'s CPU goes, check by check (issue 66).

Runs the demo (the packaged gtsrb suite on the bundled standard model and generated signs, as
``certify demo`` does, in this process) with timers around the four kinds of work a check does,
and prints one row per check:

- **model**: onnxruntime calls (``OnnxModel._run``: the scores and the penultimate features);
- **gradient**: the torch copy's passes (``TorchCopy.value_and_grad`` and ``scores``): white-box
  attacks, the adaptive-brightness gradient search, the binarization test's probes;
- **transform**: a corruption property's ``apply`` (the transformed images);
- **other**: the rest of the check's batch (attack proposals, bookkeeping, LIME's masks and
  fits, the search's candidates and records).

Times are CPU seconds of the thread that runs the batch (``time.thread_time``): on the CPU
certify gives onnxruntime and torch one thread per lane (certify/device.py), so their work runs
on that thread, and another process on a shared machine does not inflate them the way it does a
wall time. The pilot's batches count towards their checks. Each row also gives the check's
queries and CPU ms per query, its wall seconds (the run's own timing of the check, pilot
excluded) and its **lane use**: CPU seconds over wall seconds times the lanes, the share of the
cores the check kept busy (a check's batches end unevenly; the next check starts when its last
batch ends). The table ends with the run's wall and CPU time beside the reference workload
(benchmarks/reference_workload.py) run right after it in the same process.

Run: ``.venv/bin/python benchmarks/demo_profile.py [--suite gtsrb] [--json out.json]``
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

CATEGORIES = ("model", "gradient", "transform", "other")

_local = threading.local()
#: check id -> category -> CPU seconds; check id -> batches
_cpu: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
_lock = threading.Lock()


@contextlib.contextmanager
def _category(name: str) -> Iterator[None]:
    """Charge this thread's CPU inside the block to ``name`` (the outermost category wins: a
    model call inside a transform is the transform's caller's business, not double counted)."""
    check = getattr(_local, "check", None)
    if check is None or getattr(_local, "inside", False):
        yield
        return
    _local.inside = True
    t = time.thread_time()
    try:
        yield
    finally:
        spent = time.thread_time() - t
        _local.inside = False
        _local.charged += spent
        with _lock:
            _cpu[check][name] += spent


def _wrap(owner: Any, attr: str, category: str) -> None:
    fn = getattr(owner, attr)

    def timed(*args: Any, **kwargs: Any) -> Any:
        with _category(category):
            return fn(*args, **kwargs)
    setattr(owner, attr, timed)


def _install() -> None:
    """Timers on the engine's batch runner, onnxruntime calls, the torch copy and every
    property's transform; check instances tagged with their suite ids."""
    import dataclasses

    import certify.engine.local as local
    import certify.suite as suite_mod
    from certify.models.onnx import OnnxModel
    from certify.models.torchcopy import TorchCopy
    from certify.perturbations import PROPERTIES

    parse = suite_mod.parse_suite

    def tagged(raw: Any, source: str) -> Any:
        suite = parse(raw, source)
        for spec in suite.checks:
            spec.check._profile_id = spec.id  # noqa: SLF001 - a benchmark's tag
        return suite
    suite_mod.parse_suite = tagged

    run_batch = local.run_batch_isolating

    def batch(check: Any, *args: Any, **kwargs: Any) -> Any:
        cid = getattr(check, "_profile_id", type(check).__name__)
        _local.check, _local.charged, _local.inside = cid, 0.0, False
        t = time.thread_time()
        try:
            return run_batch(check, *args, **kwargs)
        finally:
            total = time.thread_time() - t
            with _lock:
                _cpu[cid]["other"] += total - _local.charged
                _cpu[cid]["batches"] += 1
            _local.check = None
    local.run_batch_isolating = batch

    _wrap(OnnxModel, "_run", "model")
    _wrap(TorchCopy, "value_and_grad", "gradient")
    _wrap(TorchCopy, "scores", "gradient")
    for name, prop in list(PROPERTIES.items()):
        apply = prop.apply

        def timed(*args: Any, _apply: Callable[..., Any] = apply, **kwargs: Any) -> Any:
            with _category("transform"):
                return _apply(*args, **kwargs)
        PROPERTIES[name] = dataclasses.replace(prop, apply=timed)


def _reference() -> float:
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("reference_workload.py"))],
                         check=True, capture_output=True, text=True).stdout
    return float(json.loads(out)["best_s"])


def main() -> None:
    """Run the demo with the timers and print the table (and ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="gtsrb")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    _install()
    from certify.api import run_demo
    from certify.progress import NullProgress

    with tempfile.TemporaryDirectory() as tmp:
        w, c = time.perf_counter(), time.process_time()
        result, _ = run_demo(Path(tmp) / "out", NullProgress(), pdf=False, suite=args.suite)
        wall, cpu = time.perf_counter() - w, time.process_time() - c
    ref = _reference()
    queries = {ch.id: int(ch.queries.total if ch.queries is not None else 0)
               for ch in result.measurement.checks}
    timings = result.provenance.timings
    walls = typing.cast(dict[str, float], timings.get("checks") or {})
    estimate = typing.cast(dict[str, dict[str, dict[str, float]]], timings.get("estimate") or {})
    pilots = {k: v.get("pilot_s", 0.0) for k, v in (estimate.get("checks") or {}).items()}
    from certify.device import choose_device

    lanes = choose_device("cpu").lanes
    rows = sorted(_cpu.items(), key=lambda kv: -sum(kv[1][k] for k in CATEGORIES))
    total = sum(sum(v[k] for k in CATEGORIES) for _, v in rows)
    print(f"demo: {wall:.1f} s wall, {cpu:.1f} s CPU (process); reference workload {ref:.2f} s "
          f"-> {wall / ref:.1f} reference workloads; {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.2f}")
    print()
    print("| check | CPU s | share | model | gradient | transform | other | queries | "
          "CPU ms/query | wall s | lane use |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    table = []
    for cid, v in rows:
        s = sum(v[k] for k in CATEGORIES)
        q = queries.get(cid, 0)
        table.append({"check": cid, "cpu_s": s, **{k: v[k] for k in CATEGORIES}, "queries": q})
        per_query = f"{1e3 * s / q:.3f}" if q else "-"
        wall = walls.get(cid, 0.0)
        # the check's CPU in the main pass: its pilot ran before, on one lane, timed apart
        use = f"{(s - pilots.get(cid, 0.0)) / (wall * lanes):.0%}" if wall > 0 else "-"
        table[-1].update({"wall_s": wall, "pilot_s": pilots.get(cid, 0.0)})
        print(f"| {cid} | {s:.1f} | {s / total:.1%} | "
              + " | ".join(f"{v[k] / s:.0%}" if s else "-" for k in CATEGORIES)
              + f" | {q:,} | {per_query} | {wall:.1f} | {use} |")
    all_wall = sum(walls.values())
    print(f"| all checks | {total:.1f} | | "
          + " | ".join(f"{sum(v[k] for _, v in rows) / total:.0%}" for k in CATEGORIES)
          + f" | {sum(queries.values()):,} | | {all_wall:.1f} | "
          f"{(total - sum(pilots.values())) / (all_wall * lanes):.0%} |")
    print(f"\npilot: {sum(pilots.values()):.1f} s; run total (evaluation) "
          f"{float(typing.cast(float, timings.get('total_s') or 0.0)):.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"wall_s": wall, "cpu_s": cpu, "reference_s": ref,
                                         "checks": table}, indent=1))


if __name__ == "__main__":
    main()
