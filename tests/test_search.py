"""Corruption properties are searched, not sampled (issue 29): planted defects that a few
random draws miss and the packaged search finds, and the search's rounds on the card."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from certify.errors import CARD_WRITTEN_CODES
from certify.perturbations import PROPERTIES

import builders

pytestmark = pytest.mark.e2e

CLASSES = [f"class {i}" for i in range(43)]
PACKAGED = {c["id"]: c for c in yaml.safe_load(
    (Path(__file__).parents[1] / "suites" / "gtsrb.yaml").read_text())["checks"]}


def _logits(trigger: torch.Tensor) -> torch.Tensor:
    """Class 0 by a margin of 10, class 1 by 10 where ``trigger`` (``[N]``, 0 or 1) is set."""
    t = trigger.float().view(-1, 1)
    others = (t * 0 - 1e3).expand(-1, 41)  # batch-sized in the exported graph
    return torch.cat([10 - 20 * t, -10 + 20 * t, others], dim=1)


class FlatPatchModel(torch.nn.Module):
    """Wrong only when the 5x5 patch centred at (row 18, col 13) is one flat colour: a sticker
    must cover that patch (its centre within about a pixel of the patch's, its angle near a
    right angle, at the largest size)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patch = x[:, :, 16:21, 11:16].flatten(2)
        var = patch.var(dim=2, unbiased=False).sum(dim=1)
        return _logits(var < 1e-4)


class HalfPixelModel(torch.nn.Module):
    """Wrong only when the centre's two-level texture (0.2 / 0.8) is averaged with its
    neighbours: a translation by a half pixel does it, a whole pixel does not."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spread = (x[:, :, 6:26, 6:26] - 0.5).abs().mean(dim=(1, 2, 3))
        return _logits(spread < 0.2)


class CornerModel(torch.nn.Module):
    """Wrong only when the top-left corner is brighter and the bottom-right one darker than
    the grey image by most of the bound (0.3): one corner of the brightness field."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tl = x[:, :, :8, :8].mean(dim=(1, 2, 3))
        br = x[:, :, -8:, -8:].mean(dim=(1, 2, 3))
        return _logits((tl > 0.72) & (br < 0.28))


LOG: list[str] = []  # the last run's log (stderr)


def _run(tmp_path: Path, module: torch.nn.Module, x: np.ndarray, check: dict) -> dict:
    np.savez(tmp_path / "d.npz", x=x, y=np.zeros(len(x), dtype=np.int64))
    model = builders.export(module, tmp_path / "m.onnx")
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"name": "planted", "classes": CLASSES, "seed": 0,
                                     "checks": [check]}))
    out = tmp_path / "out"
    proc = builders.run_cli("run", model, "--suite", suite, "--data", tmp_path / "d.npz",
                            "--out", out, "--no-pdf")
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    LOG[:] = [proc.stderr]
    doc = json.loads((out / "results.json").read_text())
    return {c["id"]: c for c in doc["measurement"]["checks"]}[check["id"]]


def _random_draws_find(prop: str, x: np.ndarray, module: torch.nn.Module, bound: float,
                       steps: int, tries: int) -> float:
    """Share of samples that ``tries`` seeded random draws per level break (the old search):
    the property's seed path, no design."""
    p = PROPERTIES[prop]
    imgs = torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255
    levels = p.levels(bound, steps).float()
    broken = torch.zeros(len(imgs), dtype=torch.bool)
    for lv in levels[p.intensity(levels.double()) > 0]:
        for t in range(tries):
            seeds = torch.arange(len(imgs)) * 1000 + t + 7
            out = p.apply(imgs, lv[:1].expand(len(imgs), 1).contiguous(), seeds)
            broken |= module(out).argmax(1) != 0
    return float(broken.float().mean())


def test_the_packaged_sticker_search_finds_a_narrow_placement(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, size=(12, 32, 32, 3), dtype=np.uint8)
    model = FlatPatchModel()
    check = dict(PACKAGED["sticker"])
    check.pop("threshold", None)
    params = check["params"]
    # a few random placements per size (the old search) rarely cover the patch
    assert _random_draws_find("sticker", x, model, params["bound"], params["steps"], 4) < 0.5
    r = _run(tmp_path, model, x, check)
    assert r["metrics"]["n_evaluated"] == 12
    assert r["metrics"]["robustness_score"] == 0.0


