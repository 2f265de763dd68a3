"""run_suite(): seeding, budgets, timing, verdicts, per-sample records and resume.

Checks only measure. The runner derives every seed from (suite seed, check id, sample index),
feeds each check the samples it has not recorded yet in batches through an executor (this
process's :class:`~certify.engine.local.LocalExecutor`, or Ray's), streams the records to the
run directory, turns an exception inside a check into an ERROR result (so a card is still
produced), applies the suite's thresholds (:mod:`certify.engine.verdicts`) and the rules across
checks (:mod:`certify.engine.crosscheck`), and assembles the result
(:mod:`certify.engine.assemble`).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import time
import traceback
import typing
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

import certify.probe as probe
from certify.canonical import JSONLike, normalize
from certify.checks import CheckContext, Measurement, Role, attack_of
from certify.checks.attack import bt_positions
from certify.data import Dataset, stratified_subset
from certify.device import DeviceChoice
from certify.engine.assemble import RunState, assemble_result, outcomes_doc
from certify.engine.crosscheck import apply_cross_checks, randomised_share
from certify.engine.executor import Executor
from certify.engine.local import LocalExecutor, cpu_batch_size, local_lanes
from certify.engine.pilot import (
    PROBE_SAMPLES,
    Bound,
    Estimate,
    PilotCheck,
    bounds_of,
    log_estimate,
    long_run,
    pilot_positions,
)
from certify.engine.pilot import estimate as estimate_time
from certify.engine.plan import TRY_IMAGES, Rates, TimeBudget, calibrate, log_plan, prepare
from certify.engine.records import (
    SUBSET_KEY,
    record_queries,
    recorded_queries,
    round_key,
)
from certify.engine.schedule import Earlier, execution_order, plan_attack
from certify.engine.verdicts import judge
from certify.errors import (
    BudgetExceeded,
    CertifyError,
    ModelError,
    NonFiniteOutput,
    SuiteError,
)
from certify.models.base import WHITE_BOX, Budget, Model, Reconfigurable, endpoint_of
from certify.progress import NullProgress, Progress, StepCounter, report_reused, report_step
from certify.redact import redact, redact_obj
from certify.results import CheckResult, RunResult, check_result_model
from certify.rundir import RunDir, SampleRecord
from certify.suite import CheckSpec, Suite

log = logging.getLogger("certify")


def check_seed(suite_seed: int, check_id: str) -> int:
    """The seed of one check, derived from the suite seed and the check id."""
    digest = hashlib.sha256(f"{suite_seed}:{check_id}".encode()).digest()
    return int.from_bytes(digest[:7], "big")


def run_fingerprint(model: Model, suite: Suite, data: Dataset, seed: int,
                    reference: Model | None = None) -> dict[str, JSONLike]:
    """What must match for ``--resume`` to continue a run (redacted: it is written to run.json)."""
    fingerprint: dict[str, JSONLike] = redact_obj({
        "model": model.info.identity,
        "reference": None if reference is None else reference.info.identity,
        "suite": suite.digest,
        "data": data.digest,
        "seed": seed,
        "preprocessing": model.info.preprocessing.to_dict(),
    })
    if "surrogate" in model.info.metadata:  # a transfer attack's proposals come from it
        fingerprint["surrogate"] = model.info.metadata["surrogate"]
    return fingerprint


@dataclass
class _Run:
    """What every check of one run shares: the models, budget, data, run folder, executor."""

    model: Model
    reference: Model | None
    run_budget: Budget
    data: Dataset
    run: RunDir
    subset_seed: int
    batch_size: int
    progress: Progress
    executor: Executor
    #: Record key -> the steps each label of it has started (:class:`StepCounter`), so that a
    #: pass that keeps the pilot's records counts on from the pilot's steps.
    steps: dict[str, dict[str, int]] = field(default_factory=dict)


def _run_check(spec: CheckSpec, ctx: CheckContext, w: _Run,
               only: list[int] | None = None) -> dict[int, SampleRecord]:
    """Run a check, round after round: each round finishes for all samples (and all shards)
    before the check decides on the next one from the merged records, so a resumed or
    distributed run makes the same decisions. ``only``: the pilot's samples of the selection
    (:mod:`certify.engine.pilot`), the others left alone."""
    records = _run_round(spec, spec, _selected(spec, w.data, w.subset_seed), ctx, w, used=0,
                         only=only)
    r = 0
    while (nxt := spec.check.next_round(records, r)) is not None:
        r += 1
        check, indices = nxt
        key = round_key(spec.id, r)
        used = sum(record_queries(x) for k in range(r) for x in
                   w.run.records[round_key(spec.id, k)].values())
        log.info("check %s: round %d on %d unbroken samples", spec.id, r, len(indices))
        new = _run_round(spec, dataclasses.replace(spec, id=key, check=check), indices, ctx, w,
                         used=used)
        records = spec.check.merge_round(records, {i: new[i] for i in indices}, r)
    return records


def _run_round(spec: CheckSpec, this: CheckSpec, selected: list[int], ctx: CheckContext,
               w: _Run, used: int, only: list[int] | None = None) -> dict[int, SampleRecord]:
    """One round of a check (``this``: its id is the round's record key) on ``selected``
    (of them ``only`` these, where given); ``used`` is what the check's earlier rounds spent
    of its budget."""
    done = w.run.records[this.id]
    counter = StepCounter(w.progress, w.steps.get(this.id))
    w.steps[this.id] = counter.started
    ctx = dataclasses.replace(ctx, selected=tuple(selected), step=counter)
    keep = set(only or ())
    chosen = selected if only is None else [i for i in selected if i in keep]
    pending = [i for i in chosen if i not in done]
    total = len(chosen)
    used += sum(record_queries(r) for r in done.values())
    budget = None if spec.budget is None else max(0, spec.budget - used)
    w.progress.start(this.id, total)
    report_reused(w.progress, total - len(pending))  # resumed records: not in the rate
    batch_size = w.batch_size
    if ctx.device.type == "cpu" and endpoint_of(w.model) is None:
        batch_size = cpu_batch_size(batch_size, tuple(w.data.x.shape[1:]),
                                    w.data.x.element_size())
    if spec.check.record_batch is not None:
        batch_size = min(batch_size, spec.check.record_batch)
    results = w.executor.run_check(this, w.data, pending, batch_size, ctx, budget)
    for idx, rows, spent, ref_spent in results:
        if len(rows) != len(idx):
            raise RuntimeError(f"check returned {len(rows)} records for {len(idx)} samples")
        # Checks report their own per-sample queries; the counters are the authority on totals.
        claimed = sum(int(r.get("queries", 0)) for r in rows)
        ref_claimed = sum(int(r.get("ref_queries", 0)) for r in rows)
        if claimed != spent or ref_claimed != ref_spent:
            raise RuntimeError(f"check claimed {claimed} + {ref_claimed} queries but the models "
                               f"saw {spent} + {ref_spent}")
        if not w.executor.live_budget:
            w.run_budget.spent += spent + ref_spent
        for i, r in zip(idx, rows, strict=True):
            r.update({"check": this.id, "i": i, "id": w.data.ids[i]})
        w.run.append(this.id, rows)
        w.progress.advance(len(idx))
    w.progress.finish()
    return w.run.records[this.id]


def _selected(spec: CheckSpec, data: Dataset, subset_seed: int) -> list[int]:
    """The dataset indices a check evaluates: all, or a seeded class-stratified subset.

    Every check draws from the same seeded stratified order (``subset_seed``, from the suite
    seed), so a check's samples are the first ``samples`` of it: a smaller check's samples are
    inside a larger one's, and checks compared sample by sample (the worst case over attacks,
    ``certify compare``) share as many samples as their sizes allow.
    """
    if spec.samples is not None and spec.samples < len(data):
        # the same whoever runs which shard
        chosen: list[int] = stratified_subset(data.y.numpy(), spec.samples,
                                              subset_seed).tolist()
        return chosen
    return list(range(len(data)))


@dataclass
class SuiteOutcome:
    """What :func:`run_suite` returns: the typed result, and the images the card shows
    (digest -> ``[H, W, 3]`` uint8 pixels; not part of the signed result)."""

    result: RunResult
    images: dict[str, np.ndarray] = field(default_factory=dict)


def _skips(suite: Suite, model: Model) -> dict[str, str]:
    """Check id -> why it is not evaluated on this model: from its description
    (:meth:`Suite.skips`), then from the model itself (a graph certify cannot bound)."""
    skips = suite.skips(model.info)
    skips.update({s.id: why for s in suite.checks if s.id not in skips
                  and (why := s.check.unavailable(model)) is not None})
    if skips and len(skips) == len(suite.checks):
        first = next(iter(skips.values()))
        raise SuiteError(f"every check of suite {suite.name!r} would be skipped on "
                         f"{model.info.name}, so nothing would be evaluated ({first})",
                         hint="add checks this model can be evaluated with")
    return skips


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
    time_budget: TimeBudget | None = None,
    estimate: bool | None = None,
) -> SuiteOutcome:
    """Run every check of ``suite`` and return the typed result and the card's images.

    ``executor`` runs the checks' batches elsewhere (see :mod:`certify.distributed`); by
    default they run in this process (:class:`~certify.engine.local.LocalExecutor`).

    ``query_budget`` caps the images sent to all models over the whole run, records of a
    resumed run included; a check that would cross it ends as an ERROR row and the checks after
    it find it spent.

    ``time_budget``: the samples ``--time-budget`` gave the attack checks (the suite already
    has them); each such row's details say so.

    ``estimate``: run the pilot and say the run's expected and at-most time before the main
    pass (:mod:`certify.engine.pilot`); ``None`` (the default): where the run may be long
    (:func:`certify.engine.pilot.long_run`). Not on a resumed run, nor under a query budget
    (the pilot would spend part of it).
    """
    progress = progress or NullProgress()
    seed = suite.seed if seed is None else seed
    white = any((atk := attack_of(s.check)) is not None and atk.white_box() for s in suite.checks)
    prepare(model, data, device.torch_device, gradients=white, reference=reference)
    skips = _skips(suite, model)
    if skips and len(skips) == len(suite.checks):
        suite.validate_for(model.info)  # raises: a run must evaluate something
    recorded = sum(recorded_queries(run))
    run_budget = Budget(None if query_budget is None else max(0, query_budget - recorded),
                        "run query budget")
    if executor is None:
        lanes = local_lanes(model, device)
        if lanes > 1:
            log.info("in-process executor: %d batches at once", lanes)
        executor = LocalExecutor(model, reference, run_budget, lanes)
    executor.start(run_budget.limit)
    executor.confirm_batching(data.x[:TRY_IMAGES])
    work = _Run(model, reference, run_budget, data, run, check_seed(seed, SUBSET_KEY),
                batch_size, progress, executor)
    state = RunState(seed=seed)
    rates: Rates = time_budget.rates if time_budget is not None else \
        calibrate(model, data, gradients=white and model.info.white_box == WHITE_BOX,
                  device=device.torch_device, lanes=local_lanes(model, device))
    endpoint = endpoint_of(model)
    state.planned_requests = log_plan(suite.checks, data, skips, rates,
                                      None if endpoint is None else int(endpoint.options.batch))
    skips = dict(skips)  # the attacks the schedule finds redundant join them as it goes
    order = execution_order(suite.checks)
    for spec in order:
        state.seeds[spec.id] = check_seed(seed, spec.id)
    pilot = _pilot(order, skips, work, state.seeds, model.info.output, suite, device, rates) \
        if _estimating(estimate, run, query_budget, bounds_of(order, data, skips), rates) else None
    done: dict[str, CheckResult] = {}
    for k, spec in enumerate(order):
        c0 = time.perf_counter()
        broken_before: dict[int, dict[str, object]] = {}
        if spec.id not in skips and spec.check.role is Role.ATTACK:
            plan = plan_attack(spec, Earlier(order[:k], done, state.finals, state.measured),
                               model.info.output)
            if plan.skip is not None:
                skips[spec.id] = plan.skip
                log.info("check %s: %s", spec.id, plan.skip)
            spec, broken_before = plan.spec, plan.broken_before
        if spec.id in skips:  # not evaluated: no query, no record, never a pass
            checked = _empty_result(spec, "SKIPPED", skips[spec.id], None)
        else:
            if broken_before:
                log.info("check %s: %d sample(s) an earlier attack of its threat model broke "
                         "are not attacked again", spec.id, len(broken_before))
            if pilot is not None:
                pilot.keep(spec, work)
            checked = _evaluate(spec, _context(spec, state.seeds[spec.id], device, data,
                                               suite, broken_before), work, state)
        state.durations[spec.id] = 0.0 if spec.id in skips else time.perf_counter() - c0
        done[spec.id] = checked
    if pilot is not None:
        state.estimate = pilot.estimate.to_doc() | {
            "pilot_records_kept": sum(p.kept for p in pilot.checks.values())}
    state.results = [done[s.id] for s in suite.checks]  # the card keeps the suite's order
    if time_budget is not None:
        state.results = [time_budget.stated(r) for r in state.results]
    state.results = apply_cross_checks(suite, state.results, state.measured)
    result = assemble_result(state, suite, skips, model, reference, data, device, run,
                             query_budget, executor, model_spec, reference_spec)
    return SuiteOutcome(result=result, images=state.images)


def _requests(model: Model) -> int:
    """The inference requests an endpoint model has sent so far (0 for a model in this
    process)."""
    endpoint = endpoint_of(model)
    if endpoint is None:
        return 0
    sent = endpoint.traffic().get("inference_requests", 0)
    return int(sent) if isinstance(sent, int) else 0


def _estimating(asked: bool | None, run: RunDir, query_budget: int | None,
                bounds: dict[str, Bound], rates: Rates) -> bool:
    """Whether the run estimates its time with a pilot: where asked (``True``), or by default
    (``None``) where the plan's bounds are long (:func:`certify.engine.pilot.long_run`); never
    on a resumed run or under a query budget (said where it was asked)."""
    why = "a resumed run" if run.resumed_records else \
        "a query budget is set, and the estimate's pilot would spend part of it" \
        if query_budget is not None else None
    if asked is False:
        return False
    if why is None and asked is None:
        why = long_run(bounds, rates)
        if why is not None:
            log.info("run time: not estimated (%s; --estimate gives one)", why)
            return False
    if why is not None:
        log.info("run time: not estimated (%s)", why)
    return why is None


def _context(spec: CheckSpec, check_seed_: int, device: DeviceChoice, data: Dataset,
             suite: Suite, broken_before: dict[int, dict[str, object]]) -> CheckContext:
    """What the runner gives ``spec``'s check (the pilot's and the main pass's alike)."""
    return CheckContext(check_seed=check_seed_, device=device.torch_device,
                        class_names=list(data.class_names),
                        flip_invariant_classes=suite.flip_invariant_classes,
                        abstain_class=suite.abstain_class,
                        n_samples=min(spec.samples or len(data), len(data)),
                        broken_before=broken_before)


