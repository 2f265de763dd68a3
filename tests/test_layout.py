"""The package's shape: no import circles, no upward imports, and a documented layout that is true.

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
#: Every module of the package must fall in one (longest matching prefix wins). The signed
#: results' schema sits on the foundation, and the report on the schema, below everything that
#: computes (issue 65): the report reads signed results, never the compute that made them.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("certify.version", "certify.errors", "certify.redact", "certify.canonical",
                    "certify.stats", "certify.progress", "certify.device", "certify.images",
                    "certify.figures", "certify.validation", "certify.params", "certify.rundir",
                    "certify.kinds", "certify.onnx_files", "certify.tolerance",
                    "certify.safetext", "certify.norms")),
    ("schema", ("certify.results",)),
    ("report", ("certify.report",)),
    ("inputs", ("certify.models", "certify.data", "certify.perturbations", "certify.demo")),
    ("attacks", ("certify.attacks",)),
    ("checks", ("certify.checks",)),
    ("engine", ("certify.engine", "certify.distributed", "certify.suite", "certify.probe")),
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


def _imported_names(node: ast.AST, pkg: str) -> tuple[str | None, list[str]]:
    """What an import statement in package ``pkg`` names, absolute: ``(None, modules)`` for
    ``import a, b``, ``(module, [module.name, ...])`` for ``from module import name`` (relative
    imports resolved); ``(None, [])`` for any other node."""
    if isinstance(node, ast.Import):
        return None, [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return None, []
    base = node.module or ""
    if node.level:
        up = pkg
        for _ in range(node.level - 1):
            up = up.rsplit(".", 1)[0]
        base = f"{up}.{base}" if base else up
    return base, [f"{base}.{a.name}" for a in node.names]


def module_imports(source: str, mod: str, pkg: str, mods: dict[str, Path]) -> set[str]:
    """The certify modules that ``source`` (module ``mod`` of package ``pkg``) imports,
    anywhere in it: at the top, in a function, under ``TYPE_CHECKING``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        for name in _imported_names(node, pkg)[1]:
            if name == "certify" or name.startswith("certify."):
                target = _resolve(name, mods)
                if target and target != mod:
                    found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    """certify module -> the certify modules it imports (anywhere in its source)."""
    mods = _modules()
    return {mod: module_imports(path.read_text(), mod,
                                mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0],
                                mods)
            for mod, path in mods.items()}


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
    assert layer_of("certify.kinds") < layer_of("certify.results") < layer_of(
        "certify.report.card") < layer_of("certify.models.onnx") < layer_of(
        "certify.checks.attack") < layer_of("certify.engine.assemble") == layer_of(
        "certify.suite")
    assert layer_of("certify.service.app") == len(LAYERS) - 1


