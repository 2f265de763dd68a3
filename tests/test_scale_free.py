"""Figures that must not move when only the logits' scale moves (issue 29 point 3): the
confident-mistake count, accuracy at 80% coverage (clean and under each worst case)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from certify.api import DEMO_SEED, demo_model_path
from certify.demo.synthetic import generate
from certify.errors import CARD_WRITTEN_CODES

import builders
from pgd_oracle import with_head

pytestmark = pytest.mark.e2e

CLASSES = [f"class {i}" for i in range(43)]
SUITE = {"name": "scale", "classes": CLASSES, "seed": 0, "checks": [
    {"id": "coverage", "kind": "coverage", "params": {"coverage": 0.8}},
    {"id": "fixed", "kind": "coverage", "params": {"coverage": 0.8,
                                                    "confidence_threshold": 0.9}},
    {"id": "noise", "kind": "corruption", "samples": 80,
     "params": {"property": "gaussian_noise", "bound": 0.1, "steps": 2, "max_draws": 128}},
    {"id": "rotation", "kind": "corruption", "samples": 80,
     "params": {"property": "rotation", "bound": 20, "steps": 2}},
    {"id": "spatial", "kind": "attack", "samples": 60,
     "params": {"attack": "spatial_grid", "max_queries": 26,
                "attack_params": {"max_rotation": 30, "max_translation": 3,
                                  "rotation_steps": 1, "translation_steps": 1}}},
]}
SCALE_FREE = {
    "coverage": ("confident_mistakes", "accuracy_at_coverage", "answered"),
    "noise": ("worst_case_accuracy_at_coverage", "robustness_score"),
    "rotation": ("worst_case_accuracy_at_coverage", "robustness_score"),
    "spatial": ("worst_case_accuracy_at_coverage", "robust_accuracy"),
}


@pytest.fixture(scope="module")
def scaled_runs(tmp_path_factory) -> dict[str, dict[str, dict]]:
    tmp = tmp_path_factory.mktemp("scale")
    x, y = generate(6, seed=DEMO_SEED + 5)  # 258 signs, a few of which the model gets wrong
    np.savez(tmp / "d.npz", x=x, y=y)
    suite = tmp / "s.yaml"
    suite.write_text(yaml.safe_dump(SUITE))
    runs = {}
    for head in ("none", "x0.1", "x10"):
        model = with_head(demo_model_path("standard"), tmp / f"{head}.onnx", head)
        out = tmp / f"out-{head}"
        proc = builders.run_cli("run", model, "--suite", suite, "--data", tmp / "d.npz",
                                "--out", out, "--no-pdf")
        assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
        doc = json.loads((out / "results.json").read_text())
        runs[head] = {c["id"]: c for c in doc["measurement"]["checks"]}
    return runs


@pytest.mark.parametrize("head", ["x0.1", "x10"])
def test_scaling_the_logits_moves_no_scale_free_figure(scaled_runs, head):
    base, scaled = scaled_runs["none"], scaled_runs[head]
    for check, names in SCALE_FREE.items():
        for name in names:
            assert scaled[check]["metrics"][name] == base[check]["metrics"][name], \
                (head, check, name)
    assert base["coverage"]["details"]["cutoff_rule"]
    # the cut-off is a margin quantile, so it scales with the logits
    ratio = scaled[check := "coverage"]["details"]["margin_cutoff"] / \
        base[check]["details"]["margin_cutoff"]
    assert ratio == pytest.approx(0.1 if head == "x0.1" else 10, rel=1e-4)


def test_a_fixed_probability_threshold_moves_and_the_card_says_so(scaled_runs):
    counts = {h: r["fixed"]["metrics"]["confident_mistakes"] for h, r in scaled_runs.items()}
    # x10 sharpens every softmax past 0.9, x0.1 flattens them below it
    assert counts["x10"] > counts["x0.1"]
    d = scaled_runs["none"]["fixed"]["details"]
    assert d["fixed_threshold"] and "moves with the logits' scale" in d["scale"]
