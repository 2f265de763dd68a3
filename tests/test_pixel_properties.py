"""Pixel threat models: random-noise properties named as such, Sparse-RS for L0, like with like.

The ``random_linf`` / ``random_l0`` corruption properties are random draws; the worst case in
those balls is searched by attacks (Square L∞, Sparse-RS L0), and the card shows the attack's
surviving share beside the random property's score.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from certify.attacks import ATTACKS, SparseRS, project
from certify.checks.attack import BT_NOT_L0, AttackCheck
from certify.errors import SuiteError
from certify.models.base import ModelInfo, QueryCounter
from certify.norms import changed_pixels
from certify.perturbations import PROPERTIES
from certify.suite import load_suite, parse_suite

import builders

pytestmark = pytest.mark.e2e

BASE: dict[str, Any] = {
    "name": "mini",
    "seed": 0,
    "classes": [f"c{i}" for i in range(43)],
    "checks": [],
}


def _suite(*checks: dict[str, Any]) -> Any:
    raw = copy.deepcopy(BASE)
    raw["checks"] = list(checks)
    return parse_suite(raw, "mini.yaml")


# -- the random draws are named as such ----------------------------------------------------

@pytest.mark.parametrize(("old", "new", "attack"), [("linf", "random_linf", "square_linf"),
                                                    ("l0", "random_l0", "sparse_rs")])
def test_old_pixel_property_names_are_refused_naming_the_new_one_and_the_attack(old, new,
                                                                                attack):
    with pytest.raises(SuiteError) as err:
        _suite({"id": "p", "kind": "corruption", "params": {"property": old, "bound": 4}})
    assert new in err.value.message and "random draw" in err.value.message
    assert err.value.hint and f"attack: {attack}" in err.value.hint
    assert attack in ATTACKS and new in PROPERTIES
    with pytest.raises(SuiteError) as err:  # in a pair too
        _suite({"id": "q", "kind": "corruption_pair",
                "params": {"first": {"property": old, "bound": 4, "steps": 1},
                           "second": {"property": "rotation", "bound": 5, "steps": 1}}})
    assert new in err.value.message


def test_random_pixel_properties_say_they_are_random_draws():
    for name in ("random_linf", "random_l0"):
        prop = PROPERTIES[name]
        assert prop.random and "a random draw, not a worst case" in prop.description


def test_packaged_suite_has_random_pixel_rows_and_a_sparse_rs_check_after_square():
    suite = load_suite("gtsrb")
    ids = [c.id for c in suite.checks]
    assert "linf" not in ids and "l0" not in ids
    assert {"random_linf", "random_l0"} <= set(ids)
    # issue 29: random draws are INFO rows beside the attack of the same bound
    assert all(c.threshold is None for c in suite.checks if c.id.startswith("random_"))
    assert ids.index("sparse_rs_l0") == ids.index("square_linf") + 1
    spec = suite.checks[ids.index("sparse_rs_l0")]
    assert isinstance(spec.check, AttackCheck)
    assert spec.check.threat_model() == ("l0", 8.0)
    assert spec.check.max_queries == 1000 and spec.samples == 100
    assert spec.threshold is not None and spec.threshold.min == 0.5


@pytest.mark.parametrize("eps", [8.5, 0, True, "8"])
def test_sparse_rs_epsilon_is_a_whole_number_of_pixels(eps):
    with pytest.raises(SuiteError) as err:
        _suite({"id": "s", "kind": "attack", "params": {"attack": "sparse_rs", "epsilon": eps}})
    assert err.value.hint


# -- projection and Sparse-RS --------------------------------------------------------------

def test_l0_projection_keeps_the_k_most_changed_pixels_all_channels_counting_as_one():
    x = torch.full((1, 3, 4, 4), 0.5)
    adv = x.clone()
    adv[0, 0, 0, 0] = 0.9   # change 0.4 on one channel
    adv[0, :, 1, 1] = 0.1   # change 0.4 on three channels: still one pixel
    adv[0, 2, 2, 2] = 0.45  # change 0.05: the smallest, dropped
    adv[0, 1, 3, 3] = 1.0   # change 0.5: the largest
    out = project(adv, x, "l0", 3)
    assert int(changed_pixels(out, x)[0]) == 3
    assert torch.equal(out[0, :, 1, 1], adv[0, :, 1, 1])
    assert float(out[0, 1, 3, 3]) == 1.0 and float(out[0, 0, 0, 0]) == pytest.approx(0.9)
    assert float(out[0, 2, 2, 2]) == 0.5
    assert torch.equal(project(adv, x, "l0", 16), adv)
    assert torch.equal(project(adv, x, "l0", 0), x)


class SparseWeak:
    """A 43-class linear model over one ``[1, 3, 8, 8]`` image that a few pixels can break.

    A handful of *sensitive* pixels carry weight 1 per channel (random sign), the rest 0.02;
    class 1 wins once ``<v, x - x0>`` passes ``tau``, a fraction of the best change that ``k``
    pixels set to corners of the colour cube can make. So a k-pixel adversarial example exists,
    but a random choice of k pixels rarely contains enough sensitive ones.
    """

    def __init__(self, x0: torch.Tensor, k: int, seed: int, sensitive: int = 6,
                 frac: float = 0.7) -> None:
        g = torch.Generator().manual_seed(seed)
        _, c, h, w = x0.shape
        self.x0 = x0
        v = 0.02 * torch.randn(c, h * w, generator=g)
        where = torch.randperm(h * w, generator=g)[:sensitive]
        v[:, where] = torch.sign(torch.randn(c, sensitive, generator=g))
        self.v = v.view(c, h, w)
        gain = torch.maximum(self.v * (1 - x0[0]), self.v * (0 - x0[0])).sum(0).flatten()
        self.tau = frac * float(gain.topk(k).values.sum())
        self.info = ModelInfo(name="sparse-weak", identity="sparse-weak", input_shape=(c, h, w),
                              num_classes=43, output="logits")

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        z = ((x - self.x0) * self.v).flatten(1).sum(1)
        logits = torch.full((len(x), 43), -10.0)
        logits[:, 0] = self.tau - z
        logits[:, 1] = 0.0
        return logits


def _image(seed: int, n: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return 0.25 + 0.5 * torch.rand(n, 3, 8, 8, generator=g)


@settings(max_examples=15, deadline=None)
@given(k=st.integers(1, 70), budget=st.integers(2, 80), seed=st.integers(0, 10_000),
       frac=st.floats(0.2, 3.0))
def test_sparse_rs_stays_within_k_pixels_and_its_budget(k, budget, seed, frac):
    x = _image(seed, 3)
    model = SparseWeak(x[:1], min(k, 64), seed, frac=frac)  # one linear model for all
    counter = QueryCounter(model, budget=3 * budget)
    attack = SparseRS(epsilon=k, max_queries=budget)
    res = attack.run(counter, x, torch.zeros(3, dtype=torch.long), torch.tensor([1, 2, 3]),
                     "logits")
    assert bool((res.queries <= budget).all()) and counter.queries <= 3 * budget
    assert int(res.queries.sum()) == counter.queries
    assert bool((changed_pixels(res.x_adv, x) <= min(k, 64)).all())  # before projection too
    assert float(res.x_adv.min()) >= 0.0 and float(res.x_adv.max()) <= 1.0
    assert torch.equal(project(res.x_adv, x, "l0", k), res.x_adv)


def test_sparse_rs_stops_each_sample_at_its_first_success_and_is_batch_independent():
    x = _image(5, 3)
    model = SparseWeak(x[:1], 4, 0, frac=0.3)
    seeds, y = torch.tensor([4, 5, 6]), torch.zeros(3, dtype=torch.long)

    together = SparseRS(epsilon=4, max_queries=300).run(QueryCounter(model), x, y, seeds,
                                                        "logits")
    for i in range(3):
        alone = SparseRS(epsilon=4, max_queries=300).run(QueryCounter(model), x[i:i + 1],
                                                         y[i:i + 1], seeds[i:i + 1], "logits")
        assert torch.equal(alone.x_adv[0], together.x_adv[i])
        assert int(alone.queries[0]) == int(together.queries[i])
    broken = model.predict(together.x_adv).argmax(1) != 0
    # a broken sample spent fewer queries than the budget: it stopped at its success
    assert bool(broken[0]) and int(together.queries[0]) < 300


def test_sparse_rs_breaks_a_planted_sparse_weakness_more_often_than_random_l0_draws():
    # measured: Sparse-RS 19 of 20, 1,000 random_l0 draws 0 of 20
    k, budget, n = 3, 1000, 20
    rs_broken = random_broken = 0
    for seed in range(n):
        x = _image(100 + seed)
        model = SparseWeak(x, k, seed)
        y = torch.zeros(1, dtype=torch.long)
        counter = QueryCounter(model)
        res = SparseRS(epsilon=k, max_queries=budget).run(counter, x, y,
                                                          torch.tensor([seed]), "logits")
        assert counter.queries <= budget
        rs_broken += int(model.predict(project(res.x_adv, x, "l0", k)).argmax(1)[0]) != 0
        # the random_l0 property at the same k with the same number of queries
        draws = PROPERTIES["random_l0"].apply(
            x.expand(budget, -1, -1, -1), torch.full((budget, 1), float(k)),
            torch.arange(budget) + 1000 * seed)
        assert bool((changed_pixels(draws, x.expand(budget, -1, -1, -1)) <= k).all())
        random_broken += bool((model.predict(draws).argmax(1) != 0).any())
    assert rs_broken >= 17, rs_broken
    assert random_broken <= rs_broken - 12, (random_broken, rs_broken)


# -- like with like on the card ------------------------------------------------------------

def test_card_puts_the_attack_beside_the_random_pixel_property_at_the_same_bound(tmp_path,
                                                                                net):
    path = builders.export(net, tmp_path / "m.onnx")
    x = builders.make_images(24, seed=7)
    np.savez(tmp_path / "d.npz", x=x, y=builders.predict_net(net, x))
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({"name": "a", "classes": [f"c{i}" for i in range(43)],
                                     "checks": [
        {"id": "rl0", "kind": "corruption",
         "params": {"property": "random_l0", "bound": 6, "steps": 2, "max_draws": 128},
         "threshold": {"metric": "robustness_score", "min": 0.0}},
        {"id": "rlinf", "kind": "corruption",
         "params": {"property": "random_linf", "bound": 0.05, "steps": 1, "max_draws": 128}},
        {"id": "srs", "kind": "attack",
         "params": {"attack": "sparse_rs", "epsilon": 6, "max_queries": 60}},
        {"id": "srs_other_k", "kind": "attack",
         "params": {"attack": "sparse_rs", "epsilon": 3, "max_queries": 20}},
        {"id": "sq", "kind": "attack",
         "params": {"attack": "square_linf", "epsilon": 0.05, "max_queries": 40,
                    "binarization": False}}]}))
    proc = builders.run_cli("run", path, "--suite", suite, "--data", tmp_path / "d.npz",
                            "--out", tmp_path / "o", "--no-pdf")
    assert proc.returncode in (0, 1, 5, 7), proc.stderr
    checks = {c["id"]: c for c in
              json.loads((tmp_path / "o" / "results.json").read_text())["measurement"]["checks"]}
    (l0,) = checks["rl0"]["details"]["worst_case_comparison"]  # not the k=3 attack
    (linf,) = checks["rlinf"]["details"]["worst_case_comparison"]
    for row, attack in ((l0, "srs"), (linf, "sq")):
        a = checks[attack]["metrics"]
        assert row["attack_check"] == attack
        assert row["surviving_share"] == pytest.approx(1 - a["attack_success_rate"])
        assert row["n_attacked"] == a["n_robust"] + a["n_broken"]
        lo, hi = row["surviving_interval"]
        assert lo <= row["surviving_share"] <= hi
        assert "does not search for the worst case" in row["note"]
    assert "worst_case_comparison" not in checks["srs"]["details"]
    # issue 29: beside an attack of the same bound a random draw is INFO, whatever its own
    # threshold said, and the decision names the attack row that decides
    for cid, attack in (("rl0", "srs"), ("rlinf", "sq")):
        assert checks[cid]["status"] == "INFO", checks[cid]["decision"]
        assert f"the attack row {attack} at the same bound decides" in checks[cid]["decision"]
    # L0 attacks have no binarization test, and the card says so instead of a score
    srs = checks["srs"]
    assert srs["details"]["binarization"] is None
    assert srs["metrics"].get("binarization_score") is None
    card = (tmp_path / "o" / "card.html").read_text()
    assert card.count("Random draw, not a worst case.") == 2
    assert "the attack row srs (sparse_rs, l0 at 6 pixels) is the worst-case evidence" in card
    assert "the attack row sq (square_linf, linf at 0.05) is the worst-case evidence" in card
    assert BT_NOT_L0.split(":")[0] in card
    assert "l0, k = 6 pixels" in card
