"""A card from the previous release of certify is compared on the checks both releases
measure the same way (issue 29 point 4).

``tests/data/previous_release/results.json`` was written by certify at cbfb502 (the release
before corruption properties were searched and confidence became the top-two margin) running
``suite.yaml`` beside it on the demo's standard model and ``generate(1, seed=29)``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from certify.api import demo_model_path
from certify.demo.synthetic import generate
from certify.errors import CARD_WRITTEN_CODES, EXIT_OK

import builders

pytestmark = pytest.mark.e2e

HERE = Path(__file__).parent / "data" / "previous_release"


def test_a_previous_release_card_is_compared_on_the_checks_both_measure_alike(tmp_path):
    x, y = generate(1, seed=29)
    np.savez(tmp_path / "prev-data.npz", x=x, y=y)  # the name is part of the digest
    out = tmp_path / "new"
    proc = builders.run_cli("run", demo_model_path("standard"), "--suite", HERE / "suite.yaml",
                            "--data", tmp_path / "prev-data.npz", "--out", out, "--no-pdf")
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    proc = builders.run_cli("compare", HERE / "results.json", out, "--json",
                            tmp_path / "cmp.json")
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "cmp.json").read_text())
    rows = {r["id"]: r for r in doc["checks"]}
    # the threat model decides (issue 38), read from the older format's worst-case row and
    # its attack's per-sample outcomes: the same samples robust, paired
    (spatial,) = doc["threat_models"]
    assert spatial["id"] == "threat model spatial" and spatial["attacks"] == ["spatial_grid"]
    assert spatial["outcome"] == "no change" and spatial["paired"], spatial
    assert rows["spatial_grid"]["role"] == "evidence"
    assert doc["old"]["results_schema"] == "certify.results/2"
    # measured alike by both releases, on the same samples and seeds: identical outcomes
    for same in ("clean", "spatial_grid", "rotation+brightness"):
        assert rows[same]["outcome"] == "no change", (same, rows[same])
    # measured by another method now (a searched property; a margin-based confidence): listed
    # as not comparable, with the reason, never as a change of the model
    for changed in ("rotation", "coverage"):
        assert rows[changed]["outcome"] == "not comparable", (changed, rows[changed])
        assert "another certify method" in rows[changed]["reason"]
