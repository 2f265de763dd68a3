"""run_suite(): seeding, budgets, timing, verdicts, per-sample records and resume.

Checks only measure. The runner derives every seed from (suite seed, check id, sample index),
feeds each check the samples it has not recorded yet in batches, streams the records to the run
directory, turns an exception inside a check into an ERROR result (so a card is still produced)
and applies the suite's thresholds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import platform
import threading
import time
import traceback
import typing
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

import certify
from certify.canonical import normalize
from certify.checks import AttackCheck, Check, CheckContext
from certify.checks.corruption import worst_case_beside_random
from certify.data import Dataset, stratified_subset
from certify.device import DeviceChoice
from certify.errors import CertifyError, ModelError, NonFiniteOutput, overall_verdict
from certify.models.base import Budget, Model, QueryCounter
from certify.progress import NullProgress, Progress
from certify.redact import redact, redact_obj
from certify.results import (
    SCHEMA,
    DataDoc,
    ModelDoc,
    Outcomes,
    Provenance,
    RunMeasurement,
    RunQueries,
    RunResult,
    Status,
    SuiteDoc,
    WorstCase,
    check_result_model,
    pack_bits,
)
from certify.rundir import RunDir
from certify.suite import CheckSpec, Suite

log = logging.getLogger("certify")

#: The ``error`` of a sample record whose model answer held NaN or infinite scores.
NON_FINITE = "non-finite model output"

# The most bytes of images in one batch when the model runs in this process on the CPU. A batch
# of 256 224x224 images is 154 MB; every tensor that large (a property's output, a gathered
# subset) is mapped fresh from the OS and pays page faults on first touch, which made the
# corruption properties 1.5-5x slower per image than in batches of a few MB, whose memory the
# heap reuses (benchmarks/RESULTS.md). onnxruntime's per-image cost at 224x224 was flat from
# batch 1 up, and whole 224x224 runs were fastest at this cap. 32x32 images (3 MB per 256) keep
# the full batch. Endpoints are left alone: their requests in flight come out of the batch.
CPU_BATCH_BYTES = 4 << 20

#: Sample groups the in-process executor runs at once per request an endpoint may have in
#: flight: a group waiting out a 429's Retry-After or a retry holds no request slot, so the
#: others keep the endpoint busy.
HTTP_LANES_PER_REQUEST = 4


class Executor(Protocol):
    """Runs a check's pending samples somewhere else (e.g. Ray actors), batch by batch.

    ``run_check`` yields (sample indices, records, queries the model saw, queries the reference
    model saw) as batches finish, in any order; the runner checks and records them. Seeds come
    from ``ctx``, so where a sample runs does not change its record.
    """

    def start(self, run_budget: int | None) -> None:
        """Called once before the first check with the run's remaining query budget."""
        ...

    def run_check(self, spec: CheckSpec, data: Dataset, pending: list[int], batch_size: int,
                  ctx: CheckContext, budget: int | None
                  ) -> Iterator[tuple[list[int], list[dict[str, Any]], int, int]]:
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
        "host": platform.node(),
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


