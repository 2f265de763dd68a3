"""A suite is refused when it loads, before any model is touched, for every kind of bad value.

Each case names the key path and the expected type in the one error line: YAML's guesses (a
date, a string where a number belongs, a boolean where an integer belongs) and thresholds on
metrics the configuration cannot produce.
"""

from __future__ import annotations

import copy
import datetime
import math
from typing import Any

import pytest
import yaml

from certify.errors import SuiteError
from certify.suite import load_suite, parse_suite
from certify.validation import plain_data

import builders

pytestmark = pytest.mark.e2e

BASE: dict[str, Any] = {
    "name": "mini",
    "seed": 0,
    "classes": [f"c{i}" for i in range(43)],
    "data": {"layout": "auto", "roi_crop": True, "samples": 43},
    "preprocessing": {"input_scale": 1.0, "mean": [0.0, 0.0, 0.0], "input_size": [32, 32]},
    "flip_invariant_classes": [1, 2],
    "checks": [
        {"id": "clean", "kind": "clean_accuracy", "threshold": {"metric": "accuracy",
                                                                 "min": 0.5}},
        {"id": "square", "kind": "attack",
         "params": {"attack": "square_linf", "epsilon": 0.03, "max_queries": 100,
                    "binarization": {"samples": 2, "n_inner": 99}},
         "threshold": {"metric": "robust_accuracy", "min": 0.1}, "budget": 10_000},
        {"id": "pair", "kind": "corruption_pair",
         "params": {"first": {"property": "rotation", "bound": 10, "steps": 2},
                    "second": {"property": "brightness", "bound": 0.3, "steps": 2}}},
        {"id": "brittle", "kind": "brittleness", "params": {"num_masks": 50}},
        {"id": "grid", "kind": "attack",
         "params": {"attack": "spatial_grid", "max_queries": 342,  # 7 x 7 x 7 - 1 points
                    "attack_params": {"max_rotation": 10, "rotation_steps": 3}}},
    ],
}


def _set(raw: dict[str, Any], path: str, value: Any) -> None:
    """Set ``a.b[2].c`` in a nested dict/list."""
    keys: list[Any] = []
    for part in path.split("."):
        name, *idx = part.replace("]", "").split("[")
        keys.append(name)
        keys.extend(int(i) for i in idx)
    node: Any = raw
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value


def _refused(path: str, value: Any) -> SuiteError:
    raw = copy.deepcopy(BASE)
    _set(raw, path, value)
    with pytest.raises(SuiteError) as err:
        parse_suite(raw, "mini.yaml")
    assert err.value.hint, "every refusal carries a hint"
    return err.value


def test_base_suite_loads():
    suite = parse_suite(copy.deepcopy(BASE), "mini.yaml")
    assert [c.id for c in suite.checks] == ["clean", "square", "pair", "brittle", "grid"]


def test_a_spatial_grid_larger_than_its_budget_is_refused():
    """A grid cut to ``max_queries`` would report robustness over points it never tried."""
    err = _refused("checks[4].params.max_queries", 341)
    assert "342" in err.message and "341" in err.message, err.message
    assert "grid" in err.message


@pytest.mark.parametrize("extent", [0, 0.0, -15.0, 0.5, 1e-30, 3, 180.0])
@pytest.mark.parametrize("steps", [0, 1, 3])
def test_a_spatial_grids_size_is_counted_as_its_grid_has_it(extent, steps):
    """The suite counts the grid without building it (issue 53: no torch to load a suite):
    the count is the built grid's, with an extent of 0 and without."""
    from certify.attacks import SpatialGrid

    for kw in ({"max_rotation": extent, "rotation_steps": steps},
               {"max_translation": extent, "translation_steps": steps},
               {"max_rotation": extent, "max_translation": extent, "rotation_steps": steps,
                "translation_steps": steps}):
        grid = SpatialGrid(**kw)
        assert grid.grid_size() == len(grid.grid()), kw


def test_a_spatial_grid_with_negative_steps_is_refused():
    """Negative steps once crashed the suite's loading (torch's linspace): a suite error."""
    err = _refused("checks[4].params.attack_params.rotation_steps", -2)
    assert "checks[4]" in err.message and "rotation_steps" in err.message, err.message


def test_budget_keys_belong_to_the_check_not_to_attack_params():
    err = _refused("checks[4].params.attack_params.max_queries", 10_000)
    assert "checks[4]" in err.message and "max_queries" in err.message, err.message


def test_packaged_suite_loads_and_its_spatial_grid_fits_its_budget():
    from certify.attacks import SpatialGrid

    suite = load_suite("gtsrb")
    grids = [c for c in suite.checks if getattr(c.check, "attack", None) == "spatial_grid"]
    assert grids
    for c in grids:
        attack = c.check.build()
        assert isinstance(attack, SpatialGrid)
        assert len(attack.grid()) <= attack.max_queries == c.check.max_queries


