"""The sealed attack call: attacks propose, one call projects, re-queries and decides.

Two planted defects, each caught on the three paths that run attacks: the attack check, the
binarization test (the attack on the planted problem and its random baseline) and the
confident-mistake search. An attack whose proposal leaves the ε-ball is judged on its
projected point (so an adversarial found only outside the ball is no break); an attack that
reports fewer queries than the model saw makes the check ERROR.
"""

from __future__ import annotations

import pytest
import torch
from test_attacks import EPS, PlantedLinear

from certify.attacks import SpatialGrid, SquareLinf, binarization, project
from certify.attacks.base import AttackResult, CountingProxy, inside
from certify.attacks.confident import ConfidentSearch, maximise_confidence
from certify.checks.attack import AttackCheck
from certify.checks.base import CheckContext
from certify.errors import AttackProtocolError
from certify.models.base import QueryCounter

pytestmark = pytest.mark.unit


def _images(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return 0.25 + 0.5 * torch.rand(n, 3, 8, 8, generator=g)


class OutOfBall(SquareLinf):
    """Proposes ``x + 3ε·sign(v)`` (adversarial, but three times outside the L∞ ball) after
    spending its queries honestly."""

    direction: torch.Tensor = torch.zeros(3, 8, 8)

    def run(self, model, x, y, seeds, output):  # noqa: D102
        res = super().run(model, x, y, seeds, output)
        res.x_adv = (x + 3 * self.epsilon * self.direction.sign()).clamp(0, 1)
        return res


class UnderReporting(SquareLinf):
    """Spends its queries, then claims one fewer for the first sample."""

    def run(self, model, x, y, seeds, output):  # noqa: D102
        res = super().run(model, x, y, seeds, output)
        res.queries = res.queries.clone()
        res.queries[0] -= 1
        return res


def _far_model(x: torch.Tensor) -> PlantedLinear:
    """A boundary beyond the ε-ball (frac 2) but within 3ε: only an out-of-ball point breaks."""
    model = PlantedLinear(x, "linf", frac=2.0)
    OutOfBall.direction = model.v
    return model


def _ctx(n: int) -> CheckContext:
    return CheckContext(check_seed=3, device=torch.device("cpu"),
                        class_names=[f"c{i}" for i in range(43)], n_samples=n)


# -- the call itself ----------------------------------------------------------------------------
def test_the_call_judges_the_projected_point_and_counts_the_judge_apart():
    x = _images(2, 0)
    model = _far_model(x[:1])
    y = torch.zeros(2, dtype=torch.long)
    raw = OutOfBall(epsilon=EPS["linf"], max_queries=30)
    counter = QueryCounter(model)
    out = raw(counter, x, y, torch.tensor([1, 2]), "logits")
    assert bool(inside(out.x_adv, x, "linf", EPS["linf"]).all())
    assert torch.equal(out.x_adv, project((x + 3 * EPS["linf"] * model.v.sign()).clamp(0, 1),
                                          x, "linf", EPS["linf"]))
    # outside the ball the proposal fools the model; projected, it does not
    assert int(model.predict((x[:1] + 3 * EPS["linf"] * model.v.sign()).clamp(0, 1))
               .argmax(1)[0]) != 0
    assert not bool(out.success[0])
    assert counter.queries == int(out.queries.sum()) + out.judge_queries
    assert out.judge_queries == 2 and out.gradients.tolist() == [0, 0]


def test_the_call_refuses_a_query_count_other_than_the_counters():
    x = _images(2, 1)
    model = PlantedLinear(x, "linf", frac=0.9)
    with pytest.raises(AttackProtocolError, match="reported .* queries but the model was "
                                                  "asked about"):
        UnderReporting(epsilon=EPS["linf"], max_queries=20)(
            QueryCounter(model), x, torch.zeros(2, dtype=torch.long), torch.tensor([1, 2]),
            "logits")


def test_a_proposer_other_than_the_judge_is_judged_by_the_judge():
    """The seam for white-box and transfer attacks: the proposal's queries go to the proposer,
    the verdict comes from the judge."""
    x = _images(1, 2)
    near = PlantedLinear(x, "linf", frac=0.3)  # the surrogate: easy to break
    far = PlantedLinear(x, "linf", frac=5.0)  # the real model: unbreakable at ε
    far.v = near.v
    surrogate, judge = QueryCounter(near), QueryCounter(far)
    out = SquareLinf(epsilon=EPS["linf"], max_queries=200)(
        surrogate, x, torch.zeros(1, dtype=torch.long), torch.tensor([5]), "logits",
        judge=judge)
    assert bool(near.predict(out.x_adv).argmax(1)[0] != 0)  # the surrogate is fooled ...
    assert not bool(out.success[0])  # ... the judge is not
    assert judge.queries == out.judge_queries == 1
    assert surrogate.queries == int(out.queries[0]) > 1


def test_the_spatial_grid_is_judged_on_its_applied_grid_point():
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))

    class Forged(SpatialGrid):
        def run(self, model, x, y, seeds, output):  # noqa: D102
            res = super().run(model, x, y, seeds, output)
            return AttackResult(torch.zeros_like(x), res.queries,
                                params=torch.tensor([[7.0, 0.0, 0.0]] * len(x)))

    class Constant:
        def predict(self, xb):
            return torch.eye(43)[torch.zeros(len(xb), dtype=torch.long)]

    with pytest.raises(AttackProtocolError, match="not on its grid"):
        Forged(rotation_steps=2, translation_steps=1)(
            CountingProxy(Constant()), x, torch.zeros(2, dtype=torch.long),
            torch.tensor([1, 2]), "logits")
    grid = SpatialGrid(rotation_steps=2, translation_steps=1)
    out = grid(CountingProxy(Constant()), x, torch.zeros(2, dtype=torch.long),
               torch.tensor([1, 2]), "logits")
    assert torch.equal(out.x_adv, x)  # nothing broke: the clean image, not x_adv's bytes


