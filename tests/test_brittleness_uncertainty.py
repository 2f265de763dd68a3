"""Brittle score: bootstrap intervals, paired R.I. (on the decision-target variant, and Vora et
al.'s on the probability target), the grid segmentation, batching invariance and what the card
says (issue 17 point 9, issue 29 point 3)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import certify.checks.brittleness as brittleness
from certify.api import demo_model_path
from certify.checks.base import CheckContext
from certify.checks.brittleness import Brittleness, direction_words, grid_segment
from certify.data.loaders import Dataset
from certify.demo.synthetic import generate
from certify.device import choose_device
from certify.engine import decide
from certify.models.base import QueryCounter
from certify.models.onnx import OnnxModel
from certify.report.card import _environment
from certify.suite import CheckSpec, Threshold

pytestmark = pytest.mark.unit

HYPOTHESIS = "Vora et al. hypothesise that a lower score tracks adversarial robustness"


@pytest.fixture(scope="module")
def models():
    dev = choose_device("cpu")
    standard = OnnxModel(demo_model_path("standard"), dev)
    return standard, OnnxModel(demo_model_path("robust"), dev), \
        OnnxModel(demo_model_path("standard"), dev)


@pytest.fixture(scope="module")
def data():
    x, y = generate(1, seed=123, classes=list(range(0, 43, 2)))
    xt = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).float() / 255
    return Dataset(x=xt, y=torch.from_numpy(y).long(), ids=[str(i) for i in range(len(y))],
                   class_names=[f"c{i}" for i in range(43)], source="synthetic", layout="NCHW")


def _records(check, model, reference, data, seed=0, batch=None):
    ctx = CheckContext(check_seed=seed, device=torch.device("cpu"), class_names=[],
                       reference=None if reference is None else QueryCounter(reference))
    counter = QueryCounter(model)
    n = len(data)
    batch = batch or n
    recs = []
    for start in range(0, n, batch):
        idx = list(range(start, min(n, start + batch)))
        recs += check.run_batch(counter, data.x[idx], data.y[idx], idx, ctx)
    for i, r in enumerate(recs):
        r.update({"i": i, "id": data.ids[i]})
    assert counter.queries == sum(r["queries"] for r in recs)
    return recs


@pytest.fixture(scope="module")
def pair(models, data):
    """The demo's standard model against its adversarially trained reference (at 100 masks
    SLIC's probability-target R.I. interval still contains 0 on these 22 samples; at 300 it
    does not; the decision-target variant resolves no difference on them)."""
    check = Brittleness(num_masks=300, max_heatmaps=0)
    return check, check.summarize(_records(check, models[0], models[1], data), data)


@pytest.fixture(scope="module")
def same(models, data):
    """The standard model against a second copy of itself."""
    check = Brittleness(num_masks=100, max_heatmaps=0)
    return check, check.summarize(_records(check, models[0], models[2], data), data)


@pytest.mark.slow
def test_intervals_are_bootstraps_containing_the_estimates(pair, data, models):
    check, m = pair
    for name in ("brittle_score", "brittle_score_grid", "reference_brittle_score",
                 "reference_brittle_score_grid", "relative_improvement",
                 "relative_improvement_grid", "brittle_score_decision",
                 "brittle_score_decision_grid", "reference_brittle_score_decision",
                 "reference_brittle_score_decision_grid", "relative_improvement_probability",
                 "relative_improvement_probability_grid"):
        lo, hi = m.intervals[name]
        assert lo < m.metrics[name] < hi, name
    assert m.details["bootstrap"]["resamples"] == brittleness.BOOTSTRAP
    # seeded from the check seed: the same records give the same interval, another seed not
    recs = _records(check, models[0], models[1], data, seed=0)
    assert check.summarize(recs, data).intervals == m.intervals
    for r in recs:
        r["check_seed"] = 5
    assert check.summarize(recs, data).intervals["brittle_score"] != m.intervals["brittle_score"]


def test_paired_ri_resolves_a_clearly_different_pair(pair):
    """The standard model against its robust reference: Vora et al.'s R.I. = (ref - model) /
    ref < 0 (the model is the more brittle one), and the paired interval lies wholly below 0."""
    _, m = pair
    lo, hi = m.intervals["relative_improvement_probability"]
    assert lo < m.metrics["relative_improvement_probability"] < hi < 0
    assert m.details["comparison_probability"]["resolved"] is True


def test_ri_is_on_the_decision_target_variant(pair):
    """``relative_improvement`` is the decision-target variant's R.I. (with its own scores and
    a paired interval), and the details say which target each R.I. is on."""
    _, m = pair
    from certify.checks.brittleness import relative_improvement
    assert m.metrics["relative_improvement"] == pytest.approx(relative_improvement(
        m.metrics["brittle_score_decision"], m.metrics["reference_brittle_score_decision"]))
    assert m.metrics["relative_improvement_probability"] == pytest.approx(relative_improvement(
        m.metrics["brittle_score"], m.metrics["reference_brittle_score"]))
    assert m.metrics["brittle_score_decision"] != m.metrics["brittle_score"]
    c = m.details["comparison"]
    assert c["basis"] == brittleness.DECISION_BASIS
    assert "positive scaling of the logits leaves unchanged" in c["basis"]
    assert "moves with the scale of the logits" in m.details["comparison_probability"]["basis"]
    assert c["resolved"] is direction_words(
        m.metrics["relative_improvement"], m.intervals["relative_improvement"],
        m.metrics["relative_improvement_grid"])[0]


def test_headline_names_the_basis_of_ri(pair):
    check, m = pair

    class View:
        metrics = type("M", (), {k: m.metrics.get(k) for k in
                                 (x.name for x in Brittleness.metrics)})
        intervals = m.intervals
        details = m.details

    text = Brittleness.headline(View)
    assert ("on the decision-target variant, which a positive scaling of the logits leaves "
            "unchanged") in text
    assert "Vora et al.'s R.I." in text and "moves with the scale of the logits" in text


def test_a_model_against_its_copy_resolves_nothing(same):
    _, m = same
    assert m.metrics["relative_improvement"] == 0
    lo, hi = m.intervals["relative_improvement"]
    assert lo <= 0 <= hi
    assert m.details["comparison"]["resolved"] is False
    assert m.details["comparison"]["words"].startswith("no difference resolved")


def test_grid_segmentation_is_scored(pair):
    grid = grid_segment(32, 32, 64)
    assert int(grid.max()) + 1 == 64
    assert np.array_equal(np.bincount(grid.ravel()), np.full(64, 16))  # 4x4 square cells
    _, m = pair
    assert m.metrics["brittle_score_grid"] > 0
    assert m.details["grid"] == {"cells": 64, "side": 4}
    lo, hi = m.intervals["brittle_score_grid"]
    assert lo < m.metrics["brittle_score_grid"] < hi


def _fake(model, ref, grid_model, grid_ref, n=30, probability=(0.5, 0.5, 0.5, 0.5)):
    """Records with decision-target scores around ``model``, ``ref``, ``grid_model`` and
    ``grid_ref``, and probability-target scores around ``probability``."""
    rng = np.random.default_rng(0)

    def v(mean):
        return mean + 0.01 * rng.standard_normal()

    pm, pr, gm, gr = probability
    return [{"i": i, "id": str(i), "d": 60, "grid_d": 64, "top": 0, "weights": [0.0] * 60,
             "check_seed": 1, "queries": 20,
             "decision_l1_per_dim": v(model), "ref_decision_l1_per_dim": v(ref),
             "grid_decision_l1_per_dim": v(grid_model),
             "ref_grid_decision_l1_per_dim": v(grid_ref),
             "l1_per_dim": v(pm), "ref_l1_per_dim": v(pr), "grid_l1_per_dim": v(gm),
             "ref_grid_l1_per_dim": v(gr)}
            for i in range(n)]


def test_segmentations_ranking_differently_resolve_nothing(data):
    check = Brittleness(num_masks=10, max_heatmaps=0)
    m = check.summarize(_fake(0.5, 1.0, 1.0, 0.5), data)
    assert m.intervals["relative_improvement"][0] > 0.4  # SLIC alone: clearly lower
    assert m.details["comparison"]["resolved"] is False
    assert "grid segmentation ranks" in m.details["comparison"]["words"]
    assert m.warnings
    # a threshold on R.I. cannot PASS on such a measurement
    spec = CheckSpec(id="b", kind="brittleness", check=check,
                     threshold=Threshold("relative_improvement", min=0.1))
    status, _ = decide(spec, m.metrics, m.warnings, 0, m.intervals)
    assert status != "PASS"
    agree = check.summarize(_fake(0.5, 1.0, 0.6, 1.0), data)
    assert agree.details["comparison"]["resolved"] and not agree.warnings
    assert decide(spec, agree.metrics, agree.warnings, 0, agree.intervals)[0] == "PASS"


def test_targets_ranking_differently_is_a_warning(data):
    """Vora et al.'s R.I. resolved one way and the decision-target variant's the other: the
    measurement warns that the probability target depends on the logit scale."""
    check = Brittleness(num_masks=10, max_heatmaps=0)
    m = check.summarize(_fake(0.5, 1.0, 0.6, 1.0, probability=(1.0, 0.5, 1.0, 0.6)), data)
    assert m.metrics["relative_improvement"] > 0 > m.metrics["relative_improvement_probability"]
    assert m.details["comparison"]["resolved"] and m.details["comparison_probability"]["resolved"]
    assert any("depends on the scale of the logits" in w for w in m.warnings)


def test_records_from_before_the_variant_still_summarize(data):
    """Records without the decision-target keys (a run resumed from an older certify) give
    the paper's scores and no variant or R.I. on it."""
    check = Brittleness(num_masks=10, max_heatmaps=0)
    old = [{k: v for k, v in r.items() if "decision" not in k} for r in _fake(0.5, 1.0, 0.6, 1.0)]
    m = check.summarize(old, data)
    assert "brittle_score_decision" not in m.metrics and "relative_improvement" not in m.metrics
    assert m.metrics["relative_improvement_probability"] == pytest.approx(0.0, abs=0.05)
    assert check.sample_values(old).keys() == {"l1_per_dim", "ref_l1_per_dim",
                                                "grid_l1_per_dim", "ref_grid_l1_per_dim"}