def run_batch_isolating(check: Check, model: QueryCounter, x: torch.Tensor, y: torch.Tensor,
                        idx: list[int], ctx: CheckContext) -> list[dict[str, Any]]:
    """``check.run_batch``, where a non-finite model answer makes error records, not a crash.

    If any query of the batch gets NaN or infinite scores back (:class:`NonFiniteOutput`), the
    batch's samples are rerun one at a time (seeds do not depend on the batch, so the other
    samples' records are those of a batched run) and each sample that fails again becomes
    ``{"outcome": "error", "error": NON_FINITE, "queries": spent}``. The queries of the
    abandoned batch attempt are charged to the error records (``batch_queries``), so the records
    still claim exactly the queries the model saw. Used in-process and by the Ray workers.
    """
    ref = ctx.reference

    def spent() -> tuple[int, int]:
        return model.queries, 0 if ref is None else ref.queries

    before = spent()
    try:
        return check.run_batch(model, x, y, idx, ctx)
    except NonFiniteOutput:
        now = spent()
        wasted = (now[0] - before[0], now[1] - before[1])
    rows: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    if len(idx) == 1:
        rows = errors = [{"outcome": "error", "error": NON_FINITE, "queries": 0}]
    else:
        for j, i in enumerate(idx):
            start = spent()
            try:
                rows.extend(check.run_batch(model, x[j : j + 1], y[j : j + 1], [i], ctx))
            except NonFiniteOutput:
                end = spent()
                rows.append({"outcome": "error", "error": NON_FINITE,
                             "queries": end[0] - start[0]})
                if end[1] - start[1]:
                    rows[-1]["ref_queries"] = end[1] - start[1]
                errors.append(rows[-1])
    # Alone, every sample may answer finitely (a batch-dependent model): then all share it.
    charged = errors or rows
    for key, total in zip(("queries", "ref_queries"), wasted, strict=True):
        if not total:
            continue
        for k, r in enumerate(charged):
            share = total // len(charged) + (1 if k < total % len(charged) else 0)
            r[key] = int(r.get(key, 0)) + share
            r[f"batch_{key}"] = share
    return rows


def lane_batches(pending: list[int], batch_size: int, lanes: int) -> list[list[int]]:
    """Split ``pending`` into equal batches of at most ``batch_size``, a multiple of ``lanes``
    of them, so that every lane gets the same share.

    Not fewer, larger batches: an attack runs until its batch's last sample is broken or out
    of queries, so each batch costs about the same number of iterations whatever its size,
    and each iteration has a fixed cost (Python, a model call). Records do not depend on the
    split (every draw is seeded per sample).
    """
    if lanes <= 1 or not pending:
        return [pending[s : s + batch_size] for s in range(0, len(pending), batch_size)]
    n = lanes * math.ceil(len(pending) / (lanes * batch_size))
    size = math.ceil(len(pending) / n)
    return [pending[s : s + size] for s in range(0, len(pending), size)]


def local_lanes(model: Model, device: DeviceChoice) -> int:
    """How many batches the in-process executor runs at once (threads).

    An endpoint: ``HTTP_LANES_PER_REQUEST ×`` its ``--concurrency``, so that a group of
    samples whose request waits for a retry, a hedge or a Retry-After does not stall the other
    groups (no head-of-line blocking); requests in flight stay within ``--concurrency``.
    A model in this process: the device's lanes (``DeviceChoice.lanes``).
    """
    http = getattr(model, "options", None)
    if getattr(model, "traffic", None) is not None and http is not None:
        return max(1, HTTP_LANES_PER_REQUEST * int(http.concurrency))
    return device.lanes


class _Stopped(Exception):
    """Raised in a lane's model query once another lane failed or the run was interrupted."""


class _LaneCounter(QueryCounter):
    """A batch's query counter that stops its lane when the executor says so."""

    def __init__(self, model: Model, shared: tuple[Budget, ...], stop: threading.Event
                 ) -> None:
        super().__init__(model, shared=shared)
        self._stop = stop

    def _spend(self, x: torch.Tensor) -> None:
        if self._stop.is_set():
            raise _Stopped("the run is stopping")
        super()._spend(x)


