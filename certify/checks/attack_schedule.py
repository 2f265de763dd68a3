"""When an attack check runs again: budgets, rounds, convergence (the scheduling half).

``max_queries: auto`` runs an attack in rounds: round 0 with the attack's initial budget
(:attr:`~certify.attacks.base.Attack.initial_queries`, or the suite's ``initial_queries``),
then, while the latest run is not converged or is below the attack's query floor
(:attr:`~certify.attacks.base.Attack.query_floor`), the still-unbroken samples again from
scratch with twice the budget, up to the cap. The records of every round are merged here.
"""

from __future__ import annotations

import copy
import typing
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

from certify.attacks import ATTACKS, Attack
from certify.attacks.binarization import BinarizationFields
from certify.checks.confidence import ConfidenceRecord

#: ``max_queries: auto``: the total queries per sample a round may reach, as a multiple of the
#: initial budget, unless ``query_cap`` says.
AUTO_CAP_FACTOR = 16
#: A budget is converged when at most max(1, this share of the samples) were still moving: first
#: broken in the last half of the budget, or (minimisation attacks) still being approached.
CONVERGENCE_SHARE = 0.01
#: A run is *stalled* when at least this share of its still-unbroken samples had no accepted
#: improvement in the last half of their budget: the model's outputs gave it no signal.
STALLED_SHARE = 0.5
#: Record fields that describe one attempt on a sample; a later round's attempt replaces them.
_ATTEMPT = ("outcome", "adv_pred", "confidence", "start_failed", "gap", "half_gap", "abstained",
            "confidence_first", "confident_queries", "adv_image", "scores")
#: Record fields that are tallies over rounds or the sample's identity.
_TALLY = ("queries", "attack_queries", "ref_queries", "check", "i", "id", "label")


class AttackRecord(ConfidenceRecord, BinarizationFields, total=False):
    """An attack record: the sample's attempt(s) and, on the tested subset, the binarization
    test's fields.

    ``outcome`` is ``misclassified`` (never attacked), ``robust`` or ``broken``;
    ``attack_queries`` are the attack's (over all rounds; ``round_queries`` per round), and a
    break records the total queries at which it happened (``broken_at``), its ``adv_pred``,
    the round (``broken_round``) and, for the card's gallery, ``adv_image`` (a PNG, base64)
    with what its ``confidence`` is (``scores``). An unbroken sample keeps the minimisation
    attacks' ``gap`` and ``half_gap`` (convergence) or ``start_failed``. A white-box attack's
    record says when it was a ``transfer`` from an endpoint's surrogate, and whether the
    surrogate gave the sample's clean image the endpoint's answer (``surrogate_agrees``).
    """

    label: int
    attack_queries: int
    round_queries: list[int]
    adv_pred: int
    broken_at: int
    broken_round: int
    clean_changed: bool
    start_failed: bool
    gap: float
    half_gap: float
    confidence_first: float
    confident_queries: int
    adv_image: str
    scores: str
    gradients: int
    late_break: bool
    white_box_mismatch: str
    sweep_broken: list[bool]
    sweep_epsilons: list[float]
    transfer: bool
    surrogate_agrees: bool
    inherited_from: str


_S = TypeVar("_S", bound="AttackSchedule")


