"""What an attack check's records decide (the verdict half): metrics, intervals, warnings.

From the merged records of every round, :func:`summarize` computes the robust accuracy and its
interval, the convergence of the budget, what a black-box row can support on its own (its
query floor, a stalled run), the white-box evidence (the ε sweep, the torch copy's use), the
binarization test's score and ladder, and what keeps the row from being settled.
"""

from __future__ import annotations

import statistics
from typing import Any, Literal, Protocol

from certify.attacks import Attack
from certify.attacks.binarization import (
    NECESSARY_ONLY,
    BinarizationSettings,
    ladder_scores,
    passes,
)
from certify.checks.attack_card import gallery_examples, histogram
from certify.checks.attack_schedule import (
    STALLED_SHARE,
    AttackRecord,
    convergence,
    robustness_curve,
    stalled_counts,
    unconverged_warning,
)
from certify.checks.base import Measurement, Settlement
from certify.checks.confidence import worst_case_coverage
from certify.data import Dataset
from certify.images import ImageSink
from certify.norms import L0, ThreatModel
from certify.stats import wilson_interval


class AttackCheck(Protocol):
    """What the verdict reads of an attack check (:class:`certify.checks.attack.AttackCheck`,
    which imports this module)."""

    attack: str
    max_queries: int | Literal["auto"]
    attack_role: Literal["own", "cross_check"]

    @property
    def auto(self) -> bool: ...  # noqa: D102
    def attack_class(self) -> type[Attack]: ...  # noqa: D102
    def white_box(self) -> bool: ...  # noqa: D102
    def build(self) -> Attack: ...  # noqa: D102
    def threat_model(self) -> ThreatModel: ...  # noqa: D102
    def reports_coverage(self) -> bool: ...  # noqa: D102
    def confident_budget(self) -> int: ...  # noqa: D102
    def initial_budget(self) -> int: ...  # noqa: D102
    def cap(self) -> int: ...  # noqa: D102
    def floor(self) -> int: ...  # noqa: D102
    def round_budget(self, r: int) -> int: ...  # noqa: D102
    def total_after(self, r: int) -> int: ...  # noqa: D102
    def binarization_ladder(self) -> tuple[tuple[BinarizationSettings, ...], int, int] | None:
        ...  # noqa: D102

#: The binarization test trusts an attack that solves at least this share of planted
#: problems...
PASS_SCORE = 0.95
#: ...and solves clearly more of them than random sampling: by at least this margin.
RASR_MARGIN = 0.1
#: Robust accuracy may rise with ε by at most max(1 sample, this share) before the attack is
#: unreliable; the largest ε must break at least SWEEP_DESTROYED of the swept samples.
SWEEP_SLACK = 0.01
SWEEP_DESTROYED = 0.99
#: Shown on the card where the binarization test cannot run for the threat model.
BT_NOT_L0: str = L0.binarization_note or ""
#: Why a decision-based attack reports no coverage-under-attack figures.
NO_COVERAGE_UNDER_ATTACK = (
    "not reported for a decision-based attack: it stops at the decision boundary and sees no "
    "scores to raise the wrong class's confidence with, so its mistakes would fall in the "
    "abstained share by construction")
#: Why a labels-only model gets no coverage-under-attack figures.
NO_COVERAGE_LABELS = ("not reported: the model answers labels only, so there is no confidence "
                      "to abstain on")


