"""The rows of ``certify compare``: one per threat model and one per check, each built once
from what the two runs measured (:class:`Row`, immutable).

A row's change is measured on one compared quantity (:class:`Change`): a rate of per-sample
outcomes (paired: McNemar's exact test and Newcombe's paired interval; unpaired: Newcombe's
interval for independent samples), a mean of per-sample scores (the bootstrap, paired where
the samples are), else the normal approximation from the two runs' own intervals. The gate
that decides each row is :mod:`certify.report.compare`, whose docstring says what is compared
and why; the statistics are :mod:`certify.stats`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING

from pydantic import JsonValue

from certify.kinds import KINDS, Metric
from certify.norms import threat_name
from certify.report.compare_inputs import (
    converged,
    converged_all,
    inherited_from,
    outcome_bits,
    outcome_values,
    paired_checks,
    same_samples,
    selected_samples,
    threat_model_of,
    why_not_comparable,
)
from certify.results import CheckResult, RunResult, WorstCase, unpack_bits
from certify.stats import (
    BOOTSTRAP,
    IntervalAt,
    bootstrap_diffs,
    bootstrap_interval,
    bootstrap_p,
    mcnemar_exact,
    newcombe_paired,
    newcombe_unpaired,
    normal_interval,
    p_from_interval,
    two_sided_z,
)

if TYPE_CHECKING:
    import numpy as np


class Outcome(str, Enum):
    """A row's outcome (:attr:`Row.outcome`); its value is what the text and the JSON say."""

    NO_CHANGE = "no change"
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    NON_INFERIOR = "non-inferior"
    INCONCLUSIVE = "inconclusive"
    NOT_COMPARABLE = "not comparable"
    NOT_COMPARED = "not compared"

    def __str__(self) -> str:
        return self.value


class RowRole(str, Enum):
    """A row's role: it gates (a threat model's row, or a check that is not an attack row
    summarised by one), or it is evidence for a threat model's row (shown, not gating)."""

    GATE = "gate"
    EVIDENCE = "evidence"

    def __str__(self) -> str:
        return self.value


# --- a row ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    """One row's comparison: a check's, or a threat model's (``kind`` ``threat_model``).

    Built once from what was measured (:class:`Change`); the gate's decision is added with
    :func:`dataclasses.replace` (:func:`certify.report.compare.compare`). The fields' order is
    the JSON's."""

    id: str
    kind: str
    metric: str
    unit: str
    direction: str
    has_threshold: bool
    old: float | None
    old_interval: list[float | None]
    new: float | None
    new_interval: list[float | None]
    compared: str = ""
    method: str = ""
    paired: bool = False
    n_old: int = 0
    n_new: int = 0
    discordant: dict[str, int] | None = None
    old_value: float | None = None
    new_value: float | None = None
    change: float | None = None
    change_interval: list[float] | None = None
    confidence: float | None = None
    p: float | None = None
    p_holm: float | None = None
    tolerance: float = 0.0
    outcome: Outcome = Outcome.NOT_COMPARED
    reason: str = ""
    converged_old: bool | None = None
    converged_new: bool | None = None
    role: RowRole = RowRole.GATE
    evidence_for: str | None = None
    #: Whether this row, when not decided, keeps the gate open (exit 6): ``False`` for a row
    #: one run did not evaluate (SKIPPED, or a threat model all of whose attacks were SKIPPED
    #: in one run), which is listed as not compared with why, and neither gates nor blocks.
    blocks: bool = True
    #: Inconclusive rows: about how many samples (paired: pairs) would decide the row at the
    #: observed change, with 80% power (see :func:`certify.report.compare.samples_to_decide`).
    samples_needed: int | None = None
    attacks: list[str] = field(default_factory=list)
    #: Attacks of the threat model left out of its comparison because one run did not
    #: evaluate them (the rows are compared on the attacks both runs evaluated).
    left_out: list[str] = field(default_factory=list)
    norm: str | None = None
    epsilon: float | None = None
    #: The change's interval at any confidence (``None``: not measured); not exported.
    interval_at: IntervalAt | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, JsonValue]:
        """Plain JSON values."""
        d = asdict(self)
        del d["interval_at"]
        d["outcome"], d["role"] = self.outcome.value, self.role.value
        return d