class AttackSchedule:
    """The budget and rounds of an attack check (mixed into
    :class:`~certify.checks.attack.AttackCheck`): what it runs next, from its records."""

    attack: str
    max_queries: int | Literal["auto"]
    initial_queries: int | None
    query_cap: int | None
    _round: int
    attack_role: Literal["own", "cross_check"]

    def attack_class(self) -> type[Attack]:
        """The attack's class: what it is (threat norms, capabilities, budgets)."""
        return ATTACKS[self.attack]

    def white_box(self) -> bool:
        """Whether the attack proposes from gradients of a torch copy of the graph."""
        return bool(self.attack_class().needs_gradients)

    @property
    def auto(self) -> bool:
        """Whether the budget grows in rounds until converged (``max_queries: auto``)."""
        return self.max_queries == "auto"

    def initial_budget(self) -> int:
        """Round 0's queries per sample (the whole budget when it is a number)."""
        if not self.auto:
            return int(self.max_queries)
        if self.initial_queries is not None:
            return self.initial_queries
        return self.attack_class().initial_queries

    def cap(self) -> int:
        """The largest budget one round's run may have."""
        if not self.auto:
            return self.initial_budget()
        return self.query_cap if self.query_cap is not None else \
            AUTO_CAP_FACTOR * self.initial_budget()

    def round_budget(self, r: int) -> int:
        """Queries per sample of round ``r``'s run: the initial budget, doubled each round."""
        return self.initial_budget() * (1 << r)

    def total_after(self, r: int) -> int:
        """Queries per sample a never-broken sample has spent after rounds ``0..r``."""
        return self.initial_budget() * ((1 << (r + 1)) - 1)

    def floor(self) -> int:
        """The single run's queries per sample this attack needs before its row may PASS on
        its own (the attack's ``query_floor``; 0 for white-box attacks and exhaustive grids).
        ``max_queries: auto`` keeps doubling a converged run until it reaches this floor, while
        the cap allows."""
        return self.attack_class().query_floor

    def for_role(self: _S, role: Literal["own", "cross_check"]) -> _S:
        """A copy that runs in ``role`` (see :attr:`attack_role`)."""
        c = copy.copy(self)
        c.attack_role = role
        return c

    def for_round(self: _S, r: int) -> _S:
        """A copy that runs round ``r`` (its budget and seed stream; no binarization test)."""
        c = copy.copy(self)
        c._round = r
        return c

    def next_round(self: _S, records: dict[int, AttackRecord], done: int
                   ) -> tuple[_S, list[int]] | None:
        """After rounds ``0..done`` (merged ``records``): the next round's check and samples,
        or None when the budget is fixed, converged (and at the attack's query floor, unless
        it runs as a cross-check: :attr:`attack_role`), or the next budget would pass the cap."""
        if not self.auto or self.round_budget(done + 1) > self.cap():
            return None
        floor = 0 if self.attack_role == "cross_check" else self.floor()
        if convergence(list(records.values()), done, self.round_budget(done))["converged"] \
                and self.round_budget(done) >= floor:
            return None
        todo = sorted(i for i, r in records.items() if r["outcome"] == "robust")
        return (self.for_round(done + 1), todo) if todo else None

    def merge_round(self, records: dict[int, AttackRecord], new: dict[int, AttackRecord],
                    r: int) -> dict[int, AttackRecord]:
        """Fold round ``r``'s records into the merged ones: queries add up, the new attempt
        replaces the old, and a break records the total queries at which it happened."""
        out = dict(records)
        for i, rec in new.items():
            old = out[i]
            rounds = [*old.get("round_queries", [int(old["attack_queries"])]),
                      int(rec["attack_queries"])]
            merged = typing.cast(AttackRecord, {k: v for k, v in old.items()
                                                if k not in _ATTEMPT})
            merged.update(typing.cast(AttackRecord, {k: v for k, v in rec.items()
                                                     if k not in _TALLY}))
            merged.update({
                "round_queries": rounds,
                "attack_queries": sum(rounds),
                "queries": int(old["queries"]) + int(rec["queries"]),
            })
            if "ref_queries" in old or "ref_queries" in rec:
                merged["ref_queries"] = int(old.get("ref_queries", 0)) + \
                    int(rec.get("ref_queries", 0))
            if rec["outcome"] == "misclassified":
                # The model changed its answer to the unattacked image between rounds (a
                # randomised model): it is not robust, whatever the attack did.
                merged.update({"outcome": "broken", "clean_changed": True})
            if merged["outcome"] == "broken":
                merged["broken_at"] = sum(rounds[:-1]) + int(rec["attack_queries"])
                merged["broken_round"] = r
            out[i] = merged
        return out