def _local_batches(spec: CheckSpec, model: Model, reference: Model | None,
                   shared: tuple[Budget, ...], data: Dataset, batches: list[list[int]],
                   ctx: CheckContext, lanes: int
                   ) -> Iterator[tuple[list[int], list[dict[str, Any]], int, int]]:
    """Run batches in this process, ``lanes`` at once on threads: yields (indices, records,
    queries the model saw, queries the reference model saw) as batches finish.

    Each batch has its own counters charged to the ``shared`` budgets. After a batch fails no
    new batch starts; the running ones stop at their next model query (their records are
    dropped, as an interrupted batch's are) and the first failure is raised.
    """
    stop = threading.Event()

    def one(idx: list[int]) -> tuple[list[int], list[dict[str, Any]], int, int]:
        if idx[-1] - idx[0] == len(idx) - 1:  # contiguous (the usual case): a view, no copy
            x, y = data.x[idx[0] : idx[-1] + 1], data.y[idx[0] : idx[-1] + 1]
        else:
            x, y = data.x[idx], data.y[idx]
        counter = _LaneCounter(model, shared, stop)
        ref = None if reference is None else _LaneCounter(reference, shared, stop)
        rows = run_batch_isolating(spec.check, counter, x.to(ctx.device), y.to(ctx.device),
                                   idx, dataclasses.replace(ctx, reference=ref))
        return idx, rows, counter.queries, 0 if ref is None else ref.queries

    if lanes <= 1:
        for idx in batches:
            yield one(idx)
        return
    todo = list(reversed(batches))
    running: set[Future[tuple[list[int], list[dict[str, Any]], int, int]]] = set()
    failure: BaseException | None = None
    with ThreadPoolExecutor(max_workers=lanes, thread_name_prefix="certify-lane") as pool:
        try:
            while todo or running:
                while todo and failure is None and len(running) < lanes:
                    running.add(pool.submit(one, todo.pop()))
                if not running:
                    break
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for f in done:
                    exc = f.exception()
                    if exc is None:
                        yield f.result()
                    elif failure is None or isinstance(failure, _Stopped):
                        failure = exc
                        stop.set()
        finally:
            stop.set()  # an interrupt or a closed generator: lanes stop at their next query
    if failure is not None:
        raise failure


def _record_queries(r: dict[str, Any]) -> int:
    """Images one record's sample cost, over all models."""
    return int(r.get("queries", 0)) + int(r.get("ref_queries", 0))


def round_key(check_id: str, r: int) -> str:
    """Where round ``r`` of a check keeps its records in the run directory."""
    return check_id if r == 0 else f"{check_id}{ROUND_SEP}{r}"


#: Separates a check id from its round in record keys (refused in check ids at suite load).
ROUND_SEP = "#round"
#: The key of the seed of the one stratified sample order all checks draw subsets from (no
#: check id contains '#').
SUBSET_KEY = "#samples"


def _run_check(
    spec: CheckSpec,
    model: Model,
    reference: Model | None,
    run_budget: Budget,
    data: Dataset,
    run: RunDir,
    ctx: CheckContext,
    subset_seed: int,
    batch_size: int,
    progress: Progress,
    executor: Executor | None = None,
    lanes: int = 1,
) -> dict[int, dict[str, Any]]:
    """Run a check, round after round: each round finishes for all samples (and all shards)
    before the check decides on the next one from the merged records, so a resumed or
    distributed run makes the same decisions."""
    records = _run_round(spec, spec, _selected(spec, data, subset_seed), model, reference,
                         run_budget, data, run, ctx, batch_size, progress, executor, used=0,
                         lanes=lanes)
    r = 0
    while (nxt := spec.check.next_round(records, r)) is not None:
        r += 1
        check, indices = nxt
        key = round_key(spec.id, r)
        used = sum(_record_queries(x) for k in range(r) for x in
                   run.records[round_key(spec.id, k)].values())
        log.info("check %s: round %d on %d unbroken samples", spec.id, r, len(indices))
        new = _run_round(spec, dataclasses.replace(spec, id=key, check=check), indices, model,
                         reference, run_budget, data, run, ctx, batch_size, progress, executor,
                         used=used, lanes=lanes)
        records = spec.check.merge_round(records, {i: new[i] for i in indices}, r)
    return records


