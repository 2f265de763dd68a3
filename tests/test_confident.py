"""Confident adversarial mistakes (Brown et al. 2018) in the attack checks' coverage figures.

After a break, score-based attacks spend a bounded extra budget raising the wrong class's
confidence inside the same ε-ball; decision-based attacks report no accuracy at coverage under
attack; a model's explicit abstain class counts as abstaining in the attack's figures.
"""

from __future__ import annotations

import pytest
import torch

from certify.checks import AttackCheck, CheckContext
from certify.checks.confidence import worst_case_coverage
from certify.errors import SuiteError
from certify.models.base import ModelInfo, QueryCounter

pytestmark = pytest.mark.unit

C = 0.5  # every image sits near the constant grey image


class MarginModel:
    """A 43-class linear model on [N, 3, 8, 8] with a clear margin past its boundary.

    Class 0 scores ``tau - z`` with ``z = <v, x - C>``, class 1 scores 0, the rest -10: past the
    boundary class 1 wins, and its probability keeps rising with ``z`` up to the far side of
    the ε-ball (``tau`` is a fraction of the largest ``z`` the ε-ball allows).
    """

    def __init__(self, norm: str, eps: float) -> None:
        self.v = torch.randn(3, 8, 8, generator=torch.Generator().manual_seed(0))
        reach = eps * (self.v.abs().sum() if norm == "linf" else self.v.norm())
        # random L2 steps align with v far less than L∞ sign steps: a nearer boundary
        self.tau = (0.5 if norm == "linf" else 0.2) * float(reach)
        self.info = ModelInfo(name="margin", identity="margin", input_shape=(3, 8, 8),
                              num_classes=43, output="logits")

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        z = ((x - C) * self.v).flatten(1).sum(1)
        logits = torch.full((len(x), 43), -10.0)
        logits[:, 0] = self.tau - z
        logits[:, 1] = 0.0
        return logits


def _data(model: MarginModel) -> tuple[torch.Tensor, torch.Tensor]:
    """4 samples near the boundary, 2 far from it (robust), 1 mislabelled."""
    g = torch.Generator().manual_seed(1)
    near = C + 0.002 * torch.randn(4, 3, 8, 8, generator=g)
    far = (C - 0.2 * model.v.sign()).expand(2, 3, 8, 8)
    x = torch.cat([near, far, near[:1]]).clamp(0, 1)
    y = torch.tensor([0, 0, 0, 0, 0, 0, 2])
    return x, y


def _ctx(abstain_class: int | None = None) -> CheckContext:
    return CheckContext(check_seed=7, device=torch.device("cpu"),
                        class_names=[f"c{i}" for i in range(43)], n_samples=7,
                        abstain_class=abstain_class)


def _run(check: AttackCheck, model: MarginModel, ctx: CheckContext
         ) -> tuple[list[dict], QueryCounter]:
    x, y = _data(model)
    counter = QueryCounter(model)
    recs = check.run_batch(counter, x, y, list(range(len(x))), ctx)
    for i, r in enumerate(recs):
        r.update({"i": i, "id": str(i)})
    return recs, counter


@pytest.mark.parametrize(("attack", "norm", "eps"), [("square_linf", "linf", 8 / 255),
                                                     ("square_l2", "l2", 0.5)])
def test_score_based_attacks_raise_the_confidence_of_their_mistakes(attack, norm, eps):
    model = MarginModel(norm, eps)
    budget = 40
    check = AttackCheck(attack, epsilon=eps, max_queries=300, binarization=False,
                        confident_queries=budget)
    recs, counter = _run(check, model, _ctx())
    broken = [r for r in recs if r["outcome"] == "broken"]
    assert len(broken) == 4  # the near samples, and only they
    for r in broken:
        assert r["confidence"] >= r["confidence_first"]
        assert 0 < r["confident_queries"] <= budget
        assert r["adv_pred"] != 0
    assert any(r["confidence"] > r["confidence_first"] + 0.05 for r in broken)
    # the extra queries are counted: the records claim exactly what the model saw
    assert sum(r["queries"] for r in recs) == counter.queries
    assert sum(r["confident_queries"] for r in broken) <= budget * len(broken)
    # the figures under attack read the raised confidence; the first-break one is kept too
    m = check.summarize(recs, None).metrics  # type: ignore[arg-type]
    assert m["confident_queries_total"] == sum(r["confident_queries"] for r in broken)
    assert m["worst_case_accuracy_at_coverage"] == worst_case_coverage(
        recs, lambda r: r["outcome"] == "robust")["worst_case_accuracy_at_coverage"]
    assert "first_break_accuracy_at_coverage" in m


