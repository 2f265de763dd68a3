"""Suite parameters are declared once (:mod:`certify.params`): every check kind's and every
attack's declaration is its constructor's signature (names, types, defaults), the suite refuses
from it (unknown names with the valid ones, values out of range with their range), and the
generated suite reference lists every declared parameter with its type, default, range and
meaning.
"""

from __future__ import annotations

import copy
import inspect
import typing
from typing import Any, Literal

import pytest

from certify.attacks import ATTACKS
from certify.checks import CHECKS
from certify.errors import SuiteError
from certify.params import REQUIRED, Param, Params, annotation_text
from certify.suite import SECTIONS, parse_suite

import builders

pytestmark = pytest.mark.unit

#: What an attack check sets itself: never an attack's ``attack_params``.
CHECK_SETS = {"epsilon", "norm", "max_queries"}

SUITE: dict[str, Any] = {
    "name": "params", "classes": [f"c{i}" for i in range(10)],
    "checks": [
        {"id": "clean", "kind": "clean_accuracy"},
        {"id": "brittle", "kind": "brittleness", "params": {"num_masks": 50}},
        {"id": "apgd", "kind": "attack", "params": {"attack": "apgd_ce", "epsilon": 0.03}},
        {"id": "grid", "kind": "attack",
         "params": {"attack": "spatial_grid", "max_queries": 342,
                    "attack_params": {"max_rotation": 10, "rotation_steps": 3}}},
    ],
}


def _signature(init: Any, skip: set[str]) -> list[tuple[str, Any, Any]]:
    """(name, type, default) of each constructor parameter but ``self`` and ``skip``."""
    hints = typing.get_type_hints(init)
    return [(n, hints[n], REQUIRED if p.default is inspect.Parameter.empty else p.default)
            for n, p in inspect.signature(init).parameters.items()
            if n != "self" and n not in skip]


def _declared(params: Params) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.type, p.default) for p in params]


@pytest.mark.parametrize("kind", list(CHECKS))
def test_a_check_kinds_declaration_is_its_constructors_signature(kind):
    cls = CHECKS[kind]
    assert _declared(cls.suite_params) == _signature(cls.__init__, set()), kind
    for p in cls.suite_params:  # the reference's type column is the annotation as written
        written = inspect.signature(cls.__init__).parameters[p.name].annotation
        assert p.annotation == written, (kind, p.name)
        assert len(p.meaning) > 10, (kind, p.name)


@pytest.mark.parametrize("name", list(ATTACKS))
def test_an_attacks_declaration_is_its_constructors_signature(name):
    """Everything the constructor takes but what the check sets, with the same defaults."""
    cls = ATTACKS[name]
    assert _declared(cls.suite_params) == _signature(cls.__init__, CHECK_SETS), name
    assert all(len(p.meaning) > 10 for p in cls.suite_params), name
    for p in cls.suite_params:
        if not p.required and p.default is not None:
            p.validate(p.default, f"{name}.{p.name}")  # its default lies in its range


def _load(change: Any) -> SuiteError:
    raw = copy.deepcopy(SUITE)
    change(raw)
    with pytest.raises(SuiteError) as err:
        parse_suite(raw, "s.yaml")
    assert err.value.hint
    return err.value


def test_the_test_suite_loads():
    suite = parse_suite(copy.deepcopy(SUITE), "s.yaml")
    assert [c.id for c in suite.checks] == ["clean", "brittle", "apgd", "grid"]


def test_an_unknown_check_parameter_is_refused_naming_the_valid_ones():
    err = _load(lambda raw: raw["checks"][1]["params"].update(masks=3))
    assert err.message == "s.yaml: checks[1]: unknown parameter(s) masks for check kind " \
                          "'brittleness'"
    assert err.hint == "valid parameters: " + ", ".join(CHECKS["brittleness"].suite_params.names())


def test_an_unknown_attack_parameter_is_refused_naming_the_valid_ones():
    err = _load(lambda raw: raw["checks"][2]["params"].update(attack_params={"n_iter": 10}))
    assert err.message == ("s.yaml: checks[2].params.attack_params: unknown parameter(s) n_iter "
                           "for attack apgd_ce")
    assert err.hint == "valid parameters: iterations, restarts"
    err = _load(lambda raw: raw["checks"][2]["params"].update(attack="random",
                                                              attack_params={"p_init": 0.5}))
    assert "p_init for attack random" in err.message and err.hint == "valid parameters: (none)"