@dataclass(frozen=True)
class Head:
    """What a row shows of each run before any comparison: its id, metric and the runs' own
    figures (the card's)."""

    id: str
    kind: str
    metric: str
    unit: str
    direction: str
    has_threshold: bool
    old: float | None = None
    old_interval: list[float | None] = field(default_factory=list)
    new: float | None = None
    new_interval: list[float | None] = field(default_factory=list)
    attacks: list[str] = field(default_factory=list)
    norm: str | None = None
    epsilon: float | None = None


@dataclass(frozen=True)
class Change:
    """How a row's change was measured: the compared quantity in each run, the change, its
    p-value and its interval at any confidence; ``reason`` says why something is missing.
    ``unit`` and ``direction`` are the compared quantity's where they are not the metric's
    (a rate of per-sample outcomes)."""

    compared: str = ""
    method: str = ""
    paired: bool = False
    n_old: int = 0
    n_new: int = 0
    discordant: dict[str, int] | None = None
    old_value: float | None = None
    new_value: float | None = None
    change: float | None = None
    p: float | None = None
    interval_at: IntervalAt | None = None
    reason: str = ""
    unit: str | None = None
    direction: str | None = None


def _row(head: Head, m: Change | None = None, *, tolerance: float = 0.0, reason: str = "",
         outcome: Outcome = Outcome.NOT_COMPARED, blocks: bool = True,
         converged_: tuple[bool | None, bool | None] = (None, None), role: RowRole = RowRole.GATE,
         evidence_for: str | None = None, left_out: Sequence[str] = ()) -> Row:
    """The row of ``head`` measured as ``m`` (none: not measured, ``reason`` says why), with
    the tolerance on its compared quantity (percentage points for rates, percent of OLD for
    scores) where a change was measured."""
    m = m or Change()
    unit = m.unit or head.unit
    if m.change is None:
        tol = 0.0
    else:
        tol = tolerance / 100 if unit == "rate" else tolerance / 100 * abs(m.old_value or 0.0)
    return Row(id=head.id, kind=head.kind, metric=head.metric, unit=unit,
               direction=m.direction or head.direction, has_threshold=head.has_threshold,
               old=head.old, old_interval=head.old_interval, new=head.new,
               new_interval=head.new_interval, compared=m.compared, method=m.method,
               paired=m.paired, n_old=m.n_old, n_new=m.n_new, discordant=m.discordant,
               old_value=m.old_value, new_value=m.new_value, change=m.change, p=m.p,
               tolerance=tol, outcome=outcome, reason=reason or m.reason,
               converged_old=converged_[0], converged_new=converged_[1], role=role,
               evidence_for=evidence_for, blocks=blocks, attacks=head.attacks,
               left_out=list(left_out), norm=head.norm, epsilon=head.epsilon,
               interval_at=m.interval_at)


# --- measuring a change -------------------------------------------------------------------------

def _rate_change(so: np.ndarray, sn: np.ndarray, bo: np.ndarray, bn: np.ndarray, paired: bool,
                 direction: str, compared: str) -> Change:
    """The change of the share of the evaluated samples (``so``, ``sn``) with an outcome
    (``bo``, ``bn``), better in ``direction``: paired over the common samples (McNemar, and
    Newcombe's paired interval) or unpaired (Newcombe's interval for independent samples)."""
    base = Change(compared=compared, unit="rate", direction=direction)
    if not paired:
        no, nn = int(so.sum()), int(sn.sum())
        if no == 0 or nn == 0:
            return replace(base, reason="a run evaluated no sample")
        ko, kn = int(bo[so].sum()), int(bn[sn].sum())

        def unpaired_at(conf: float) -> tuple[float, float]:
            return newcombe_unpaired(ko, no, kn, nn, conf)

        return replace(base, method="unpaired: Newcombe hybrid score interval", n_old=no,
                       n_new=nn, old_value=ko / no, new_value=kn / nn,
                       change=kn / nn - ko / no, p=p_from_interval(unpaired_at),
                       interval_at=unpaired_at)
    common = so & sn
    a, b = bo[common], bn[common]
    both, old_only = int((a & b).sum()), int((a & ~b).sum())
    new_only, neither = int((~a & b).sum()), int((~a & ~b).sum())
    n = int(common.sum())
    if n == 0:
        return replace(base, reason="no sample evaluated in both runs")
    # worse/better in the direction of the compared outcome
    worse, better = (old_only, new_only) if direction == "higher" else (new_only, old_only)
    ko, kn = int(a.sum()), int(b.sum())

    def paired_at(conf: float) -> tuple[float, float]:
        return newcombe_paired(both, old_only, new_only, neither, conf)

    return replace(base, method="paired: McNemar exact, Newcombe paired interval",
                   paired=True, n_old=n, n_new=n, old_value=ko / n, new_value=kn / n,
                   change=kn / n - ko / n, discordant={"worse": worse, "better": better},
                   p=mcnemar_exact(worse, better), interval_at=paired_at)