def test_records_do_not_depend_on_batching(models, data, monkeypatch):
    check = Brittleness(num_masks=50, max_heatmaps=0)
    sub = Dataset(x=data.x[:8], y=data.y[:8], ids=data.ids[:8], class_names=data.class_names,
                  source="synthetic", layout="NCHW")
    eight = _records(check, models[0], models[1], sub, batch=8)
    one = _records(check, models[0], models[1], sub, batch=1)
    monkeypatch.setattr(brittleness, "_CHUNK", 37)  # model calls that cut across samples
    odd = _records(check, models[0], models[1], sub, batch=8)
    # images built in a worker thread while the models run (as for an endpoint or a GPU),
    # into two buffers taken in turn
    monkeypatch.setattr(brittleness, "_local_cpu", lambda model: False)
    overlapped = _records(check, models[0], models[1], sub, batch=8)
    assert all("grid_l1_per_dim" in r and "ref_grid_l1_per_dim" in r for r in eight)
    assert all("grid_decision_l1_per_dim" in r and "ref_decision_l1_per_dim" in r for r in eight)
    assert eight == one == odd == overlapped


def test_sample_values_pair_every_score(models, data):
    """``certify compare`` pairs each score's per-sample values: every ``compare_values`` key
    is among ``sample_values``, one value per record."""
    check = Brittleness(num_masks=20, max_heatmaps=0)
    sub = Dataset(x=data.x[:3], y=data.y[:3], ids=data.ids[:3], class_names=data.class_names,
                  source="synthetic", layout="NCHW")
    values = check.sample_values(_records(check, models[0], models[1], sub))
    assert set(Brittleness.compare_values.values()) <= set(values)
    assert set(values) == set(brittleness._VALUE_KEYS)
    assert all(len(v) == 3 for v in values.values())
    assert {"brittle_score_decision", "brittle_score_decision_grid"} <= set(
        Brittleness.compare_values)


