"""Spending queries where they decide something (issue 42 point 2): the run order by threat
model, broken samples not attacked again, a black-box cross-check that stops at convergence,
decision-based attacks only where they are needed, and no attack row PASSing beside a
gradient-masking warning."""

from __future__ import annotations

import pytest
import torch

from certify.checks import AttackCheck, CheckContext, Measurement
from certify.engine.crosscheck import attack_worst_case, no_attack_passes_beside_masking
from certify.engine.schedule import Earlier, execution_order, plan_attack
from certify.models.base import ModelInfo, QueryCounter
from certify.results import DecidedBy, check_result_model
from certify.suite import parse_suite

pytestmark = pytest.mark.unit

CLASSES = [f"c{i}" for i in range(43)]


def _suite(*extra: dict):
    return parse_suite({"name": "t", "classes": CLASSES, "checks": [
        {"id": "clean", "kind": "clean_accuracy"},
        {"id": "square", "kind": "attack",
         "params": {"attack": "square_linf", "epsilon": 0.03, "max_queries": "auto"},
         "threshold": {"metric": "robust_accuracy", "min": 0.5}},
        {"id": "hsj", "kind": "attack",
         "params": {"attack": "hopskipjump", "norm": "linf", "epsilon": 0.03,
                    "max_queries": 1000}},
        {"id": "l2", "kind": "attack",
         "params": {"attack": "square_l2", "epsilon": 0.5, "max_queries": 100}},
        {"id": "apgd", "kind": "attack", "params": {"attack": "apgd_ce", "epsilon": 0.03},
         "threshold": {"metric": "robust_accuracy", "min": 0.5}},
        *extra]}, "s.yaml")


def test_attacks_of_a_threat_model_run_together_white_box_first_sanity_before_all():
    suite = _suite({"id": "sanity", "kind": "sanity"})
    order = [s.id for s in execution_order(suite.checks)]
    assert order == ["sanity", "clean", "apgd", "square", "hsj", "l2"]
    assert sorted(order) == sorted(s.id for s in suite.checks)  # nothing lost or repeated


def _result(cid: str, status: str = "PASS"):
    return check_result_model("attack").model_construct(
        id=cid, kind="attack", status=status, warnings=[], decision="", details={},
        decided_by=DecidedBy(rule="interval_within"))


def _earlier(suite, ran: dict[str, tuple[str, dict[int, dict], dict]]) -> Earlier:
    """``ran``: check id -> (status, records by sample, measurement details)."""
    specs = [s for s in execution_order(suite.checks) if s.id in ran]
    return Earlier(specs, {k: _result(k, v[0]) for k, v in ran.items()},
                   {k: v[1] for k, v in ran.items()},
                   {k: Measurement(metrics={}, details=v[2]) for k, v in ran.items()})


def _spec(suite, cid: str):
    return next(s for s in suite.checks if s.id == cid)


CONVERGED_APGD = {"white_box": {"transfer": None, "not_attacked": 0},
                  "convergence": {"converged": True}}


def test_samples_an_earlier_attack_broke_are_handed_on_and_a_cross_check_stops_at_convergence():
    suite = _suite()
    recs = {0: {"outcome": "broken", "adv_pred": 3, "confidence": 0.9, "probability": 0.8},
            1: {"outcome": "robust"}, 2: {"outcome": "misclassified"}}
    plan = plan_attack(_spec(suite, "square"),
                       _earlier(suite, {"apgd": ("PASS", recs, CONVERGED_APGD)}), "logits")
    assert plan.skip is None
    assert plan.broken_before == {0: {"by": "apgd", "adv_pred": 3, "confidence": 0.9,
                                      "probability": 0.8}}
    assert plan.spec.check.attack_role == "cross_check"
    assert _spec(suite, "square").check.attack_role == "own"  # the suite's check is not changed
    # converged after round 0: the cross-check stops there, an attack on its own goes on
    rounds = {i: {"outcome": "robust", "attack_queries": 1000} for i in range(50)}
    assert plan.spec.check.next_round(rounds, 0) is None
    assert _spec(suite, "square").check.next_round(rounds, 0) is not None
    # an unconverged, transfer or partly unattacked white-box attack makes no cross-check
    for details in ({"white_box": {}, "convergence": {"converged": False}},
                    {"white_box": {"transfer": {"attacked": 3}}, "convergence":
                     {"converged": True}},
                    {"white_box": {"not_attacked": 4}, "convergence": {"converged": True}}):
        again = plan_attack(_spec(suite, "square"),
                            _earlier(suite, {"apgd": ("WARN", recs, details)}), "logits")
        assert again.spec.check.attack_role == "own"
    # an errored earlier attack hands nothing on
    errored = plan_attack(_spec(suite, "square"),
                          _earlier(suite, {"apgd": ("ERROR", recs, CONVERGED_APGD)}), "logits")
    assert errored.broken_before == {} and errored.spec.check.attack_role == "own"


