"""Attacks: threat-model and budget properties, planted adversarials, the binarization test."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from certify.attacks import (
    ATTACKS,
    HopSkipJump,
    RandomSearch,
    SquareL2,
    SquareLinf,
    margin,
    project,
)
from certify.attacks.binarization import PACKAGED, _readout, binarization_test
from certify.attacks.hsj import estimate_direction
from certify.attacks.square import default_p_init
from certify.checks.attack import one_hot_answers
from certify.models.base import ModelInfo, QueryCounter

import builders

pytestmark = pytest.mark.e2e

EPS = {"linf": 8 / 255, "l2": 0.5}


class PlantedLinear:
    """A linear 43-class model over [N, 3, 8, 8] with a known adversarial direction.

    Class 0 wins while ``<v, x - x0> < tau``; past it class 1 wins. ``tau`` is set to a fraction
    of the best achievable change in the ε-ball, so an adversarial example exists at ε.
    """

    def __init__(self, x0: torch.Tensor, norm: str, frac: float = 0.5, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x0 = x0
        self.v = torch.randn(x0.shape[1:], generator=g)
        best = EPS[norm] * (self.v.abs().sum() if norm == "linf" else self.v.norm())
        self.tau = frac * float(best)
        self.info = ModelInfo(name="planted", identity="planted", input_shape=(3, 8, 8),
                              num_classes=43, output="logits")

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        z = ((x - self.x0[: len(x)] if len(x) == len(self.x0) else x - self.x0[0]) * self.v
             ).flatten(1).sum(1)
        logits = torch.full((len(x), 43), -10.0)
        logits[:, 0] = self.tau - z
        logits[:, 1] = 0.0
        return logits


def _images(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return 0.25 + 0.5 * torch.rand(n, 3, 8, 8, generator=g)


@pytest.mark.parametrize(("cls", "norm"), [(SquareLinf, "linf"), (SquareL2, "l2"),
                                           (HopSkipJump, "l2")])
def test_planted_linear_direction_is_found_within_budget(cls, norm):
    x = _images(1, 0)
    model = PlantedLinear(x, norm, frac=0.5)
    kw = {"norm": norm} if cls is HopSkipJump else {}
    attack = cls(epsilon=EPS[norm], max_queries=2000, **kw)
    counter = QueryCounter(model)
    y = torch.zeros(1, dtype=torch.long)
    res = attack.run(counter, x, y, torch.tensor([3]), "logits")
    adv = project(res.x_adv, x, norm, EPS[norm])
    assert int(model.predict(adv).argmax(1)[0]) != 0
    assert counter.queries <= 2000


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(["square_linf", "square_l2", "hopskipjump", "random"]),
       norm=st.sampled_from(["linf", "l2"]), budget=st.integers(2, 60),
       seed=st.integers(0, 10_000), frac=st.floats(0.3, 3.0))
def test_attacks_stay_in_the_threat_model_and_budget(name, norm, budget, seed, frac):
    cls = ATTACKS[name]
    if name.startswith("square"):
        norm = cls.default_norm()
    x = _images(3, seed)
    model = PlantedLinear(x, norm, frac=frac, seed=seed)
    kw = {"norm": norm} if name in ("hopskipjump", "random") else {}
    attack = cls(epsilon=EPS[norm], max_queries=budget, **kw)
    counter = QueryCounter(model, budget=3 * budget)
    res = attack.run(counter, x, torch.zeros(3, dtype=torch.long), torch.tensor([1, 2, 3]),
                     "logits")
    assert counter.queries <= 3 * budget
    assert bool((res.queries <= budget).all())
    assert int(res.queries.sum()) == counter.queries
    proj = project(res.x_adv, x, norm, EPS[norm])
    assert float(proj.min()) >= 0.0 and float(proj.max()) <= 1.0
    d = (proj - x).flatten(1)
    size = d.abs().max(dim=1).values if norm == "linf" else d.norm(dim=1)
    assert bool((size <= EPS[norm] + 1e-5).all())
    if name != "hopskipjump":  # score-based and random attacks never leave the ball at all
        d = (res.x_adv - x).flatten(1)
        raw = d.abs().max(dim=1).values if norm == "linf" else d.norm(dim=1)
        assert bool((raw <= EPS[norm] + 1e-5).all())
        assert float(res.x_adv.min()) >= 0.0 and float(res.x_adv.max()) <= 1.0


def test_hopskipjump_finds_a_planted_direction_in_3072_dimensions():
    # At d = 3072 the paper's binary-search tolerance (d^-1.5 = 5.9e-6) is what keeps the
    # gradient probes straddling the boundary; a looser one (1e-4) left every probe on the
    # adversarial side and this failed for every seed.
    for seed in range(2):
        g = torch.Generator().manual_seed(seed)
        x = 0.25 + 0.5 * torch.rand(1, 3, 32, 32, generator=g)
        model = PlantedLinear(x, "l2", frac=0.5, seed=seed)
        res = HopSkipJump(epsilon=0.5, max_queries=2000).run(
            QueryCounter(model), x, torch.zeros(1, dtype=torch.long), torch.tensor([seed]),
            "logits")
        adv = project(res.x_adv, x, "l2", 0.5)
        assert int(model.predict(adv).argmax(1)[0]) != 0, seed


@pytest.mark.parametrize("cls", [SquareLinf, HopSkipJump])
def test_a_samples_result_does_not_depend_on_its_batch(cls):
    x = _images(3, 11)
    model = PlantedLinear(x[:1], "l2" if cls is HopSkipJump else "linf", frac=0.9)
    eps = EPS["l2" if cls is HopSkipJump else "linf"]
    seeds = torch.tensor([4, 5, 6])
    y = torch.zeros(3, dtype=torch.long)
    together = cls(epsilon=eps, max_queries=300).run(QueryCounter(model), x, y, seeds, "logits")
    for i in range(3):
        alone = cls(epsilon=eps, max_queries=300).run(QueryCounter(model), x[i:i + 1],
                                                      y[i:i + 1], seeds[i:i + 1], "logits")
        assert torch.equal(alone.x_adv[0], together.x_adv[i]), (cls, i)
        assert int(alone.queries[0]) == int(together.queries[i]), (cls, i)


def test_hopskipjump_subtracts_the_baseline_when_answers_are_mixed():
    # Chen et al. 2020, Eq. (16): with mixed answers the estimate is mean((phi - mean phi) u).
    dirs = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]).view(4, 1, 1, 2)
    ans = torch.tensor([True, True, True, False])
    phi = torch.tensor([0.5, 0.5, 0.5, -1.5])  # +-1 minus their mean 0.5
    want = (phi.view(4, 1, 1, 1) * dirs).mean(dim=0)
    got = estimate_direction(ans, dirs, linf=False)
    assert torch.allclose(got, want / want.norm()), got  # (0.71, -0.71); no baseline: (0.95, -0.32)
    assert torch.equal(estimate_direction(ans, dirs, linf=True), want.sign())
    # All answers agree: no baseline (it would zero the estimate); +-mean of the directions.
    mean = dirs.mean(dim=0)
    assert torch.allclose(estimate_direction(torch.ones(4, dtype=torch.bool), dirs, False),
                          mean / mean.norm())
    assert torch.allclose(estimate_direction(torch.zeros(4, dtype=torch.bool), dirs, False),
                          -mean / mean.norm())


class SmoothIsOther:
    """Labels only: class 1 for smooth images (low mean neighbour difference), else class 0.

    Uniform noise is never smooth, so the paper's random start never leaves class 0; the
    textured images below are class 0 too.
    """

    info = ModelInfo(name="smooth", identity="smooth", input_shape=(3, 8, 8), num_classes=2,
                     output="labels")

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        tv = (x[..., 1:, :] - x[..., :-1, :]).abs().flatten(1).mean(1)
        return torch.nn.functional.one_hot((tv < 0.2).long(), 2).float()


class Constant(SmoothIsOther):
    """Class 0 whatever the input: no adversarial start exists."""

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(torch.zeros(len(x), dtype=torch.long), 2).float()


def _textures(n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return torch.rand(n, 3, 8, 8, generator=g)


def test_hopskipjump_takes_a_second_start_when_uniform_noise_stays_in_the_class():
    x, y = _textures(2), torch.zeros(2, dtype=torch.long)
    model = SmoothIsOther()
    assert int(model.predict(x).argmax(1).sum()) == 0
    assert int(model.predict(torch.rand(500, 3, 8, 8)).argmax(1).sum()) == 0  # noise: class 0
    res = HopSkipJump(epsilon=3.0, max_queries=1000).run(QueryCounter(model), x, y,
                                                         torch.tensor([1, 2]), "labels")
    assert res.start_failed is not None and not bool(res.start_failed.any())
    assert bool((model.predict(res.x_adv).argmax(1) == 1).all())


def test_hopskipjump_reports_samples_it_could_not_start_on():
    x, y = _textures(2), torch.zeros(2, dtype=torch.long)
    attack = HopSkipJump(epsilon=0.5, max_queries=1000, init_tries=7)
    counter = QueryCounter(Constant())
    res = attack.run(counter, x, y, torch.tensor([1, 2]), "labels")
    assert res.start_failed is not None and bool(res.start_failed.all())
    assert torch.equal(res.x_adv, x)
    assert res.queries.tolist() == [14, 14]  # init_tries draws of each of the two starts
    assert counter.queries == 28


def test_attack_check_counts_and_warns_about_samples_without_a_start():
    from certify.checks.attack import AttackCheck
    from certify.checks.base import CheckContext

    check = AttackCheck("hopskipjump", norm="l2", epsilon=0.5, max_queries=100,
                        attack_params={"init_tries": 3}, binarization=False)
    ctx = CheckContext(check_seed=0, device=torch.device("cpu"), class_names=["a", "b"],
                       n_samples=3)
    x, y = _textures(3), torch.tensor([0, 0, 1])  # the third is misclassified
    recs = check.run_batch(QueryCounter(Constant()), x, y, [0, 1, 2], ctx)
    assert [r.get("start_failed", False) for r in recs] == [True, True, False]
    m = check.summarize([r | {"id": str(i)} for i, r in enumerate(recs)], None)
    assert m.metrics["n_start_failed"] == 2
    assert m.metrics["n_robust"] == 2  # still an upper bound, but not silently
    assert any("no adversarial starting point" in w and "2 of 2" in w for w in m.warnings)
    square = AttackCheck("random", max_queries=5, binarization=False)
    recs = square.run_batch(QueryCounter(Constant()), x, y, [0, 1, 2], ctx)
    assert "n_start_failed" not in square.summarize(recs, None).metrics


def test_square_p_init_follows_the_input_size():
    linf, l2 = SquareLinf.large_p_init, SquareL2.large_p_init
    assert default_p_init(linf, 32, 32) == default_p_init(l2, 64, 64) == 0.8
    assert default_p_init(linf, 224, 224) == 0.05
    assert default_p_init(l2, 224, 224) == 0.1


def test_attacks_are_repeatable_from_a_seed():
    x = _images(2, 5)
    for cls, norm in ((SquareLinf, "linf"), (HopSkipJump, "l2"), (RandomSearch, "linf")):
        kw = {"norm": norm} if cls is not SquareLinf else {}
        runs = []
        for _ in range(2):
            model = PlantedLinear(x, norm, frac=0.9)
            res = cls(epsilon=EPS[norm], max_queries=300, **kw).run(
                QueryCounter(model), x, torch.zeros(2, dtype=torch.long),
                torch.tensor([7, 8]), "logits")
            runs.append(res)
        assert torch.equal(runs[0].x_adv, runs[1].x_adv), cls
        assert torch.equal(runs[0].queries, runs[1].queries), cls


@pytest.fixture(scope="module")
def demo_model():
    from certify.api import demo_model_path
    from certify.device import choose_device
    from certify.models.onnx import OnnxModel

    return OnnxModel(demo_model_path("standard"), choose_device("cpu"))


@pytest.fixture(scope="module")
def demo_images():
    from certify.demo.synthetic import generate

    x, y = generate(1, seed=77, classes=list(range(0, 43, 4)))
    return torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).float() / 255, torch.from_numpy(y)


def _bt_scores(model, x, y, attack, settings=PACKAGED["linf"]):
    out = []
    for i in range(len(x)):
        counter = QueryCounter(model)
        m0 = float(margin(model.predict(x[i:i + 1]), y[i:i + 1], "logits")[0])
        out.append(binarization_test(counter, x[i], attack, "linf", 8 / 255, 100 + i,
                                     settings, "logits", m0))
    tested = [r for r in out if r["bt"] != "setup_failed"]
    asr = sum(r["bt"] == "success" for r in tested) / len(tested)
    rasr = sum(bool(r["bt_rasr"]) for r in tested) / len(tested)
    return asr, rasr, out


@pytest.mark.slow
def test_binarization_test_passes_a_real_attack_and_fails_a_starved_one(demo_model,
                                                                         demo_images):
    x, y = demo_images
    asr, rasr, out = _bt_scores(demo_model, x, y, SquareLinf(epsilon=8 / 255, max_queries=1000))
    assert all(r["bt_features"] == "penultimate" for r in out)
    assert asr >= 0.95
    assert rasr < asr
    starved, _, _ = _bt_scores(demo_model, x, y, SquareLinf(epsilon=8 / 255, max_queries=10))
    assert starved < 0.95


def test_confident_logits_keep_a_logit_binarized_copy():
    # softmax of a 30-logit margin is 1.0 in float32; the model still answers with logits
    logits = torch.tensor([[30.0, 0.0, -5.0], [1.0, 0.5, 0.0]])
    assert one_hot_answers(logits, "logits") == [False, False]
    probs = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.5, 0.3]])
    assert one_hot_answers(probs, "probs") == [True, False]


def test_readout_does_not_hang_on_a_unit_dead_on_every_inner_point():
    g = torch.Generator().manual_seed(0)
    f_in = torch.randn(300, 16, generator=g).relu()
    f_in[:, 15] = 0.0  # a ReLU unit that never fires inside the ball
    f_b = torch.randn(1, 16, generator=g).relu()
    f_b[0, :4] += 3.0
    f_b[0, 15] = 0.05  # ... and barely fires at the boundary point
    w = _readout(f_in, f_b)
    assert w is not None
    gap = float((f_b @ w).min() - (f_in @ w).max())
    assert gap > 0
    # per-feature standardisation gave this unit a ~1e6 weight and 99.9999% of the gap
    assert float(w[15]) * 0.05 < 0.1 * gap


class BrokenSquare(SquareLinf):
    """A deliberately broken Square Attack: it never accepts an improvement."""

    def run(self, model, x, y, seeds, output):
        res = super().run(model, x, y, seeds, output)
        res.x_adv = x.clone()  # throws its work away
        return res


def test_binarization_test_fails_a_broken_attack(demo_model, demo_images):
    x, y = demo_images
    asr, _, _ = _bt_scores(demo_model, x[:4], y[:4], BrokenSquare(epsilon=8 / 255,
                                                                  max_queries=200))
    assert asr < 0.95


def test_attack_check_end_to_end_with_labels_only_refusal(tmp_path, net):
    # a labels-only model: argmax inside the graph
    class Labels(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x).argmax(dim=1)

    path = tmp_path / "labels.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Labels(net).eval(), (torch.rand(2, 3, 32, 32),), str(path),
                          input_names=["input"], output_names=["label"], dynamo=False,
                          dynamic_axes={"input": {0: "n"}, "label": {0: "n"}})
    x = builders.make_images(20, seed=4)
    import numpy as np

    np.savez(tmp_path / "d.npz", x=x, y=builders.predict_net(net, x))
    suite = tmp_path / "s.yaml"
    classes = [f"c{i}" for i in range(43)]
    suite.write_text(yaml.safe_dump({"name": "a", "classes": classes, "checks": [
        {"id": "sq", "kind": "attack", "params": {"attack": "square_linf"}}]}))
    proc = builders.run_cli("run", path, "--suite", suite, "--data", tmp_path / "d.npz",
                            "--out", tmp_path / "o")
    assert proc.returncode == 2
    assert "needs scores" in proc.stderr and "Traceback" not in proc.stderr
    suite.write_text(yaml.safe_dump({"name": "a", "classes": classes, "checks": [
        {"id": "hsj", "kind": "attack", "params": {"attack": "hopskipjump", "norm": "l2",
                                                   "max_queries": 200,
                                                   "binarization": False}},
        {"id": "rnd", "kind": "attack", "params": {"attack": "random", "max_queries": 50,
                                                   "binarization": False}}]}))
    proc = builders.run_cli("run", path, "--suite", suite, "--data", tmp_path / "d.npz",
                            "--out", tmp_path / "o2", "--no-pdf")
    assert proc.returncode in (0, 7), proc.stderr  # INFO, or WARN: a 200-query budget is short
    r = json.loads((tmp_path / "o2" / "results.json").read_text())
    assert r["measurement"]["model"]["output"] == "labels"
    for c in r["measurement"]["checks"]:
        assert c["metrics"]["n"] == 20
        assert c["metrics"]["queries_max"] <= c["params"]["max_queries"]


def test_a_run_with_unstartable_hopskipjump_warns_on_the_card(tmp_path):
    class ConstantNet(torch.nn.Module):
        def forward(self, x):
            return x.flatten(1)[:, :43] * 0 + torch.eye(43)[0]  # class 0, whatever x

    path = tmp_path / "const.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(ConstantNet().eval(), (torch.rand(2, 3, 32, 32),), str(path),
                          input_names=["input"], output_names=["logits"], dynamo=False,
                          dynamic_axes={"input": {0: "n"}, "logits": {0: "n"}})
    import numpy as np

    x = builders.make_images(4, seed=4)
    np.savez(tmp_path / "d.npz", x=x, y=np.zeros(4, dtype=np.int64))
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({"name": "a", "classes": [f"c{i}" for i in range(43)],
                                     "checks": [{"id": "hsj", "kind": "attack", "params": {
                                         "attack": "hopskipjump", "max_queries": 50,
                                         "attack_params": {"init_tries": 2},
                                         "binarization": False}}]}))
    proc = builders.run_cli("run", path, "--suite", suite, "--data", tmp_path / "d.npz",
                            "--out", tmp_path / "o", "--no-pdf")
    assert proc.returncode == 7, proc.stderr  # WARN: not silently robust
    (row,) = json.loads((tmp_path / "o" / "results.json").read_text()
                        )["measurement"]["attack_worst_case"]
    assert row["status"] == "WARN"  # the threat model's row carries the attack row's WARN
    (c,) = json.loads((tmp_path / "o" / "results.json").read_text())["measurement"]["checks"]
    assert c["metrics"]["n_start_failed"] == 4 and c["metrics"]["robust_accuracy"] == 1.0
    assert any("no adversarial starting point on 4 of 4" in w for w in c["warnings"])
    assert "4 never attacked (no adversarial start)" in (tmp_path / "o" / "card.html").read_text()



class _Linear:
    """A linear model that records the size of each call."""

    def __init__(self, w: torch.Tensor) -> None:
        self.w, self.calls = w, []

    def predict(self, z: torch.Tensor) -> torch.Tensor:
        self.calls.append(len(z))
        return z.flatten(1) @ self.w


def _random_search(x, y, model, per_call):
    from certify.attacks.base import Uniforms
    from certify.attacks.simple import first_success, random_ball_points

    rng = Uniforms(torch.arange(len(x)))

    def candidates(q: int, active: torch.Tensor) -> torch.Tensor:
        u = rng.draw(x[0].numel(), active).view(len(active), *x.shape[1:])
        return random_ball_points(x[active], "linf", 0.3, u, None,
                                  torch.full((len(active),), q % 2 == 1))

    return first_success(model, x, y, 200, candidates, call_images=per_call)


def test_random_search_draws_and_first_hits_do_not_depend_on_draws_per_call():
    """first_success asks several draws of its last samples in one call: the same draws, the
    same first hits, and every image the model saw is counted."""
    torch.manual_seed(0)
    w = torch.randn(3 * 8 * 8, 5)
    x = torch.rand(7, 3, 8, 8)
    y = (x.flatten(1) @ w).argmax(1)
    one, many = _Linear(w), _Linear(w)
    res1, hit1 = _random_search(x, y, one, 1)
    res64, hit64 = _random_search(x, y, many, 64)
    assert bool((hit1 >= 0).any()) and torch.equal(hit1, hit64)
    assert torch.equal(res1.x_adv, res64.x_adv)
    for res, hit, model in ((res1, hit1, one), (res64, hit64, many)):
        assert int(res.queries.sum()) == sum(model.calls)  # every image asked is counted
        assert bool((res.queries >= hit + 1).all())
    assert len(many.calls) < len(one.calls)
