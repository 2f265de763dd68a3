"""The package's shape: no import circles, no upward imports, and a README layout that is true.

Imports are read from the source (``ast``), function-level (lazy) imports included: a lazy
import hides a dependency from the import system, not from the design.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "certify"

#: Layers, lowest first: a module may import its own layer and the ones below it, never above.
#: Every module of the package must fall in one (longest matching prefix wins).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("certify.version", "certify.errors", "certify.redact", "certify.canonical",
                    "certify.stats", "certify.progress", "certify.device", "certify.images",
                    "certify.figures", "certify.validation", "certify.rundir", "certify.kinds",
                    "certify.onnx_files")),
    ("inputs", ("certify.models", "certify.data", "certify.perturbations", "certify.demo")),
    ("attacks", ("certify.attacks",)),
    ("checks", ("certify.checks",)),
    ("engine", ("certify.engine", "certify.distributed", "certify.suite", "certify.results",
                "certify.probe")),
    ("report", ("certify.report",)),
    ("edges", ("certify", "certify.api", "certify.cli", "certify.ci_action", "certify.service",
               "certify.init_suite", "certify.model_card")),
]


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    while name not in mods:
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return name


def import_graph() -> dict[str, set[str]]:
    """certify module -> the certify modules it imports (anywhere in its source)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg
                    for _ in range(node.level - 1):
                        up = up.rsplit(".", 1)[0]
                    base = f"{up}.{base}" if base else up
                names = [f"{base}.{a.name}" for a in node.names]
            for name in names:
                if name == "certify" or name.startswith("certify."):
                    target = _resolve(name, mods)
                    if target and target != mod:
                        graph[mod].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> int:
    """Index in :data:`LAYERS` of the module (longest matching prefix)."""
    best, best_len = -1, -1
    for k, (_name, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = k, len(p)
    return best


def test_no_import_circles():
    assert _cycles(import_graph()) == []


def test_no_module_imports_a_layer_above_its_own():
    graph = import_graph()
    unplaced = sorted(m for m in graph if layer_of(m) < 0)
    assert not unplaced, f"modules in no layer (add them to LAYERS): {unplaced}"
    upward = sorted(f"{m} ({LAYERS[layer_of(m)][0]}) -> {t} ({LAYERS[layer_of(t)][0]})"
                    for m, targets in graph.items() for t in targets
                    if layer_of(t) > layer_of(m))
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_the_checker_sees_a_planted_circle_and_an_upward_import():
    graph = {"certify.a": {"certify.b"}, "certify.b": {"certify.a"}, "certify.c": set()}
    assert _cycles(graph) == [["certify.a", "certify.b"]]
    assert layer_of("certify.checks.attack") < layer_of("certify.report.card")
    assert layer_of("certify.service.app") == len(LAYERS) - 1


def test_readme_layout_names_every_top_level_part_of_the_package():
    """The README's layout section lists exactly the package's top-level modules and folders."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    listed = set(re.findall(r"^  (\w+)(?:\.py|/)", block, flags=re.M))
    actual = {p.stem for p in PKG.glob("*.py") if p.stem != "__init__"} | {
        p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert listed == actual, (f"README lists {sorted(listed - actual)} that do not exist and "
                              f"misses {sorted(actual - listed)}")


def test_no_function_of_the_engine_is_over_100_lines():
    """The engine stays a set of small parts (certify/engine: no function over 100 lines)."""
    long = []
    for path in sorted((PKG / "engine").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > 100:
                    long.append(f"{path.name}:{node.name} ({n} lines)")
    assert not long, long