#: What computes a result: the report reads the signed results (:mod:`certify.results`) and
#: the foundation, never one of these (issue 65). ``certify bundle``, ``verify`` and the card's
#: rendering then load no check, attack, model adapter, torch or onnxruntime by structure.
COMPUTE = ("certify.engine", "certify.checks", "certify.attacks", "certify.models",
           "certify.suite", "certify.distributed", "certify.probe", "certify.perturbations",
           "certify.data", "certify.demo")


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def compute_imports(graph: dict[str, set[str]]) -> list[str]:
    """``report module -> compute module`` for each import of a :data:`COMPUTE` module by a
    module of certify.report, sorted."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() if _within(m, "certify.report")
                  for t in targets if any(_within(t, c) for c in COMPUTE))


def test_the_report_imports_no_engine_checks_attacks_or_models_module():
    """The report reads only signed results: no module of certify.report imports a module of
    the engine, the checks, the attacks, the model adapters, the suite, the data or the
    perturbations, at the top or inside a function."""
    found = compute_imports(import_graph())
    assert not found, "the report imports compute:\n" + "\n".join(found)


def test_the_report_rule_sees_planted_imports_even_inside_functions():
    mods = _modules()
    planted = ("from certify.results import RunResult\n"
               "from certify import onnx_files\n"
               "def render():\n    from certify.engine import assemble\n"
               "    import certify.checks.attack\n"
               "    from ..models.onnx import model_identity\n")
    graph = {"certify.report.planted": module_imports(planted, "certify.report.planted",
                                                      "certify.report", mods),
             "certify.cli": {"certify.engine.run"}}
    assert compute_imports(graph) == ["certify.report.planted -> certify.checks.attack",
                                      "certify.report.planted -> certify.engine.assemble",
                                      "certify.report.planted -> certify.models.onnx"]


def test_docs_layout_names_every_top_level_part_of_the_package():
    """The layout section of the developer docs (docs/development.md) lists exactly the
    package's top-level modules and folders."""
    text = (ROOT / "docs" / "development.md").read_text()
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    listed = set(re.findall(r"^  (\w+)(?:\.py|/)", block, flags=re.M))
    actual = {p.stem for p in PKG.glob("*.py") if p.stem != "__init__"} | {
        p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert listed == actual, (f"docs/development.md lists {sorted(listed - actual)} that do not "
                              "exist and "
                              f"misses {sorted(actual - listed)}")


NORM_NAMES = {"linf", "l2", "l1", "l0", "spatial"}


def norm_name_comparisons(source: str) -> list[int]:
    """Lines of ``source`` that compare with a norm's name written out (``norm == "linf"``,
    ``norm in ("linf", "l2")``) or key a table by one (``{"linf": ...}``)."""
    def named(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in NORM_NAMES
        return isinstance(node, ast.Tuple | ast.List | ast.Set) and any(
            named(e) for e in node.elts)

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(
                named(n) for n in (node.left, *node.comparators)):
            lines.append(node.lineno)
        elif isinstance(node, ast.Dict) and any(k is not None and named(k) for k in node.keys):
            lines.append(node.lineno)
    return lines


def test_no_code_compares_a_norm_by_its_name_outside_the_norm_module():
    """A threat norm is a value (certify/norms.py): everything else asks it, so a new norm is
    one class there and the attacks that attack in it (issue 63)."""
    found = [f"{p.relative_to(ROOT)}:{line}" for p in sorted(PKG.rglob("*.py"))
             if p != PKG / "norms.py" for line in norm_name_comparisons(p.read_text())]
    templates = [f"{p.relative_to(ROOT)}" for p in sorted((ROOT / "templates").rglob("*.j2"))
                 if re.search(r"norm\s*[!=]=\s*[\"'](" + "|".join(NORM_NAMES) + ")",
                              p.read_text())]
    assert not found and not templates, (found, templates)


def test_the_norm_checker_sees_planted_comparisons():
    planted = 'a = n == "linf"\nb = n in ("l2", "x")\nc = {"l0": 1}\nd = n == "linear"\n'
    assert norm_name_comparisons(planted) == [1, 2, 3]


def concrete_isinstance(source: str, names: set[str]) -> list[str]:
    """``isinstance(x, C)`` calls in ``source`` whose class (or one of a tuple) is in
    ``names``: ``line: C``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id == "isinstance" and len(node.args) == 2:
            cls = node.args[1]
            for c in (cls.elts if isinstance(cls, ast.Tuple) else [cls]):
                name = c.id if isinstance(c, ast.Name) else \
                    c.attr if isinstance(c, ast.Attribute) else None
                if name in names:
                    out.append(f"{node.lineno}: {name}")
    return out


def test_the_engine_reads_a_checks_role_not_its_class():
    """No ``isinstance`` of a concrete check or attack class in certify/engine: the engine
    reads :attr:`certify.kinds.Kind.role` (and :func:`certify.checks.attack_of`)."""
    from certify.attacks import ATTACKS, Attack
    from certify.checks import CHECKS, Check

    names = {c.__name__ for c in (*CHECKS.values(), *ATTACKS.values())} | {
        c.__name__ for base in (Check, Attack) for c in _subclasses(base)}
    found = {str(p.relative_to(ROOT)): hits for p in sorted((PKG / "engine").glob("*.py"))
             if (hits := concrete_isinstance(p.read_text(), names))}
    assert not found, found
    assert concrete_isinstance("isinstance(c, (int, AttackCheck))", names) == ["1: AttackCheck"]


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _subclasses(sub)
    return out


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


#: Libraries that take seconds to import or need system libraries (issue 53): a command imports
#: them when it computes with them, never because a module it reads imports them.
HEAVY = ("torch", "kornia", "onnx", "onnxruntime", "skimage", "threadpoolctl", "weasyprint",
         "matplotlib", "transformers", "ray")
#: What loading a suite, ``certify init``'s refusals, ``export`` and ``compare`` import: the
#: modules these import when they are imported (function-level imports left out) must not
#: import a :data:`HEAVY` library then.
LIGHT_ROOTS = ("certify.suite", "certify.init_suite", "certify.engine.assemble",
               "certify.report.export", "certify.report.compare", "certify.results")


def _heavy(name: str) -> bool:
    return name.split(".", 1)[0] in HEAVY


def _type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _import_time_nodes(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of a module that run when it is imported, outside ``TYPE_CHECKING``
    blocks, function bodies left out (their defaults and decorators are kept by callers)."""
    out: list[ast.stmt] = []
    for node in body:
        if _type_checking(node):
            out.extend(_import_time_nodes(node.orelse))  # type: ignore[attr-defined]
        elif isinstance(node, ast.If | ast.Try | ast.With):
            blocks = [getattr(node, f, []) for f in ("body", "orelse", "finalbody")]
            blocks += [h.body for h in getattr(node, "handlers", [])]
            for block in blocks:
                out.extend(_import_time_nodes(block))
        else:
            out.append(node)
    return out


def _import_time_imports(path: Path, mod: str, mods: dict[str, Path]) -> tuple[set[str],
                                                                             list[str]]:
    """(certify modules, heavy libraries) a module imports when it is imported."""
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    certify_mods: set[str] = set()
    heavy: list[str] = []
    for node in _import_time_nodes(ast.parse(path.read_text()).body):
        base, names = _imported_names(node, pkg)
        for name in ([base] if base else []) + names:
            if _heavy(name):
                heavy.append(f"{name} (line {node.lineno})")
            elif name == "certify" or name.startswith("certify."):
                target = _resolve(name, mods)
                while target:  # a package's __init__ runs before its submodule
                    certify_mods.add(target)
                    target = target.rsplit(".", 1)[0] if "." in target else None
    return certify_mods - {mod}, heavy


def light_modules() -> dict[str, list[str]]:
    """The modules the :data:`LIGHT_ROOTS` import at import time, each with the heavy
    libraries it imports then (empty when none)."""
    mods = _modules()
    seen: dict[str, list[str]] = {}
    todo = list(LIGHT_ROOTS)
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        deps, heavy = _import_time_imports(mods[mod], mod, mods)
        seen[mod] = heavy
        todo.extend(deps)
    return seen


def unbound_heavy_names(source: str) -> list[str]:
    """Uses of a heavy library's name where it is not bound when the code runs: at import time
    (outside functions, annotations and ``TYPE_CHECKING``), or in a function that neither
    imports it nor sits in one that does (a module that imports torch lazily must import it in
    every function that uses it; mypy and ruff see the ``TYPE_CHECKING`` import and say
    nothing). A function called at import time is the fresh interpreters' to catch
    (``tests/test_console.py``)."""
    tree = ast.parse(source)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if _heavy(a.name)}
        elif isinstance(node, ast.ImportFrom) and node.module and _heavy(node.module):
            names |= {a.asname or a.name for a in node.names}
    found: list[str] = []

    def own_imports(fn: ast.AST) -> set[str]:
        bound: set[str] = set()
        stack = list(ast.iter_child_nodes(fn))
        while stack:
            node = stack.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda |
                          ast.ClassDef):
                continue
            if isinstance(node, ast.Import):
                bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                bound |= {a.asname or a.name for a in node.names}
            stack.extend(ast.iter_child_nodes(node))
        return bound

    def visit(node: ast.AST, bound: set[str], where: str) -> None:
        if _type_checking(node):
            for sub in node.orelse:  # type: ignore[attr-defined]
                visit(sub, bound, where)
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            args = node.args
            for d in [*getattr(node, "decorator_list", []), *args.defaults,
                      *(d for d in args.kw_defaults if d is not None)]:
                visit(d, bound, where)  # evaluated where the function is defined
            inner = bound | own_imports(node)
            name = getattr(node, "name", "<lambda>")
            body = node.body if isinstance(node.body, list) else [node.body]
            for sub in body:
                visit(sub, inner, name)
            return
        if isinstance(node, ast.AnnAssign):
            for sub in (node.target, node.value):
                if sub is not None:
                    visit(sub, bound, where)
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and \
                node.id in names and node.id not in bound:
            found.append(f"line {node.lineno} ({where}): {node.id}")
        for sub in ast.iter_child_nodes(node):
            visit(sub, bound, where)

    for node in tree.body:
        visit(node, set(), "import time")
    return found


