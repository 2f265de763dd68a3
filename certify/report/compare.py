"""``certify compare OLD NEW``: did a release get less robust than the last one?

Two runs of the same suite on the same data are compared on **the rows that decide their
cards**: one row per threat model (``measurement.attack_worst_case``: a sample is robust under
(norm, ε) only if every attack of that threat model failed on it) and every check that is not an
attack row summarised by a threat model. The attack rows are compared too, as **evidence**:
shown beside their threat model's row, never gating.

Each row is compared on one metric (a threat model on its worst-case robust accuracy; a check
on its threshold's metric, else its exported headline metric):

- a rate with per-sample outcomes (a check's ``Check.compare_outcomes``; a threat model's
  "robust to every attack", from its attack rows' outcome bitmaps) is compared as the share of
  the evaluated samples with that outcome, unconditionally (for robustness: "correct and stays
  correct" over all samples, so each model's own set of correct samples does not break the
  pairing). When both runs evaluated the same samples with the same seeds the comparison is
  **paired**: McNemar's exact test on the discordant samples, and Newcombe's hybrid score
  interval for a paired difference (his method 10). Otherwise it is **unpaired**: Newcombe's
  hybrid score interval for two independent proportions (method 10).
- a score with per-sample values in both runs (``Check.compare_values``) is compared by the
  bootstrap of the mean difference, paired over the common samples when the pairing holds;
- anything else by the normal approximation of the two runs' own 95% intervals.

**A gate, per gating row** (``--tolerance``: percentage points for rates, percent of the old
value for scores):

- *no change*: the same samples with identical per-sample outcomes (exit 0);
- *regression*: Holm's step-down correction at family-wise level 0.05 across the compared
  gating rows rejects "no change", and the interval at the level Holm used for it
  (``1 - 0.05 / (m - rank)``) lies wholly beyond the tolerance on the worse side (exit 1);
- *non-inferior*: the change's 95% interval lies within the tolerance on the worse side
  (showing every row non-inferior needs no multiplicity correction: an intersection-union
  test) and NEW's search converged (exit 0); an *improvement* is non-inferior and resolved
  beyond the tolerance on the better side by Holm, with both runs' searches converged;
- *inconclusive*: neither shown (exit 6): a regression too small to resolve, or a sample too
  small to show non-inferiority at this tolerance.

An evidence row is shown at its threat model's level (the one Holm used for that row) and
labelled the same way, outside the Holm family and the exit code.

A row whose OLD or NEW search did not converge says so: its robust accuracy is an
overestimate, so it is never a resolved improvement, and NEW's must have converged for a
non-inferior row. A threat model converged when every one of its attacks did (none stalled).
Convergence is read from the rows' typed ``settled`` field, never from ``details``. The exit
code follows the gating rows with a threshold: 1 for a regression, else 6 for an inconclusive
or uncompared row that blocks, else 0.

**Rows a run did not evaluate.** A check SKIPPED in both runs, or only in OLD, is listed as not
compared and neither gates nor blocks; one OLD evaluated and NEW SKIPPED blocks (the release
dropped evidence the last one had), and so does an ERROR in either run. An attack row is
evidence (never a gate) unless it errored. A threat model with an attack only one run
evaluated is compared on the attacks both evaluated, unless one of those took over breaks of
the attack left out (later attacks of a threat model do not attack samples an earlier one
broke), which blocks.

**The tolerance** (``--tolerance``): :data:`certify.tolerance.TOLERANCE_RULE`, "Without
--tolerance, the gate's tolerance is the smaller of OLD's and NEW's release_tolerance, a run
whose results state none counting as certify's default of 2, so the release under test can
narrow its gate but never widen it." An undecided row says about how many samples would decide
it (:func:`samples_to_decide`).

Runs on different subsets of one dataset (``--samples``, ``--sample-offset``, other seeds) are
comparable, unpaired. Runs of different suite versions (a card from an older certify) are
compared on the checks both have with the same parameters, and on the threat models whose
attacks are those same checks; the others are listed as not comparable. A threat model one of
whose attacks errored in a run is not compared (its worst case left that attack out), which
keeps the gate open. Two runs on different source data or with different reference models, or
with no check in common, are not comparable: :class:`NotComparable` (exit 4) says which.

Where it lives: loading the runs and deciding what is comparable is
:mod:`certify.report.compare_inputs`; the rows, each built once from what was measured
(:class:`Row`, immutable), are :mod:`certify.report.compare_rows`; the statistics are
:mod:`certify.stats`; this module decides the gate (Holm's correction, each row's outcome,
:class:`Comparison`), and :mod:`certify.report.comparison` shows it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from certify.errors import EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_OK, UsageError
from certify.report.compare_inputs import NotComparable, check_comparable, load_run
from certify.report.compare_rows import (
    Outcome,
    Row,
    RowRole,
    check_rows,
    threat_row_id,
    threat_rows,
)
from certify.results import RunResult
from certify.stats import holm, two_sided_z
from certify.tolerance import TOLERANCE_RULE, gate_tolerance

__all__ = ["ALPHA", "COMPARE_SCHEMA", "GATE_OPEN", "POWER", "Comparison", "NotComparable",
           "Outcome", "RowRole", "Row", "Side", "compare", "compare_paths", "load_run",
           "release_tolerance", "samples_to_decide", "threat_row_id"]

#: Family-wise error rate of the comparison (Holm).
ALPHA = 0.05
#: Schema of the comparison's JSON output.
COMPARE_SCHEMA = "certify.compare/2"
#: The power :func:`samples_to_decide` plans for.
POWER = 0.8
#: Outcomes that keep the gate open (exit 6) on a gating row with a threshold.
GATE_OPEN = frozenset({Outcome.INCONCLUSIVE, Outcome.NOT_COMPARED})


# --- the gate ------------------------------------------------------------------------------------

def samples_to_decide(r: Row) -> int | None:
    """About how many samples (paired rows: pairs; unpaired: per run) would decide an
    inconclusive rate or score row at its observed change with :data:`POWER`: showing
    non-inferiority when the change is better than the tolerance's edge, a regression when it
    is worse (at the level Holm used for the row). Paired rates use the power of McNemar's
    test at the observed discordant rates (normal approximation: per-pair variance
    ``p_worse + p_better - (p_better - p_worse)^2``, Connor 1987); unpaired rates the two
    binomial variances; scores scale the interval's standard error. A single variance serves
    both terms (the Wald form of Connor's estimate). ``None`` when the change sits on the
    tolerance's edge (no sample size decides it), nothing is known to scale, or the estimate
    does not exceed the samples already used."""
    if r.change is None or r.change_interval is None:
        return None
    gain = r.change if r.direction != "lower" else -r.change  # better is positive
    margin = gain + r.tolerance
    if abs(margin) < 1e-9:  # on the tolerance's edge: no sample size decides it
        return None
    level = ALPHA if margin > 0 else 1 - (r.confidence or 1 - ALPHA)
    # the two-sided quantile at the row's level, plus the one-sided quantile at POWER
    z = two_sided_z(1 - level) + two_sided_z(2 * POWER - 1)
    n = min(r.n_old, r.n_new)
    if r.unit == "rate" and r.paired and r.discordant is not None and n:
        pw, pb = r.discordant["worse"] / n, r.discordant["better"] / n
        var = pw + pb - (pb - pw) ** 2
    elif r.unit == "rate" and not r.paired and r.old_value is not None and \
            r.new_value is not None:
        var = (r.old_value * (1 - r.old_value) + r.new_value * (1 - r.new_value))
    else:
        var = 0.0
    if var <= 0:  # scale the interval's standard error
        if r.interval_at is None or not n:
            return None
        lo, hi = r.interval_at(1 - ALPHA)
        if hi <= lo:
            return None
        var = n * ((hi - lo) / (2 * two_sided_z(1 - ALPHA))) ** 2
    need = math.ceil(var * (z / margin) ** 2)
    # an estimate at or below the samples already used would contradict the interval that
    # left the row undecided (it is an approximation): say nothing rather than that
    return need if n < need < 1e9 else None


def _gate(r: Row, resolved: bool, corrected: tuple[float, float],
          plain: tuple[float, float]) -> tuple[Outcome, str]:
    """A tested row's outcome (see the module's docstring) and its reason: ``corrected`` is
    its interval at the level Holm used for it, ``plain`` at 95%."""
    tol = r.tolerance
    higher = r.direction == "higher"
    lo, hi = corrected
    if r.paired and r.change == 0 and (r.discordant == {"worse": 0, "better": 0}
                                       or lo == hi == 0):
        return Outcome.NO_CHANGE, r.reason  # the same samples, the same per-sample outcomes
    worse = hi < -tol if higher else lo > tol
    better = lo > tol if higher else hi < -tol
    plo, phi = plain
    within = plo >= -tol if higher else phi <= tol
    unconverged = [w for w, ok in (("OLD", r.converged_old), ("NEW", r.converged_new))
                   if ok is False]
    reason = r.reason
    if unconverged:
        reason = (f"{' and '.join(unconverged)}'s attacks did not all converge: its worst "
                  "case is an overestimate" if r.kind == "threat_model" else
                  f"{' and '.join(unconverged)}'s attack did not converge: its robust "
                  "accuracy is an overestimate")
    if resolved and worse:
        return Outcome.REGRESSION, reason
    if within and r.converged_new is not False:
        if resolved and better and not unconverged:
            return Outcome.IMPROVEMENT, reason
        return Outcome.NON_INFERIOR, reason
    return Outcome.INCONCLUSIVE, reason or (
        "neither a regression nor non-inferiority within the tolerance is shown: more samples "
        "or a stated --tolerance would decide it")


def _decided(r: Row, resolved: bool, level: float, p_holm: float | None = None) -> Row:
    """A tested row decided at ``level`` (its interval's confidence is ``1 - level``)."""
    assert r.interval_at is not None
    lo, hi = r.interval_at(1 - level)
    outcome, reason = _gate(r, resolved, (lo, hi), r.interval_at(1 - ALPHA))
    return replace(r, confidence=1 - level, change_interval=[lo, hi], p_holm=p_holm,
                   outcome=outcome, reason=reason)


def _settled(r: Row) -> Row:
    """A row's final outcome: compared without a test, identical outcomes are no change; an
    inconclusive row (its searches converged) says about how many samples would decide it."""
    if r.p is None and r.change == 0 and r.discordant == {"worse": 0, "better": 0}:
        r = replace(r, outcome=Outcome.NO_CHANGE)
    if r.outcome != Outcome.INCONCLUSIVE or r.converged_old is False \
            or r.converged_new is False:
        return r
    needed = samples_to_decide(r)
    if needed is None:
        return r
    return replace(r, samples_needed=needed, reason=(
        f"neither a regression nor non-inferiority within the tolerance is shown: about "
        f"{needed:,} {'paired samples' if r.paired else 'samples per run'} (now "
        f"{min(r.n_old, r.n_new):,}) would decide it at the observed change ({POWER:.0%} "
        "power)"))


def _decide(rows: list[Row]) -> list[Row]:
    """The rows decided: the gating ones tested by Holm's correction across them (at
    :data:`ALPHA`), the evidence rows at their threat model's level outside that family, then
    each settled (:func:`_settled`)."""
    rows = list(rows)
    tested = [k for k, r in enumerate(rows) if r.role == RowRole.GATE and r.p is not None
              and r.interval_at is not None]
    adjusted, reject, levels = holm([rows[k].p or 1.0 for k in tested], ALPHA)
    level_of: dict[str, float] = {}
    for k, p_adj, rej, level in zip(tested, adjusted, reject, levels, strict=True):
        level_of[rows[k].id] = level
        rows[k] = _decided(rows[k], rej, level, p_holm=p_adj)
    for k, r in enumerate(rows):  # evidence: at its threat model's level, outside the family
        if r.role == RowRole.EVIDENCE and r.p is not None and r.interval_at is not None:
            level = level_of.get(r.evidence_for or "", ALPHA)
            rows[k] = _decided(r, r.p <= level, level)
    return [_settled(r) for r in rows]


# --- the comparison ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Side:
    """One run of a comparison, as its JSON names it."""

    path: str
    model: str
    identity: str
    verdict: str
    suite: str
    suite_digest: str
    data_digest: str
    seed: int
    results_schema: str

    @classmethod
    def of(cls, result: RunResult, path: Path) -> Side:
        """The side of the run ``result`` read from ``path``."""
        m = result.measurement
        return cls(path=str(path), model=m.model.name, identity=m.model.identity,
                   verdict=m.verdict, suite=m.suite.name, suite_digest=m.suite.digest,
                   data_digest=m.data.digest, seed=m.seeds.suite,
                   results_schema=result.schema_version)


@dataclass(frozen=True)
class Comparison:
    """The outcome of ``certify compare``: a row per threat model and a row per check."""

    old: Side
    new: Side
    tolerance: float
    rows: list[Row]
    threat_models: list[Row] = field(default_factory=list)
    #: Where the tolerance came from, in words: ``--tolerance``, or which run's stated (or
    #: defaulted) release_tolerance :data:`~certify.tolerance.TOLERANCE_RULE` took.
    tolerance_source: str = "--tolerance"

    @property
    def gating(self) -> list[Row]:
        """The rows that decide: the threat models', then the checks' that are not evidence
        for one (the rows that decide the card)."""
        return [r for r in (*self.threat_models, *self.rows) if r.role == RowRole.GATE]

    @property
    def regressions(self) -> list[Row]:
        """Resolved regressions of gating rows (with a threshold or not)."""
        return [r for r in self.gating if r.outcome == Outcome.REGRESSION]

    @property
    def inconclusive(self) -> list[Row]:
        """Gating rows with a threshold for which neither a regression nor non-inferiority
        (nor no change) was shown, or that could not be compared."""
        return [r for r in self.gating
                if r.has_threshold and r.blocks and r.outcome in GATE_OPEN]

    @property
    def not_evaluated(self) -> list[Row]:
        """Rows one run did not evaluate (SKIPPED): listed as not compared, neither gating
        nor blocking."""
        return [r for r in (*self.threat_models, *self.rows)
                if not r.blocks and r.outcome == Outcome.NOT_COMPARED]

    @property
    def exit_code(self) -> int:
        """1 for a regression of a gating row with a threshold; else 6 for an inconclusive
        one (:attr:`inconclusive`); else 0."""
        if any(r.has_threshold for r in self.regressions):
            return EXIT_FAIL
        return EXIT_INCONCLUSIVE if self.inconclusive else EXIT_OK

    @property
    def decision(self) -> str:
        """The comparison's decision in a few words, as its exit code has it: REGRESSION
        (exit 1), INCONCLUSIVE (exit 6); with exit 0, NO CHANGE when every gating row with a
        threshold is unchanged, IMPROVEMENT when the others improved, NON-INFERIOR otherwise
        (NO THRESHOLD GATED when no gating row has a threshold)."""
        code = self.exit_code
        if code == EXIT_FAIL:
            return "REGRESSION"
        if code == EXIT_INCONCLUSIVE:
            return "INCONCLUSIVE"
        seen = {r.outcome for r in self.gating
                if r.has_threshold and r.blocks
                and r.outcome not in (Outcome.NOT_COMPARABLE, Outcome.NOT_COMPARED)}
        if not seen:
            return "NO THRESHOLD GATED"
        if seen == {Outcome.NO_CHANGE}:
            return "NO CHANGE"
        if seen <= {Outcome.NO_CHANGE, Outcome.IMPROVEMENT}:
            return "IMPROVEMENT"
        return "NON-INFERIOR"

    def to_json(self) -> dict[str, Any]:
        """The comparison as plain JSON values (``--json``)."""
        return {"schema": COMPARE_SCHEMA, "alpha": ALPHA, "correction": "holm",
                "decides_on": "the threat-model rows and the checks that are not an attack "
                              "row of a threat model (the rows that decide the card); attack "
                              "rows are evidence (role: evidence), not gating",
                "tolerance": {"rates_pp": self.tolerance, "scores_relative_percent":
                              self.tolerance, "source": self.tolerance_source,
                              "rule": TOLERANCE_RULE},
                "old": asdict(self.old), "new": asdict(self.new),
                "threat_models": [r.to_json() for r in self.threat_models],
                "checks": [r.to_json() for r in self.rows],
                "regressions": [r.id for r in self.regressions],
                "inconclusive": [r.id for r in self.inconclusive],
                "not_evaluated": [r.id for r in self.not_evaluated],
                "decision": self.decision,
                "exit_code": self.exit_code}


def release_tolerance(old: RunResult, new: RunResult, given: float | None
                      ) -> tuple[float, str]:
    """The tolerance a comparison uses and where it came from, by
    :func:`certify.tolerance.gate_tolerance`: ``given`` (``--tolerance``) when given, else
    :data:`~certify.tolerance.TOLERANCE_RULE` over what each run's results state."""
    try:
        return gate_tolerance(old.measurement.suite.release_tolerance,
                              new.measurement.suite.release_tolerance, given)
    except ValueError as exc:
        raise UsageError(str(exc), hint="percentage points for rates, percent for scores"
                         ) from None


def compare(old: RunResult, new: RunResult, tolerance: float | None = None,
            old_path: Path = Path("OLD"), new_path: Path = Path("NEW")) -> Comparison:
    """Compare two comparable runs on their threat models and checks (raises
    :class:`NotComparable`). ``tolerance``: percentage points for rates, percent of OLD for
    scores; ``None`` takes it by :data:`~certify.tolerance.TOLERANCE_RULE`
    (:func:`release_tolerance`)."""
    tolerance, source = release_tolerance(old, new, tolerance)
    check_comparable(old, new)
    threats = threat_rows(old, new, tolerance)
    rows = check_rows(old, new, threats, tolerance)
    decided = _decide([*threats, *rows])
    return Comparison(Side.of(old, old_path), Side.of(new, new_path), tolerance,
                      decided[len(threats):], decided[:len(threats)], tolerance_source=source)


def compare_paths(old: Path, new: Path, tolerance: float | None = None,
                  pubkey: Path | None = None) -> Comparison:
    """Load (verifying first when ``pubkey`` is given) and compare two runs or cards."""
    _, ro = load_run(old, pubkey)
    _, rn = load_run(new, pubkey)
    return compare(ro, rn, tolerance, old, new)
