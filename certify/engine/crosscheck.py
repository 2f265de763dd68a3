"""Rules across checks, applied to the finished checks' typed results.

A randomised model caps every attack (no PASS); quantised scores cap every score-based attack;
a random corruption property is put beside the attack of the same bound; one headline row per
threat model decides over its attacks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from certify.canonical import JSONLike, normalize
from certify.checks import Measurement, Role, attack_of, certified_of
from certify.checks.base import pct
from certify.kinds import CERTIFIED_METHODS
from certify.norms import L1, L2, LINF, ThreatModel
from certify.results import CertifiedFloor, CheckResult, DecidedBy, WorstCase
from certify.rundir import SampleRecord
from certify.stats import samples_to_decide, wilson_interval
from certify.suite import CheckSpec, Suite


def apply_cross_checks(suite: Suite, results: list[CheckResult],
                       measured: dict[str, Measurement]) -> list[CheckResult]:
    """The results after every rule across checks, whatever the suite's order.

    ``measured`` holds each evaluated check's measurement, as its summary made it, by id.
    """
    results = no_attack_passes_when_randomised(suite, results, measured)
    results = no_score_based_pass_when_quantised(suite, results, measured)
    return worst_case_beside_random(suite.checks, results, measured)


def no_score_based_pass_when_quantised(suite: Suite, results: list[CheckResult],
                                       measured: dict[str, Measurement]) -> list[CheckResult]:
    """When a ``sanity`` check found quantised scores, no score-based attack PASSes on its own.

    Rounded scores starve score-based attacks: a flat loss reads as "no progress", which the
    convergence rule would take for converged. Each score-based attack row (white-box and
    decision-based attacks are not affected) gets a warning naming the sanity check, and a
    PASS becomes WARN; a threat model's row then needs other support to PASS.
    """
    found = [s.id for s in suite.checks if s.id in measured and s.check.role is Role.SUSPECT
             and measured[s.id].metrics.get("quantised")]
    if not found:
        return results
    scored = {s.id for s in suite.checks
              if (atk := attack_of(s.check)) is not None and atk.score_based()}
    why = (f"check {found[0]} found quantised scores (small noise moved the outputs in steps or "
           "not at all), which give a score-based attack little signal")
    return _no_pass(results, scored, why, "a score-based attack cannot PASS on its own")


def _no_pass(results: list[CheckResult], ids: set[str], why: str, rule: str
             ) -> list[CheckResult]:
    """The results with each evaluated check of ``ids`` warned ``why``, and a PASS among them
    turned into WARN whose decision says why and which ``rule`` forbids it."""
    out = []
    for r in results:
        if r.id in ids and r.status not in ("ERROR", "SKIPPED"):
            update: dict[str, object] = {"warnings": [*r.warnings, why]}
            if r.status == "PASS":
                update.update(status="WARN", decision=r.decision + f"; but {why}: {rule}",
                              decided_by=r.decided_by.model_copy(
                                  update={"stopped": [*r.decided_by.stopped, "warning"],
                                          "reason": why}))
            r = r.model_copy(update=update)
        out.append(r)
    return out


def randomised_share(spec: CheckSpec, m: Measurement) -> float:
    """The share of samples on which a suspect-model check (:class:`~certify.checks.Sanity`)
    saw the model answer the same input differently (0 for any other check)."""
    if spec.check.role is not Role.SUSPECT:
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
    attacks = {s.id for s in suite.checks if s.check.role is Role.ATTACK}
    why = (f"check {cid} found the model randomised ({share:.0%} of its samples gave different "
           "outputs for the same input), so this robust accuracy may be inflated")
    return _no_pass(results, attacks, why, "no attack can PASS on a randomised model")


#: Gradient masking is suspected when a black-box attack breaks at least this many samples...
MASKING_SAMPLES = 2
#: ...or this share of the threat model's samples, whichever is more, beyond the white-box ones.
MASKING_SHARE = 0.02


def attack_worst_case(suite: Suite, finals: dict[str, dict[int, SampleRecord]],
                      results: Sequence[CheckResult] = (),
                      skipped: frozenset[str] = frozenset()) -> list[WorstCase]:
    """One headline row per threat model (norm, ε): robust accuracy against all of the
    suite's evaluated attacks of it at once, from each check's merged records (every round's),
    decided against the strictest ``robust_accuracy`` threshold of its attack rows.

    ``results`` are the attack rows' finished results (after the other cross-check rules):
    the row may PASS only when its whole interval meets the threshold (the suite's decision
    rule), at least one of its attack rows PASSed on its own (a converged white-box attack, or
    a black-box attack at its query floor, converged and validated), no attack errored, and no
    black-box attack broke max(2, 2%) more samples than the white-box ones (gradient masking,
    AutoAttack's cross-check). A transfer attack (white-box on an endpoint's surrogate) counts
    its breaks like any attack, never PASSes on its own, and takes no part in the masking
    cross-check.
    """
    floors = _floors(suite, finals, skipped)
    groups: dict[ThreatModel, list[CheckSpec]] = {}
    for spec in suite.checks:
        if (attack := attack_of(spec.check)) is not None and spec.id not in skipped:
            groups.setdefault(attack.threat_model(), []).append(spec)
    by_id = {r.id: r for r in results}
    out = []
    for (norm, eps), group in sorted(groups.items(), key=lambda g: (g[0].norm.name, g[0].epsilon)):
        # an errored attack (no records) is left out of the worst case and stops a PASS
        specs = [s for s in group if finals.get(s.id) and
                 (s.id not in by_id or by_id[s.id].status != "ERROR")]
        ids = [s.id for s in specs]
        recs = [finals[i] for i in ids]
        common = set.intersection(*(set(r) for r in recs)) if recs else set()
        common = {s for s in common if all(r[s]["outcome"] != "error" for r in recs)}
        if not common:
            continue
        robust = sum(all(r[s]["outcome"] == "robust" for r in recs) for s in common)
        broken = {i: sum(r[s]["outcome"] != "robust" and r[s]["outcome"] != "misclassified"
                         for s in common) for i, r in zip(ids, recs, strict=True)}
        moved = [s.id for s in specs if _transfer(by_id.get(s.id))]
        white = [s.id for s in specs if (atk := attack_of(s.check)) is not None and
                 atk.white_box() and s.id not in moved]
        row = WorstCase(norm=norm.name, epsilon=eps, attacks=ids, n=len(common),
                        robust_accuracy=robust / len(common), n_robust=robust,
                        interval=list(wilson_interval(robust, len(common))),
                        white_box=white, transfer=moved, broken_by=broken)
        errored = [s.id for s in group if s not in specs]
        row = _masking(row, {i: r for i, r in zip(ids, recs, strict=True)}, common)
        row = _with_floor(row, floors.get(ThreatModel(norm, eps)), finals, common)
        out.append(_decide_threat_model(row, specs, errored, by_id, suite.decision))
    return out


class CertifiedButBroken(RuntimeError):  # noqa: N818 - a bug of certify, said as one
    """A sample proved robust by bound propagation that an attack of the same threat model
    broke: one of the two is wrong, so the run stops (exit 70) with both records."""


def _floors(suite: Suite, finals: dict[str, dict[int, SampleRecord]], skipped: frozenset[str]
            ) -> dict[ThreatModel, CheckSpec]:
    """The certified check of each threat model (the first in the suite's order) that left
    records: the floor its row shows."""
    out: dict[ThreatModel, CheckSpec] = {}
    for spec in suite.checks:
        cert = certified_of(spec.check)
        if cert is not None and spec.id not in skipped and finals.get(spec.id):
            out.setdefault(cert.threat_model(), spec)
    return out


def _inside(inner: ThreatModel, outer: ThreatModel, dims: int) -> bool:
    """Whether every perturbation of ``inner`` is one of ``outer`` (``dims`` values per
    image): the same norm at a radius no larger, an L2 or L1 ball inside an L∞ ball of the
    same radius, an L1 ball inside an L2 ball, an L∞ ball inside an L2 ball of √dims times
    its radius."""
    (a, ea), (b, eb) = inner, outer
    if a == b:
        return ea <= eb
    if b is LINF and a in (L2, L1):
        return ea <= eb
    if b is L2 and a is L1:
        return ea <= eb
    if b is L2 and a is LINF:
        return ea * math.sqrt(dims) <= eb
    return False


def no_certified_sample_broken(suite: Suite, finals: dict[str, dict[int, SampleRecord]],
                               dims: int) -> None:
    """Raise :class:`CertifiedButBroken` where a sample certified by any certified check was
    broken by any attack whose threat model lies inside the certified one (its own, a smaller
    radius, a smaller ball of another norm), errored attacks' records included: one of the
    two is wrong."""
    certs = [(s, c) for s in suite.checks if (c := certified_of(s.check)) is not None
             and finals.get(s.id)]
    attacks = [(s, a) for s in suite.checks if (a := attack_of(s.check)) is not None
               and finals.get(s.id)]
    for spec, cert in certs:
        tm = cert.threat_model()
        proved = {i: r for i, r in finals[spec.id].items() if r.get("outcome") == "certified"}
        for aspec, atk in attacks:
            if not _inside(atk.threat_model(), tm, dims):
                continue
            for i, rec in sorted(proved.items()):
                hit = finals[aspec.id].get(i)
                if hit is not None and hit["outcome"] not in ("robust", "misclassified",
                                                              "error"):
                    raise CertifiedButBroken(
                        f"sample {i} is certified robust by {spec.id} ({tm.norm.name} "
                        f"ε={tm.epsilon:g}) and broken by {aspec.id} (its threat model "
                        f"{atk.threat_model().norm.name} ε={atk.threat_model().epsilon:g} lies "
                        f"inside): a bug of certify (certified record {normalize(dict(rec))}; "
                        f"attack record {normalize(dict(hit))})")


def _with_floor(row: WorstCase, spec: CheckSpec | None,
                finals: dict[str, dict[int, SampleRecord]], common: set[int]) -> WorstCase:
    """The row with its certified floor over the row's own samples: a sample the certified
    check did not evaluate counts as not certified, so the floor is never measured on fewer
    samples than the row it may decide."""
    if spec is None:
        return row
    cert = finals[spec.id]
    shared = sorted(common)
    proved = [cert[s].get("method") for s in shared
              if s in cert and cert[s].get("outcome") == "certified"]
    check = certified_of(spec.check)
    methods = list(check.chosen_methods()) if check is not None else []
    floor = CertifiedFloor(
        check=spec.id, n=len(shared), n_certified=len(proved),
        share=len(proved) / len(shared), interval=list(wilson_interval(len(proved),
                                                                       len(shared))),
        methods=methods,
        by_method={m: sum(p in methods[:k + 1] for p in proved) for k, m in enumerate(methods)},
        n_budget=sum(bool(cert[s].get("budget")) for s in shared if s in cert),
        n_unevaluated=sum(s not in cert for s in shared))
    return row.model_copy(update={"certified": floor})


def _masking(row: WorstCase, recs: dict[str, dict[int, SampleRecord]], common: set[int]
             ) -> WorstCase:
    """The row with a warning for each black-box attack that broke at least max(2, 2%) of
    its samples that no white-box attack broke (gradient masking, AutoAttack's cross-check).

    Counted sample by sample: a black-box attack that ran only on the samples the white-box
    attacks left unbroken (:mod:`certify.engine.schedule`) is judged on the same breaks as
    one that ran on all of them. A black-box attack beating a transfer attack is expected,
    not a sign of masking.
    """
    white = set(row.white_box)
    if not white:
        return row

    def broken(i: str) -> set[int]:
        return {s for s in common if recs[i][s]["outcome"] not in ("robust", "misclassified")}

    by_white = set().union(*(broken(w) for w in white))
    allowance = max(MASKING_SAMPLES, MASKING_SHARE * row.n)
    warnings = list(row.warnings)
    for i in row.attacks:
        if i in white or i in row.transfer:
            continue
        more = len(broken(i) - by_white)
        if more >= allowance:
            warnings.append(f"gradient masking suspected: {i} (black-box) broke {more} "
                            f"sample(s) that the white-box attacks ({', '.join(sorted(white))}) "
                            f"did not, at least max({MASKING_SAMPLES}, {MASKING_SHARE:.0%} of "
                            f"{row.n}) = {allowance:g}")
    return row.model_copy(update={"warnings": warnings})


def no_attack_passes_beside_masking(results: list[CheckResult], worst: Sequence[WorstCase]
                                    ) -> list[CheckResult]:
    """No attack row PASSes while its threat model's row suspects gradient masking: a PASS of
    a white-box row there measured the masked gradients, and a black-box row's was overtaken
    by the breaks its own threat model found (issue 42: APGD-T PASSed at 64% beside a
    threat-model FAIL at 11% on a model that quantises its input inside its graph)."""
    for row in worst:
        masked = [w for w in row.warnings if w.startswith("gradient masking suspected")]
        if masked:
            results = _no_pass(results, set(row.attacks), f"its threat model's row: {masked[0]}",
                               "no attack row PASSes while its threat model suspects gradient "
                               "masking")
    return results


def _transfer(result: CheckResult | None) -> bool:
    """Whether an attack row ran as a transfer attack from an endpoint's surrogate."""
    wb = result.details.get("white_box") if result is not None else None
    return isinstance(wb, dict) and bool(wb.get("transfer"))


def _decide_threat_model(row: WorstCase, specs: Sequence[CheckSpec], errored: list[str],
                         by_id: dict[str, CheckResult], rule: str) -> WorstCase:
    """The row with its threshold, status, decision, support and warnings; ``errored`` are
    the threat model's attacks that produced no result (left out of the worst case)."""
    mins = [float(s.threshold.min) for s in specs if s.threshold is not None
            and s.threshold.metric == "robust_accuracy" and s.threshold.min is not None]
    value, (lo, hi) = row.robust_accuracy, row.interval
    warnings = list(row.warnings)
    support = [i for i in row.attacks if i in by_id and by_id[i].status == "PASS"]
    if not mins:
        warned = [i for i in row.attacks if i in by_id and by_id[i].status == "WARN"]
        return row.model_copy(update={
            "status": "WARN" if warnings or warned or errored else "INFO",
            "warnings": warnings, "support": support,
            "decision": "no robust_accuracy threshold among this threat model's attack rows "
                        "(informational)" + (f"; warnings on {', '.join(warned)}"
                                             if warned else ""),
            "decided_by": DecidedBy(rule="no_threshold")})
    t = max(mins)
    proof = _proved(row, t, rule)
    if proof is not None:
        return row.model_copy(update={"threshold": t, "status": "PASS", "decision": proof[0],
                                      "warnings": warnings, "support": support,
                                      "decided_by": proof[1]})
    said = (f"worst case over {len(row.attacks)} attack(s) {pct(value)} "
            f"(95% interval {pct(lo)}–{pct(hi)}, n {row.n})")
    if rule == "point":
        status = "PASS" if value >= t else "FAIL"
        said += f" {'meets' if status == 'PASS' else 'misses'} robust_accuracy ≥ {t:g} " \
                "(point rule; the strictest threshold of its attack rows)"
        why = DecidedBy(rule="point_meets" if status == "PASS" else "point_misses")
    elif hi < t:
        status, said = "FAIL", said + f" lies wholly below robust_accuracy ≥ {t:g} " \
            "(interval rule; the strictest threshold of its attack rows)"
        why = DecidedBy(rule="interval_outside")
    elif lo >= t:
        status, said = "PASS", said + f" lies wholly within robust_accuracy ≥ {t:g} " \
            "(interval rule; the strictest threshold of its attack rows)"
        why = DecidedBy(rule="interval_within")
    else:
        status = "INCONCLUSIVE"
        said += f" straddles robust_accuracy ≥ {t:g} (interval rule)"
        needed = samples_to_decide(value, t) if support else None
        left = (f"about {needed:,} samples at the observed value would decide it"
                if needed is not None else
                "a stronger attack can only lower it" if not support else
                "no practical sample size decides it at the observed value")
        said += f": {left}"
        why = DecidedBy(rule="interval_straddles", reason=left)
    if status == "PASS":
        status, said, why = _stopped_pass(row, errored, warnings, support, by_id, said, why)
    if row.certified is not None:
        f = row.certified
        said += (f"; the certified floor {pct(f.share)} (95% interval {pct(f.interval[0])}–"
                 f"{pct(f.interval[1])}, n {f.n}, by {f.check}) does not prove it")
    return row.model_copy(update={"threshold": t, "status": status, "decision": said,
                                  "warnings": warnings, "support": support,
                                  "decided_by": why})


def _proved(row: WorstCase, t: float, rule: str) -> tuple[str, DecidedBy] | None:
    """A PASS by proof: the row's certified share meets the threshold ``t`` (its whole interval
    under the interval rule, its point estimate under the point rule); ``None`` when it does
    not (or the row has no certified floor). A proof needs no attack's support: no
    perturbation of the threat model changes a certified sample's answer."""
    f = row.certified
    if f is None:
        return None
    lo = f.interval[0] if f.interval else f.share
    met = f.share >= t if rule == "point" else lo >= t
    if not met:
        return None
    how = "point rule" if rule == "point" else "interval rule"
    said = (f"certified {pct(f.share)} (95% interval {pct(f.interval[0])}–{pct(f.interval[1])}, "
            f"n {f.n}) by {f.check} ({' → '.join(CERTIFIED_METHODS.get(m, m) for m in f.methods)}) "
            f"{'meets' if rule == 'point' else 'lies wholly within'} robust_accuracy ≥ {t:g} "
            f"({how}; the strictest threshold of its attack rows): decided by proof, each "
            f"certified sample robust to every perturbation of the threat model; the attacks "
            f"found {pct(row.robust_accuracy)}")
    return said, DecidedBy(rule="certified_meets" if rule == "point" else "certified_within")


def _stopped_pass(row: WorstCase, errored: list[str], warnings: list[str], support: list[str],
                  by_id: dict[str, CheckResult], said: str, why: DecidedBy
                  ) -> tuple[str, str, DecidedBy]:
    """A threat model's PASS by its interval, unless something stops it (an errored attack,
    a masking warning, no attack row that PASSed on its own): (status, decision, rule)."""
    status = "PASS"
    # what stopped the pass, typed, with the clause the card gives as its reason
    blocked: list[tuple[str, str, str]] = []
    if errored:
        gone = f"{', '.join(errored)} produced no result, so the worst case leaves it out"
        blocked.append(("errored_attack", gone, gone))
    if warnings:
        blocked.append(("warning", "gradient masking suspected", warnings[0]))
    if not support:
        blocked.append((
            "no_support",
            "no attack of this threat model PASSed on its own ("
            + "; ".join(f"{i}: {by_id[i].status}" for i in row.attacks if i in by_id) +
            "): a PASS needs a converged white-box attack, or a black-box attack at its "
            "query floor, converged and validated; a stronger attack can only lower this "
            "robust accuracy",
            "no attack of this threat model PASSed on its own: a PASS needs a converged "
            "white-box attack, or a black-box attack at its query floor, converged and "
            "validated"))
    if blocked:
        status, said = "WARN", said + "; but " + "; ".join(b[1] for b in blocked)
        why = why.model_copy(update={"stopped": [b[0] for b in blocked],
                                     "reason": blocked[0][2]})
    else:
        said += f"; supported by {', '.join(support)}"
    return status, said, why


def worst_case_beside_random(specs: Sequence[CheckSpec], results: list[CheckResult],
                             measured: dict[str, Measurement]) -> list[CheckResult]:
    """Put the attack's evidence beside a random-noise pixel property at the same ε.

    ``random_linf`` and ``random_l0`` draw noise at random, so their robustness score (the share
    of correctly classified samples that stay correct) can far exceed the share that survives
    an attack in the same ball. For each such property and each attack check of the suite in
    the same norm at the same ε, the property's result gets, in its details (signed and
    rendered), the attack's share of correctly classified samples that survive
    (1 - attack success rate, with its 95% interval) and a sentence saying which row is the
    worst-case evidence; the property's own status becomes INFO (issue 29): random draws never
    PASS or FAIL beside an attack of the same bound, which decides. Applied to the finished
    checks' typed results after all checks have run; ``specs`` are the suite's check specs
    (``id`` and ``check``), ``measured`` each evaluated check's measurement as its summary
    made it, by id. Returns the results.
    """
    by_id = {r.id: r for r in results}
    attacks = [(s.id, atk.threat_model()) for s in specs
               if (atk := attack_of(s.check)) is not None]
    for spec in specs:
        check = spec.check
        norm = check.random_norm()
        if norm is None:
            continue
        prop = str(check.get_params().get("property"))
        entry, m = by_id.get(spec.id), measured.get(spec.id)
        if entry is None or entry.status == "ERROR" or m is None:
            continue
        bound = _number(m.details["bound"])
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
            at = f"{bound:g} {norm.unit}".strip()
            attack = str(a.params.get("attack", aid))
            sentence = (
                f"{prop} draws noise at random and does not search for the worst "
                f"case; the attack row {aid} ({attack}, {norm} at "
                f"{at}) is the worst-case evidence: {pct(survive)} of the correctly classified "
                f"samples it attacked survive it, against this property's {pct(score)}")
            rows.append({"attack_check": aid, "attack": attack,
                         "norm": norm.name, "epsilon": bound, "surviving_share": survive,
                         "surviving_interval": [1.0 - float(hi), 1.0 - float(lo)],
                         "n_attacked": int(am.metrics["n_robust"]) +
                         int(am.metrics["n_broken"]),
                         "attack_status": a.status, "property_score": score,
                         "exceeds_attack": score > survive, "note": sentence})
        if rows:
            update: dict[str, object] = {"details": {
                **entry.details, "worst_case_comparison": normalize(rows)}}
            # random draws are not a worst case: the attack row of the same bound decides
            # (issue 29); the row stays on the card as information beside it
            said = (f"informational: {prop} draws at random and does not search "
                    f"for the worst case; the attack row {rows[0]['attack_check']} at the "
                    "same bound decides")
            if spec.threshold is not None:
                said += f" (by its own threshold this row was {entry.status}: {entry.decision})"
            update.update(status="INFO", decision=said, decided_by=DecidedBy(
                rule="random_draw", reason=f"the attack row {rows[0]['attack_check']} at the "
                "same bound decides"))
            by_id[spec.id] = entry.model_copy(update=update)
    return [by_id[r.id] for r in results]


def _number(v: JSONLike) -> float:
    """A number a check put in its details (a TypeError if it put something else)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TypeError(f"expected a number in the check's details, got {v!r}")
    return float(v)