def _score_change(co: CheckResult, cn: CheckResult, key: str, paired: bool) -> Change:
    """The change of the mean of per-sample ``values[key]``, by the bootstrap: paired over the
    samples both runs have a value for (at least two), else unpaired."""
    import numpy as np

    vo, vn = outcome_values(co, key), outcome_values(cn, key)
    compared = f"mean of per-sample {key}"
    common = sorted(set(vo) & set(vn))
    paired = paired and len(common) >= 2
    if paired:
        a, b = np.array([vo[i] for i in common]), np.array([vn[i] for i in common])
    else:
        a, b = np.array(list(vo.values())), np.array(list(vn.values()))
        if len(a) < 2 or len(b) < 2:
            return Change(compared=compared, reason="too few per-sample values")
    boot = bootstrap_diffs(a, b, paired)
    old_value, new_value = float(a.mean()), float(b.mean())
    return Change(compared=compared, paired=paired,
                  method=f"{'paired' if paired else 'unpaired'} bootstrap ({BOOTSTRAP} "
                         "resamples)",
                  n_old=len(a), n_new=len(b), old_value=old_value, new_value=new_value,
                  change=new_value - old_value, p=bootstrap_p(boot),
                  interval_at=bootstrap_interval(boot))


def _interval_change(head: Head, compared: str = "") -> Change:
    """The change from the two runs' own 95% intervals (normal approximation); ``compared``:
    what the row says it compares when the runs have no interval to compare with."""
    z95 = two_sided_z(0.95)
    ses = []
    for v, iv in ((head.old, head.old_interval), (head.new, head.new_interval)):
        if v is None or len(iv) != 2 or iv[0] is None or iv[1] is None:
            return Change(compared=compared, reason="no interval to compare with")
        ses.append((float(iv[1]) - float(iv[0])) / (2 * z95))
    assert head.old is not None and head.new is not None
    se = math.hypot(*ses)
    m = Change(compared=f"{head.metric} (from the runs' 95% intervals)",
               method="unpaired: normal approximation", old_value=head.old,
               new_value=head.new)
    if se == 0:
        return replace(m, reason="both intervals have zero width")
    interval_at = normal_interval(head.new - head.old, se)
    return replace(m, change=head.new - head.old, interval_at=interval_at,
                   p=p_from_interval(interval_at))


# --- a check's row ------------------------------------------------------------------------------

def _metric_of(c: CheckResult) -> Metric | None:
    """The metric a check is compared on: its threshold's, else its exported headline metric,
    else its first thresholdable metric with a direction."""
    cls = KINDS[c.kind]
    name = (c.threshold.metric if c.threshold is not None
            else cls.export.metric if cls.export is not None else None)
    if name is None:
        name = next((m.name for m in cls.metrics if m.threshold and m.direction != "none"), None)
    return next((m for m in cls.metrics if m.name == name), None)


def _skip_reason(c: CheckResult) -> str:
    """Why a run SKIPPED a check: its decision sentence, cut to 160 characters."""
    text = str(c.decision or "SKIPPED").strip()
    return text if len(text) <= 160 else text[:157].rstrip() + "…"


