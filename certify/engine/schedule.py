"""Which check runs when, and what an attack spends its queries on (issue 42).

The card keeps the suite's order; the runner executes in :func:`execution_order`: sanity checks
first (what they find decides what later attacks may skip), then the suite's other checks in
order, except that the attacks of one threat model (norm, ε) run together where the first of
them stands, cheapest evidence first: white-box attacks, then score-based black-box attacks,
then decision-based ones, each group in suite order. Before an attack runs,
:func:`plan_attack` asks the attacks of its threat model that ran before it:

- **Broken samples stay broken.** Samples an earlier attack of the same threat model broke are
  not attacked again (AutoAttack's rule): the worst case is over attacks, so it is unchanged,
  and the row counts them as broken, saying by whom.
- **A cross-check needs a verdict, not a floor.** After a converged white-box attack of the
  threat model (judged on every sample it was asked to attack, not a transfer), a black-box
  attack is its gradient-masking cross-check: ``max_queries: auto`` stops at convergence
  instead of doubling on to the attack's query floor. It never PASSes on its own then; the
  white-box row carries the support.
- **Decision-based attacks run where they are needed.** On a model that answers scores, after
  a score-based black-box attack of the threat model ran without stalling and no sanity check
  found the scores quantised or the model randomised, a decision-based attack (HopSkipJump,
  random search) adds no evidence that attack did not: its row is SKIPPED with the reason. It
  runs on labels-only models (where it is the only black-box evidence), or where the scores
  gave the score-based attack no signal.

Every choice depends only on the suite, the model's description and the earlier checks'
records and results, which a resumed or distributed run rebuilds identically.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from certify.checks import AttackCheck, Measurement, Role, attack_of
from certify.norms import ThreatModel
from certify.results import CheckResult
from certify.rundir import SampleRecord
from certify.suite import CheckSpec


def execution_order(checks: Sequence[CheckSpec]) -> list[CheckSpec]:
    """The order the runner evaluates ``checks`` in (see the module docstring)."""
    sanity = [s for s in checks if s.check.role is Role.SUSPECT]
    groups: dict[ThreatModel, list[CheckSpec]] = {}
    for spec in checks:
        if (attack := attack_of(spec.check)) is not None:
            groups.setdefault(attack.threat_model(), []).append(spec)
    out: list[CheckSpec] = list(sanity)
    for spec in checks:
        if spec.check.role is Role.SUSPECT:
            continue
        attack = attack_of(spec.check)
        if attack is None:
            out.append(spec)
            continue
        group = groups.pop(attack.threat_model(), None)
        if group is not None:  # the first attack of its threat model: the whole group here
            out.extend(sorted(group, key=lambda s: _rank(s.check)))  # stable: suite order
    return out


def _rank(check: Any) -> int:
    """0 white-box, 1 score-based black-box, 2 decision-based."""
    cls = check.attack_class()
    return 0 if cls.needs_gradients else 1 if cls.needs_scores else 2


@dataclass
class AttackPlan:
    """What an attack check is given before it runs."""

    #: The check to run (a copy in its role).
    spec: CheckSpec
    #: Dataset index -> what the earlier attack that broke it said (see
    #: :attr:`certify.checks.CheckContext.broken_before`).
    broken_before: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: Why the check is not run at all (a SKIPPED row), or None.
    skip: str | None = None


@dataclass
class Earlier:
    """What the runner knows of the checks evaluated so far."""

    specs: list[CheckSpec]
    results: Mapping[str, CheckResult]
    finals: Mapping[str, Mapping[int, SampleRecord]]
    measured: Mapping[str, Measurement]


def plan_attack(spec: CheckSpec, earlier: Earlier, output: str) -> AttackPlan:
    """The plan for attack check ``spec`` after the checks in ``earlier``, on a model whose
    answers are ``output`` (``logits``, ``probs`` or ``labels``)."""
    check = attack_of(spec.check)
    assert check is not None, f"{spec.id} is not an attack"
    same = [s for s in earlier.specs if (atk := attack_of(s.check)) is not None
            and atk.threat_model() == check.threat_model()
            and s.id in earlier.finals and _usable(earlier.results.get(s.id))]
    skip = _redundant(check, same, earlier, output)
    if skip is not None:
        return AttackPlan(spec, skip=skip)
    role: Literal["own", "cross_check"] = "own"
    if not check.white_box() and any(_converged_white_box(s, earlier) for s in same):
        role = "cross_check"
    out = AttackPlan(spec if role == "own" else _with_check(spec, check.for_role(role)))
    for s in same:
        for i, rec in earlier.finals[s.id].items():
            got: Mapping[str, Any] = rec
            if got.get("outcome") == "broken" and i not in out.broken_before:
                out.broken_before[i] = {
                    "by": str(got.get("inherited_from", s.id)),
                    "adv_pred": int(got.get("adv_pred", -1)),
                    **{k: float(got[k]) for k in ("confidence", "probability") if k in got}}
    return out


def _with_check(spec: CheckSpec, check: AttackCheck) -> CheckSpec:
    return dataclasses.replace(spec, check=check)


def _doc(m: Measurement, key: str) -> Mapping[str, Any]:
    """A mapping of a measurement's details (empty where absent or not a mapping)."""
    value = m.details.get(key)
    return value if isinstance(value, Mapping) else {}


def _usable(result: CheckResult | None) -> bool:
    """An earlier row whose records may be relied on (evaluated, not errored)."""
    return result is not None and result.status not in ("ERROR", "SKIPPED")


def _converged_white_box(spec: CheckSpec, earlier: Earlier) -> bool:
    """A white-box attack (not a transfer) that attacked every sample it was asked to and
    converged."""
    m = earlier.measured.get(spec.id)
    attack = attack_of(spec.check)
    if attack is None or not attack.white_box() or m is None:
        return False
    wb, conv = _doc(m, "white_box"), _doc(m, "convergence")
    return bool(conv.get("converged")) and not wb.get("transfer") and \
        not wb.get("not_attacked")


def _redundant(check: AttackCheck, same: list[CheckSpec], earlier: Earlier, output: str
               ) -> str | None:
    """Why a decision-based attack adds nothing here (see the module docstring), or None."""
    cls = check.attack_class()
    if not cls.decision_based() or output == "labels":
        return None
    for s in earlier.specs:
        m = earlier.measured.get(s.id)
        if s.check.role is Role.SUSPECT and m is not None and (
                m.metrics.get("quantised") or m.metrics.get("nondeterministic_share")):
            return None
    scored = [s for s in same if (atk := attack_of(s.check)) is not None and atk.score_based()]
    for s in scored:
        m = earlier.measured.get(s.id)
        if m is None or _doc(m, "evidence").get("stalled"):
            return None
    if not scored:
        return None
    return (f"not needed: {scored[0].id} attacked this threat model with scores, without "
            f"stalling ({check.attack} runs on labels-only models, or where scores starve "
            "the score-based attack)")
