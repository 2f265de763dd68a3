"""Corruption checks end to end, with planted defects whose scores are known exactly."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image, ImageDraw

from certify.errors import CARD_WRITTEN_CODES
from certify.perturbations import PROPERTIES

import builders

pytestmark = pytest.mark.e2e

CLASSES = [f"class {i}" for i in range(43)]


class BarAngleModel(torch.nn.Module):
    """Class 0 while the image's bright bar is within 10 degrees of vertical, else class 1.

    The angle comes from the image's second central moments, which a rotation turns exactly
    (and bilinear resampling blurs isotropically, which leaves the angle alone).
    """

    def __init__(self, size: int = 32) -> None:
        super().__init__()
        ys, xs = torch.meshgrid(torch.arange(size, dtype=torch.float32),
                                torch.arange(size, dtype=torch.float32), indexing="ij")
        self.register_buffer("xs", xs)
        self.register_buffer("ys", ys)
        self.tan = math.tan(math.radians(20))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = x.mean(dim=1)
        m00 = g.sum(dim=(1, 2))
        cx = (g * self.xs).sum(dim=(1, 2)) / m00
        cy = (g * self.ys).sum(dim=(1, 2)) / m00
        dx = self.xs - cx.view(-1, 1, 1)
        dy = self.ys - cy.view(-1, 1, 1)
        mu20 = (g * dx * dx).sum(dim=(1, 2)) / m00
        mu02 = (g * dy * dy).sum(dim=(1, 2)) / m00
        mu11 = (g * dx * dy).sum(dim=(1, 2)) / m00
        margin = self.tan * (mu02 - mu20) - (2 * mu11).abs()  # > 0 iff |angle| < 10 degrees
        others = torch.full((x.shape[0], 41), -1e3)
        return torch.cat([100 * margin.unsqueeze(1), torch.zeros_like(margin).unsqueeze(1),
                          others], dim=1)


class RedGreenModel(torch.nn.Module):
    """Class 0 when the image is redder than green, else class 1: blind to brightness."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = (x[:, 0] - x[:, 1]).mean(dim=(1, 2))
        others = torch.full((x.shape[0], 41), -1e3)
        return torch.cat([100 * d.unsqueeze(1), -100 * d.unsqueeze(1), others], dim=1)


def _export(module: torch.nn.Module, path: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (torch.rand(2, 3, 32, 32),), str(path),
                          input_names=["input"], output_names=["logits"],
                          dynamic_axes={"input": {0: "n"}, "logits": {0: "n"}}, dynamo=False,
                          opset_version=17)
    return path


def _bar(angle: float, size: int = 32, ss: int = 8) -> np.ndarray:
    """A thin bright bar through the centre, ``angle`` degrees from vertical, anti-aliased."""
    big = Image.new("L", (size * ss, size * ss), 0)
    c, half = size * ss / 2, 11 * ss
    a = math.radians(angle)
    dx, dy = math.sin(a) * half, -math.cos(a) * half
    ImageDraw.Draw(big).line([(c - dx, c - dy), (c + dx, c + dy)], fill=255, width=2 * ss)
    small = np.asarray(big.resize((size, size), Image.Resampling.BOX))
    return np.repeat(small[:, :, None], 3, axis=2)


def _suite(tmp_path: Path, checks: list[dict]) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"name": "planted", "classes": CLASSES, "seed": 0,
                                    "checks": checks}))
    return path


def _run(model: Path, suite: Path, data: Path, out: Path) -> dict:
    proc = builders.run_cli("run", model, "--suite", suite, "--data", data, "--out", out,
                            "--no-pdf")
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    doc = json.loads((out / "results.json").read_text())
    return {c["id"]: c for c in doc["measurement"]["checks"]}