def test_what_a_suite_and_the_reading_commands_import_imports_no_heavy_library():
    """Issue 53: loading a suite (``suites list|show``, ``init``), ``export`` and ``compare``
    import no torch, onnxruntime, kornia or WeasyPrint; the modules they read (checks,
    attacks, perturbations, model and data descriptions) import those inside the functions
    that compute, and every such function imports what it uses."""
    mods = _modules()
    light = light_modules()
    assert "certify.checks.attack" in light and "certify.attacks.square" in light
    eager = {m: heavy for m, heavy in light.items() if heavy}
    assert not eager, f"imported at import time by modules a suite needs: {eager}"
    unbound = {m: found for m in sorted(light)
               if (found := unbound_heavy_names(mods[m].read_text()))}
    assert not unbound, f"heavy names used where they are not imported: {unbound}"


def test_the_light_checker_sees_uses_where_torch_is_not_imported():
    src = ("from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
           "if TYPE_CHECKING:\n    import torch\n"
           "def f(x: torch.Tensor) -> torch.Tensor:\n    import torch\n    return torch.abs(x)\n"
           "def g(x: torch.Tensor) -> int:\n    return len(torch.nonzero(x))\n"
           "h = lambda: torch.zeros(1)\n"
           "ALIAS = torch.Tensor\n")
    assert unbound_heavy_names(src) == ["line 9 (g): torch", "line 10 (<lambda>): torch",
                                        "line 11 (import time): torch"]
