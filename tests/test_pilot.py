"""Issue 62 point 2: a plan that holds. Before the main pass every check runs on a few
samples (the pilot); the run says its expected and at-most time from it, and the main pass keeps
the pilot's records where they are its own, so the card is byte for byte what a run without the
pilot writes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import certify
from certify.api import DEMO_PER_CLASS, DEMO_SEED, demo_model_path
from certify.demo.synthetic import generate
from certify.engine.pilot import (
    AT_MOST_MARGIN,
    ESTIMATE_FROM_QUERIES,
    Bound,
    PilotCheck,
    Units,
    estimate,
    long_run,
    pilot_positions,
)
from certify.engine.plan import Rates

import builders

pytestmark = pytest.mark.e2e

#: The packaged suite's checks the run keeps, and what each is cut to: an L-inf threat model
#: with a white-box attack and Square after it (its breaks inherited, its binarization test on
#: 2 samples, its doubling rounds), a random corruption that stops on confidence, a bounded
#: transform and the sanity checks.
CHECKS: dict[str, dict[str, Any]] = {
    "sanity": {"samples": 43}, "clean": {},
    "gaussian_noise": {"samples": 60, "params": {"steps": 2, "max_draws": 128}},
    "rotation": {"samples": 60},
    "apgd_linf": {"samples": 16, "params": {"attack_params": {"iterations": 10}}},
    "square_linf": {"samples": 16, "params": {"initial_queries": 40, "query_cap": 160,
                                              "confident_queries": 10,
                                              "binarization": {"samples": 2}}},
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("pilot")
    suite = builders.write_demo_small_suite(folder / "suite.yaml", CHECKS, "pilot")
    x, y = generate(DEMO_PER_CLASS, seed=DEMO_SEED)
    data = folder / "signs.npz"
    np.savez(data, x=x, y=y)
    return suite, data


@pytest.fixture(scope="module")
def runs(inputs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
         ) -> dict[bool, dict[str, Any]]:
    """The same run with the pilot (asked for: the run is short) and without it: results.json
    of each."""
    suite, data = inputs
    out = {}
    for estimate_ in (True, False):
        folder = tmp_path_factory.mktemp(f"estimate-{estimate_}")
        certify.evaluate(str(demo_model_path("standard")), str(data), suite=str(suite),
                         out=folder, pdf=False, progress=None, estimate=estimate_)
        out[estimate_] = json.loads((folder / "results.json").read_text())
    return out


def test_the_pilot_changes_nothing_on_the_card(runs):
    with_pilot, without = runs[True], runs[False]
    assert with_pilot["measurement"] == without["measurement"]
    est = with_pilot["provenance"]["timings"]["estimate"]
    assert "estimate" not in without["provenance"]["timings"]
    # it kept records (else it was a test of nothing): the pilot samples of every check but
    # the attacks, whose records depend on their batch and are evaluated again
    assert est["pilot_records_kept"] >= 4 * len(set(CHECKS) - {"apgd_linf", "square_linf"}), est


def test_the_estimate_brackets_the_run(runs):
    timings = runs[True]["provenance"]["timings"]
    est = timings["estimate"]
    assert est["at_most_s"] >= timings["total_s"], (est, timings["total_s"])
    assert 0 < est["pilot_s"] <= est["expected_s"] <= est["at_most_s"]
    assert set(est["checks"]) == set(CHECKS)


def test_the_run_says_its_expected_and_at_most_time(inputs, tmp_path):
    suite, data = inputs
    proc = builders.run_cli("run", demo_model_path("standard"), "--suite", suite, "--data",
                            data, "--out", tmp_path / "o", "--no-pdf", "--estimate")
    assert proc.returncode in (0, 1), proc.stderr
    text = " ".join(proc.stderr.split())
    assert "run time: expected about " in text and ", at most " in text, text[-2000:]
    # by default a run this short is not estimated (the pilot would cost more than it tells)
    quiet = builders.run_cli("run", demo_model_path("standard"), "--suite", suite, "--data",
                             data, "--out", tmp_path / "q", "--no-pdf")
    said = " ".join(quiet.stderr.split())
    assert "run time: expected" not in said
    assert "run time: not estimated (a short run: model time at most" in said, said[-2000:]
    assert "--estimate gives one" in said


def test_a_long_run_is_estimated_by_default():
    rates = Rates(0.001, 0.01, "test")
    assert long_run({"a": Bound(100_000, 2_000)}, rates) is None  # 100 s + 20 s
    short = long_run({"a": Bound(10_000, 0), "brittle": Bound(None, 0)}, rates)
    assert short is not None and "model time at most 10 s" in short
    endpoint = Rates(None, None, "an endpoint")
    assert long_run({"a": Bound(ESTIMATE_FROM_QUERIES, 0)}, endpoint) is None
    assert long_run({"a": Bound(1_000, 0)}, endpoint) == "a short run: at most 1,000 queries"


def test_pilot_positions_price_both_answers_and_one_binarization_sample():
    right, wrong = [31, 3, 20, 9, 12], [7, 5]  # the run's order, not the index order
    selected = list(range(40))
    positions, tested = pilot_positions(selected, right, wrong, {0, 10, 20, 30})
    assert positions == [3, 7, 9, 20, 31] and tested == 1  # 20 is already a test sample
    positions, tested = pilot_positions(selected, right, wrong, {25})
    assert positions == [3, 7, 9, 20, 25, 31] and tested == 1
    positions, tested = pilot_positions([3, 4, 5], right, wrong, set())
    assert positions == [3, 5] and tested == 0


def test_each_answer_is_priced_at_its_share():
    # the pilot: 4 right answers at 100 queries each, 1 wrong one at 1; 75% of the check's
    # samples are answered right
    p = PilotCheck("a", samples=105, tested=0, pilot_samples=5, right=Units(400, 0),
                   wrong=Units(1, 0), plain=Units(401, 0), pilot_right=4, pilot_wrong=1,
                   right_share=0.75)
    assert p.expected_units().queries == 100 * 100 * 0.75 + 1 * 100 * 0.25


def test_expected_scales_the_pilots_units_to_the_samples_left():
    p = PilotCheck("a", samples=100, tested=10, pilot_samples=5, pilot_tested=1,
                   plain=Units(400, 40), bt=Units(1_000, 0), seconds=2.0)
    u = p.expected_units()
    # 90 plain samples at 100 queries and 10 gradients each, 4 of them done in the pilot;
    # 10 test samples at 1,000 queries, 1 done
    assert (u.queries, u.gradients) == (86 * 100 + 9 * 1_000, 86 * 10)
    rates = Rates(0.001, 0.01, "test")
    e = estimate({"a": p}, {"a": Bound(200_000, 5_000)}, rates, pilot_s=3.0)
    # the model's work at the rates, and the check's own once: 2 s less 1.8 s of model work
    assert math.isclose(e.expected_s, 3.0 + u.cost(rates) + 0.2)
    # all in, the pilot paid 2 s for 0.8 + 1.0 = 1.8 s of model time: the bound at that cost
    factor = 2.0 / 1.8
    assert math.isclose(e.at_most_s, 3.0 + AT_MOST_MARGIN * factor * (200 + 50))


def test_a_check_without_bound_or_pilot_makes_at_most_unknown():
    e = estimate({}, {"a": Bound(None, 0)}, Rates(0.001, None, "test"), pilot_s=1.0)
    assert e.at_most_s == math.inf and e.checks["a"]["at_most_s"] == -1.0