def test_rotation_score_of_a_model_that_breaks_above_a_known_angle(tmp_path):
    robust = [0.0, 1.0, -1.0, 2.5, -2.5, 3.0, -3.0]
    breaks = {5.0: 6.0, -5.0: 6.0, 7.0: 4.0, -7.0: 4.0, 9.0: 2.0, -9.0: 2.0}
    wrong = [12.0, -13.0]
    angles = robust + list(breaks) + wrong
    x = np.stack([_bar(a) for a in angles])
    np.savez(tmp_path / "bars.npz", x=x, y=np.zeros(len(angles), dtype=np.int64))
    model = _export(BarAngleModel(), tmp_path / "bar.onnx")
    # grid: rotations of -6, -4, -2, 2, 4, 6 degrees; a sample survives iff |angle| + 6 < 10
    suite = _suite(tmp_path, [{"id": "rot", "kind": "corruption",
                               "params": {"property": "rotation", "bound": 6, "steps": 3}}])
    r = _run(model, suite, tmp_path / "bars.npz", tmp_path / "out")["rot"]
    assert r["metrics"]["n_misclassified"] == len(wrong)
    assert r["metrics"]["n_evaluated"] == len(robust) + len(breaks)
    assert r["metrics"]["robustness_score"] == pytest.approx(len(robust) / (len(robust) + 6))
    records = [json.loads(line) for line in
               (tmp_path / "out" / "records.jsonl").read_text().splitlines()]
    got = {angles[rec["i"]]: rec.get("break_intensity") for rec in records}
    for a, level in breaks.items():
        assert got[a] == pytest.approx(level), (a, got[a])
    for a in robust:
        assert got[a] is None
    curve = {p["intensity"]: p["score"] for p in r["details"]["curve"]}
    assert curve[0.0] == 1.0
    assert curve[2.0] == pytest.approx(11 / 13)
    assert curve[4.0] == pytest.approx(9 / 13)
    assert curve[6.0] == pytest.approx(7 / 13)
    ex = r["details"]["examples"]
    assert ex and ex[0]["intensity"] == 2.0
    # the example names its image by pixel digest; the run dir holds it, and what the example
    # records (sample, parameters, seed) regenerates exactly those pixels
    from certify.images import ImageSink, decode_png, image_digest
    from certify.perturbations import PROPERTIES

    png = tmp_path / "out" / "images" / (ex[0]["perturbed"].removeprefix("sha256:") + ".png")
    assert image_digest(decode_png(png.read_bytes())) == ex[0]["perturbed"]
    img = torch.from_numpy(x[ex[0]["index"]]).permute(2, 0, 1).float().unsqueeze(0) / 255
    again = PROPERTIES["rotation"].apply(img, torch.tensor([ex[0]["params"]]),
                                         torch.tensor([ex[0]["seed"]]))
    assert ImageSink().add(again[0]) == ex[0]["perturbed"]


def test_brightness_invariant_model_scores_one(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.uniform(0.35, 0.65, size=(40, 32, 32, 3))
    x = np.rint(x * 255).astype(np.uint8)
    d = x[..., 0].astype(int).mean(axis=(1, 2)) - x[..., 1].astype(int).mean(axis=(1, 2))
    y = (d <= 0).astype(np.int64)
    np.savez(tmp_path / "rg.npz", x=x, y=y)
    model = _export(RedGreenModel(), tmp_path / "rg.onnx")
    suite = _suite(tmp_path, [
        {"id": "brightness", "kind": "corruption",
         "params": {"property": "brightness", "bound": 0.3, "steps": 5},
         # decided on the 95% interval: 40 of 40 robust has a lower bound of 0.91
         "threshold": {"min": 0.9}},
        {"id": "hue", "kind": "corruption", "params": {"property": "hue", "bound": 90}},
    ])
    r = _run(model, suite, tmp_path / "rg.npz", tmp_path / "out")
    assert r["brightness"]["metrics"]["n_evaluated"] == 40
    assert r["brightness"]["metrics"]["robustness_score"] == 1.0
    assert r["brightness"]["status"] == "PASS"
    # the same model is not blind to everything: a hue rotation does break it
    assert r["hue"]["metrics"]["robustness_score"] < 1.0


@pytest.mark.slow
def test_full_gtsrb_suite_on_a_user_model(model_path, official_dir, tmp_path):
    out = tmp_path / "out"
    proc = builders.run_cli("run", model_path, "--suite", "gtsrb", "--data", official_dir,
                            "--out", out, "--samples", "43", "--no-pdf")
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    doc = json.loads((out / "results.json").read_text())
    checks = {c["id"]: c for c in doc["measurement"]["checks"]}
    seen = {c["details"]["property"] for c in checks.values() if c["kind"] == "corruption"}
    assert seen == set(PROPERTIES)
    for c in checks.values():
        assert c["status"] != "ERROR", c["error"]
        if c["kind"] != "corruption":
            continue
        m = c["metrics"]
        assert 0.0 <= m["worst_case_accuracy_at_coverage"] <= 1.0
        lo, hi = c["intervals"]["robustness_score"]
        assert lo <= m["robustness_score"] <= hi
        if c["details"].get("statistical"):  # a random corruption: failures per intensity
            assert c["details"]["curve"][0]["failure_share"] == 0
            assert c["details"]["curve"][0]["score"] == 1
            assert m["n_robust"] + m["n_undecided"] <= m["n_evaluated"]
        else:
            assert c["details"]["curve"][0] == {"intensity": 0, "score": 1 if m["n_evaluated"]
                                                else None}
        if m["n_robust"] < m["n_evaluated"]:
            assert c["details"]["examples"], c["id"]
    pairs = [c for c in checks.values() if c["kind"] == "corruption_pair"]
    assert len(pairs) >= 3
    for c in pairs:
        m = c["metrics"]
        # a combination can only lose robustness against either property alone
        assert m["robustness_score"] <= min(m["score_first"], m["score_second"]) + 1e-12
        assert m["change_vs_weaker"] <= 1e-12