def _check_head(co: CheckResult, cn: CheckResult, metric: Metric) -> Head:
    """A check's row head on ``metric``: each run's value and 95% interval."""

    def val(c: CheckResult) -> tuple[float | None, list[float | None]]:
        iv = c.intervals.get(metric.name)
        return c.metric(metric.name), (list(iv) if iv else [None, None])

    (vo, io), (vn, inn) = val(co), val(cn)
    return Head(id=co.id, kind=co.kind, metric=metric.name, unit=metric.unit,
                direction=metric.direction, has_threshold=co.threshold is not None, old=vo,
                old_interval=io, new=vn, new_interval=inn)


def _not_evaluated(co: CheckResult, cn: CheckResult) -> tuple[str, bool] | None:
    """Why a check has no change to measure (its evaluation failed, or a run SKIPPED it) and
    whether the row then blocks; ``None`` when both runs measured it."""
    for c, which in ((co, "OLD"), (cn, "NEW")):
        if c.status == "ERROR" or (c.metrics is None and c.status != "SKIPPED"):
            return (f"{which} has no measurement ({c.status}): its evaluation failed, so the "
                    "gate stays open"), True
    if cn.status == "SKIPPED":
        # skipped in both runs, nothing was lost; evaluated in OLD and not in NEW, the
        # release dropped evidence the last one had: the gate stays open
        blocks = co.status != "SKIPPED" and co.threshold is not None
        reason = f"NEW did not evaluate it: {_skip_reason(cn)}"
        if blocks:
            reason += (f" (OLD evaluated it: {co.status}), so the release dropped evidence "
                       "and the gate stays open")
        return reason, blocks
    if co.status == "SKIPPED":
        return f"OLD did not evaluate it: {_skip_reason(co)}", False
    return None


def _check_change(co: CheckResult, cn: CheckResult, head: Head, seeds_equal: bool) -> Change:
    """How a check measured by both runs changed on its row's metric (``seeds_equal``: both
    ran the same samples of the same data with the same seeds)."""
    cls = KINDS[co.kind]
    name = head.metric
    so, sn = selected_samples(co), selected_samples(cn)
    paired = (seeds_equal and so is not None and sn is not None and so.shape == sn.shape
              and co.outcomes is not None and cn.outcomes is not None and bool(
                  (unpack_bits(co.outcomes.selected, co.outcomes.n)
                   == unpack_bits(cn.outcomes.selected, cn.outcomes.n)).all()))
    if name in cls.compare_outcomes:
        bit, direction = cls.compare_outcomes[name]
        compared = f"share of all samples '{bit}'"
        if so is None or sn is None:  # no per-sample outcomes kept
            return _interval_change(head, compared)
        return _rate_change(so, sn, outcome_bits(co, bit), outcome_bits(cn, bit), paired,
                            direction, compared)
    key = cls.compare_values.get(name)
    if key is not None and all(c.outcomes is not None and key in c.outcomes.values
                               for c in (co, cn)):
        return _score_change(co, cn, key, paired)
    # a rate with no per-sample outcome (its denominator is the check's own, e.g. the
    # answered inputs) or a score without per-sample values: from the runs' intervals
    return _interval_change(head)


def _check_row(co: CheckResult, cn: CheckResult, seeds_equal: bool, tolerance: float,
               role: RowRole, evidence_for: str | None) -> Row:
    """One check's row, compared on its metric (:func:`_metric_of`); ``role`` and
    ``evidence_for`` place it (a gate, or evidence for a threat model's row)."""
    conv = (converged(co), converged(cn))
    metric = _metric_of(co)
    if metric is None:
        head = Head(id=co.id, kind=co.kind, metric="", unit="", direction="none",
                    has_threshold=co.threshold is not None)
        return _row(head, reason="no metric with a direction to compare", converged_=conv,
                    role=role, evidence_for=evidence_for)
    head = _check_head(co, cn, metric)
    unevaluated = _not_evaluated(co, cn)
    if unevaluated is not None:
        reason, blocks = unevaluated
        return _row(head, reason=reason, blocks=blocks, converged_=conv, role=role,
                    evidence_for=evidence_for)
    return _row(head, _check_change(co, cn, head, seeds_equal), tolerance=tolerance,
                converged_=conv, role=role, evidence_for=evidence_for)