# -- path 1: the attack check -------------------------------------------------------------------
def _check_with(attack) -> AttackCheck:
    check = AttackCheck("square_linf", epsilon=EPS["linf"], max_queries=30,
                        binarization=False, confident_queries=0)
    check.build = lambda: attack  # type: ignore[method-assign]
    return check


def test_attack_check_judges_an_out_of_ball_proposal_projected():
    x = _images(3, 3)
    model = _far_model(x[:1])
    y = model.predict(x).argmax(1)
    recs = _check_with(OutOfBall(epsilon=EPS["linf"], max_queries=30)).run_batch(
        QueryCounter(model), x, y, [0, 1, 2], _ctx(3))
    assert recs[0]["outcome"] == "robust"


def test_attack_check_errors_on_under_reported_queries():
    x = _images(3, 4)
    model = PlantedLinear(x, "linf", frac=0.9)
    y = model.predict(x).argmax(1)
    with pytest.raises(AttackProtocolError):
        _check_with(UnderReporting(epsilon=EPS["linf"], max_queries=30)).run_batch(
            QueryCounter(model), x, y, [0, 1, 2], _ctx(3))


@pytest.mark.e2e
def test_a_check_whose_attack_under_reports_is_an_error_row(monkeypatch, tmp_path, model_path,
                                                            npz_path):
    """End to end: the runner turns the protocol error into the check's ERROR (exit 5)."""
    import json

    import yaml

    from certify import attacks

    import builders

    monkeypatch.setitem(attacks.ATTACKS, "square_linf", UnderReporting)
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({"name": "sealed", "classes": builders.CLASSES, "checks": [
        {"id": "sq", "kind": "attack", "params": {"attack": "square_linf", "max_queries": 20,
                                                  "binarization": False}}]}))
    proc = builders.run_cli("run", model_path, "--suite", suite, "--data", npz_path,
                            "--samples", "8", "--out", tmp_path / "o", "--no-pdf")
    assert proc.returncode == 5, proc.stderr
    (c,) = json.loads((tmp_path / "o" / "results.json").read_text())["measurement"]["checks"]
    assert c["status"] == "ERROR" and "reported" in c["error"]


# -- path 2: the binarization test ----------------------------------------------------------------
class _Features:
    """A feature model over [N, 3, 8, 8]: the identity features, counted."""

    def __init__(self) -> None:
        self.queries = 0

    def has_features(self) -> bool:
        return True

    def features(self, x):
        self.queries += len(x)
        return x.flatten(1)

    def predict(self, x):
        self.queries += len(x)
        return x.flatten(1)[:, :43]


def _bt(attack) -> dict:
    x = _images(1, 5)[0]
    return binarization.binarization_test(
        _Features(), x, attack, "linf", EPS["linf"], seed=9,
        settings=binarization.BinarizationSettings(n_inner=99), output="logits",
        original_margin=1.0, rasr_queries=10)


