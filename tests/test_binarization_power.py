"""The binarization test with power (issue 17 point 2): a ladder from the hardest configuration,
one packaged configuration per threat model, R-ASR with the attack's full budget, 20 samples."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
import yaml

from certify.api import demo_model_path
from certify.attacks import SquareLinf, margin
from certify.attacks.binarization import (
    LADDER,
    NECESSARY_ONLY,
    PACKAGED,
    BinarizationSettings,
    binarization_test,
    ladder_scores,
    ladder_test,
    passes,
)
from certify.checks.attack import PASS_SCORE, RASR_MARGIN, AttackCheck
from certify.demo.synthetic import GTSRB_CLASS_NAMES, generate
from certify.models.base import QueryCounter
from certify.suite import load_suite

import builders

pytestmark = pytest.mark.e2e

EPS = 8 / 255


@pytest.fixture(scope="module")
def demo_model():
    from certify.device import choose_device
    from certify.models.onnx import OnnxModel

    return OnnxModel(demo_model_path("standard"), choose_device("cpu"))


def _benchmark_signs(model):
    """benchmarks/binarization_power.py's 20 correctly classified signs (uint8 and float)."""
    xu8, y = generate(4, seed=4242)
    x = torch.from_numpy(xu8.transpose(0, 3, 1, 2).copy()).float() / 255
    yt = torch.from_numpy(y)
    keep = (model.predict(x).argmax(1) == yt).nonzero().flatten()[:20]
    return xu8[keep.numpy()], y[keep.numpy()], x[keep], yt[keep]


@pytest.fixture(scope="module")
def signs(demo_model):
    """The benchmark's signs, as tensors."""
    return _benchmark_signs(demo_model)[2:]


def _packaged_outcomes(model, x, y, attack):
    records = []
    for i in range(len(x)):
        counter = QueryCounter(model)
        m0 = float(margin(model.predict(x[i:i + 1]), y[i:i + 1], "logits")[0])
        records.append(binarization_test(counter, x[i], attack, "linf", EPS, 500 + i,
                                         PACKAGED["linf"], "logits", m0))
    tested = [r for r in records if r["bt"] != "setup_failed"]
    assert len(tested) >= 0.8 * len(x)  # the readout separates on the demo model's features
    asr = sum(r["bt"] == "success" for r in tested)
    rasr = sum(bool(r["bt_rasr"]) for r in tested)
    return asr, rasr, len(tested), records


def test_ladder_starts_hardest_and_packaged_configuration_is_fixed_per_threat_model():
    for norm in ("linf", "l2"):
        ladder = LADDER[norm]
        assert ladder[0].n_inner == 999
        # each rung is no harder than the one before it on every knob
        for a, b in zip(ladder, ladder[1:], strict=False):
            assert b.n_inner <= a.n_inner and b.inner_gap >= a.inner_gap
            assert b.closeness <= a.closeness and b.inner_shell <= a.inner_shell
        assert PACKAGED[norm] in ladder
    # the budget does not choose the configuration
    low, high = AttackCheck("square_linf", max_queries=100), AttackCheck("square_linf",
                                                                          max_queries=5000)
    assert low.binarization_ladder() == high.binarization_ladder()


@pytest.mark.slow
def test_packaged_test_passes_adequate_square_and_fails_starved_square(demo_model, signs):
    x, y = signs
    asr, rasr, n, _ = _packaged_outcomes(demo_model, x, y, SquareLinf(EPS, max_queries=1000))
    assert passes(asr, rasr, n, PASS_SCORE, RASR_MARGIN), (asr, rasr, n)
    asr, rasr, n, _ = _packaged_outcomes(demo_model, x, y, SquareLinf(EPS, max_queries=100))
    # today's configuration (N_i 499, closeness 0.5) scored the starved Square 1.00; on other
    # signs the packaged one can too (benchmarks/RESULTS.md): a necessary condition only
    assert not passes(asr, rasr, n, PASS_SCORE, RASR_MARGIN), (asr, rasr, n)


def test_rasr_samples_with_the_attacks_full_budget(demo_model, signs):
    x, y = signs
    attack = SquareLinf(EPS, max_queries=400)
    settings = BinarizationSettings(n_inner=199, inner_gap=0.01, closeness=0.999,
                                    inner_shell=1.0)
    counter = QueryCounter(demo_model)
    m0 = float(margin(demo_model.predict(x[:1]), y[:1], "logits")[0])
    r = binarization_test(counter, x[0], attack, "linf", EPS, 3, settings, "logits", m0)
    assert r["bt"] == "success" and not r["bt_rasr"]
    assert r["bt_attack_queries"] < attack.max_queries  # the attack stopped early...
    assert r["bt_rasr_queries"] == attack.max_queries  # ...random sampling did not
    # every query on the counter: features, the attack and its read-back, random sampling
    assert r["bt_queries"] == (settings.n_inner + settings.n_boundary + 1
                               + r["bt_attack_queries"] + 1 + r["bt_rasr_queries"])