def _not_comparable_row(co: CheckResult | None, cn: CheckResult | None, why: str, role: RowRole,
                        evidence_for: str | None) -> Row:
    """The row of a check that cannot be compared (another suite version or threat model)."""
    c = co if co is not None else cn
    assert c is not None
    head = Head(id=c.id, kind=c.kind, metric="", unit="", direction="none",
                has_threshold=c.threshold is not None)
    return _row(head, reason=why, outcome=Outcome.NOT_COMPARABLE, role=role,
                evidence_for=evidence_for)


def check_rows(old: RunResult, new: RunResult, threats: list[Row], tolerance: float
               ) -> list[Row]:
    """Every check's row, OLD's order first; an attack row is evidence for its threat
    model's row (never a gate), also when its threat model has no row (e.g. every attack of it
    was SKIPPED), unless it errored."""
    seeds_o, seeds_n = old.measurement.seeds, new.measurement.seeds
    evidence_for = {a: t.id for t in threats for a in t.attacks}
    named = {(t.norm, t.epsilon): t.id for t in threats}
    rows = []
    for co, cn in paired_checks(old, new):
        c = co if co is not None else cn
        assert c is not None
        errored = any(x is not None and x.status == "ERROR" for x in (co, cn))
        role, of = RowRole.GATE, None
        if c.id in evidence_for or (c.kind == "attack" and not errored):
            role, of = RowRole.EVIDENCE, evidence_for.get(c.id) or _threat_of(co, cn, named)
        why = why_not_comparable(co, cn)
        if why is not None or co is None or cn is None:
            rows.append(_not_comparable_row(co, cn, why or "", role, of))
            continue
        # paired only on the very same samples (the per-sample outcomes are by position in
        # the evaluated data) with the same seeds
        same_seed = (seeds_o.checks.get(co.id) == seeds_n.checks.get(co.id)
                     and seeds_o.suite == seeds_n.suite
                     and same_samples(old.measurement.data, new.measurement.data))
        rows.append(_check_row(co, cn, same_seed, tolerance, role, of))
    return rows


def _threat_of(co: CheckResult | None, cn: CheckResult | None,
               named: dict[tuple[str | None, float | None], str]) -> str:
    """The threat-model row an attack row is evidence for, from its details (``norm``,
    ``epsilon``) in either run; a SKIPPED row records none, so it is named by its check."""
    for c in (co, cn):
        key = None if c is None else threat_model_of(c)
        if key is not None:
            return named.get(key, threat_row_id(*key))
    return "its threat model"


# --- a threat model's row -----------------------------------------------------------------------

def threat_row_id(norm: str, epsilon: float) -> str:
    """A threat model's row id: ``threat model L∞ 8/255`` (the card's name for it)."""
    return f"threat model {threat_name(norm, epsilon)}"


#: A threat model in OLD and in NEW: its row id and its worst-case rows (``None`` where a run
#: has none).
ThreatPair = tuple[str, WorstCase | None, WorstCase | None]


def _threat_models(old: RunResult, new: RunResult) -> list[ThreatPair]:
    """Each threat model of either run with its row in OLD and in NEW (``None`` where a run
    has none), OLD's order first; ids made unique by ε where two share a name."""
    rows: dict[tuple[str, float], list[WorstCase | None]] = {}
    for k, run in enumerate((old, new)):
        for w in run.measurement.attack_worst_case:
            rows.setdefault((w.norm, float(w.epsilon)), [None, None])[k] = w
    names = [threat_row_id(norm, eps) for norm, eps in rows]
    out = []
    for ((_, eps), (wo, wn)), name in zip(rows.items(), names, strict=True):
        if names.count(name) > 1:
            name += f" (ε={eps:g})"
        out.append((name, wo, wn))
    return out