def test_a_decision_based_attack_runs_only_where_it_is_needed():
    suite = _suite({"id": "sanity", "kind": "sanity"})
    square = ("WARN", {0: {"outcome": "robust"}}, {"evidence": {"stalled": False}})
    ran = {"apgd": ("PASS", {}, CONVERGED_APGD), "square": square}
    plan = plan_attack(_spec(suite, "hsj"), _earlier(suite, ran), "logits")
    assert plan.skip is not None and "not needed: square attacked this threat model" in plan.skip
    # labels only: the only black-box evidence
    assert plan_attack(_spec(suite, "hsj"), _earlier(suite, ran), "labels").skip is None
    # the score-based attack stalled, or errored
    stalled = ran | {"square": ("WARN", {}, {"evidence": {"stalled": True}})}
    assert plan_attack(_spec(suite, "hsj"), _earlier(suite, stalled), "logits").skip is None
    gone = ran | {"square": ("ERROR", {}, {})}
    assert plan_attack(_spec(suite, "hsj"), _earlier(suite, gone), "logits").skip is None
    # a sanity check found quantised scores, or a randomised model
    for metric in ("quantised", "nondeterministic_share"):
        found = ran | {"sanity": ("INFO", {}, {})}
        earlier = _earlier(suite, found)
        earlier.measured["sanity"].metrics[metric] = 1.0
        assert plan_attack(_spec(suite, "hsj"), earlier, "logits").skip is None
    # another threat model's score-based attack does not count
    other = parse_suite({"name": "t", "classes": CLASSES, "checks": [
        {"id": "l2", "kind": "attack",
         "params": {"attack": "square_l2", "epsilon": 0.5, "max_queries": 100}},
        {"id": "hsj", "kind": "attack",
         "params": {"attack": "hopskipjump", "epsilon": 0.3, "max_queries": 100}}]}, "o.yaml")
    assert plan_attack(_spec(other, "hsj"), _earlier(other, {"l2": square}), "logits").skip \
        is None


class _Linear:
    """43 classes; class 0 wins by ``m - <1, x - 0.5>`` over class 1 (a margin per image)."""

    def __init__(self) -> None:
        self.info = ModelInfo(name="lin", identity="lin", input_shape=(3, 4, 4),
                              num_classes=43, output="logits")

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        z = (x - 0.5).flatten(1).sum(1)
        out = torch.full((len(x), 43), -10.0)
        out[:, 0] = 0.5 - z
        out[:, 1] = 0.0
        return out


def test_a_sample_broken_before_is_not_attacked_again_and_counts_as_broken():
    x = torch.full((4, 3, 4, 4), 0.5)
    y = torch.zeros(4, dtype=torch.long)
    check = AttackCheck("square_linf", epsilon=0.05, max_queries=50, binarization=False,
                        confident_queries=0)
    earlier = {1: {"by": "apgd", "adv_pred": 1, "confidence": 0.7, "probability": 0.6}}
    ctx = CheckContext(check_seed=3, device=torch.device("cpu"), class_names=CLASSES,
                       n_samples=4, broken_before=earlier)
    counter = QueryCounter(_Linear())
    recs = check.run_batch(counter, x, y, [0, 1, 2, 3], ctx)
    assert recs[1]["outcome"] == "broken" and recs[1]["inherited_from"] == "apgd"
    assert (recs[1]["queries"], recs[1]["attack_queries"], recs[1]["adv_pred"]) == (1, 0, 1)
    assert recs[1]["confidence"] == 0.7
    attacked = [r for k, r in enumerate(recs) if k != 1]
    assert all(r["attack_queries"] > 0 and "inherited_from" not in r for r in attacked)
    assert counter.queries == sum(r["queries"] for r in recs)
    m = check.summarize([r | {"i": k, "id": str(k)} for k, r in enumerate(recs)], None)
    assert m.metrics["n_broken"] >= 1 and m.details["inherited"]["by"] == {"apgd": 1}


