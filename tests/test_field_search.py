"""Issue 40: adaptive brightness's gradient search over its 16 control points.

A planted ONNX model breaks only when the brightness field lies near one corner of the
control-point box that no design point of the packaged search visits: the design search alone
cannot find it, the gradient search through the torch copy of the graph does, every finding is
judged on the model itself, and queries and gradient evaluations are counted.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from certify.checks.base import CheckContext
from certify.checks.corruption import Corruption
from certify.device import choose_device
from certify.models import load_model
from certify.models.base import ModelInfo, QueryCounter
from certify.models.torchcopy import white_box_of
from certify.perturbations import PROPERTIES
from tests import builders

pytestmark = pytest.mark.unit

BOUND = 0.3
#: The corner the model is vulnerable at: a checkerboard of the 4x4 control points (no
#: quadrant pattern of the design has it, and its Sobol corners agree on ~half the signs).
CORNER = torch.tensor([1.0 if (r + c) % 2 else -1.0 for r in range(4) for c in range(4)])


def _pooled_offset(c: torch.Tensor) -> torch.Tensor:
    """Σ_k s_k (block k's mean brightness − 0.5) of a grey image under control points ``c``."""
    x = torch.full((len(c), 3, 32, 32), 0.5)
    level = torch.full((len(c), 1), BOUND)
    xt = PROPERTIES["adaptive_brightness"].apply(x, torch.cat([level, c], 1),
                                                  torch.zeros(len(c), dtype=torch.long))
    blocks = nn.functional.avg_pool2d(xt[:, :1], 8).flatten(1) - 0.5
    return blocks @ CORNER


class _Corner(nn.Module):
    """Class 1 wins when Σ s_k p_k passes ``thr`` (p_k: channel 0's mean on 8x8 block k)."""

    def __init__(self, thr: float) -> None:
        super().__init__()
        self.pool = nn.Conv2d(3, 1, 8, stride=8, bias=False)  # channel 0's 8x8 block means
        self.head = nn.Linear(16, 2)
        with torch.no_grad():
            self.pool.weight.zero_()
            self.pool.weight[0, 0] = 1 / 64
            self.head.weight.zero_()
            self.head.weight[1] = 100 * CORNER
            self.head.bias.copy_(torch.tensor([0.0, -100 * (0.5 * float(CORNER.sum()) + thr)]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(x).flatten(1))


class _BlackBox:
    """The same model without its graph (as an endpoint would be): design search only."""

    def __init__(self, model: object) -> None:
        self.model = model
        self.info: ModelInfo = model.info  # type: ignore[attr-defined]

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.predict(x)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, torch.Tensor, float]:
    at_corner = float(_pooled_offset(CORNER.view(1, -1))[0])
    thr = 0.85 * at_corner
    path = builders.export(_Corner(thr).eval(), Path(tmp_path_factory.mktemp("m")) / "c.onnx")
    model = load_model(str(path), choose_device("cpu"))
    g = torch.Generator().manual_seed(3)
    x = torch.full((6, 3, 32, 32), 0.5)
    x[:, 2] = torch.rand(6, 32, 32, generator=g)  # distinct images; channel 2 is ignored
    return model, x, thr


def _ctx() -> CheckContext:
    return CheckContext(check_seed=11, device=torch.device("cpu"), class_names=["ok", "bad"])


def test_no_design_point_of_the_packaged_search_reaches_the_corner(planted):
    _, _, thr = planted
    check = Corruption("adaptive_brightness", bound=BOUND, steps=1, tries=8)
    rows = torch.cat([check._round_candidates(r).rows for r in range(len(check.planned()))])
    assert len(rows) == sum(check.planned()) >= 64
    reach = _pooled_offset(rows[:, 1:])
    # the premise: every design point the packaged budget allows stays well short of the corner
    assert float(reach.max()) < 0.8 * thr


def test_the_gradient_search_finds_the_corner_on_the_onnx_path(planted):
    model, x, thr = planted
    assert white_box_of(model) is not None  # an ONNX file with a torch copy of its graph
    y = torch.zeros(len(x), dtype=torch.long)
    check = Corruption("adaptive_brightness", bound=BOUND, steps=1, tries=8)
    counter = QueryCounter(model)
    recs = check.run_batch(counter, x, y, list(range(len(x))), _ctx())
    assert all(r["outcome"] == "broken" and r["field_search"] == "broken" for r in recs)
    assert sum(r["queries"] for r in recs) == counter.queries  # judged points are queries
    assert all(r["gradients"] == 10 for r in recs)  # 1 start x 10 steps, counted apart
    for j, r in enumerate(recs):  # the field found is near the corner and breaks the model
        c = torch.tensor(r["break_params"][1:])
        assert float((torch.sign(c) == CORNER).float().mean()) >= 0.9
        assert float(_pooled_offset(c.view(1, -1))[0]) > thr
        xt = PROPERTIES["adaptive_brightness"].apply(
            x[j : j + 1], torch.tensor([r["break_params"]]), torch.zeros(1, dtype=torch.long))
        assert int(model.predict(xt).argmax(1)[0]) == 1


def test_without_the_graph_the_design_search_alone_misses_it_and_says_so(planted):
    model, x, _ = planted
    y = torch.zeros(len(x), dtype=torch.long)
    check = Corruption("adaptive_brightness", bound=BOUND, steps=1, tries=8)
    box = _BlackBox(model)
    recs = check.run_batch(box, x, y, list(range(len(x))), _ctx())  # type: ignore[arg-type]
    assert all(r["outcome"] == "robust" for r in recs)
    assert all(str(r["field_search"]).startswith("not run: the model's graph is not "
                                                 "available") for r in recs)
    summary = check._field_summary(recs)
    assert summary["searched"] == 0 and summary["not_run"]