def summarize(check: AttackCheck, records: list[AttackRecord], data: Dataset) -> Measurement:
    """The attack row's measurement from the merged records of every round."""
    correct = [r for r in records if r["outcome"] != "misclassified"]
    rounds = max((len(r.get("round_queries", [0])) for r in correct), default=1)
    total = 0 if check.white_box() else check.total_after(rounds - 1)
    metrics, intervals = _counts(records, rounds, total)
    labels_only = any(r.get("scores") == "labels" for r in records)
    if check.reports_coverage() and not labels_only:
        metrics.update(_coverage_under_attack(records))
    norm, epsilon = check.threat_model()
    details: dict[str, Any] = {
        "attack": check.attack, "norm": norm.name, "epsilon": epsilon,
        "max_queries": check.max_queries, "attack_params": check.build().params(),
        "queries_histogram": histogram([r["attack_queries"] for r in correct], total),
        "convergence": None,
        "confident_queries": check.confident_budget(),
        "coverage_under_attack": None if check.reports_coverage() and not labels_only else
        NO_COVERAGE_UNDER_ATTACK if not labels_only else NO_COVERAGE_LABELS,
    }
    inherited = [r for r in records if r.get("inherited_from")]
    if inherited:
        details["inherited"] = inherited_details(inherited)
    warnings: list[str] = []
    if check.white_box():
        metrics["gradient_evaluations"] = sum(int(r.get("gradients", 0)) for r in records)
        details["white_box"] = white_box_details(check, records, warnings)
    if check.attack_class().convergence != "exhaustive":
        details["convergence"] = _convergence(check, records, rounds, total, metrics, warnings)
        if not check.white_box():
            details["evidence"] = black_box_evidence(check, records, rounds, metrics,
                                                     warnings)
    if check.attack_class().needs_start:
        _no_start(check, correct, metrics, warnings)
    details["binarization"] = binarization_details(check, records, metrics, intervals,
                                                   warnings)
    if details["binarization"] is None and norm.binarization_note:
        details["binarization_note"] = norm.binarization_note
    sink = ImageSink()
    details["examples"] = gallery_examples(records, data, norm, sink)
    unsettled, settled = _settlement(details)
    return Measurement(metrics=metrics, intervals=intervals, details=details,
                       warnings=warnings, images=sink.images, unsettled=unsettled,
                       settled=settled)


def _counts(records: list[AttackRecord], rounds: int, total: int
            ) -> tuple[dict[str, Any], dict[str, tuple[float, float]]]:
    """The row's counts, rates and query statistics, and the rates' Wilson intervals."""
    n = len(records)
    correct = [r for r in records if r["outcome"] != "misclassified"]
    robust = sum(r["outcome"] == "robust" for r in records)
    broken = sum(r["outcome"] == "broken" for r in records)
    aq = [r["attack_queries"] for r in correct]
    metrics: dict[str, Any] = {
        "robust_accuracy": robust / n if n else 0.0,
        "attack_success_rate": broken / len(correct) if correct else 0.0,
        "clean_accuracy": len(correct) / n if n else 0.0,
        "n": n, "n_robust": robust, "n_broken": broken,
        "queries_median": statistics.median(aq) if aq else 0,
        "queries_mean": statistics.fmean(aq) if aq else 0.0,
        "queries_max": max(aq) if aq else 0,
        "query_budget": total, "rounds": rounds,
    }
    intervals = {"robust_accuracy": wilson_interval(robust, n),
                 "attack_success_rate": wilson_interval(broken, len(correct))}
    return metrics, intervals


def _coverage_under_attack(records: list[AttackRecord]) -> dict[str, Any]:
    """Accuracy at coverage with each sample at its worst case (and, for comparison, at the
    confidence of its first break), the queries spent raising confidences, abstentions."""
    out: dict[str, Any] = dict(worst_case_coverage(records, lambda r: r["outcome"] == "robust"))
    first = [r | {"confidence": r["confidence_first"]} if "confidence_first" in r
             else r for r in records]
    out["first_break_accuracy_at_coverage"] = worst_case_coverage(
        first, lambda r: r["outcome"] == "robust")["worst_case_accuracy_at_coverage"]
    out["confident_queries_total"] = sum(int(r.get("confident_queries", 0)) for r in records)
    out["worst_case_abstentions"] = sum(bool(r.get("abstained")) for r in records)
    return out


def inherited_details(inherited: list[AttackRecord]) -> dict[str, Any]:
    """Samples an earlier attack of the same threat model broke, which this one did not
    attack again (the worst case is over attacks: a broken sample stays broken)."""
    by: dict[str, int] = {}
    for r in inherited:
        by[str(r["inherited_from"])] = by.get(str(r["inherited_from"]), 0) + 1
    return {"samples": len(inherited), "by": dict(sorted(by.items())),
            "why": "broken by an earlier attack of the same threat model, so not attacked "
                   "again: they count as broken here, as in the threat model's worst case"}


