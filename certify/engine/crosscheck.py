"""Rules across checks, applied to the finished checks' typed results.

A randomised model caps every attack (no PASS); a random corruption property is put beside the
attack of the same bound; the worst case over a threat model's attacks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from certify.canonical import JSONLike, normalize
from certify.checks import AttackCheck, Corruption, Measurement, Sanity
from certify.checks.base import pct
from certify.checks.corruption import RANDOM_PIXEL_NORMS
from certify.results import CheckResult, WorstCase
from certify.rundir import SampleRecord
from certify.suite import CheckSpec, Suite


def apply_cross_checks(suite: Suite, results: list[CheckResult],
                       measured: dict[str, Measurement]) -> list[CheckResult]:
    """The results after every rule across checks, whatever the suite's order.

    ``measured`` holds each evaluated check's measurement, as its summary made it, by id.
    """
    results = no_attack_passes_when_randomised(suite, results, measured)
    return worst_case_beside_random(suite.checks, results, measured)


def randomised_share(spec: CheckSpec, m: Measurement) -> float:
    """The share of samples on which a :class:`~certify.checks.Sanity` check saw the model
    answer the same input differently (0 for any other check)."""
    if not isinstance(spec.check, Sanity):
        return 0.0
    return float(m.metrics.get("nondeterministic_share") or 0.0)


def no_attack_passes_when_randomised(suite: Suite, results: list[CheckResult],
                                     measured: dict[str, Measurement]) -> list[CheckResult]:
    """On a model a ``sanity`` check found randomised, no attack check may PASS.

    Randomness defeats fixed attacks without making a model robust (Brown et al. 2018,
    Appendix E), so a robust accuracy measured on such a model is an inflated estimate. Applied
    to the finished checks' results, whatever the suite's order: each attack gets a warning
    naming the sanity check, and a PASS becomes WARN with a decision sentence that says why.
    """
    found = [(s.id, share) for s in suite.checks
             if s.id in measured and (share := randomised_share(s, measured[s.id]))]
    if not found:
        return results
    cid, share = found[0]
    attacks = {s.id for s in suite.checks if isinstance(s.check, AttackCheck)}
    why = (f"check {cid} found the model randomised ({share:.0%} of its samples gave different "
           "outputs for the same input), so this robust accuracy may be inflated")
    out = []
    for r in results:
        if r.id in attacks and r.status not in ("ERROR", "SKIPPED"):
            update: dict[str, object] = {"warnings": [*r.warnings, why]}
            if r.status == "PASS":
                update.update(status="WARN", decision=r.decision + f"; but {why}: no attack "
                              "can PASS on a randomised model")
            r = r.model_copy(update=update)
        out.append(r)
    return out


def attack_worst_case(suite: Suite, finals: dict[str, dict[int, SampleRecord]],
                      skipped: frozenset[str] = frozenset()) -> list[WorstCase]:
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
        out.append(WorstCase(norm=norm, epsilon=eps, attacks=ids, n=len(common),
                             robust_accuracy=robust / len(common)))
    return out


def worst_case_beside_random(specs: Sequence[CheckSpec], results: list[CheckResult],
                             measured: dict[str, Measurement]) -> list[CheckResult]:
    """Put the attack's evidence beside a random-noise pixel property at the same ε.

    ``random_linf`` and ``random_l0`` draw noise at random, so their robustness score (the share
    of correctly classified samples that stay correct) can far exceed the share that survives
    an attack in the same ball. For each such property and each attack check of the suite in
    the same norm at the same ε, the property's result gets, in its details (signed and
    rendered), the attack's share of correctly classified samples that survive
    (1 - attack success rate, with its 95% interval) and a sentence saying which row is the
    worst-case evidence. Applied to the finished checks' typed results after all checks have
    run; ``specs`` are the suite's check specs (``id`` and ``check``), ``measured`` each
    evaluated check's measurement as its summary made it, by id. Returns the results.
    """
    by_id = {r.id: r for r in results}
    attacks = [(s.id, s.check.threat_model()) for s in specs
               if isinstance(s.check, AttackCheck)]
    for spec in specs:
        check = spec.check
        if not isinstance(check, Corruption) or check.property not in RANDOM_PIXEL_NORMS:
            continue
        entry, m = by_id.get(spec.id), measured.get(spec.id)
        if entry is None or entry.status == "ERROR" or m is None:
            continue
        norm, bound = RANDOM_PIXEL_NORMS[check.property], _number(m.details["bound"])
        score = float(m.metrics["robustness_score"])
        rows = []
        for aid, (anorm, eps) in attacks:
            a, am = by_id.get(aid), measured.get(aid)
            if anorm != norm or not math.isclose(eps, bound, rel_tol=1e-9, abs_tol=1e-12) or \
                    a is None or a.status == "ERROR" or am is None:
                continue
            asr = float(am.metrics["attack_success_rate"])
            lo, hi = am.intervals.get("attack_success_rate", (asr, asr))
            survive = 1.0 - asr
            unit = "pixels" if norm == "l0" else ""
            at = f"{bound:g} {unit}".strip()
            attack = str(a.params.get("attack", aid))
            sentence = (
                f"{check.property} draws noise at random and does not search for the worst "
                f"case; the attack row {aid} ({attack}, {norm} at "
                f"{at}) is the worst-case evidence: {pct(survive)} of the correctly classified "
                f"samples it attacked survive it, against this property's {pct(score)}")
            rows.append({"attack_check": aid, "attack": attack,
                         "norm": norm, "epsilon": bound, "surviving_share": survive,
                         "surviving_interval": [1.0 - float(hi), 1.0 - float(lo)],
                         "n_attacked": int(am.metrics["n_robust"]) +
                         int(am.metrics["n_broken"]),
                         "attack_status": a.status, "property_score": score,
                         "exceeds_attack": score > survive, "note": sentence})
        if rows:
            by_id[spec.id] = entry.model_copy(update={"details": {
                **entry.details, "worst_case_comparison": normalize(rows)}})
    return [by_id[r.id] for r in results]


def _number(v: JSONLike) -> float:
    """A number a check put in its details (a TypeError if it put something else)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TypeError(f"expected a number in the check's details, got {v!r}")
    return float(v)