def test_binarization_judges_an_out_of_ball_proposal_projected():
    class Away(SquareLinf):
        """Proposes a point far outside the ball in every pixel, with zero queries."""

        def run(self, model, x, y, seeds, output):  # noqa: D102
            return AttackResult((x + 0.5).clamp(0, 1), torch.zeros(len(x), dtype=torch.long))

    asked: list[torch.Tensor] = []
    honest = binarization.BinarizedModel.predict

    def spy(self, x):
        asked.append(x.clone())
        return honest(self, x)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(binarization.BinarizedModel, "predict", spy)
        fields = _bt(Away(epsilon=EPS["linf"], max_queries=10))
    assert fields["bt"] in ("success", "failure")
    assert fields["bt_attack_queries"] == 1  # max(0, 1): the attack spent none
    # The attack asked nothing, so the planted model's first question is the judge's: about the
    # projected proposal (inside the ε-ball), never the proposal itself (0.5 outside it).
    x_c = _images(1, 5)
    assert len(asked[0]) == 1
    assert bool(inside(asked[0], x_c, "linf", EPS["linf"]).all())


def test_binarization_errors_on_under_reported_queries():
    with pytest.raises(AttackProtocolError):
        _bt(UnderReporting(epsilon=EPS["linf"], max_queries=10))


def test_the_random_baseline_goes_through_the_call(monkeypatch):
    def cheat(self, model, x, y, seeds, output):
        model.predict(x)
        return AttackResult(x, torch.zeros(1, dtype=torch.long))

    monkeypatch.setattr(binarization.RandomBaseline, "run", cheat)
    with pytest.raises(AttackProtocolError):
        _bt(SquareLinf(epsilon=EPS["linf"], max_queries=10))


# -- path 3: the confident-mistake search --------------------------------------------------------
def _broken(model: PlantedLinear, x: torch.Tensor):
    y = torch.zeros(len(x), dtype=torch.long)
    adv = project(x + EPS["linf"] * model.v.sign(), x, "linf", EPS["linf"])
    scores = model.predict(adv)
    assert bool((scores.argmax(1) != 0).all())
    return y, adv, scores


def test_confident_search_judges_an_out_of_ball_proposal_projected(monkeypatch):
    x = _images(1, 6).repeat(2, 1, 1, 1)  # one image twice: rows share x0
    model = PlantedLinear(x[:1], "linf", frac=0.5)
    y, adv, scores = _broken(model, x)

    def away(self, m, xb, yb, seeds, output):
        for _ in range(3):
            m.predict(xb)
        return AttackResult((xb + 0.5).clamp(0, 1), torch.full((len(xb),), 3))

    monkeypatch.setattr(ConfidentSearch, "run", away)
    counter = QueryCounter(model)
    out = maximise_confidence(counter, x, adv, y, scores, "linf", EPS["linf"], 3,
                              torch.tensor([1, 2]), "logits")
    assert bool(inside(out.x_adv, x, "linf", EPS["linf"]).all())
    assert out.queries.tolist() == [3, 3]
    # the projected points were never queried by the search: the judge asked about them
    assert counter.queries == 6 + 2


def test_confident_search_errors_on_under_reported_queries(monkeypatch):
    x = _images(1, 7).repeat(2, 1, 1, 1)  # one image twice: rows share x0
    model = PlantedLinear(x[:1], "linf", frac=0.5)
    y, adv, scores = _broken(model, x)
    honest = ConfidentSearch.run

    def under(self, m, xb, yb, seeds, output):
        res = honest(self, m, xb, yb, seeds, output)
        res.queries = res.queries - 1
        return res

    monkeypatch.setattr(ConfidentSearch, "run", under)
    with pytest.raises(AttackProtocolError):
        maximise_confidence(QueryCounter(model), x, adv, y, scores, "linf", EPS["linf"], 5,
                            torch.tensor([1, 2]), "logits")


def test_confident_search_is_judged_from_its_own_queries():
    """The honest search costs exactly its budget: the judge's answers are the model's own
    answers to the points it already asked about."""
    x = _images(1, 8).repeat(2, 1, 1, 1)  # one image twice: rows share x0
    model = PlantedLinear(x[:1], "linf", frac=0.5)
    y, adv, scores = _broken(model, x)
    counter = QueryCounter(model)
    out = maximise_confidence(counter, x, adv, y, scores, "linf", EPS["linf"], 7,
                              torch.tensor([1, 2]), "logits")
    assert counter.queries == 14 and out.queries.tolist() == [7, 7]
    assert bool((out.pred != 0).all())
    assert bool((out.confidence >= out.confidence_first).all())
