"""The brittle score's decision-target variant does not move with the logit scale (issue 29
point 3): the demo's standard model with its logits multiplied by 0.1 and by 10 (no decision
changes) gives the variant, per sample and on average, and R.I. on it, as unscaled; Vora et
al.'s score on the probability target moves."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from certify.api import demo_model_path
from certify.checks.base import CheckContext
from certify.checks.brittleness import Brittleness
from certify.data.loaders import Dataset
from certify.demo.synthetic import generate
from certify.device import choose_device
from certify.models.base import QueryCounter
from certify.models.onnx import OnnxModel

from pgd_oracle import with_head

pytestmark = pytest.mark.unit

#: Per-sample keys of the variant: model and reference, SLIC and grid.
VARIANT = ("decision_l1_per_dim", "grid_decision_l1_per_dim", "ref_decision_l1_per_dim",
           "ref_grid_decision_l1_per_dim")


class _Softmax:
    """A model answering the softmax of another's logits (``output: probs``)."""

    def __init__(self, model: OnnxModel) -> None:
        self.model = model
        self.info = dataclasses.replace(model.info, output="probs")

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.model.predict(x), dim=1)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Records and summary of the standard model (against the robust reference) unscaled,
    with logits x0.1 and x10, and as probabilities: 4 samples, 60 masks."""
    dev = choose_device("cpu")
    src = demo_model_path("standard")
    tmp = tmp_path_factory.mktemp("scaled")
    models: dict[str, OnnxModel | _Softmax] = {"none": OnnxModel(src, dev)}
    for head, name in (("x0.1", "x01.onnx"), ("x10", "x10.onnx")):
        models[head] = OnnxModel(with_head(src, tmp / name, head), dev)
    models["probs"] = _Softmax(OnnxModel(src, dev))
    reference = OnnxModel(demo_model_path("robust"), dev)
    x, y = generate(1, seed=7, classes=[1, 12, 25, 38])
    data = Dataset(x=torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).float() / 255,
                   y=torch.from_numpy(y).long(), ids=[str(i) for i in range(len(y))],
                   class_names=[f"c{i}" for i in range(43)], source="synthetic", layout="NCHW")
    check = Brittleness(num_masks=60, max_heatmaps=0)
    out = {}
    for name, model in models.items():
        ctx = CheckContext(check_seed=3, device=torch.device("cpu"), class_names=[],
                           reference=QueryCounter(reference))
        idx = list(range(len(data)))
        recs = check.run_batch(QueryCounter(model), data.x, data.y, idx, ctx)
        for i, r in enumerate(recs):
            r.update({"i": i, "id": data.ids[i]})
        out[name] = (recs, check.summarize(recs, data))
    return out


@pytest.mark.parametrize("head", ["x0.1", "x10", "probs"])
def test_decision_variant_ignores_the_logit_scale(runs, head):
    base, base_m = runs["none"]
    recs, m = runs[head]
    assert [r["top"] for r in recs] == [r["top"] for r in base]
    for key in VARIANT:
        np.testing.assert_allclose([r[key] for r in recs], [r[key] for r in base],
                                   rtol=1e-9, atol=0)
    for name in ("brittle_score_decision", "brittle_score_decision_grid",
                 "relative_improvement", "relative_improvement_grid"):
        assert m.metrics[name] == pytest.approx(base_m.metrics[name], rel=1e-9, abs=0)
        np.testing.assert_allclose(m.intervals[name], base_m.intervals[name], rtol=1e-9)
    assert m.details["comparison"]["words"] == base_m.details["comparison"]["words"]
    assert base_m.metrics["brittle_score_decision"] > 0


@pytest.mark.parametrize("head", ["x0.1", "x10"])
def test_probability_target_moves_with_the_logit_scale(runs, head):
    """Vora et al.'s score (and their R.I.) is not scale-free: the same decisions give another
    score; the softmax of the same logits gives the same one."""
    base, base_m = runs["none"]
    recs, m = runs[head]
    per, per0 = np.array([r["l1_per_dim"] for r in recs]), np.array([r["l1_per_dim"]
                                                                      for r in base])
    assert np.all(np.abs(per - per0) > 1e-3 * per0)
    assert abs(m.metrics["brittle_score"] - base_m.metrics["brittle_score"]) > \
        0.1 * base_m.metrics["brittle_score"]
    assert m.metrics["relative_improvement_probability"] != pytest.approx(
        base_m.metrics["relative_improvement_probability"], rel=0.05)
    probs = runs["probs"][1]
    assert probs.metrics["brittle_score"] == pytest.approx(base_m.metrics["brittle_score"],
                                                           rel=1e-6)