def test_ladder_scores_count_skipped_rungs_as_solved_and_rasr_only_where_run():
    records = [
        {"bt_ladder": [{"bt": "success", "rasr": False}, None, None]},
        {"bt_ladder": [{"bt": "failure", "rasr": False}, {"bt": "success", "rasr": True},
                       None]},
        {"bt_ladder": [{"bt": "setup_failed", "rasr": None},
                       {"bt": "failure", "rasr": False}, {"bt": "success", "rasr": True}]},
    ]
    rungs = ladder_scores(records, 3)
    assert rungs[0] == {"tested": 2, "success": 1, "rasr_success": 0, "rasr_tested": 2,
                        "setup_failed": 1, "skipped": 0}
    assert rungs[1] == {"tested": 3, "success": 2, "rasr_success": 1, "rasr_tested": 2,
                        "setup_failed": 0, "skipped": 1}
    assert rungs[2] == {"tested": 3, "success": 3, "rasr_success": 1, "rasr_tested": 1,
                        "setup_failed": 0, "skipped": 2}


def test_ladder_runs_down_to_the_packaged_rung_on_every_sample(demo_model, signs):
    x, y = signs
    ladder = (BinarizationSettings(n_inner=99, closeness=0.9),
              BinarizationSettings(n_inner=49, closeness=0.5),
              BinarizationSettings(n_inner=19, closeness=0.1))
    counter = QueryCounter(demo_model)
    m0 = float(margin(demo_model.predict(x[:1]), y[:1], "logits")[0])
    r = ladder_test(counter, x[0], SquareLinf(EPS, max_queries=300), "linf", EPS, 9, ladder, 1,
                    "logits", m0)
    assert r["bt_ladder"][0] is not None and r["bt_ladder"][1] is not None
    assert r["bt"] == r["bt_ladder"][1]["bt"]  # the verdict's fields are the packaged rung's
    if r["bt_ladder"][0]["bt"] == "success" or r["bt_ladder"][1]["bt"] == "success":
        assert r["bt_ladder"][2] is None


def test_packaged_suite_tests_20_samples_in_the_packaged_configuration():
    assert AttackCheck("square_linf").binarization_ladder()[2] == 20
    suite = load_suite("gtsrb")
    attacks = [c.check for c in suite.checks if isinstance(c.check, AttackCheck)
               and c.check.binarization_ladder() is not None]
    assert attacks
    for check in attacks:
        ladder, packaged, samples = check.binarization_ladder()
        assert samples >= 20
        norm = check.threat_model()[0]
        assert ladder == LADDER[norm] and ladder[packaged] == PACKAGED[norm]
    assert set(NECESSARY_ONLY) == {"square_linf", "hopskipjump", "square_l2"}  # RESULTS.md
    for attack, why in NECESSARY_ONLY.items():
        # the card states the measured figure itself: a reader has no repository to open
        assert "measured on certify's demo model" in why and any(c.isdigit() for c in why)
        assert "RESULTS.md" not in why and "benchmarks/" not in why, attack


@pytest.mark.slow
def test_starved_square_warns_and_card_shows_hardest_passed_and_interval(tmp_path,
                                                                         demo_model):
    x, y, _, _ = _benchmark_signs(demo_model)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({"name": "bt", "classes": list(GTSRB_CLASS_NAMES),
                                     "checks": [{"id": "starved", "kind": "attack", "params": {
                                         "attack": "square_linf", "epsilon": EPS,
                                         "max_queries": 100},
                                         "threshold": {"metric": "robust_accuracy",
                                                       "min": 0.0}}]}))
    out = tmp_path / "out"
    builders.run_cli("run", demo_model_path("standard"), "--suite", suite, "--data",
                     tmp_path / "d.npz", "--out", out, "--no-pdf")
    r = json.loads((out / "results.json").read_text())
    c = {c["id"]: c for c in r["measurement"]["checks"]}["starved"]
    bt = c["details"]["binarization"]
    assert c["metrics"]["binarization_tested"] + c["metrics"]["binarization_setup_failed"] == 20
    assert c["status"] == "WARN" and not bt["trusted"]
    assert any("too weak" in w for w in c["warnings"])
    assert bt["packaged"] == PACKAGED["linf"].label()
    assert bt["rasr_queries"] == 100
    assert len(bt["ladder"]) == len(LADDER["linf"])
    assert bt["ladder"][0]["packaged"] and not bt["ladder"][0]["passed"]
    hardest = bt["hardest_passed"]
    assert hardest is None or hardest["label"] != PACKAGED["linf"].label()
    lo, hi = c["intervals"]["binarization_score"]
    assert lo <= c["metrics"]["binarization_score"] <= hi
    html = (out / "card.html").read_text()
    assert "hardest configuration passed: " + (hardest["label"] if hardest else "none") in html
    assert f"(95% CI {lo:.2f}–{hi:.2f})" in html
    # Square is a measured necessary-condition-only case (benchmarks/RESULTS.md)
    assert bt["necessary_only"] == NECESSARY_ONLY["square_linf"]
    assert ("the binarization test is a necessary condition only: it cannot tell a starved "
            "square_linf from a converged one") in html


def test_twenty_of_the_checks_own_samples_get_the_test_whatever_their_dataset_indices():
    from certify.checks.attack import bt_positions
    from certify.checks.base import CheckContext

    rng = np.random.default_rng(0)
    selected = tuple(sorted(rng.choice(4300, size=100, replace=False).tolist()))
    ctx = CheckContext(check_seed=1, device=torch.device("cpu"), class_names=[],
                       n_samples=100, selected=selected)
    picked = bt_positions(ctx, 20)
    assert len(picked) == 20 and picked <= set(selected)
    # dataset indices modulo a stride (the old rule) picked a varying number: 13 and 17 of 20
    # on the demo
    assert bt_positions(dataclasses.replace(ctx, selected=selected[:7]), 20) == set(selected[:7])
