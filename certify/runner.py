"""run_suite(): seeding, budgets, timing, verdicts, per-sample records and resume.

Checks only measure. The runner derives every seed from (suite seed, check id, sample index),
feeds each check the samples it has not recorded yet in batches, streams the records to the run
directory, turns an exception inside a check into an ERROR result (so a card is still produced)
and applies the suite's thresholds.
"""

from __future__ import annotations

import hashlib
import logging
import math
import platform
import time
import traceback
from collections.abc import Iterator
from typing import Any, Protocol

import torch

import certify
from certify.checks import CheckContext
from certify.data import Dataset, stratified_subset
from certify.device import DeviceChoice
from certify.errors import CertifyError, ModelError
from certify.models.base import Model, QueryCounter
from certify.progress import NullProgress, Progress
from certify.redact import redact, redact_obj
from certify.rundir import RunDir
from certify.suite import CheckSpec, Suite

log = logging.getLogger("certify")

SCHEMA = "certify.results/1"

# The most bytes of images in one batch when the model runs in this process on the CPU. A batch
# of 256 224x224 images is 154 MB; every tensor that large (a property's output, a gathered
# subset) is mapped fresh from the OS and pays page faults on first touch, which made the
# corruption properties 1.5-5x slower per image than in batches of a few MB, whose memory the
# heap reuses (benchmarks/RESULTS.md). onnxruntime's per-image cost at 224x224 was flat from
# batch 1 up, and whole 224x224 runs were fastest at this cap. 32x32 images (3 MB per 256) keep
# the full batch. Endpoints are left alone: their requests in flight come out of the batch.
CPU_BATCH_BYTES = 4 << 20


class Executor(Protocol):
    """Runs a check's pending samples somewhere else (e.g. Ray actors), batch by batch.

    ``run_check`` yields (sample indices, records, queries the model saw) as batches finish, in
    any order; the runner checks and records them. Seeds come from ``ctx``, so where a sample
    runs does not change its record.
    """

    def start(self, run_budget: int | None) -> None:
        """Called once before the first check with the run's remaining query budget."""
        ...

    def run_check(self, spec: CheckSpec, data: Dataset, pending: list[int], batch_size: int,
                  ctx: CheckContext, budget: int | None
                  ) -> Iterator[tuple[list[int], list[dict[str, Any]], int]]:
        """Yield the finished batches of ``pending``."""
        ...


def check_seed(suite_seed: int, check_id: str) -> int:
    """The seed of one check, derived from the suite seed and the check id."""
    digest = hashlib.sha256(f"{suite_seed}:{check_id}".encode()).digest()
    return int.from_bytes(digest[:7], "big")


def _versions() -> dict[str, str]:
    import numpy
    import onnxruntime

    return {
        "certify": certify.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "onnxruntime": onnxruntime.__version__,
        "platform": platform.platform(terse=True),
    }


def run_fingerprint(model: Model, suite: Suite, data: Dataset, seed: int,
                    reference: Model | None = None) -> dict[str, Any]:
    """What must match for ``--resume`` to continue a run (redacted: it is written to run.json)."""
    return redact_obj({
        "model": model.info.identity,
        "reference": None if reference is None else reference.info.identity,
        "suite": suite.digest,
        "data": data.digest,
        "seed": seed,
        "preprocessing": model.info.preprocessing.to_dict(),
    })