class _MemoryRecords:
    """The pilot's records, in memory: what :func:`_run_round` reads and appends (as a
    :class:`~certify.rundir.RunDir`), and each check's round-0 records as written, for the
    main pass to keep."""

    def __init__(self) -> None:
        self.records: dict[str, dict[int, SampleRecord]] = defaultdict(dict)
        self.written: dict[str, list[SampleRecord]] = defaultdict(list)

    def append(self, check_id: str, rows: list[SampleRecord]) -> None:
        """Keep one batch of records (a copy as written: later rounds merge into them)."""
        self.written[check_id].extend(copy.deepcopy(rows))
        for r in rows:
            self.records[check_id][int(r["i"])] = r


class _PilotProgress:
    """The pilot as one task on the run's progress reporter, a check at a time: the checks'
    own tasks and steps are named as its steps."""

    def __init__(self, inner: Progress, total: int) -> None:
        self._inner = inner
        self._label = ""
        inner.start("estimating the run time (a pilot of every check)", total)

    def start(self, label: str, total: int) -> None:  # noqa: D102
        self._label = label
        report_step(self._inner, label)

    def advance(self, n: int) -> None:  # noqa: D102
        pass

    def finish(self) -> None:  # noqa: D102
        pass

    def step(self, text: str) -> None:  # noqa: D102
        report_step(self._inner, f"{self._label}: {text}")

    def check_done(self) -> None:
        """One more check piloted."""
        self._inner.advance(1)

    def close(self) -> None:
        """The pilot is over."""
        self._inner.finish()


