"""The service's and the report's code stay in small, typed parts (issue 65): no function of
certify/service or certify/report is over 80 lines, and ``Any`` is at most 15 words in 1,000
lines in each (29 and 33 before the routes were split per resource, the fork protocol got one
typed client, compare was split and typed and the report read the results classes)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PKG = Path(__file__).resolve().parents[1] / "certify"
SERVICE = PKG / "service"
PARTS = (SERVICE, PKG / "report")
MAX_LINES = 80
MAX_ANY_PER_1000 = 15


def long_functions(source: str, limit: int = MAX_LINES) -> list[tuple[str, int]]:
    """The functions (nested ones too) of ``source`` over ``limit`` lines, with their length."""
    return [(node.name, n) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and (n := node.end_lineno - node.lineno + 1) > limit]  # type: ignore[operator]


def any_words(source: str) -> int:
    """How many times ``Any`` stands as a word in ``source``."""
    return len(re.findall(r"\bAny\b", source))


@pytest.mark.parametrize("part", PARTS, ids=lambda p: p.name)
def test_no_function_of_the_service_or_the_report_is_over_80_lines(part: Path):
    long = [f"{path.relative_to(part)}:{name} ({n} lines)"
            for path in sorted(part.rglob("*.py"))
            for name, n in long_functions(path.read_text(encoding="utf-8"))]
    assert not long, long


@pytest.mark.parametrize("part", PARTS, ids=lambda p: p.name)
def test_the_service_and_the_report_say_any_at_most_15_times_in_1000_lines(part: Path):
    texts = [p.read_text(encoding="utf-8") for p in sorted(part.rglob("*.py"))]
    lines = sum(t.count("\n") for t in texts)
    words = sum(any_words(t) for t in texts)
    assert words * 1000 <= MAX_ANY_PER_1000 * lines, (words, lines)


def test_the_checkers_see_a_long_function_and_the_word():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    assert long_functions(f"def f():\n{body}\n") == [("f", MAX_LINES + 1)]
    assert long_functions(f"def f():\n{body}\n", limit=MAX_LINES + 1) == []
    assert any_words("from typing import Any\nx: Any\nAnyway = 1  # Any\n") == 3