def _threat_outcomes(checks: list[CheckResult]) -> tuple[np.ndarray, np.ndarray] | None:
    """A threat model's evaluated samples and its robust ones (robust to every attack), from
    its attack rows' per-sample outcomes; ``None`` when a row kept none."""
    sel: np.ndarray | None = None
    robust: np.ndarray | None = None
    for c in checks:
        s = selected_samples(c)
        if s is None or (sel is not None and s.shape != sel.shape):
            return None
        r = outcome_bits(c, "robust")
        sel = s if sel is None else sel & s
        robust = r if robust is None else robust & r
    if sel is None or robust is None:
        return None
    return sel, robust & sel


def _threat_head(tm_id: str, wo: WorstCase | None, wn: WorstCase | None) -> Head:
    """A threat model's row head: each run's worst-case robust accuracy and its interval."""
    w = wo if wo is not None else wn
    assert w is not None
    ids = list(dict.fromkeys([*(wo.attacks if wo else []), *(wn.attacks if wn else [])]))
    return Head(id=tm_id, kind="threat_model", metric="robust_accuracy", unit="rate",
                direction="higher",
                has_threshold=any(x is not None and x.threshold is not None for x in (wo, wn)),
                old=None if wo is None else wo.robust_accuracy,
                old_interval=list(wo.interval) if wo is not None and wo.interval else [None, None],
                new=None if wn is None else wn.robust_accuracy,
                new_interval=list(wn.interval) if wn is not None and wn.interval else [None, None],
                attacks=ids, norm=w.norm, epsilon=float(w.epsilon))


@dataclass(frozen=True)
class _Attacks:
    """A threat model's attacks in the two runs: those both evaluated (``common``), the others
    (``left_out``, with ``skipped`` saying which run SKIPPED each), or why they cannot be
    compared (``why``: an attack not comparable, or one that errored in a run)."""

    common: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    why: str = ""
    outcome: Outcome = Outcome.NOT_COMPARED


def _threat_attacks(ids: list[str], wo: WorstCase | None, wn: WorstCase | None,
                    checks_o: dict[str, CheckResult], checks_n: dict[str, CheckResult]
                    ) -> _Attacks:
    """Which attacks of a threat model its two rows can be compared on (:class:`_Attacks`)."""
    for i in ids:
        why = why_not_comparable(checks_o.get(i), checks_n.get(i))
        if why is not None:
            return _Attacks(why=f"its attack {i}: {why}", outcome=Outcome.NOT_COMPARABLE)
    skipped: list[str] = []
    for x, which, checks in ((wo, "OLD", checks_o), (wn, "NEW", checks_n)):
        left = [i for i in ids if x is None or i not in x.attacks]
        failed = [i for i in left if checks[i].status != "SKIPPED"]
        if failed:  # an attack that errored in that run: its worst case left it out
            return _Attacks(why=(f"{which}'s worst case leaves out {', '.join(failed)} ("
                                 + ", ".join(f"{i}: {checks[i].status}" for i in failed)
                                 + "): the two worst cases are over different attacks"))
        skipped += [f"{i} (SKIPPED in {which})" for i in left]
    common = [i for i in ids if wo is not None and wn is not None
              and i in wo.attacks and i in wn.attacks]
    return _Attacks(common=common, left_out=[i for i in ids if i not in common],
                    skipped=skipped)


def _inherited_breaks(co: list[CheckResult], cn: list[CheckResult], left_out: list[str]
                      ) -> list[str]:
    """The attack rows compared that carry breaks of an attack left out (a later attack takes
    over the samples an earlier one broke), with the run, e.g. ``b (OLD)``."""
    return sorted({f"{c.id} ({which})" for c, which in [*((c, "OLD") for c in co),
                                                        *((c, "NEW") for c in cn)]
                   if set(inherited_from(c)) & set(left_out)})


