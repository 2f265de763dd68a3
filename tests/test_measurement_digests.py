"""The demo's measurement, check by check, against the stored digests of the packaged suites
on the demo models (``benchmarks/measurement_digests.py`` wrote them; issue 63's refactoring
of threat models into values changed no byte of them).

The test suite's own ``certify demo`` run (the packaged gtsrb suite on the standard model, the
robust model as its reference) is compared at no extra cost; the other suite and model pairs
are compared by the benchmark (``--check tests/data/measurement_digests.json``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STORED = Path(__file__).parent / "data" / "measurement_digests.json"

pytestmark = pytest.mark.e2e


def _digests():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from measurement_digests import digests
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return digests


@pytest.mark.slow
def test_the_demo_measures_every_check_as_the_stored_digests_say(demo_run):
    stored = json.loads(STORED.read_text())["gtsrb/standard"]
    got = _digests()(json.loads((demo_run / "results.json").read_text())["measurement"])
    checks = {k for k in stored if k != "*"}
    assert checks <= set(got), f"checks missing from the demo: {sorted(checks - set(got))}"
    changed = sorted(k for k in checks if got[k] != stored[k])
    assert not changed, f"the demo's measurement changed in {changed}"


def test_the_stored_digests_cover_both_packaged_suites_on_both_demo_models():
    from certify.suite import packaged_suites

    stored = json.loads(STORED.read_text())
    assert set(stored) == {f"{s}/{m}" for s in packaged_suites() for m in ("standard", "robust")}
    assert all(len(v) > 5 and all(len(d) == 64 for d in v.values()) for v in stored.values())