def convergence(records: Sequence[AttackRecord], last_round: int, last_budget: int
                ) -> dict[str, Any]:
    """Whether the latest run's budget is converged, from the merged records of every round.

    ``last_round`` is the latest round and ``last_budget`` its run's queries per sample. *Late
    breaks* are samples that run first broke in the last half of its budget. *Approaching* are
    unbroken samples whose gap to success (the margin loss of score-based attacks; the distance
    beyond ε of a minimisation attack's closest adversarial point) fell in the last half of that
    run by at least the gap left: at the same pace, as many queries again would break them.
    Converged when both together are at most max(1, :data:`CONVERGENCE_SHARE` × samples).
    """
    n = len(records)
    allowance = max(1.0, CONVERGENCE_SHARE * n)
    late = sum(1 for r in records if r["outcome"] == "broken" and (
        bool(r.get("late_break")) or (  # white-box: after the second-to-last checkpoint
            int(r.get("broken_round", 0)) == last_round and "gradients" not in r
            and int(r.get("round_queries", [r["attack_queries"]])[-1]) > last_budget / 2)))
    approaching = sum(
        1 for r in records if r["outcome"] == "robust" and "gap" in r and "half_gap" in r
        and float(r["half_gap"]) > float(r["gap"])
        and float(r["gap"]) <= float(r["half_gap"]) - float(r["gap"]))
    return {"late_breaks": late, "approaching": approaching, "allowance": allowance,
            "last_budget": last_budget, "converged": late + approaching <= allowance}


def stalled_counts(records: Sequence[AttackRecord]) -> tuple[int, int]:
    """(unbroken samples whose gap to success did not move in the last half of the latest
    run's budget, unbroken samples with a recorded gap). Score-based attacks record the
    margin loss, HopSkipJump the distance beyond ε; an unchanged gap means no candidate was
    accepted (no improvement) in that half."""
    judged = [r for r in records if r["outcome"] == "robust" and "gap" in r and "half_gap" in r]
    flat = sum(float(r["gap"]) >= float(r["half_gap"]) for r in judged)
    return flat, len(judged)


def robustness_curve(records: Sequence[AttackRecord], total: int) -> list[dict[str, float]]:
    """Robust accuracy had the attack stopped after q queries per sample, for q from 0 to
    ``total`` on a doubling grid (each round's total included)."""
    n = len(records)
    correct = sum(r["outcome"] != "misclassified" for r in records)
    at = sorted(int(r.get("broken_at", r["attack_queries"])) for r in records
                if r["outcome"] == "broken")
    qs = {0, total}
    q = 1
    while q < total:
        qs.add(q)
        q *= 2
    out = []
    for q in sorted(qs):
        broken = sum(b <= q for b in at)
        out.append({"queries": q, "robust_accuracy": (correct - broken) / n if n else 0.0})
    return out


def unconverged_warning(conv: dict[str, Any], total: int, rounds: int, auto: bool, cap: int,
                 n: int) -> str:
    moving = (f"{conv['late_breaks']} sample(s) first broken in the last half of the "
              f"{conv['last_budget']:,}-query run")
    if conv["approaching"]:
        moving += f" and {conv['approaching']} still being approached"
    allowed = f"more than max(1, 1% of {n}) = {conv['allowance']:g}"
    if auto:
        return (f"budget not converged at the cap: after {rounds} round(s) ({total:,} queries "
                f"per unbroken sample, the last run at the cap of {cap:,}), {moving}, "
                f"{allowed}; a stronger attack can only lower this robust accuracy")
    return (f"budget not converged: with {total:,} queries per sample, {moving}, {allowed}; "
            "a stronger attack can only lower this robust accuracy (max_queries: auto grows "
            "the budget until converged)")