def _run_round(
    spec: CheckSpec,
    this: CheckSpec,
    selected: list[int],
    model: Model,
    reference: Model | None,
    run_budget: Budget,
    data: Dataset,
    run: RunDir,
    ctx: CheckContext,
    batch_size: int,
    progress: Progress,
    executor: Executor | None,
    used: int,
    lanes: int = 1,
) -> dict[int, dict[str, Any]]:
    """One round of a check (``this``: its id is the round's record key) on ``selected``;
    ``used`` is what the check's earlier rounds spent of its budget; ``lanes`` batches run at
    once when there is no executor."""
    done = run.records[this.id]
    ctx = dataclasses.replace(ctx, selected=tuple(selected))
    pending = [i for i in selected if i not in done]
    total = len(selected)
    used += sum(_record_queries(r) for r in done.values())
    budget = None if spec.budget is None else max(0, spec.budget - used)
    progress.start(this.id, total)
    progress.advance(total - len(pending))
    if ctx.device.type == "cpu" and getattr(model, "traffic", None) is None:
        batch_size = cpu_batch_size(batch_size, tuple(data.x.shape[1:]), data.x.element_size())
    if spec.check.record_batch is not None:
        batch_size = min(batch_size, spec.check.record_batch)
    if executor is None:
        check_budget = Budget(budget, f"query budget of check {spec.id}")
        http = getattr(model, "options", None)
        if lanes > 1 and http is not None and getattr(model, "traffic", None) is not None:
            batch_size = min(batch_size, int(http.batch))  # one request per lane and step
        batches = lane_batches(pending, batch_size, lanes)
        results = _local_batches(this, model, reference, (check_budget, run_budget), data,
                                 batches, ctx, lanes)
    else:
        results = executor.run_check(this, data, pending, batch_size, ctx, budget)
    for idx, rows, spent, ref_spent in results:
        if len(rows) != len(idx):
            raise RuntimeError(f"check returned {len(rows)} records for {len(idx)} samples")
        # Checks report their own per-sample queries; the counters are the authority on totals.
        claimed = sum(int(r.get("queries", 0)) for r in rows)
        ref_claimed = sum(int(r.get("ref_queries", 0)) for r in rows)
        if claimed != spent or ref_claimed != ref_spent:
            raise RuntimeError(f"check claimed {claimed} + {ref_claimed} queries but the models "
                               f"saw {spent} + {ref_spent}")
        if executor is not None:
            run_budget.spent += spent + ref_spent
        for i, r in zip(idx, rows, strict=True):
            r.update({"check": this.id, "i": i, "id": data.ids[i]})
        run.append(this.id, rows)
        progress.advance(len(idx))
    progress.finish()
    return run.records[this.id]


def _selected(spec: CheckSpec, data: Dataset, subset_seed: int) -> list[int]:
    """The dataset indices a check evaluates: all, or a seeded class-stratified subset.

    Every check draws from the same seeded stratified order (``subset_seed``, from the suite
    seed), so a check's samples are the first ``samples`` of it: a smaller check's samples are
    inside a larger one's, and checks compared sample by sample (the worst case over attacks,
    ``certify compare``) share as many samples as their sizes allow.
    """
    if spec.samples is not None and spec.samples < len(data):
        # the same whoever runs which shard
        return stratified_subset(data.y.numpy(), spec.samples, subset_seed).tolist()
    return list(range(len(data)))


def _recorded_queries(run: RunDir) -> tuple[int, int]:
    """(model, reference) images recorded in the run directory so far."""
    recs = [r for recs in run.records.values() for r in recs.values()]
    return (sum(int(r.get("queries", 0)) for r in recs),
            sum(int(r.get("ref_queries", 0)) for r in recs))


