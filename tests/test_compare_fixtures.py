"""`certify compare` keeps its outputs: the table, the narrow terminal's blocks, ``--json`` and
the exit code of every stored pair of runs (``tests/compare_fixtures.py`` says which and how
they were made) equal the stored ones, character for character.

Nothing is normalised: the command runs in a folder where the inputs were unpacked, with OLD
and NEW given relative to it, so no output holds a path, a time or anything else that varies.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from compare_fixtures import CASES, HERE, MODES, run_case, unpack

import builders

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack(tmp_path_factory.mktemp("compare-fixtures"))


def test_every_case_has_its_stored_outputs_and_nothing_else_is_stored() -> None:
    stored = {p.stem for p in (HERE / "expected").glob("*.json")}
    assert stored == {name for name, *_ in CASES}


@pytest.mark.parametrize(("name", "old", "new", "args"), CASES, ids=[c[0] for c in CASES])
def test_compare_s_outputs_are_the_stored_ones(name: str, old: str, new: str,
                                               args: list[str], unpacked: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    expected = json.loads((HERE / "expected" / f"{name}.json").read_text(encoding="utf-8"))
    monkeypatch.chdir(unpacked)
    got = run_case(old, new, args, builders.run_cli)
    assert (got["old"], got["new"], got["args"]) == (expected["old"], expected["new"],
                                                     expected["args"])
    for mode in MODES:
        for key in ("exit_code", "stderr", "stdout"):
            assert got[mode][key] == expected[mode][key], (mode, key)