@dataclass
class _Pilot:
    """The pilot's records and measurements, and the estimate made from them."""

    memory: _MemoryRecords
    checks: dict[str, PilotCheck]
    estimate: Estimate
    #: Record key -> the steps the pilot's checks started (see ``_Run.steps``).
    steps: dict[str, dict[str, int]]

    def keep(self, spec: CheckSpec, w: _Run) -> None:
        """Write the pilot's round-0 records of ``spec`` into ``w.run`` where they are the
        records the main pass would make (see :mod:`certify.engine.pilot`): a check that is
        not an attack (whose records depend on its batch) and has no query budget of its own
        (whose share per sample depends on what the others spent)."""
        rows = self.memory.written.get(spec.id)
        if not rows or spec.budget is not None or w.run.records[spec.id] \
                or spec.check.role is Role.ATTACK:
            return
        w.run.append(spec.id, rows)
        w.steps[spec.id] = dict(self.steps.get(spec.id, {}))
        self.checks[spec.id].kept = len(rows)


def _probe(w: _Run, device: torch.device) -> tuple[list[int], list[int]]:
    """The run's first :data:`~certify.engine.pilot.PROBE_SAMPLES` samples (seeded
    class-stratified order), asked once before the pilot: (those the model answers right,
    those it answers wrong). Not a check's queries: an endpoint's traffic counts them."""
    idx = stratified_subset(w.data.y.numpy(), PROBE_SAMPLES, w.subset_seed).tolist()
    if not idx:
        return [], []
    batch = w.batch_size
    if device.type == "cpu" and endpoint_of(w.model) is None:
        batch = cpu_batch_size(batch, tuple(w.data.x.shape[1:]), w.data.x.element_size())
    got = torch.cat([w.model.predict(w.data.x[idx[s:s + batch]].to(device)).argmax(1).cpu()
                     for s in range(0, len(idx), batch)])
    ok = (got == w.data.y[idx].cpu()).tolist()
    return [i for i, a in zip(idx, ok, strict=True) if a], \
        [i for i, a in zip(idx, ok, strict=True) if not a]