def test_the_packaged_translation_search_finds_a_sub_pixel_defect(tmp_path):
    rng = np.random.default_rng(2)
    x = np.where(rng.random((10, 32, 32, 1)) < 0.5, 51, 204).astype(np.uint8).repeat(3, axis=3)
    check = dict(PACKAGED["translation"])
    check.pop("threshold", None)
    r = _run(tmp_path, HalfPixelModel(), x, check)
    st = r["details"]["search_rounds"]
    # the integer grid of round 0 breaks nothing; round 1's half pixels break every sample
    assert st["rounds"][0]["broken"] == 0
    assert st["rounds"][1]["broken"] == 10
    assert r["metrics"]["robustness_score"] == 0.0
    assert st["converged"]


def test_the_packaged_brightness_field_search_finds_one_corner(tmp_path):
    x = np.full((10, 32, 32, 3), 128, dtype=np.uint8)
    x += np.random.default_rng(3).integers(0, 3, size=x.shape, dtype=np.uint8)
    model = CornerModel()
    check = dict(PACKAGED["adaptive_brightness"])
    check.pop("threshold", None)
    params = check["params"]
    assert _random_draws_find("adaptive_brightness", x, model, params["bound"],
                              params["steps"], params["tries"]) < 0.5
    r = _run(tmp_path, model, x, check)
    assert r["metrics"]["robustness_score"] == 0.0
    assert r["details"]["search_rounds"]["rounds"][0]["broken"] == 10


def test_a_search_stopped_by_its_budget_cannot_pass(tmp_path):
    """A budget that leaves no room for round 1: convergence was never judged across a
    doubling, the card says so, and the row cannot PASS whatever its threshold."""
    rng = np.random.default_rng(2)
    x = np.where(rng.random((10, 32, 32, 1)) < 0.5, 51, 204).astype(np.uint8).repeat(3, axis=3)
    check = {"id": "t", "kind": "corruption", "threshold": {"min": 0.1},
             "params": {"property": "translation", "bound": 2, "steps": 2, "max_queries": 24}}
    r = _run(tmp_path, HalfPixelModel(), x, check)
    st = r["details"]["search_rounds"]
    assert r["metrics"]["robustness_score"] == 1.0  # the whole pixels break nothing
    assert not st["converged"] and "not converged" in st["why"]
    assert r["status"] == "WARN"
    assert any("cannot PASS" in w for w in r["warnings"])
    # the cost was logged before any query: round 0's 24 candidates and its clean query
    assert "query plan: t at most 25 queries per sample x 10 samples" in LOG[0]


class _ByAngle:
    """A predictor whose answer depends on the rotation the image went through: it reads the
    angle back from a marker pixel's position. Wrong (class 1) at both ±30° grid points, far
    more confidently at -30° (the grid tries +30° first)."""

    def __init__(self) -> None:
        self.calls = 0

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        # the marker's column after rotating about the centre tells the sign of the angle
        col = (x[:, 0].sum(dim=1) > 0.5).float().argmax(dim=1).float()
        logits = torch.zeros(len(x), 43)
        logits[:, 0] = 5.0
        right = col > 17  # the marker moved right: one sign of rotation
        left = col < 12
        logits[left, 1] = 6.0  # wrong by a margin of 1
        logits[right, 1] = 25.0  # wrong by a margin of 20
        return logits


def test_the_spatial_grid_searches_its_whole_grid_and_keeps_the_most_confident_mistake():
    from certify.attacks.simple import SpatialGrid

    x = torch.zeros(1, 3, 32, 32)
    x[0, 0, 2:6, 14:18] = 1.0  # a marker above the centre
    model = _ByAngle()
    attack = SpatialGrid(max_rotation=30, max_translation=0, rotation_steps=1,
                         translation_steps=1)
    grid = attack.grid()
    res = attack.run(model, x, torch.tensor([0]), torch.tensor([0]), "logits")
    assert int(res.queries[0]) == len(grid) == model.calls  # every point, no early stop
    picked = res.params[0]
    out = model.predict(attack.transform(x, picked.view(1, -1)))
    assert int(out.argmax(1)) == 1 and float(out[0, 1] - out[0, 0]) == 20.0
    # the grid's first wrong point is the less confident one: a first-success search would
    # have stopped there
    first = next(g for g in grid
                 if int(model.predict(attack.transform(x, g.view(1, -1))).argmax(1)) == 1)
    assert not torch.equal(first, picked)