def _threat_change(head: Head, wo: WorstCase, wn: WorstCase, co: list[CheckResult],
                   cn: list[CheckResult], attacks: _Attacks, same_seeds: bool) -> Change:
    """How the share of samples robust to every attack both runs evaluated changed; from the
    runs' intervals when the per-sample outcomes cannot give it."""
    so, sn = _threat_outcomes(co), _threat_outcomes(cn)
    # over all its attacks, the bitmaps must give the rows' own worst case (they do, from the
    # same records); over the common attacks they give that subset's worst case
    usable = so is not None and sn is not None and bool(attacks.left_out or (
        (int(so[0].sum()), int(so[1].sum())) == (wo.n, wo.n_robust)
        and (int(sn[0].sum()), int(sn[1].sum())) == (wn.n, wn.n_robust)))
    common, skipped = ", ".join(attacks.common), ", ".join(attacks.skipped)
    if so is None or sn is None or not usable:
        if attacks.left_out:
            return Change(reason="the runs kept no per-sample outcomes to compare it on the "
                                 f"attacks both evaluated ({common}; left out: {skipped})")
        return _interval_change(head)
    # paired when every attack evaluated the very same samples in both runs
    paired = same_seeds and all(
        (a.outcomes and b.outcomes and a.outcomes.n == b.outcomes.n
         and a.outcomes.selected == b.outcomes.selected)
        for a, b in zip(co, cn, strict=True))
    compared = "share of all samples robust to every attack of the threat model"
    if attacks.left_out:
        compared += f" that both runs evaluated ({common}; left out: {skipped})"
    return _rate_change(so[0], sn[0], so[1], sn[1], paired, "higher", compared)


def threat_rows(old: RunResult, new: RunResult, tolerance: float) -> list[Row]:
    """Each threat model's row (of either run), OLD's order first."""
    return [_threat_row(tm_id, wo, wn, old, new, tolerance)
            for tm_id, wo, wn in _threat_models(old, new)]


def _threat_row(tm_id: str, wo: WorstCase | None, wn: WorstCase | None, old: RunResult,
                new: RunResult, tolerance: float) -> Row:
    """One threat model's comparison (``wo``, ``wn``: its worst-case rows, either may be
    ``None``), on the share of samples robust to every attack of it that both runs evaluated.

    An attack one run SKIPPED (the scheduler found it adds nothing there, or the model gives
    no gradients) is left out of both sides, and the row says so; an attack that errored in
    a run keeps the row from being compared (its worst case left it out), which keeps the gate
    open. A threat model with no attack both runs evaluated is not compared and, when that is
    because of SKIPPED attacks only, does not block.
    """
    head = _threat_head(tm_id, wo, wn)
    checks_o = {c.id: c for c in old.checks}
    checks_n = {c.id: c for c in new.checks}
    attacks = _threat_attacks(head.attacks, wo, wn, checks_o, checks_n)
    if attacks.why:
        return _row(head, reason=attacks.why, outcome=attacks.outcome)
    left_out = attacks.left_out
    if not attacks.common:
        # every attack SKIPPED in NEW that OLD evaluated: the release dropped the evidence
        blocks = wo is not None and any(wn is None or i not in wn.attacks for i in wo.attacks)
        reason = "no attack of it was evaluated in both runs: " + ", ".join(attacks.skipped)
        if blocks:
            reason += " (OLD evaluated it), so the gate stays open"
        return _row(head, reason=reason, blocks=blocks, left_out=left_out)
    assert wo is not None and wn is not None
    co, cn = [checks_o[i] for i in attacks.common], [checks_n[i] for i in attacks.common]
    inherited = _inherited_breaks(co, cn, left_out)
    if inherited:
        # a later attack took over the breaks of the one left out (samples broken earlier
        # are not attacked again), so over the common attacks the two runs would measure
        # different things: not compared, and the gate stays open
        return _row(head, left_out=left_out, reason=(
            f"{', '.join(attacks.skipped)}: the attacks both runs evaluated carry breaks of "
            f"the one left out ({', '.join(inherited)}), so they cannot be compared without "
            "it"))
    mo, mn = old.measurement, new.measurement
    same_seeds = (mo.seeds.suite == mn.seeds.suite and same_samples(mo.data, mn.data)
                  and all(mo.seeds.checks.get(i) == mn.seeds.checks.get(i)
                          for i in attacks.common))
    return _row(head, _threat_change(head, wo, wn, co, cn, attacks, same_seeds),
                tolerance=tolerance, left_out=left_out,
                converged_=(converged_all(co), converged_all(cn)))