def _pilot(order: list[CheckSpec], skips: dict[str, str], w: _Run, seeds: dict[str, int],
           output: str, suite: Suite, device: DeviceChoice, rates: Rates) -> _Pilot:
    """Run every check on its pilot samples (:func:`certify.engine.pilot.pilot_positions`) in
    the runner's order and schedule, timed, and estimate the run's time from it. Quiet:
    what the pilot's checks would log (warnings included) is said by the main pass."""
    memory = _MemoryRecords()
    shown = _PilotProgress(w.progress, sum(s.id not in skips for s in order))
    pw = dataclasses.replace(w, run=typing.cast(RunDir, memory),
                             progress=typing.cast(Progress, shown), steps={})
    checks: dict[str, PilotCheck] = {}
    done: dict[str, CheckResult] = {}
    finals: dict[str, dict[int, SampleRecord]] = {}
    measured: dict[str, Measurement] = {}
    t0 = time.perf_counter()
    right, wrong = _probe(w, device.torch_device)
    answered_right = set(right)
    level = log.level
    log.setLevel(max(logging.ERROR, log.getEffectiveLevel()))
    try:
        for k, spec in enumerate(order):
            if spec.id in skips:
                continue
            selected = _selected(spec, w.data, w.subset_seed)
            attack = attack_of(spec.check)
            tested, _ = attack.binarization_queries() if attack is not None else (0, 0)
            tested_at = bt_positions(CheckContext(0, device.torch_device, [],
                                                  selected=tuple(selected)), tested) \
                if tested else set()
            positions, n_tested = pilot_positions(selected, right, wrong, tested_at)
            mine = set(selected)
            n_right, n_wrong = sum(i in mine for i in right), sum(i in mine for i in wrong)
            p = PilotCheck(spec.id, len(selected), len(tested_at), pilot_samples=len(positions),
                           pilot_tested=n_tested, right_share=n_right / max(1, n_right + n_wrong))
            checks[spec.id] = p
            c0, r0 = time.perf_counter(), _requests(w.model)
            before: dict[int, dict[str, object]] = {}
            if attack is not None:
                plan = plan_attack(spec, Earlier(order[:k], done, finals, measured), output)
                if plan.skip is not None:
                    p.none = plan.skip
                    shown.check_done()
                    continue
                spec, before = plan.spec, plan.broken_before
            try:
                records = _run_check(spec, _context(spec, seeds[spec.id], device, w.data, suite,
                                                    before), pw, only=positions)
                finals[spec.id] = records
                done[spec.id], measured[spec.id] = _summarize(spec, records, w.data)
                p.count(records, tested_at, answered_right)
            except (KeyboardInterrupt, ModelError):
                raise
            except Exception as exc:  # noqa: BLE001 - the main pass says what went wrong
                p.none = f"{type(exc).__name__}: {exc}"[:200]
                memory.written.pop(spec.id, None)
            finally:
                shown.check_done()
            p.seconds, p.requests = time.perf_counter() - c0, _requests(w.model) - r0
    finally:
        log.setLevel(level)
        shown.close()
    endpoint = endpoint_of(w.model)
    found = estimate_time(checks, bounds_of(order, w.data, skips), rates, time.perf_counter() - t0,
                          None if endpoint is None else int(endpoint.options.batch))
    log_estimate(found)
    return _Pilot(memory, checks, found, pw.steps)