# (key path, bad value, words the message must contain: the path and the expected type)
TYPE_CASES = [
    ("checks[1].params.epsilon", "8/255", ["checks[1].params.epsilon", "a number", "'8/255'"]),
    ("checks[1].params.epsilon", datetime.date(2024, 6, 1),
     ["checks[1].params.epsilon", "a number", "date"]),
    ("checks[1].params.max_queries", True, ["checks[1].params.max_queries", "an integer",
                                            "boolean"]),
    ("checks[1].params.max_queries", 100.5, ["checks[1].params.max_queries", "an integer"]),
    ("checks[1].params.attack", 5, ["checks[1].params.attack", "a string"]),
    ("checks[1].params.binarization", "yes", ["checks[1].params.binarization", "a mapping",
                                              "true or false"]),
    ("checks[1].params.binarization.samples", "ten",
     ["checks[1].params.binarization.samples", "an integer"]),
    ("checks[1].params.binarization.inner_gap", "5%",
     ["checks[1].params.binarization.inner_gap", "a number"]),
    ("checks[4].params.attack_params.max_rotation", "30",
     ["checks[4].params.attack_params.max_rotation", "a number"]),
    ("checks[4].params.attack_params.rotation_steps", False,
     ["checks[4].params.attack_params.rotation_steps", "an integer"]),
    ("checks[2].params.first.bound", "10", ["checks[2].params.first.bound", "a number"]),
    ("checks[2].params.second", [1, 2], ["checks[2].params.second", "a mapping"]),
    ("checks[3].params.compactness", datetime.date(2020, 1, 1),
     ["checks[3].params.compactness", "a number"]),
    ("checks[0].threshold.min", "0.9", ["checks[0].threshold.min", "a number"]),
    ("checks[0].threshold.metric", ["accuracy"], ["checks[0].threshold.metric", "a string"]),
    ("checks[1].budget", True, ["checks[1].budget", "an integer"]),
    ("checks[1].samples", 4.5, ["checks[1].samples", "an integer"]),
    ("checks[0].kind", ["clean_accuracy"], ["checks[0].kind", "a string"]),
    ("seed", True, ["seed", "an integer"]),
    ("seed", "0", ["seed", "an integer"]),
    ("name", datetime.date(2024, 6, 1), ["name", "a string", "date"]),
    ("classes", [1, 2, 3], ["classes[0]", "a string"]),
    ("flip_invariant_classes", [True], ["flip_invariant_classes[0]", "an integer"]),
    ("data.samples", True, ["data.samples", "an integer"]),
    ("data.roi_crop", "false", ["data.roi_crop", "true or false"]),
    ("data.path", 3, ["data.path", "a string"]),
    ("preprocessing.input_size", [True, 32], ["preprocessing.input_size[0]", "an integer"]),
    ("preprocessing.mean", "0.5", ["preprocessing.mean", "a number"]),
    ("preprocessing.input_scale", datetime.datetime(2024, 6, 1, 12, 0),
     ["preprocessing.input_scale", "a number", "date-time"]),
]


@pytest.mark.parametrize(("path", "value", "needles"), TYPE_CASES,
                         ids=[f"{p}={v!r}" for p, v, _ in TYPE_CASES])
def test_wrong_type_is_refused_naming_key_and_type(path, value, needles):
    err = _refused(path, value)
    for n in needles:
        assert n in err.message, err.message


# Values JSON cannot hold exactly, anywhere (even where an annotation says Any).
PLAIN_CASES = [
    ("checks[1].threshold.min", math.nan, "checks[1].threshold.min must be a finite number"),
    ("checks[1].params.epsilon", math.inf, "checks[1].params.epsilon must be a finite number"),
    ("checks[4].params.attack_params.max_rotation", -math.inf, "finite"),
    ("description", datetime.date(2024, 6, 1), "description must be a string, got a date"),
    ("checks[1].params.attack_params", {1: 2}, "key the integer 1 must be a string"),
    ("version", b"\x00\x01", "version must be"),
]


@pytest.mark.parametrize(("path", "value", "needle"), PLAIN_CASES,
                         ids=[p for p, _, _ in PLAIN_CASES])
def test_non_json_value_is_refused(path, value, needle):
    assert needle in _refused(path, value).message


def test_untyped_places_refuse_dates_and_nan_too():
    """Under an ``Any`` annotation nothing is typed, but JSON-less values are still refused."""
    with pytest.raises(SuiteError, match=r"s\.yaml: extra\.when\[1\] must be a number, string"):
        plain_data({"extra": {"when": [1, datetime.date(2024, 6, 1)]}}, "s.yaml")
    with pytest.raises(SuiteError, match=r"s\.yaml: extra\.x must be a finite number"):
        plain_data({"extra": {"x": math.nan}}, "s.yaml")
    plain_data({"extra": {"when": ["2024-06-01", 1, 2.5, True, None]}}, "s.yaml")