def cpu_batch_size(batch_size: int, image_shape: tuple[int, ...], itemsize: int = 4) -> int:
    """The batch a check gets for an in-process model on the CPU: ``batch_size`` images, fewer
    where that would pass ``CPU_BATCH_BYTES`` (at least one). Records do not depend on it."""
    per_image = itemsize * math.prod(image_shape)
    return max(1, min(batch_size, CPU_BATCH_BYTES // max(1, per_image)))


def _local_batches(spec: CheckSpec, counter: QueryCounter, data: Dataset,
                   batches: list[list[int]], ctx: CheckContext
                   ) -> Iterator[tuple[list[int], list[dict[str, Any]], int]]:
    """Run batches in this process: yields (indices, records, queries the model saw)."""
    for idx in batches:
        if idx[-1] - idx[0] == len(idx) - 1:  # contiguous (the usual case): a view, no copy
            x, y = data.x[idx[0] : idx[-1] + 1], data.y[idx[0] : idx[-1] + 1]
        else:
            x, y = data.x[idx], data.y[idx]
        before = counter.queries
        rows = spec.check.run_batch(counter, x.to(ctx.device), y.to(ctx.device), idx, ctx)
        yield idx, rows, counter.queries - before


def _run_check(
    spec: CheckSpec,
    model: QueryCounter,
    data: Dataset,
    run: RunDir,
    ctx: CheckContext,
    batch_size: int,
    progress: Progress,
    executor: Executor | None = None,
) -> dict[int, dict[str, Any]]:
    done = run.records[spec.id]
    selected = range(len(data))
    if spec.samples is not None and spec.samples < len(data):
        # a seeded, class-stratified subset, the same whoever runs which shard
        selected = stratified_subset(data.y.numpy(), spec.samples, ctx.check_seed).tolist()
    pending = [i for i in selected if i not in done]
    total = len(selected)
    used = sum(int(r.get("queries", 0)) for r in done.values())
    budget = None if spec.budget is None else max(0, spec.budget - used)
    progress.start(spec.id, total)
    progress.advance(total - len(pending))
    if ctx.device.type == "cpu" and getattr(model.model, "traffic", None) is None:
        batch_size = cpu_batch_size(batch_size, tuple(data.x.shape[1:]), data.x.element_size())
    if executor is None:
        batches = [pending[s : s + batch_size] for s in range(0, len(pending), batch_size)]
        results = _local_batches(spec, QueryCounter(model, budget), data, batches, ctx)
    else:
        results = executor.run_check(spec, data, pending, batch_size, ctx, budget)
    for idx, rows, spent in results:
        if len(rows) != len(idx):
            raise RuntimeError(f"check returned {len(rows)} records for {len(idx)} samples")
        # Checks report their own per-sample queries; the counter is the authority on totals.
        claimed = sum(int(r.get("queries", 0)) for r in rows)
        if claimed != spent:
            raise RuntimeError(f"check claimed {claimed} queries but the model saw {spent}")
        for i, r in zip(idx, rows, strict=True):
            r.update({"check": spec.id, "i": i, "id": data.ids[i]})
        run.append(spec.id, rows)
        progress.advance(len(idx))
    progress.finish()
    return run.records[spec.id]


def _recorded_queries(run: RunDir) -> int:
    return sum(int(r.get("queries", 0)) for recs in run.records.values() for r in recs.values())


def _worst_case(suite: Suite, run: RunDir) -> list[dict[str, Any]]:
    """Robust accuracy against all of the suite's attacks at once, per (norm, ε)."""
    groups: dict[tuple[str, float], list[str]] = {}
    for spec in suite.checks:
        if spec.kind == "attack":
            chk: Any = spec.check
            groups.setdefault(chk.threat_model(), []).append(spec.id)
    out = []
    for (norm, eps), ids in sorted(groups.items()):
        recs = [run.records.get(i, {}) for i in ids]
        common = set.intersection(*(set(r) for r in recs)) if recs else set()
        if not common:
            continue
        robust = sum(all(r[s]["outcome"] == "robust" for r in recs) for s in common)
        out.append({"norm": norm, "epsilon": eps, "attacks": ids, "n": len(common),
                    "robust_accuracy": robust / len(common)})
    return out


def run_suite(
    model: Model,
    data: Dataset,
    suite: Suite,
    run: RunDir,
    device: DeviceChoice,
    *,
    seed: int | None = None,
    batch_size: int = 256,
    progress: Progress | None = None,
    model_spec: str = "",
    reference: Model | None = None,
    query_budget: int | None = None,
    executor: Executor | None = None,
) -> dict[str, Any]:
    """Run every check of ``suite`` and return the results document (results.json).

    ``executor`` runs the checks' batches elsewhere (see :mod:`certify.distributed`); by
    default they run in this process.

    ``query_budget`` caps the queries of the whole run, records of a resumed run included;
    a check that would cross it ends as an ERROR row and the checks after it find it spent.
    """
    progress = progress or NullProgress()
    seed = suite.seed if seed is None else seed
    recorded = _recorded_queries(run)
    run_budget = None if query_budget is None else max(0, query_budget - recorded)
    run_counter = QueryCounter(model, run_budget)
    if executor is not None:
        executor.start(run_budget)
    t0 = time.perf_counter()
    checks: list[dict[str, Any]] = []
    seeds: dict[str, int] = {}
    for spec in suite.checks:
        cseed = check_seed(seed, spec.id)
        seeds[spec.id] = cseed
        ctx = CheckContext(check_seed=cseed, device=device.torch_device,
                           class_names=list(data.class_names),
                           flip_invariant_classes=suite.flip_invariant_classes,
                           n_samples=min(spec.samples or len(data), len(data)),
                           reference=None if reference is None else QueryCounter(reference))
        entry: dict[str, Any] = {
            "id": spec.id,
            "kind": spec.kind,
            "params": spec.check.get_params(),
            "threshold": None if spec.threshold is None else {
                "metric": spec.threshold.metric, "min": spec.threshold.min,
                "max": spec.threshold.max, "text": spec.threshold.describe(),
            },
            "budget": spec.budget,
        }
        c0 = time.perf_counter()
        try:
            records = _run_check(spec, run_counter, data, run, ctx, batch_size, progress,
                                 executor)
            ordered = [records[i] for i in sorted(records)]
            m = spec.check.summarize(ordered, data)
            queries = [int(r.get("queries", 0)) for r in ordered]
            entry.update({
                "metrics": m.metrics,
                "intervals": {k: list(v) for k, v in m.intervals.items()},
                "details": m.details,
                "queries": {"total": sum(queries),
                            "mean_per_sample": sum(queries) / len(queries) if queries else 0.0},
                "error": None,
                "warnings": m.warnings,
            })
            if spec.threshold is None:
                entry["status"] = "WARN" if m.warnings else "INFO"
            else:
                value = float(m.metrics[spec.threshold.metric])
                entry["status"] = "PASS" if spec.threshold.passes(value) else "FAIL"
                if entry["status"] == "PASS" and m.warnings:
                    entry["status"] = "WARN"
        except (KeyboardInterrupt, ModelError):
            raise
        except Exception as exc:  # noqa: BLE001 - a check's crash is a result, not a crash
            progress.finish()
            if isinstance(exc, CertifyError):
                message = exc.message
            else:
                message = redact(f"{type(exc).__name__}: {exc}")
            log.debug("check %s failed:\n%s", spec.id, traceback.format_exc())
            log.error("check %s errored: %s", spec.id, message)
            entry.update({"status": "ERROR", "metrics": {}, "intervals": {}, "details": {},
                          "queries": {"total": 0, "mean_per_sample": 0.0}, "error": message,
                          "warnings": []})
        entry["duration_s"] = time.perf_counter() - c0
        checks.append(entry)

    model_doc: dict[str, Any] = {"spec": model_spec, **model.info.to_dict()}
    traffic = getattr(model, "traffic", None)
    if traffic is not None:  # an endpoint: what this invocation sent it
        model_doc["traffic"] = traffic()
    model_doc = redact_obj(model_doc)  # every string certify writes about a model
    statuses = [c["status"] for c in checks]
    verdict = next((v for v in ("ERROR", "FAIL", "WARN") if v in statuses), "PASS")
    return {
        "schema": SCHEMA,
        "certify_version": certify.__version__,
        "suite": {"name": suite.name, "source": suite.source, "digest": suite.digest,
                  "description": suite.description},
        "model": model_doc,
        "queries": {"total": _recorded_queries(run), "budget": query_budget},
        "reference_model": None if reference is None else redact_obj(reference.info.to_dict()),
        "data": data.describe(),
        "device": {"name": device.name, "requested": device.requested, "reason": device.reason,
                   "provider": model.info.provider},
        "environment": _versions(),
        "seeds": {"suite": seed, "checks": seeds},
        "timings": {"total_s": time.perf_counter() - t0,
                    "checks": {c["id"]: c["duration_s"] for c in checks},
                    "resumed_records": run.resumed_records},
        "checks": checks,
        "summary": {s.lower(): statuses.count(s)
                    for s in ("PASS", "FAIL", "WARN", "ERROR", "INFO")},
        "attack_worst_case": _worst_case(suite, run),
        "verdict": verdict,
    }
