"""Three-way threshold decisions on 95% intervals (issue 17, point 7)."""

from __future__ import annotations

import re

import pytest
import yaml

from certify.checks import CHECKS
from certify.engine import decide
from certify.errors import SuiteError
from certify.stats import samples_to_decide, wilson_bounds, wilson_interval
from certify.suite import CheckSpec, Threshold, parse_suite

pytestmark = pytest.mark.unit


def _spec(threshold: Threshold, rule: str = "interval", kind: str = "attack") -> CheckSpec:
    check = CHECKS[kind].__new__(CHECKS[kind])  # only its declared metrics are read
    return CheckSpec("c", kind, check, threshold, decision=rule)


MIN = Threshold("robust_accuracy", min=0.5)
MAX = Threshold("robust_accuracy", max=0.5)


def _rate(k: int, n: int) -> tuple[dict, dict]:
    return {"robust_accuracy": k / n}, {"robust_accuracy": wilson_interval(k, n)}


def test_a_rate_whose_whole_interval_clears_min_passes():
    metrics, iv = _rate(33, 40)  # 82.5% of 40: interval 68-91%
    status, why = decide(_spec(MIN), metrics, [], 0, iv)
    assert status == "PASS"
    assert "interval rule" in why and "0.6805" in why


def test_a_rate_whose_interval_straddles_min_is_inconclusive_with_the_samples_that_decide():
    metrics = {"robust_accuracy": 0.52}  # 52% of 40: interval 37-67%
    iv = {"robust_accuracy": wilson_bounds(0.52, 40)}
    status, why = decide(_spec(MIN), metrics, [], 0, iv)
    assert status == "INCONCLUSIVE"
    n = samples_to_decide(0.52, 0.5)
    assert n is not None and n > 40
    assert f"about {n:,} evaluated samples" in why
    # that many samples at the same rate decide it (PASS); one fewer does not
    assert wilson_bounds(0.52, n)[0] > 0.5 >= wilson_bounds(0.52, n - 1)[0]
    decided, _ = decide(_spec(MIN), metrics, [], 0,
                        {"robust_accuracy": wilson_bounds(0.52, n)})
    assert decided == "PASS"


def test_a_rate_whose_whole_interval_misses_min_fails():
    metrics, iv = _rate(12, 40)  # 30% of 40: interval 18-45%
    assert decide(_spec(MIN), metrics, [], 0, iv)[0] == "FAIL"


def test_point_rule_restores_the_point_estimate():
    metrics = {"robust_accuracy": 0.52}
    iv = {"robust_accuracy": wilson_bounds(0.52, 40)}
    status, why = decide(_spec(MIN, "point"), metrics, [], 0, iv)
    assert status == "PASS" and "point rule" in why
    metrics, iv = _rate(19, 40)
    assert decide(_spec(MIN, "point"), metrics, [], 0, iv)[0] == "FAIL"


@pytest.mark.parametrize(("k", "status"), [(7, "PASS"), (19, "INCONCLUSIVE"), (28, "FAIL")])
def test_max_thresholds_are_mirrored(k, status):
    metrics, iv = _rate(k, 40)  # 17.5%, 47.5%, 70% of 40 against max 0.5
    got, why = decide(_spec(MAX), metrics, [], 0, iv)
    assert got == status
    if status == "INCONCLUSIVE":
        n = samples_to_decide(k / 40, 0.5)
        assert n is not None and f"{n:,}" in why
        assert wilson_bounds(k / 40, n)[1] < 0.5


def test_a_point_estimate_on_the_threshold_is_decided_by_no_sample_size():
    metrics, iv = _rate(20, 40)
    status, why = decide(_spec(MIN), metrics, [], 0, iv)
    assert status == "INCONCLUSIVE"
    assert "no sample size decides it" in why
    assert samples_to_decide(0.5, 0.5) is None


def test_a_metric_without_an_interval_is_decided_on_its_point_estimate_and_says_so():
    status, why = decide(_spec(MIN), {"robust_accuracy": 0.52}, [], 0, {})
    assert status == "PASS"
    assert "point estimate: no interval for this metric" in why


def test_a_score_interval_scales_with_its_sample_count():
    t = Threshold("brittle_score", max=1.0)
    metrics = {"brittle_score": 0.9, "n": 50}
    status, why = decide(_spec(t, kind="brittleness"), metrics, [], 0,
                         {"brittle_score": (0.7, 1.1)})
    assert status == "INCONCLUSIVE"
    # half-widths shrink as 1/sqrt(n): 50 * (0.2 / 0.1)^2 samples put 1.0 on the boundary
    needed = int(re.search(r"about ([\d,]+) samples", why).group(1).replace(",", ""))
    assert 200 <= needed <= 201


def test_warnings_and_sample_errors_still_stop_an_interval_pass():
    metrics, iv = _rate(33, 40)
    assert decide(_spec(MIN), metrics, ["w"], 0, iv)[0] == "WARN"
    assert decide(_spec(MIN), metrics, [], 2, iv)[0] == "INCONCLUSIVE"
    # an undecided interval stays INCONCLUSIVE whatever the warnings
    assert decide(_spec(MIN), *_rate(21, 40)[:1], ["w"], 0, _rate(21, 40)[1])[0] == \
        "INCONCLUSIVE"


def _raw(**top) -> dict:
    return {"name": "t", "classes": ["a", "b"], **top,
            "checks": [{"id": "clean", "kind": "clean_accuracy",
                        "threshold": {"metric": "accuracy", "min": 0.9}},
                       {"id": "clean2", "kind": "clean_accuracy", "decision": "point",
                        "threshold": {"metric": "accuracy", "min": 0.9}}]}


def test_suite_decision_defaults_to_interval_and_a_check_may_override_it():
    s = parse_suite(_raw(), "s.yaml")
    assert s.decision == "interval"
    assert [c.decision for c in s.checks] == ["interval", "point"]
    p = parse_suite(_raw(decision="point"), "s.yaml")
    assert [c.decision for c in p.checks] == ["point", "point"]
    assert p.digest != s.digest  # the rule is part of the suite's content


@pytest.mark.parametrize("where", ["top", "check"])
def test_an_unknown_decision_rule_is_refused(where):
    raw = _raw(decision="median") if where == "top" else _raw()
    if where == "check":
        raw["checks"][0]["decision"] = "median"
    with pytest.raises(SuiteError, match=re.escape("one of 'interval', 'point'")):
        parse_suite(raw, "s.yaml")


def test_the_packaged_suite_states_its_rule():
    from certify.suite import load_suite, resolve_suite_path

    assert yaml.safe_load(resolve_suite_path("gtsrb").read_text())["decision"] == "interval"
    assert load_suite("gtsrb").decision == "interval"