def _worst_case(suite: Suite, finals: dict[str, dict[int, dict[str, Any]]],
                skipped: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """Robust accuracy against all of the suite's evaluated attacks at once, per (norm, ε),
    from each check's merged records (every round's)."""
    groups: dict[tuple[str, float], list[str]] = {}
    for spec in suite.checks:
        if isinstance(spec.check, AttackCheck) and spec.id not in skipped:
            groups.setdefault(spec.check.threat_model(), []).append(spec.id)
    out = []
    for (norm, eps), ids in sorted(groups.items()):
        recs = [finals.get(i, {}) for i in ids]
        common = set.intersection(*(set(r) for r in recs)) if recs else set()
        if not common:
            continue
        common = {s for s in common if all(r[s]["outcome"] != "error" for r in recs)}
        if not common:
            continue
        robust = sum(all(r[s]["outcome"] == "robust" for r in recs) for s in common)
        out.append({"norm": norm, "epsilon": eps, "attacks": ids, "n": len(common),
                    "robust_accuracy": robust / len(common)})
    return out


def _outcomes(check: Any, records: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """A check's per-sample outcomes as packed bitmaps over the dataset (``n`` samples).

    Samples whose model output was not finite have an ``error`` bit and no other outcome.
    """
    import numpy as np

    good = [r for r in records if r.get("outcome") != "error"]
    errors = [int(r["i"]) for r in records if r.get("outcome") == "error"]
    selected = np.zeros(n, dtype=bool)
    selected[[int(r["i"]) for r in records]] = True
    good_index = [int(r["i"]) for r in good]
    placed = [(name, good_index, flags) for name, flags in check.outcome_bits(good).items()]
    if errors:
        placed.append(("error", errors, [True] * len(errors)))
    bits = {}
    for name, index, flags in placed:
        full = np.zeros(n, dtype=bool)
        full[index] = np.asarray(flags, dtype=bool)
        bits[name] = pack_bits(full)
    pos = {int(r["i"]): k for k, r in enumerate(good)}
    values = {k: [float(vs[pos[int(r["i"])]]) if int(r["i"]) in pos else None
                  for r in records]
              for k, vs in check.sample_values(good).items()}
    return Outcomes(n=n, selected=pack_bits(selected), bits=bits, values=values).model_dump()


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _samples_needed(spec: CheckSpec, metrics: dict[str, Any], value: float,
                    interval: tuple[float, float], bounds: list[float]) -> str:
    """How many samples would decide an interval that straddles ``bounds``, in words."""
    from certify.stats import samples_to_decide

    if any(value == b for b in bounds):
        return "no sample size decides it: the point estimate is on the threshold"
    metric = next((m for m in getattr(spec.check, "metrics", ())
                   if m.name == spec.threshold.metric), None) if spec.threshold else None
    if metric is None or metric.unit == "rate":
        needed = [samples_to_decide(value, b) for b in bounds]
        if any(n is None for n in needed):
            return "no practical sample size decides it at the observed value"
        return (f"about {max(n for n in needed if n is not None):,} evaluated samples at the "
                f"observed {_fmt(value)} would decide it")
    # Other intervals (e.g. the brittle score's normal approximation) narrow as 1/sqrt(n).
    n0 = metrics.get("n")
    half = (interval[1] - interval[0]) / 2
    if not isinstance(n0, int | float) or not n0 or not math.isfinite(half) or half <= 0:
        return "a larger sample would narrow the interval"
    gap = min(abs(value - b) for b in bounds)
    return (f"about {math.ceil(n0 * (half / gap) ** 2):,} samples at the observed {_fmt(value)} "
            "would decide it")


def decide(spec: CheckSpec, metrics: dict[str, Any], warnings: list[str],
           sample_errors: int = 0,
           intervals: dict[str, Any] | None = None) -> tuple[str, str]:
    """A check's status and the rule that made it, from its metrics, intervals and warnings.

    With the ``interval`` rule (``spec.decision``, the default), a threshold's metric that has a
    95% interval in ``intervals`` decides three ways: PASS when the whole interval meets the
    threshold (lower bound ≥ ``min``, upper bound ≤ ``max``), FAIL when the whole interval
    misses one side (upper bound < ``min`` or lower bound > ``max``), otherwise INCONCLUSIVE,
    with the sample size that would decide it at the observed value. A metric without an
    interval, and every metric under the ``point`` rule, is decided on its point estimate, and
    the decision sentence says so.

    A NaN or infinite thresholded metric is INCONCLUSIVE (it can neither pass nor fail), and so
    is a passing value measured with samples left out for non-finite model outputs: such a
    check can never PASS. A failing value stays FAIL; a warning turns a PASS into WARN.
    """
    if spec.threshold is None:
        if warnings:
            return "WARN", "no threshold (informational); warnings found"
        return "INFO", "no threshold (informational)"
    t = spec.threshold
    value = metrics.get(t.metric)
    if value is None or not math.isfinite(float(value)):
        return "INCONCLUSIVE", f"{t.metric} is not a number, so {t.describe()} cannot be decided"
    value = float(value)
    iv = (intervals or {}).get(t.metric)
    usable = iv is not None and len(iv) == 2 and all(
        b is not None and math.isfinite(float(b)) for b in iv)
    if spec.decision == "interval" and usable:
        lo, hi = float(iv[0]), float(iv[1])  # type: ignore[index]
        said = f"{t.metric} = {_fmt(value)} (95% interval {_fmt(lo)}–{_fmt(hi)})"
        missed = [b for b, out in ((t.min, t.min is not None and hi < t.min),
                                   (t.max, t.max is not None and lo > t.max)) if out]
        if missed:
            return "FAIL", f"{said} lies wholly outside {t.describe()} (interval rule)"
        undecided = [b for b, met in ((t.min, t.min is None or lo >= t.min),
                                  (t.max, t.max is None or hi <= t.max)) if not met]
        if undecided:
            bounds = [float(b) for b in undecided if b is not None]
            return "INCONCLUSIVE", (f"{said} straddles {t.describe()} (interval rule): "
                                    f"{_samples_needed(spec, metrics, value, (lo, hi), bounds)}")
        rule = f"{said} lies wholly within {t.describe()} (interval rule)"
    else:
        why = ("point rule" if spec.decision == "point"
               else "point estimate: no interval for this metric")
        if not t.passes(value):
            return "FAIL", f"{t.metric} = {_fmt(value)} does not meet {t.describe()} ({why})"
        rule = f"{t.metric} = {_fmt(value)} meets {t.describe()} ({why})"
    if sample_errors:
        return "INCONCLUSIVE", rule + f", but {sample_errors} sample(s) gave non-finite outputs"
    if warnings:
        return "WARN", rule + "; a warning stops it from passing"
    return "PASS", rule


def no_attack_passes_when_randomised(suite: Suite, entries: list[dict[str, Any]]) -> None:
    """On a model a ``sanity`` check found randomised, no attack check may PASS.

    Randomness defeats fixed attacks without making a model robust (Brown et al. 2018,
    Appendix E), so a robust accuracy measured on such a model is an inflated estimate. Applied
    to the finished checks' result entries, in place, whatever the suite's order: each attack
    gets a warning naming the sanity check, and a PASS becomes WARN with a decision sentence
    that says why.
    """
    found = [(e["id"], float(e["metrics"]["nondeterministic_share"])) for e in entries
             if e["kind"] == "sanity" and e["status"] != "ERROR" and e.get("metrics")
             and e["metrics"].get("nondeterministic_share")]
    if not found:
        return
    cid, share = found[0]
    attacks = {s.id for s in suite.checks if isinstance(s.check, AttackCheck)}
    why = (f"check {cid} found the model randomised ({share:.0%} of its samples gave different "
           "outputs for the same input), so this robust accuracy may be inflated")
    for e in entries:
        if e["id"] not in attacks or e["status"] in ("ERROR", "SKIPPED"):
            continue
        e["warnings"] = [*e["warnings"], why]
        if e["status"] == "PASS":
            e["status"] = "WARN"
            e["decision"] += f"; but {why}: no attack can PASS on a randomised model"


@dataclass
class SuiteOutcome:
    """What :func:`run_suite` returns: the typed result, and the images the card shows
    (digest -> ``[H, W, 3]`` uint8 pixels; not part of the signed result)."""

    result: RunResult
    images: dict[str, Any] = field(default_factory=dict)


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
    reference_spec: str | None = None,
    query_budget: int | None = None,
    executor: Executor | None = None,
) -> SuiteOutcome:
    """Run every check of ``suite`` and return the typed result and the card's images.

    ``executor`` runs the checks' batches elsewhere (see :mod:`certify.distributed`); by
    default they run in this process.

    ``query_budget`` caps the images sent to all models over the whole run, records of a
    resumed run included; a check that would cross it ends as an ERROR row and the checks after
    it find it spent.
    """
    progress = progress or NullProgress()
    seed = suite.seed if seed is None else seed
    skips = suite.skips(model.info)
    if skips and len(skips) == len(suite.checks):
        suite.validate_for(model.info)  # raises: a run must evaluate something
    recorded = sum(_recorded_queries(run))
    run_budget = Budget(None if query_budget is None else max(0, query_budget - recorded),
                        "run query budget")
    if executor is not None:
        executor.start(run_budget.limit)
    lanes = local_lanes(model, device)
    if executor is None and lanes > 1:
        log.info("in-process executor: %d batches at once", lanes)
    t0 = time.perf_counter()
    entries: list[dict[str, Any]] = []
    durations: dict[str, float] = {}
    seeds: dict[str, int] = {}
    images: dict[str, Any] = {}
    finals: dict[str, dict[int, dict[str, Any]]] = {}
    for spec in suite.checks:
        cseed = check_seed(seed, spec.id)
        seeds[spec.id] = cseed
        ctx = CheckContext(check_seed=cseed, device=device.torch_device,
                           class_names=list(data.class_names),
                           flip_invariant_classes=suite.flip_invariant_classes,
                           abstain_class=suite.abstain_class,
                           n_samples=min(spec.samples or len(data), len(data)))
        entry: dict[str, Any] = {
            "id": spec.id,
            "kind": spec.kind,
            "params": spec.check.get_params(),
            "threshold": None if spec.threshold is None else {
                "metric": spec.threshold.metric, "min": spec.threshold.min,
                "max": spec.threshold.max, "text": spec.threshold.describe(),
                "rule": spec.decision,
            },
            "budget": spec.budget,
        }
        c0 = time.perf_counter()
        if spec.id in skips:  # not evaluated: no query, no record, never a pass
            entry.update({"status": "SKIPPED", "decision": skips[spec.id], "metrics": None,
                          "intervals": {}, "details": {}, "error": None, "warnings": [],
                          "queries": {"total": 0, "mean_per_sample": 0.0, "reference": 0},
                          "outcomes": None})
            durations[spec.id] = 0.0
            entries.append(entry)
            continue
        try:
            records = _run_check(spec, model, reference, run_budget, data, run, ctx,
                                 check_seed(seed, SUBSET_KEY),
                                 batch_size, progress, executor, lanes)
            finals[spec.id] = records
            ordered = [records[i] for i in sorted(records)]
            errored = [r for r in ordered if r.get("outcome") == "error"]
            if errored and len(errored) == len(ordered):
                raise NonFiniteOutput(f"the model returned NaN or infinite outputs on every "
                                      f"sample ({len(errored)})")
            # Summaries never see error records: they are counted, and make PASS impossible.
            m = spec.check.summarize([r for r in ordered if r.get("outcome") != "error"], data)
            if errored:
                m.warnings.append(f"{len(errored)} of {len(ordered)} samples gave NaN or "
                                  "infinite model outputs and are left out of the metrics")
            queries = [int(r.get("queries", 0)) for r in ordered]
            status, decision = decide(spec, m.metrics, m.warnings, len(errored),
                                      m.intervals)
            entry.update({
                "metrics": m.metrics,
                "intervals": {k: list(v) for k, v in m.intervals.items()},
                "details": m.details,
                "queries": {"total": sum(queries),
                            "mean_per_sample": sum(queries) / len(queries) if queries else 0.0,
                            "reference": sum(int(r.get("ref_queries", 0)) for r in ordered)},
                "error": None,
                "warnings": m.warnings,
                "status": status,
                "decision": decision,
                "outcomes": _outcomes(spec.check, ordered, len(data)),
                "sample_errors": len(errored),
            })
            images.update(m.images)
            share = (m.metrics or {}).get("nondeterministic_share") if spec.kind == "sanity" \
                else None
            if share:
                _no_hedging(f"check {spec.id} found the model randomised ({share:.0%} of its "
                            "samples gave different outputs for the same input)",
                            model, reference, executor)
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
            entry.update({"status": "ERROR", "decision": "the check could not complete",
                          "metrics": None, "intervals": {}, "details": {},
                          "queries": {"total": 0, "mean_per_sample": 0.0, "reference": 0},
                          "error": message, "warnings": [], "outcomes": None})
        durations[spec.id] = time.perf_counter() - c0
        entries.append(entry)

    no_attack_passes_when_randomised(suite, entries)
    worst_case_beside_random(suite.checks, entries)
    checks = [_typed_check(e) for e in entries]
    statuses = [c.status for c in checks]
    verdict = overall_verdict(statuses)
    model_q, ref_q = _recorded_queries(run)
    measurement = RunMeasurement(
        certify_version=certify.__version__,
        suite=SuiteDoc(name=suite.name, digest=suite.digest, description=suite.description,
                       decision=typing.cast(Any, suite.decision)),
        model=ModelDoc(**_model_doc(model)),
        reference_model=None if reference is None else ModelDoc(**_model_doc(reference)),
        data=DataDoc(**_data_doc(data)),
        device=typing.cast(Any, device.name),
        seeds={"suite": seed, "checks": seeds},
        queries=RunQueries(total=model_q + ref_q, model=model_q, reference=ref_q,
                           budget=query_budget),
        checks=checks,
        summary={s.lower(): statuses.count(s) for s in typing.get_args(Status)},
        attack_worst_case=[WorstCase(**w) for w in _worst_case(suite, finals,
                                                                 frozenset(skips))],
        verdict=typing.cast(Any, verdict),
        decision=("the first of ERROR, FAIL, INCONCLUSIVE, WARN that any evaluated check has, "
                  f"else PASS: {verdict}"
                  + (f" ({len(skips)} check(s) skipped: not evaluated, not passed)"
                     if skips else "")),
    )
    traffic = _traffic(model, reference, executor)
    provenance = Provenance(**redact_obj(dict(  # every string certify writes about a model
        model_spec=model_spec,
        reference_spec=reference_spec,
        data_source=str(data.source),
        suite_source=suite.source,
        device={"requested": device.requested, "reason": device.reason,
                "provider": model.info.provider},
        environment=_versions(),
        timings={"total_s": time.perf_counter() - t0, "checks": durations,
                 "resumed_records": run.resumed_records},
        traffic=traffic or None,
    )))
    result = RunResult(schema=SCHEMA, measurement=measurement, provenance=provenance)
    return SuiteOutcome(result=result, images=images)


def _no_hedging(why: str, *where: Any) -> None:
    """Stop hedged requests for the rest of the run, in this process and on the workers: with
    a model that answers randomly, which of two answers arrives first would decide a record."""
    for w in where:
        off = getattr(w, "disable_hedging", None)
        if off is not None:
            off(why)


def _traffic(model: Model, reference: Model | None, executor: Executor | None
             ) -> dict[str, Any]:
    """Endpoint traffic of this invocation per model: this process's, plus the workers'."""
    out: dict[str, Any] = {}
    for name, m in (("model", model), ("reference", reference)):
        t = getattr(m, "traffic", None)
        if t is not None:
            out[name] = t()
    remote = getattr(executor, "traffic", None)
    for name, counts in (remote() if remote is not None else {}).items():
        if name in out:
            for k, v in counts.items():
                out[name][k] = out[name].get(k, 0) + v
    return out


def _typed_check(entry: dict[str, Any]) -> Any:
    """The typed result of one check (its kind's model validates the metrics it declares)."""
    return check_result_model(entry["kind"]).model_validate(normalize(entry))


def _model_doc(model: Model) -> dict[str, Any]:
    d = model.info.to_dict()
    d.pop("provider", None)  # provenance: the same model gives the same numbers on either
    return redact_obj(d)  # an endpoint's URL is part of its name and identity


def _data_doc(data: Dataset) -> dict[str, Any]:
    d = data.describe()
    d["name"] = Path(str(d.pop("source"))).name
    return d