def test_confident_search_stays_adversarial_and_in_the_ball():
    from certify.attacks import project
    from certify.attacks.confident import maximise_confidence

    model = MarginModel("linf", 8 / 255)
    x, y = _data(model)
    x, y = x[:4], y[:4]
    adv = project(x + (8 / 255) * model.v.sign(), x, "linf", 8 / 255)
    scores = model.predict(adv)
    assert bool((scores.argmax(1) != y).all())
    out = maximise_confidence(QueryCounter(model), x, adv, y, scores, "linf", 8 / 255, 30,
                              torch.arange(4), "logits")
    assert (out.x_adv - x).abs().max() <= 8 / 255 + 1e-6
    assert bool((model.predict(out.x_adv).argmax(1) != y).all())
    assert bool((out.confidence >= out.confidence_first).all())
    assert bool((out.queries == 30).all())


def test_abstain_class_counts_as_abstention_in_an_attack_check():
    model = MarginModel("linf", 8 / 255)
    check = AttackCheck("square_linf", epsilon=8 / 255, max_queries=300, binarization=False,
                        confident_queries=10)
    recs, _ = _run(check, model, _ctx(abstain_class=1))  # the attack's wrong class abstains
    m = check.summarize(recs, None).metrics  # type: ignore[arg-type]
    assert m["n_broken"] == 4 and m["worst_case_abstentions"] == 4
    # 7 samples, 80% coverage keeps 6 places: 2 robust, 1 mislabelled answer, the abstentions
    # rank last and are not answers: 2 right of 3 answered
    assert m["worst_case_accuracy_at_coverage"] == pytest.approx(2 / 3)
    plain, _ = _run(check, model, _ctx())
    pm = check.summarize(plain, None).metrics  # type: ignore[arg-type]
    assert pm["worst_case_abstentions"] == 0
    assert pm["worst_case_accuracy_at_coverage"] != pytest.approx(2 / 3)


def test_decision_based_attacks_report_no_coverage_under_attack():
    model = MarginModel("l2", 0.5)
    check = AttackCheck("hopskipjump", norm="l2", epsilon=0.5, max_queries=200,
                        binarization=False)
    recs, counter = _run(check, model, _ctx())
    assert sum(r["queries"] for r in recs) == counter.queries
    assert not any("confident_queries" in r for r in recs)
    res = check.summarize(recs, None)  # type: ignore[arg-type]
    assert "worst_case_accuracy_at_coverage" not in res.metrics
    assert "decision-based" in res.details["coverage_under_attack"]
    with pytest.raises(SuiteError, match="score-based"):
        AttackCheck("hopskipjump", confident_queries=50).check_params("checks[0]")


def test_worst_case_coverage_ranks_explicit_abstentions_last_and_never_answers_them():
    recs = [{"outcome": "robust", "confidence": 0.9}, {"outcome": "robust", "confidence": 0.8},
            {"outcome": "broken", "confidence": 0.99, "abstained": True},
            {"outcome": "broken", "confidence": 0.7},
            {"outcome": "misclassified", "confidence": 0.6}]
    robust = lambda r: r["outcome"] == "robust"  # noqa: E731
    # full coverage: 4 answers (2 right), the abstention is not one of them
    assert worst_case_coverage(recs, robust, 1.0)["worst_case_accuracy_at_coverage"] == 0.5
    # 60%: 3 places; without the flag the confident break (0.99) would take one of them
    assert worst_case_coverage(recs, robust, 0.6)["worst_case_accuracy_at_coverage"] == \
        pytest.approx(2 / 3)
    plain = [{k: v for k, v in r.items() if k != "abstained"} for r in recs]
    assert worst_case_coverage(plain, robust, 1.0)["worst_case_accuracy_at_coverage"] == 0.4