@pytest.mark.parametrize(("where", "value", "says"), [
    (("checks", 1, "params", "num_masks"), 5, "checks[1].params.num_masks must be an integer "
                                              ">= 10, got the integer 5"),
    (("checks", 1, "params", "alpha"), 0.0, "checks[1].params.alpha must be a number > 0"),
    (("checks", 2, "params", "attack_params"), {"restarts": 0},
     "checks[2].params.attack_params.restarts must be an integer >= 1, got the integer 0"),
    (("checks", 3, "params", "attack_params"), {"rotation_steps": -1},
     "checks[3].params.attack_params.rotation_steps must be an integer >= 0"),
    (("checks", 2, "params", "max_queries"), 1,
     "checks[2].params.max_queries must be an integer >= 2 or 'auto', got the integer 1"),
    (("checks", 2, "params", "attack"), "apgd", "checks[2].params.attack must be one of "
                                                "'square_linf'"),
    (("seed",), -1, "s.yaml: seed must be an integer in [0, 2^63 - 1], got the integer -1"),
    (("release_tolerance",), 101, "release_tolerance must be a number in [0, 100]"),
    (("checks", 0, "budget"), 0, "checks[0].budget must be an integer >= 1 or null"),
])
def test_a_value_out_of_range_is_refused_with_its_range(where, value, says):
    def change(raw: dict[str, Any]) -> None:
        node: Any = raw
        for key in where[:-1]:
            node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
        node[where[-1]] = value

    err = _load(change)
    assert says in err.message, err.message
    name = where[-1] if where[-1] != "attack_params" else next(iter(value))
    assert err.hint.startswith(f"{name}: "), err.hint  # what the parameter is


def test_a_check_built_by_hand_is_held_to_its_declaration_too():
    from certify.checks import Brittleness, Coverage

    with pytest.raises(SuiteError, match=r"checks\[0\]\.params\.num_masks must be an integer >= "
                                         r"10"):
        Brittleness(num_masks=3).check_params("checks[0]")
    with pytest.raises(SuiteError, match=r"coverage must be a number in \(0, 1\]"):
        Coverage(coverage=1.5).check_params("checks[0]")
    Coverage(coverage=1.0).check_params("checks[0]")


def test_a_param_says_its_range_and_type_in_words():
    p = Param("p", float | None, None, "a share", low=0, low_open=True, high=1)
    assert p.range_text() == "in (0, 1]" and p.expected() == "a number in (0, 1] or null"
    p.validate(None, "x.p")
    p.validate(1, "x.p")
    with pytest.raises(SuiteError, match=r"x\.p must be a number in \(0, 1\] or null, got the "
                                         r"integer 0"):
        p.validate(0, "x.p")
    with pytest.raises(SuiteError, match="x.p must be a number or null, got the string"):
        p.validate("0.5", "x.p")  # the type first, by expect
    q = Param("q", str, "a", "a letter", choices=("a", "b"))
    assert q.allowed() == "one of 'a', 'b'"
    with pytest.raises(SuiteError, match="x.q must be one of 'a', 'b', got the string 'c'"):
        q.validate("c", "x.q")
    assert annotation_text(int | Literal["auto"]) == "int | Literal['auto']"
    assert annotation_text(dict[str, Any] | None) == "dict[str, Any] | None"
    with pytest.raises(ValueError, match="declared twice: q"):
        Params(q, q)


def _rows(markdown: str, first_table: bool = True) -> dict[str, list[str]]:
    """The first cell (a parameter's name) -> the row's cells, of the rows of the first table
    (of every table)."""
    out: dict[str, list[str]] = {}
    for line in markdown.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            out[cells[0].strip("`")] = cells
        elif out and first_table and not line.startswith("|"):
            break
    return out


def _section(markdown: str, label: str) -> str:
    start = markdown.index(f"({label})=")
    end = markdown.find("\n(", start + 1)
    return markdown[start:end if end > 0 else len(markdown)]


def test_the_suite_reference_lists_every_declared_parameter():
    """Every check kind's parameters and every attack's attack_params, each with its type,
    default, range and meaning from the declaration; every key of a suite file too."""
    docs = builders.docs_extension()
    reference = docs.suite_reference()
    owners = [(f"kind-{k}", c.suite_params) for k, c in CHECKS.items()]
    owners += [(f"attack-{n}", a.suite_params) for n, a in ATTACKS.items()]
    for label, params in owners:
        rows = _rows(_section(reference, label))
        for p in params:
            row = rows[p.name]
            assert row[1] == docs.code(p.annotation), (label, p.name)
            assert row[2] == docs._default(p), (label, p.name)
            assert row[3] == docs.code(p.allowed()), (label, p.name)
            assert row[4] == docs.cell(p.meaning), (label, p.name)
        if not len(params):
            assert "None" in _section(reference, label)
    assert "`>= 10`" in _rows(_section(reference, "kind-brittleness"))["num_masks"][3]
    assert "`>= 1`" in _rows(_section(reference, "attack-apgd_ce"))["restarts"][3]
    suite_file = docs.suite_file_reference()
    rows = _rows(suite_file, first_table=False)
    for params in SECTIONS.values():
        for p in params:
            assert p.name in rows and docs.cell(p.meaning) in suite_file, p.name
    assert "SUITE_KEYS" not in vars(docs)  # no hand-written key table beside the declaration