def _worst(square: str, apgd: str, statuses: tuple[str, str]):
    suite = parse_suite({"name": "t", "classes": CLASSES, "checks": [
        {"id": "square", "kind": "attack",
         "params": {"attack": "square_linf", "epsilon": 0.03, "max_queries": 100},
         "threshold": {"metric": "robust_accuracy", "min": 0.1}},
        {"id": "apgd", "kind": "attack", "params": {"attack": "apgd_ce", "epsilon": 0.03},
         "threshold": {"metric": "robust_accuracy", "min": 0.1}}]}, "s.yaml")
    word = {"r": "robust", "b": "broken"}
    finals = {k: {i: {"outcome": word[c]} for i, c in enumerate(v)}
              for k, v in (("square", square), ("apgd", apgd))}
    results = [_result("square", statuses[0]), _result("apgd", statuses[1])]
    return suite, finals, results


def test_masking_is_counted_sample_by_sample_and_stops_every_attack_row_from_passing():
    # both break 3 of 100, but different samples: 3 that no white-box attack broke
    suite, finals, results = _worst("bbb" + "r" * 97, "rrrbbb" + "r" * 94, ("WARN", "PASS"))
    (row,) = attack_worst_case(suite, finals, results)
    assert row.broken_by == {"square": 3, "apgd": 3}
    assert row.warnings and "square (black-box) broke 3 sample(s) that the white-box" \
        in row.warnings[0]
    after = no_attack_passes_beside_masking(results, [row])
    apgd = next(r for r in after if r.id == "apgd")
    assert apgd.status == "WARN" and "gradient masking" in apgd.decision
    (again,) = attack_worst_case(suite, finals, after)
    assert again.status == "WARN" and again.support == []
    # the same breaks: no warning, the rows keep their status
    suite, finals, results = _worst("bbb" + "r" * 97, "bbb" + "r" * 97, ("WARN", "PASS"))
    (row,) = attack_worst_case(suite, finals, results)
    assert not row.warnings and no_attack_passes_beside_masking(results, [row]) == results


@pytest.mark.unit
def test_a_ray_worker_gets_every_field_of_the_context_it_runs_in():
    """Issue 62: the Ray executor rebuilt a check's context from a hand-written list of fields
    that lacked ``broken_before``, so under Ray an attack re-attacked the samples an earlier
    attack of its threat model broke and its row differed from the local run's. Every field
    but the worker's own (device, reference model) travels, whatever fields are added."""
    import dataclasses
    import pickle

    from certify.distributed import context_fields

    ctx = CheckContext(check_seed=7, device=torch.device("cpu"), class_names=("a", "b"),
                       flip_invariant_classes=frozenset({1}), n_samples=5, abstain_class=1,
                       selected=(0, 2, 4), broken_before={2: {"by": "apgd", "adv_pred": 1}},
                       reference=object())
    fields = context_fields(ctx)
    assert set(fields) == {f.name for f in dataclasses.fields(CheckContext)} - {
        "device", "reference", "step"}
    rebuilt = CheckContext(device=torch.device("cpu"), **pickle.loads(pickle.dumps(fields)))
    for f in dataclasses.fields(CheckContext):
        if f.name not in ("reference", "step"):
            assert getattr(rebuilt, f.name) == getattr(ctx, f.name) or \
                list(getattr(rebuilt, f.name)) == list(getattr(ctx, f.name)), f.name
    assert rebuilt.broken_before == {2: {"by": "apgd", "adv_pred": 1}}