def _typed(spec: CheckSpec, fields: dict[str, object]) -> CheckResult:
    """A check's typed result: what it says whatever happens (id, kind, params, threshold,
    budget) and ``fields``, in canonical form, validated by its kind's result model."""
    head = {
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
    return check_result_model(spec.kind).model_validate(normalize(head | fields))


def _empty_result(spec: CheckSpec, status: str, decision: str, error: str | None
                  ) -> CheckResult:
    """The result of a check that measured nothing (SKIPPED, or ERROR)."""
    return _typed(spec, {"status": status, "decision": decision, "metrics": None,
                         "intervals": {}, "details": {}, "error": error, "warnings": [],
                         "queries": {"total": 0, "mean_per_sample": 0.0, "reference": 0},
                         "outcomes": None, "settled": {},
                         "decided_by": {"rule": status.lower()}})


def _evaluate(spec: CheckSpec, ctx: CheckContext, w: _Run, state: RunState) -> CheckResult:
    """Run one check and decide it: its typed result (an ERROR result if it crashed)."""
    try:
        records = _run_check(spec, ctx, w)
        state.finals[spec.id] = records
        result, m = _summarize(spec, records, w.data,
                               diagnose=lambda m: _diagnose_chance(spec, m, w))
        state.images.update(m.images)
        state.measured[spec.id] = m
        share = randomised_share(spec, m)
        if share:
            _no_hedging(f"check {spec.id} found the model randomised ({share:.0%} of its "
                        "samples gave different outputs for the same input)",
                        w.model, w.reference, w.executor)
        return result
    except (KeyboardInterrupt, ModelError):
        raise
    except Exception as exc:  # noqa: BLE001 - a check's crash is a result, not a crash
        w.progress.finish()
        if isinstance(exc, CertifyError):
            message = exc.message
        else:
            message = redact(f"{type(exc).__name__}: {exc}")
        log.debug("check %s failed:\n%s", spec.id, traceback.format_exc())
        log.error("check %s errored: %s", spec.id, message)
        return _empty_result(spec, "ERROR", "the check could not complete", message)


def _summarize(spec: CheckSpec, records: dict[int, SampleRecord], data: Dataset,
               diagnose: Callable[[Measurement], None] | None = None,
               ) -> tuple[CheckResult, Measurement]:
    """A check's typed result from its merged records, and its measurement (``diagnose`` may
    add warnings and details to it before it is decided)."""
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
    if diagnose is not None:
        diagnose(m)
    queries = [int(r.get("queries", 0)) for r in ordered]
    verdict = judge(spec, m.metrics, m.warnings, len(errored), m.intervals, m.unsettled)
    # a measurement that states its own method (a random corruption's) keeps it
    details = {"method": spec.check.method, **m.details} if spec.check.method else m.details
    return _typed(spec, {
        "metrics": m.metrics,
        "intervals": {k: list(v) for k, v in m.intervals.items()},
        "details": details,
        "queries": {"total": sum(queries),
                    "mean_per_sample": sum(queries) / len(queries) if queries else 0.0,
                    "reference": sum(int(r.get("ref_queries", 0)) for r in ordered)},
        "error": None,
        "warnings": m.warnings,
        "status": verdict.status,
        "decision": verdict.decision,
        "outcomes": outcomes_doc(spec.check, ordered, len(data)).model_dump(),
        "sample_errors": len(errored),
        # typed beside the evidence (details) and the sentence (decision), for the readers
        "settled": m.settled.model_dump(),
        "decided_by": verdict.decided_by.model_dump(),
    }), m


def _diagnose_chance(spec: CheckSpec, m: Measurement, w: _Run) -> None:
    """A clean accuracy at chance level: probe the other input preprocessings on a seeded,
    class-stratified subset of the data and, when one is clearly better, warn naming it.

    The probe's figures (and the queries it spent, charged to the run's budget but not to the
    check's records) go to the check's ``details["preprocessing_probe"]``.
    """
    metric = spec.check.chance_metric
    value = m.metrics.get(metric) if metric else None
    k = len(w.data.class_names)
    interval = m.intervals.get(metric or "", (None, None))
    if value is None or k < 2 or not probe.at_chance(float(value), interval, k):
        return
    if not isinstance(w.model, Reconfigurable):
        return
    chosen = stratified_subset(w.data.y.numpy(), probe.PROBE_SAMPLES, w.subset_seed)
    idx = torch.from_numpy(chosen)
    info = w.model.info
    current = probe.candidate(info.preprocessing, info.layout)
    log.info("check %s: clean accuracy %s is at chance level (1/%d); probing %d samples "
             "through other preprocessings", spec.id, probe.pct(float(value)), k, len(chosen))
    layouts = probe.layouts_of(w.model)
    refused = w.run_budget.refusal(len(chosen) * len(probe.candidates(layouts, current)))
    if refused is not None:  # never spend part of it: the checks after would find less
        m.details["preprocessing_probe"] = {"skipped": refused}
        log.info("check %s: no preprocessing probe: %s", spec.id, refused)
        return
    try:
        report = probe.probe_preprocessing(w.model, w.data.x[idx], w.data.y[idx], k,
                                           current=current, layouts=layouts,
                                           budget=w.run_budget)
    except BudgetExceeded as exc:
        m.details["preprocessing_probe"] = {"skipped": exc.message}
        return
    fix = probe.chance_diagnosis(report, current, float(value), interval)
    m.details["preprocessing_probe"] = {**report.to_doc(current), "fix": fix}
    if fix is not None:
        m.warnings.append(fix)
        log.warning("check %s: %s", spec.id, fix)
    else:
        log.info("check %s: no other preprocessing does clearly better (best: %s, %s)",
                 spec.id, report.best.candidate.label(), probe.pct(report.best.accuracy))


def _no_hedging(why: str, model: Model, reference: Model | None, executor: Executor) -> None:
    """Stop hedged requests for the rest of the run, in this process and on the workers: with
    a model that answers randomly, which of two answers arrives first would decide a record."""
    for m in (model, reference):
        endpoint = endpoint_of(m)
        if endpoint is not None:
            endpoint.disable_hedging(why)
    executor.disable_hedging(why)