def _render(m, reference: bool) -> str:
    c = {"id": "brittleness", "status": "INFO", "error": None, "metrics": m.metrics,
         "intervals": m.intervals, "details": m.details}
    meta = {"model": {"name": "standard.onnx"},
            "reference_model": {"name": "robust.onnx"} if reference else None}
    html = _environment().get_template("checks/brittleness.html.j2").render(
        checks=[c], m=meta, img=lambda digest, alt: "")
    return " ".join(html.split())


def test_card_states_the_hypothesis_and_the_direction(pair, same, models, data):
    check = Brittleness(num_masks=10, max_heatmaps=0)
    resolved = check.summarize(_fake(1.0, 0.5, 1.0, 0.6), data)  # the model clearly higher
    html = _render(resolved, True)
    assert HYPOTHESIS in html
    assert "higher than the reference (more brittle" in html
    assert "positive means this model's score is lower than the reference's" in html
    assert "No difference resolved" in _render(same[1], True)
    check = Brittleness(num_masks=50, max_heatmaps=0)
    alone = check.summarize(_records(check, models[0], None, data), data)
    html = _render(alone, False)
    assert HYPOTHESIS in html and "R.I." not in html
    lo, hi = alone.intervals["brittle_score_grid"]
    assert f"{lo:.5f}–{hi:.5f}" in html
