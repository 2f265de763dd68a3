"""The run's plan before its first query: what each check may cost, in queries, gradient
evaluations and seconds on this device, and ``--time-budget`` (issue 42 point 1).

**Cost model.** Each check says the most queries one sample can cost it
(:meth:`~certify.checks.Check.max_queries_per_sample`) and, for white-box attacks, the most
gradient evaluations (:meth:`~certify.checks.AttackCheck.gradients_per_sample`). A short
calibration (:func:`calibrate`: a few timed batches of the data through the model, and through
its torch copy's forward and backward pass where there is one) turns them into seconds. Both are
upper bounds: an attack stops on a sample once it is broken, and samples an earlier attack of
the same threat model broke are not attacked again, so runs usually take far less. They bound
the model's time only (the attacks' binarization tests included, at their own bound: every
rung of the ladder at the attack's budget): the checks' own work (transforms, attack steps)
is not priced, and the log says so beside the figure (:data:`NOT_THE_RUN_TIME`; issue
62: a run planned at "at most 6.1 min" took 9.4). The run's time, "expected" and "at most",
is estimated from a pilot of every check (:mod:`certify.engine.pilot`) after this plan.

**Time budget.** :func:`choose_samples` keeps every other check as the suite has it and gives
every attack check the same number of samples (so that the threat models' worst cases are
over common samples), the most whose upper-bound cost fits in what the budget leaves, at
least :data:`MIN_ATTACK_SAMPLES` and at most the data. An attack's binarization test counts as
a fixed cost (its samples at the bound of :func:`binarization_cost`). The choice is recorded
in the run folder's fingerprint, so ``--resume`` continues with the same samples, and it is
stated on the card (each attack row's details, and the card's limitations).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from certify.checks import attack_of
from certify.data import Dataset
from certify.errors import UsageError
from certify.models.base import BatchChecked, Model, QueryCounter, endpoint_of
from certify.models.torchcopy import WhiteBoxUnavailable, transfer_source_of, white_box_of
from certify.results import CheckResult
from certify.suite import CheckSpec

log = logging.getLogger("certify")

#: Images per timed calibration batch, and timed batches (after one untimed warm-up).
CALIBRATION_BATCH = 64
CALIBRATION_ROUNDS = 2
#: The fewest samples a time budget may give each attack check: fewer decide nothing.
MIN_ATTACK_SAMPLES = 20
#: What the plan's seconds leave out, said beside them (issue 62: a run planned at "at most
#: 6.1 min" took 9.4): they are the model's queries and gradient evaluations at the calibrated
#: rates, not the run's time.
NOT_THE_RUN_TIME = ("The checks' own work (transforms, attack steps) comes on top: this is "
                    "not an estimate of the run's time (the run-time estimate follows, from a "
                    "pilot of every check)")
#: Real images the model's batching and its white-box path are tried on before the first check.
TRY_IMAGES = 8


def prepare(model: Model, data: Dataset, device: torch.device, gradients: bool,
            reference: Model | None = None) -> None:
    """Before the first check, on the first :data:`TRY_IMAGES` real images of ``data`` (not
    counted as queries: checks of certify's own adapters, not of the model):

    - a graph exported at batch 1 and proven batchable (the model's, the reference model's)
      must answer them alone as in batches
      (:meth:`~certify.models.base.BatchChecked.confirm_batching`), else it runs per image;
    - with ``gradients`` (the suite has white-box attacks), :func:`try_white_box`: a torch copy
      or program cut that fails makes its rows SKIPPED now, at the cost of seconds, instead of
      failing after the corruption checks' minutes.
    """
    n = min(TRY_IMAGES, len(data))
    if n == 0:
        return
    x, y = data.x[:n].to(device), data.y[:n].to(device)
    for m in (model, reference):
        inner: object = m
        while isinstance(inner, QueryCounter):
            inner = inner.model
        if m is not None and isinstance(inner, BatchChecked) \
                and inner.confirm_batching(x) is not None:
            m.info = inner.info  # the same object unless counted through a wrapper
    if gradients:
        try_white_box(model, x, y)


def try_white_box(model: Model, x: torch.Tensor, y: torch.Tensor) -> str | None:
    """Run the white-box path once on real images ``x`` with labels ``y``: build the torch
    copy (or the program's cut), answer, take a cross-entropy gradient, and apply the output
    head to a 2-class readout as the binarization test does. A failure refuses white-box
    attacks on the model with the reason (their rows are then SKIPPED); returns it, or ``None``
    when the path ran or the model has none."""
    found = white_box_of(model)
    source = found if found is not None else transfer_source_of(model)
    if source is None:
        return None
    try:
        copy = source.torch_copy()
        copy.scores(x)
        _, cut, _, grad = copy.value_and_grad(x, lambda z: torch.nn.functional.cross_entropy(
            z, (y % z.shape[1]).to(z.device), reduction="none"))
        if grad.shape != x.shape:
            raise WhiteBoxUnavailable(f"the gradient has shape {list(grad.shape)} for images "
                                      f"{list(x.shape)}")
        if not bool((grad.flatten(1).abs().amax(1) > 0).any()):
            raise WhiteBoxUnavailable(
                f"the input gradient is zero on all {len(x)} images tried: something inside the "
                "network masks it, so a white-box attack would find nothing and prove nothing")
    except WhiteBoxUnavailable as exc:
        why = str(exc)
    except Exception as exc:  # noqa: BLE001 - any failure of the copy: said, not fatal
        why = f"{type(exc).__name__}: {str(exc)[:200]}"
    else:
        if copy.head:
            try:  # the binarization test's readout: without a usable head it runs without one
                copy.apply_head(torch.zeros(len(x), 2, device=cut.device))
            except WhiteBoxUnavailable as exc:
                log.info("white-box path: the output head cannot run on a planted readout "
                         "(%s): the binarization test keeps no head", exc)
        return None
    why = f"the white-box path failed on real images before the first check: {why}"
    log.warning("%s; white-box attacks are skipped", why)
    source.refuse_white_box(why)
    if found is None:  # an endpoint's transfer attacks: the surrogate's copy failed
        why = f"the surrogate's {why}"
    if source is not model:
        model.info = dataclasses.replace(model.info, white_box=f"unavailable: {why}")
    return why


@dataclass(frozen=True)
class Rates:
    """Measured seconds per image: a model query, and a gradient evaluation of the torch copy
    (``None`` where not measured: an endpoint, or no torch copy)."""

    query_s: float | None
    gradient_s: float | None
    how: str

    def seconds(self, queries: int, gradients: int) -> float | None:
        """The time ``queries`` and ``gradients`` take at these rates (None if unknown)."""
        if self.query_s is None or (gradients and self.gradient_s is None):
            return None
        return queries * self.query_s + gradients * (self.gradient_s or 0.0)


def calibrate(model: Model, data: Dataset, gradients: bool = True,
              device: torch.device | None = None, lanes: int = 1) -> Rates:
    """Time a few batches of ``data`` (on ``device``, default where the data is) through
    ``model`` (and, with ``gradients``, its torch copy's forward and backward pass), not
    counted as queries: only for a model in this process (an endpoint's queries may be paid
    for, so it is not calibrated). ``lanes``: batches at once, on threads, as the in-process
    executor runs them (two lanes on two cores answered 1.5x the images per second of one
    call in the demo)."""
    if endpoint_of(model) is not None:
        return Rates(None, None, "not measured: the model is an endpoint (queries may cost)")
    n = min(CALIBRATION_BATCH, len(data))
    x = data.x[:n] if device is None else data.x[:n].to(device)
    query_s = _timed(lambda: model.predict(x), lanes) / n
    gradient_s = None
    found = white_box_of(model) if gradients else None
    if found is not None:
        try:
            copy = found.torch_copy()
            y = data.y[:n].to(x.device)

            def grad() -> object:
                return copy.value_and_grad(x, lambda z: torch.nn.functional.cross_entropy(
                    z, y.to(z.device), reduction="none"))
            gradient_s = _timed(grad, lanes) / n
        except Exception:  # noqa: BLE001 - a copy that fails: try_white_box says why
            gradient_s = None
    how = (f"measured on {n} images{f' in {lanes} lanes' if lanes > 1 else ''}: "
           f"{1 / query_s:,.0f} queries/s"
           + (f", {1 / gradient_s:,.0f} gradient evaluations/s" if gradient_s else ""))
    return Rates(query_s, gradient_s, how)


def _timed(call: Callable[[], object], lanes: int = 1) -> float:
    """The fastest of :data:`CALIBRATION_ROUNDS` timed calls of ``call`` after a warm-up, per
    call: with ``lanes`` > 1, that many calls at once on threads, their time divided by it."""
    if lanes > 1:
        pool = ThreadPoolExecutor(lanes)

        def together() -> None:
            for f in [pool.submit(call) for _ in range(lanes)]:
                f.result()
        try:
            return _timed(together) / lanes
        finally:
            pool.shutdown()
    call()
    best = math.inf
    for _ in range(CALIBRATION_ROUNDS):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-9)


def per_sample(spec: CheckSpec) -> tuple[int | None, int]:
    """(most queries, most gradient evaluations) one sample can cost ``spec``'s check."""
    attack = attack_of(spec.check)
    gradients = attack.gradients_per_sample() if attack is not None else 0
    return spec.check.max_queries_per_sample(), gradients


def binarization_cost(spec: CheckSpec, data: Dataset) -> tuple[int, int]:
    """(samples, most queries in all) of an attack check's binarization test (0, 0 without
    one): at most the check's own samples are tested."""
    attack = attack_of(spec.check)
    if attack is None:
        return 0, 0
    tested, each = attack.binarization_queries()
    tested = min(tested, samples_of(spec, data))
    return tested, tested * each


def samples_of(spec: CheckSpec, data: Dataset) -> int:
    """How many samples the check evaluates."""
    return min(spec.samples or len(data), len(data))


def log_plan(checks: Sequence[CheckSpec], data: Dataset, skips: Mapping[str, str],
             rates: Rates | None, request_batch: int | None = None) -> int | None:
    """Log, before any query, the most each check can cost: queries (and gradient
    evaluations) per sample times its samples, and the time that takes at ``rates``.

    For an endpoint (``request_batch``: its images per request), also the requests planned:
    per check, its samples in batches of ``request_batch``, each batch at most one request per
    query one sample can cost (every step of a batch, an attack's iteration or a search's
    candidates for each of its samples, fills whole requests). Returns that sum (``None``
    for a model in this process)."""
    total_q, total_s, unknown, total_r = 0, 0.0, [], 0
    for spec in checks:
        if spec.id in skips:
            continue
        queries, gradients = per_sample(spec)
        if queries is None:
            unknown.append(spec.id)
            continue
        n = samples_of(spec, data)
        bt_n, bt_q = binarization_cost(spec, data)
        total_q += queries * n + bt_q
        # the test's queries go one planted problem at a time: at most one request each
        requests = (None if request_batch is None
                    else math.ceil(n / max(1, request_batch)) * queries + bt_q)
        total_r += requests or 0
        secs = rates.seconds(queries * n + bt_q, gradients * n) if rates else None
        if secs is not None:
            total_s += secs
        note = spec.check.plan_note()
        log.info("query plan: %s at most %s queries%s per sample x %s samples%s%s%s%s", spec.id,
                 f"{queries:,}", f" and {gradients:,} gradient evaluations" if gradients
                 else "", f"{n:,}",
                 f", and its binarization test at most {bt_q:,} queries on {bt_n} samples"
                 if bt_q else "",
                 f", model time at most {_duration(secs)}" if secs is not None else "",
                 f", at most {requests:,} requests" if requests is not None else "",
                 f" ({note})" if note else "")
    if total_q:
        log.info("query plan: at most %s queries%s for the checks above%s (the others bound "
                 "theirs by their own budgets)", f"{total_q:,}",
                 f" in at most {total_r:,} requests of {request_batch} images"
                 if request_batch is not None else "",
                 f"; their model time is at most {_duration(total_s)} on this device "
                 f"({rates.how}). {NOT_THE_RUN_TIME}"
                 if rates and rates.query_s is not None else "")
    return None if request_batch is None else total_r


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown time"
    return f"{seconds:,.0f} s" if seconds < 120 else f"{seconds / 60:,.1f} min"


def choose_samples(checks: Sequence[CheckSpec], data: Dataset, rates: Rates,
                   budget_s: float) -> dict[str, int]:
    """Samples per attack check within ``budget_s`` seconds (see the module docstring):
    check id -> samples. Refused (:class:`~certify.errors.UsageError`) where the rates are
    unknown or the budget cannot give each attack :data:`MIN_ATTACK_SAMPLES` samples."""
    if rates.query_s is None:
        raise UsageError(f"--time-budget needs the model's speed, which was {rates.how}",
                         hint="give the checks' samples in the suite, or --samples N")
    fixed, per = 0.0, 0.0
    attacks = []
    for spec in checks:
        queries, gradients = per_sample(spec)
        secs = rates.seconds(queries or 0, gradients)
        if secs is None:
            raise UsageError(f"--time-budget cannot price check {spec.id}: {rates.how}",
                             hint="give the checks' samples in the suite instead")
        attack = attack_of(spec.check)
        if attack is not None:
            attacks.append(spec.id)
            per += secs
            # its binarization test: a fixed cost (its samples, whatever the attack's)
            tested, each = attack.binarization_queries()
            fixed += rates.seconds(min(tested, len(data)) * each, 0) or 0.0
        else:
            fixed += secs * samples_of(spec, data)
    if not attacks:
        return {}
    left = budget_s - fixed
    n = min(len(data), int(left / per)) if per > 0 else len(data)
    if n < MIN_ATTACK_SAMPLES:
        raise UsageError(
            f"--time-budget {budget_s:,.0f} s leaves {max(left, 0):,.0f} s for the attacks "
            f"after the other checks' {fixed:,.0f} s, enough for {max(n, 0)} sample(s) each "
            f"at {per:,.2f} s per sample (an upper bound, {rates.how}); at least "
            f"{MIN_ATTACK_SAMPLES} are needed",
            hint=f"raise --time-budget to about {fixed + MIN_ATTACK_SAMPLES * per:,.0f} s")
    return {i: n for i in attacks}


@dataclass(frozen=True)
class TimeBudget:
    """``--time-budget``'s choice: the budget, the rates it was priced at, and the samples it
    gave each attack check (recorded in the run folder's fingerprint)."""

    seconds: float
    rates: Rates
    samples: dict[str, int]

    def fingerprint(self) -> dict[str, object]:
        """What ``--resume`` must find again: the budget and the samples chosen."""
        return {"seconds": self.seconds, "samples": dict(sorted(self.samples.items()))}

    def stated(self, result: CheckResult) -> CheckResult:
        """``result`` with the budget's choice in its details (for the checks it chose for)."""
        if result.id not in self.samples or result.status == "SKIPPED":
            return result
        doc = {"seconds": self.seconds, "samples": self.samples[result.id],
               "rates": self.rates.how,
               "rule": "every attack check gets the same number of samples, the most whose "
                       "upper-bound cost fits in what the budget leaves after the other checks"}
        return result.model_copy(update={"details": {**result.details, "time_budget": doc}})


def parse_duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``10m``, ``1.5h``; :class:`UsageError` otherwise."""
    raw = text.strip().lower()
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(raw[-1:], None)
    number = raw[:-1] if scale is not None else raw
    try:
        value = float(number) * (scale or 1.0)
    except ValueError:
        raise UsageError(f"--time-budget {text!r} is not a duration",
                         hint="e.g. 600, 600s, 10m or 1.5h") from None
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"--time-budget {text!r} must be a positive duration",
                         hint="e.g. 10m")
    return value