def test_yaml_date_and_fraction_from_a_file(tmp_path):
    """The same refusals through YAML text as a user writes it, with the source named."""
    for line, needle in (("epsilon: 2024-06-01", "a date (2024-06-01)"),
                         ("epsilon: 8/255", "the string '8/255'")):
        text = yaml.safe_dump(BASE).replace("epsilon: 0.03", line)
        assert line in text
        path = tmp_path / "s.yaml"
        path.write_text(text)
        with pytest.raises(SuiteError) as err:
            load_suite(str(path))
        assert err.value.message.startswith(f"{path}: checks[1].params.epsilon must be a number")
        assert needle in err.value.message


def test_ints_are_numbers_and_nulls_are_allowed_where_annotated():
    raw = copy.deepcopy(BASE)
    _set(raw, "checks[1].params.epsilon", 1)  # an int where a float is expected
    _set(raw, "checks[1].threshold.min", 0)
    _set(raw, "checks[3].params.compactness", 10)
    _set(raw, "checks[2].params.first.steps", None)  # the property's default
    _set(raw, "data.samples", None)
    suite = parse_suite(raw, "mini.yaml")
    assert suite.checks[1].check.epsilon == 1  # stored verbatim (scikit-learn style)


# -- thresholds this configuration cannot produce ----------------------------------------------
def test_binarization_threshold_refused_when_the_test_is_off():
    raw = copy.deepcopy(BASE)
    _set(raw, "checks[1].threshold", {"metric": "binarization_score", "min": 0.95})
    parse_suite(copy.deepcopy(raw), "mini.yaml")  # on: accepted
    _set(raw, "checks[1].params.binarization", False)
    with pytest.raises(SuiteError) as err:
        parse_suite(raw, "mini.yaml")
    assert "checks[1].threshold" in err.value.message
    assert "binarization_score" in err.value.message
    assert "robust_accuracy" in err.value.hint  # what it does report


def test_binarization_threshold_refused_for_a_spatial_attack():
    raw = copy.deepcopy(BASE)
    _set(raw, "checks[4].threshold", {"metric": "binarization_score", "min": 0.95})
    with pytest.raises(SuiteError, match=r"checks\[4\]\.threshold.*binarization_score"):
        parse_suite(raw, "mini.yaml")


def test_relative_improvement_needs_a_reference():
    raw = copy.deepcopy(BASE)
    _set(raw, "checks[3].threshold", {"metric": "relative_improvement", "min": 0.1})
    suite = parse_suite(raw, "mini.yaml")  # the reference is not known yet at load
    suite.check_thresholds(reference=True)
    with pytest.raises(SuiteError) as err:
        suite.check_thresholds(reference=False)
    assert "relative_improvement" in err.value.message and "reference" in err.value.message
    assert "--reference" in err.value.hint


def test_threshold_min_above_max_is_refused():
    err = _refused("checks[0].threshold", {"metric": "accuracy", "min": 0.9, "max": 0.5})
    assert "checks[0].threshold" in err.message and "nothing can pass" in err.message


def test_nan_never_passes_a_threshold():
    suite = parse_suite(copy.deepcopy(BASE), "mini.yaml")
    t = suite.checks[0].threshold
    assert t is not None and t.passes(0.9) and not t.passes(0.1)
    assert not t.passes(math.nan)
    assert not t.passes(math.inf)


def test_cli_relative_improvement_without_reference_exits_2_before_any_folder(
        tmp_path, model_path, npz_path):
    raw = copy.deepcopy(BASE)
    raw["checks"] = [{"id": "brittle", "kind": "brittleness", "params": {"num_masks": 20},
                      "threshold": {"metric": "relative_improvement", "min": 0.0}}]
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    proc = builders.run_cli("run", model_path, "--suite", suite, "--data", npz_path,
                            "--out", out, "--no-pdf")
    assert proc.returncode == 2, proc.stderr
    assert "relative_improvement" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


def test_a_control_character_in_suite_text_is_a_suite_error():
    """The YAML reader refuses control characters while it is built, before any parsing: that
    is a suite error too (it was a 500 on the service's upload, found by the API fuzzer)."""
    from certify.suite import read_suite_yaml

    with pytest.raises(SuiteError) as err:
        read_suite_yaml("name: a\x03b\n", "uploaded suite")
    assert err.value.message.startswith("uploaded suite: not valid YAML")
    assert "control characters" in (err.value.hint or "")
