"""Rules across checks, applied to the finished checks' result entries.

A randomised model caps every attack (no PASS); a random corruption property is put beside the
attack of the same bound; the worst case over a threat model's attacks.
"""

from __future__ import annotations

from typing import Any

from certify.checks import AttackCheck
from certify.checks.corruption import worst_case_beside_random
from certify.suite import Suite


def apply_cross_checks(suite: Suite, entries: list[dict[str, Any]]) -> None:
    """Every rule across checks, in place, whatever the suite's order."""
    no_attack_passes_when_randomised(suite, entries)
    worst_case_beside_random(suite.checks, entries)


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


def attack_worst_case(suite: Suite, finals: dict[str, dict[int, dict[str, Any]]],
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

