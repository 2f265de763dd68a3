"""Verdict rules: a check's status from its metrics, intervals, warnings and threshold."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

from certify.results import DecidedBy
from certify.suite import CheckSpec


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _samples_needed(spec: CheckSpec, metrics: Mapping[str, float | None], value: float,
                    interval: tuple[float, float], bounds: list[float]) -> str:
    """How many samples would decide an interval that straddles ``bounds``, in words."""
    from certify.stats import samples_to_decide

    if any(value == b for b in bounds):
        return "no sample size decides it: the point estimate is on the threshold"
    metric = next((m for m in spec.check.metrics
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


class Verdict(NamedTuple):
    """A check's status, the sentence that states the rule, and the rule typed."""

    status: str
    decision: str
    decided_by: DecidedBy


def decide(spec: CheckSpec, metrics: Mapping[str, float | None], warnings: list[str],
           sample_errors: int = 0,
           intervals: Mapping[str, tuple[float | None, float | None]] | None = None,
           unsettled: str | None = None) -> tuple[str, str]:
    """A check's status and the sentence that states its rule (:func:`judge` without the
    typed rule)."""
    v = judge(spec, metrics, warnings, sample_errors, intervals, unsettled)
    return v.status, v.decision


def judge(spec: CheckSpec, metrics: Mapping[str, float | None], warnings: list[str],
          sample_errors: int = 0,
          intervals: Mapping[str, tuple[float | None, float | None]] | None = None,
          unsettled: str | None = None) -> Verdict:
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
    ``unsettled`` says why more samples would not decide a straddling interval (an attack
    that has not converged); the decision then says that instead of a sample size.

    The rule is returned typed too (``decided_by``): what the card and ``certify compare``
    read, so that nothing parses the sentence.
    """
    if spec.threshold is None:
        informational = DecidedBy(rule="no_threshold")
        if warnings:
            return Verdict("WARN", "no threshold (informational); warnings found", informational)
        return Verdict("INFO", "no threshold (informational)", informational)
    t = spec.threshold
    value = metrics.get(t.metric)
    if value is None or not math.isfinite(float(value)):
        return Verdict("INCONCLUSIVE", f"{t.metric} is not a number, so {t.describe()} cannot "
                       "be decided", DecidedBy(rule="not_a_number"))
    value = float(value)
    iv = (intervals or {}).get(t.metric)
    ends = [float(b) for b in iv if b is not None] if iv is not None else []
    usable = len(ends) == 2 and len(iv or ()) == 2 and all(math.isfinite(b) for b in ends)
    if spec.decision == "interval" and usable:
        lo, hi = ends
        said = f"{t.metric} = {_fmt(value)} (95% interval {_fmt(lo)}–{_fmt(hi)})"
        missed = [b for b, out in ((t.min, t.min is not None and hi < t.min),
                                   (t.max, t.max is not None and lo > t.max)) if out]
        if missed:
            return Verdict("FAIL", f"{said} lies wholly outside {t.describe()} (interval rule)",
                           DecidedBy(rule="interval_outside"))
        undecided = [b for b, met in ((t.min, t.min is None or lo >= t.min),
                                  (t.max, t.max is None or hi <= t.max)) if not met]
        if undecided:
            bounds = [float(b) for b in undecided if b is not None]
            why = unsettled or _samples_needed(spec, metrics, value, (lo, hi), bounds)
            return Verdict("INCONCLUSIVE",
                           f"{said} straddles {t.describe()} (interval rule): {why}",
                           DecidedBy(rule="interval_straddles", reason=why))
        rule = f"{said} lies wholly within {t.describe()} (interval rule)"
        met = DecidedBy(rule="interval_within")
    else:
        how = ("point rule" if spec.decision == "point"
               else "point estimate: no interval for this metric")
        if not t.passes(value):
            return Verdict("FAIL", f"{t.metric} = {_fmt(value)} does not meet {t.describe()} "
                           f"({how})", DecidedBy(rule="point_misses"))
        rule = f"{t.metric} = {_fmt(value)} meets {t.describe()} ({how})"
        met = DecidedBy(rule="point_meets")
    if sample_errors:
        said_errors = f"{sample_errors} sample(s) gave non-finite outputs"
        return Verdict("INCONCLUSIVE", rule + f", but {said_errors}",
                       met.model_copy(update={"stopped": ["sample_errors"],
                                              "reason": said_errors}))
    if warnings:
        return Verdict("WARN", rule + "; a warning stops it from passing",
                       met.model_copy(update={"stopped": ["warning"], "reason": warnings[0]}))
    return Verdict("PASS", rule, met)