def _convergence(check: AttackCheck, records: list[AttackRecord], rounds: int, total: int,
                 metrics: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """Whether the latest run's budget converged, its rounds and the robustness curve."""
    n = len(records)
    correct = [r for r in records if r["outcome"] != "misclassified"]
    attacked = [r for r in correct if not r.get("inherited_from")]
    conv = convergence(records, rounds - 1, check.round_budget(rounds - 1))
    metrics.update(late_breaks=conv["late_breaks"], approaching=conv["approaching"])
    doc = conv | {
        "auto": check.auto, "initial": check.initial_budget(), "cap": check.cap(),
        "role": check.attack_role,
        "rounds": [{"round": k, "budget": check.round_budget(k),
                    "total": check.total_after(k),
                    "attacked": sum(len(r.get("round_queries", [0])) > k for r in attacked),
                    "broken": sum(r.get("broken_round", 0) == k for r in attacked
                                  if r["outcome"] == "broken")}
                   for k in range(rounds)],
        "curve": robustness_curve(records, total),
    }
    if not conv["converged"] and check.white_box():
        warnings.append(
            f"{check.attack} not converged: {conv['late_breaks']} sample(s) first broken "
            f"after its second-to-last step-size checkpoint or by a later restart, more "
            f"than max(1, 1% of {n}) = {conv['allowance']:g}; a stronger attack can only "
            "lower this robust accuracy")
    elif not conv["converged"]:
        warnings.append(unconverged_warning(conv, total, rounds, check.auto, check.cap(), n))
    return doc


def _no_start(check: AttackCheck, correct: list[AttackRecord], metrics: dict[str, Any],
              warnings: list[str]) -> None:
    """Attacks that need an adversarial start: the samples they never attacked."""
    no_start = sum(bool(r.get("start_failed")) for r in correct)
    metrics["n_start_failed"] = no_start
    if no_start:
        warnings.append(
            f"{check.attack} found no adversarial starting point on {no_start} of "
            f"{len(correct)} attacked samples (uniform and coarse noise): they count as "
            f"robust without having been attacked")


def binarization_details(check: AttackCheck, records: list[AttackRecord],
                         metrics: dict[str, Any], intervals: dict[str, tuple[float, float]],
                         warnings: list[str]) -> dict[str, Any] | None:
    """The binarization test's score, R-ASR, ladder and trust, or None when it did not run
    (off, white-box, spatial or L0); a warning when it could not vouch for the attack."""
    bt = check.binarization_ladder()
    if bt is None:
        return None
    tested = [r for r in records if r.get("bt") in ("success", "failure")]
    failed_setup = [r for r in records if r.get("bt") == "setup_failed"]
    asr_n = sum(r["bt"] == "success" for r in tested)
    rasr_n = sum(bool(r["bt_rasr"]) for r in tested)
    asr = asr_n / len(tested) if tested else 0.0
    rasr = rasr_n / len(tested) if tested else 0.0
    metrics.update({"binarization_score": asr, "binarization_rasr": rasr,
                    "binarization_tested": len(tested),
                    "binarization_setup_failed": len(failed_setup)})
    if tested:
        intervals["binarization_score"] = wilson_interval(asr_n, len(tested))
        intervals["binarization_rasr"] = wilson_interval(rasr_n, len(tested))
    trusted = passes(asr_n, rasr_n, len(tested), PASS_SCORE, RASR_MARGIN)
    ladder, packaged, samples = bt
    rungs = ladder_scores([r for r in records if "bt_ladder" in r], len(ladder))
    for k, (cfg, rung) in enumerate(zip(ladder, rungs, strict=True)):
        rung.update(label=cfg.label(), settings=vars(cfg), packaged=k == packaged,
                    passed=passes(rung["success"], rung["rasr_success"], rung["tested"],
                                  PASS_SCORE, RASR_MARGIN, rung["rasr_tested"]))
    # the test qualifies a robust accuracy: where the attack left no robust sample there is
    # none to qualify (0% cannot be lowered by a stronger attack), and the row says so instead
    qualifies = int(metrics.get("n_robust", 0)) > 0
    note = None
    if not tested:
        if qualifies:
            warnings.append("the binarization test could not be set up on any sample, so "
                            "the strength of this attack is unverified")
        else:
            note = ("the binarization test could not be set up, but the attack left no robust "
                    "sample: there is no robust accuracy for it to qualify")
    elif not trusted:
        why = (f"its binarization-test score {asr:.2f} is below {PASS_SCORE}"
               if asr < PASS_SCORE else
               f"its binarization-test score {asr:.2f} is not clearly above random "
               f"sampling (R-ASR {rasr:.2f})")
        if qualifies:
            warnings.append(f"attack too weak to support the robust accuracy it measured: "
                            f"{why}")
        else:
            note = (f"{why}, but the attack left no robust sample: there is no robust "
                    "accuracy for the test to qualify")
    return {
        "settings": vars(ladder[packaged]) | {"samples": samples},
        "packaged": ladder[packaged].label(),
        "ladder": rungs,
        "hardest_passed": next((r for r in rungs if r["passed"]), None),
        "necessary_only": NECESSARY_ONLY.get(check.attack_class().name),
        "head": next((r["bt_head"] for r in tested + failed_setup if "bt_head" in r), None),
        "rasr_queries": check.initial_budget(),
        "features": sorted({r.get("bt_features", "none") for r in tested + failed_setup}),
        "separation_rate": len(tested) / (len(tested) + len(failed_setup))
        if tested or failed_setup else None,
        "setup_failures": [{"id": r["id"], "reason": r.get("bt_reason", "")}
                           for r in failed_setup][:10],
        "trusted": trusted,
        "qualifies": qualifies,
        **({"note": note} if note else {}),
        "pass_score": PASS_SCORE, "rasr_margin": RASR_MARGIN,
    }


def _settlement(details: dict[str, Any]) -> tuple[str | None, Settlement]:
    """Why the robust accuracy is not settled (a stronger attack could lower it), if so, and
    the typed flags the verdict reads."""
    conv_doc, evidence = details.get("convergence"), details.get("evidence")
    unsettled = None
    if (details.get("white_box") or {}).get("transfer"):
        unsettled = "a transfer attack: a stronger attack can only lower it"
    elif conv_doc and not conv_doc["converged"]:
        unsettled = "the attack has not converged: a stronger attack can only lower it"
    elif evidence and evidence["stalled"]:
        unsettled = "the attack stalled: a stronger attack can only lower it"
    settled = Settlement(
        attack_converged=None if not conv_doc else bool(conv_doc["converged"]),
        stalled=bool(evidence and evidence["stalled"]),
        binarization_failed=((details["binarization"] or {}).get("trusted") is False
                             and (details["binarization"] or {}).get("qualifies", True)),
        short_of_floor=bool(evidence and evidence["short_of_pass"]))
    return unsettled, settled


def black_box_evidence(check: AttackCheck, records: list[AttackRecord], rounds: int,
                        metrics: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """What a black-box attack's row can support on its own (issue 27), with a warning
    for each reason it may not PASS: a stalled last run (no signal from the outputs), a
    last run below its floor (the attack's ``query_floor``) or not preceded by a run of half its
    budget (convergence judged across two doubled rounds), and an attack the binarization
    test did not check."""
    floor, last = check.floor(), check.round_budget(rounds - 1)
    flat, judged = stalled_counts(records)
    stalled = judged > 0 and flat >= STALLED_SHARE * judged
    metrics["stalled"] = flat
    if stalled:
        warnings.append(
            f"stalled: {flat} of {judged} unbroken sample(s) had no accepted improvement in "
            f"the last half of their budget: the model's outputs gave the attack no signal "
            "(rounded or saturated scores do this); a stronger attack can only lower this "
            "robust accuracy")
    short = []
    if last < floor:
        short.append(f"its last run had {last:,} queries per sample, below its floor of "
                     f"{floor:,}" + (f" (the cap is {check.cap():,})" if check.auto else ""))
    if rounds < 2:
        short.append("its convergence was not judged across two doubled rounds "
                     "(max_queries: auto)" if not check.auto else
                     "it stopped after one round, so its convergence was not judged "
                     "across two doubled rounds")
    if check.binarization_ladder() is None:
        short.append("the binarization test did not check it" +
                     check.threat_model().norm.no_binarization)
    unbroken = any(r["outcome"] == "robust" for r in records)
    if short and unbroken:
        warnings.append(
            f"{check.attack} alone is evidence, not a PASS: " + "; ".join(short) +
            f"; a black-box attack may PASS on its own only after a run of at least "
            f"{floor:,} queries per sample that followed one of half that budget, "
            "converged and validated by the binarization test; a stronger attack can only "
            "lower this robust accuracy")
    return {"floor": floor, "stalled": stalled, "stalled_samples": flat,
            "unbroken_judged": judged, "short_of_pass": short,
            "can_pass": not short and not stalled}


def sweep_details(records: list[AttackRecord], warnings: list[str]
                   ) -> dict[str, Any] | None:
    """The ε sweep's robust counts per radius, and a warning when the attack is unreliable
    on this model: robust accuracy rising with ε by more than max(1, 1%) of the swept
    samples, or the largest ε breaking fewer than 99% of them."""
    done = [r for r in records if "sweep_broken" in r and "sweep_epsilons" in r]
    if not done:
        return None
    epsilons = [float(e) for e in done[0]["sweep_epsilons"]]
    swept = [r["sweep_broken"] for r in done if len(r["sweep_broken"]) == len(epsilons)]
    m = len(swept)
    robust = [sum(not b[k] for b in swept) for k in range(len(epsilons))]
    slack = max(1.0, SWEEP_SLACK * m)
    rises = [(epsilons[k], epsilons[k + 1]) for k in range(len(robust) - 1)
             if robust[k + 1] > robust[k] + slack]
    destroyed = (m - robust[-1]) >= SWEEP_DESTROYED * m
    if rises or not destroyed:
        why = []
        if rises:
            a, b = rises[0]
            why.append(f"robust accuracy rose from ε={a:.4g} to ε={b:.4g} by more than "
                       f"max(1, 1% of {m})")
        if not destroyed:
            why.append(f"at ε={epsilons[-1]:.4g}, which reaches any image, "
                       f"{robust[-1]} of {m} swept samples stayed unbroken (at most "
                       f"{100 * (1 - SWEEP_DESTROYED):.0f}% may)")
        warnings.append("attack unreliable on this model (ε sweep, Carlini et al. 2019): "
                        + "; ".join(why) + "; a stronger attack can only lower this "
                        "robust accuracy")
    return {"epsilons": epsilons, "robust": robust, "samples": m,
            "reliable": not rises and destroyed}


def white_box_details(check: AttackCheck, records: list[AttackRecord], warnings: list[str]
                       ) -> dict[str, Any]:
    """What the card says of a white-box attack: its effort, the ε sweep, and where the
    torch copy could not be used (a warning: those samples were not attacked)."""
    attack = check.build()
    mismatched = [r for r in records if "white_box_mismatch" in r]
    if mismatched:
        warnings.append(f"{len(mismatched)} sample(s) were not attacked: "
                        f"{mismatched[0]['white_box_mismatch']}; the black-box attacks of "
                        "this threat model carry the verdict")
    grads = [int(r.get("gradients", 0)) for r in records if "gradients" in r]
    moved = [r for r in records if r.get("transfer")]
    transfer = None
    if moved:
        agree = sum(bool(r.get("surrogate_agrees")) for r in moved)
        transfer = {"attacked": len(moved), "surrogate_agrees": agree,
                    "agreement": agree / len(moved)}
        warnings.append(
            f"transfer attack: {check.attack} took its gradients from the surrogate (a local "
            f"model that gave the endpoint's answer on {agree} of {len(moved)} attacked "
            "clean images) and the endpoint judged every candidate; its breaks are real, "
            "but a sample it did not break is no evidence of robustness, so this row "
            "cannot PASS; a stronger attack can only lower this robust accuracy")
    return {"iterations": getattr(attack, "iterations", None),
            "restarts": getattr(attack, "restarts", None),
            "targets": getattr(attack, "targets", None),
            "gradients_median": statistics.median(grads) if grads else 0,
            "not_attacked": len(mismatched),
            "why_not_attacked": mismatched[0]["white_box_mismatch"] if mismatched else None,
            "judged_on": "the real model (every proposal re-queried)",
            "transfer": transfer,
            "eps_sweep": sweep_details(records, warnings)}
