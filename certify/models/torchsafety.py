"""Static checks of PyTorch model files, before torch's loaders read them.

A PyTorch file can run code when it is loaded: a pickle runs whatever its ``REDUCE`` opcodes
call; ``torch.export.load`` unpickles some members of a ``.pt2`` archive with
``weights_only=False`` (measured with torch 2.13: a ``sample_inputs`` member replaced by a pickle
with a payload ran it) and parses the shape expressions of its graph with ``sympy.sympify``,
which evaluates them; a TorchScript program runs its ``__setstate__`` methods while it is loaded
and can call operations that write files (``torch.from_file(..., shared=True)``). So certify
reads the archive itself first and refuses, with the reason, what it cannot show to be inert:

- **the archive** (:func:`read_archive`) is read through torch's own zip reader, after checking
  that Python's reader sees the same members: no bytes before the archive or between its
  central directory and its end record, no two members whose names differ only in case (torch
  looks names up case-insensitively), no FlatBuffer program behind a zip header;
- **pickled checkpoints** (``torch.save`` of a state dict or a module, any other pickle) are
  refused outright by the registry: certify never unpickles them;
- **``.pt2`` archives** (:func:`scan_pt2`): every member torch would unpickle (pickled weights and
  constants, sample inputs, legacy weight files) must be read by torch's weights-only unpickler
  (which refuses every callable it does not list); custom and opaque objects, native code
  (AOTInductor) and unknown members are refused; the graph (``models/*.json``) may call only
  aten operations that touch no file, and its shape expressions may use only symbols, numbers
  and sympy's arithmetic (:func:`check_program_json`);
- **TorchScript files** (:func:`scan_torchscript`): the program's code is parsed (it is Python
  syntax) and may reach ``torch`` and ``ops`` only as ``torch.NAME`` / ``ops.NS.NAME``
  attribute chains, with ``aten``/``prim`` operations that read or write no file and no custom
  class (:func:`code_refusal`); its pickles (the module's data, its constants, and the example
  inputs ``torch.jit.trace`` stores in ``traced_inputs.pkl``) may name only the types
  TorchScript's unpickler builds, each by literal names; the other members are raw tensor
  bytes (``data/N``, ``constants/N``, ``traced_inputs/N``).

These checks refuse every way of running code at load time that certify knows of; they are not
a sandbox. A PyTorch file is a program: evaluate files from a source you would run code from
(the README says so).
"""

from __future__ import annotations

import ast
import io
import json
import pickletools
import re
import struct
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from certify.errors import ModelError

#: How a loadable program is saved (said with every refusal of a checkpoint or a pickle).
SAVE_A_PROGRAM = ("save a program instead of weights: torch.export.save(torch.export.export("
                  "model.eval(), (example_batch,)), 'model.pt2'), or export to ONNX "
                  "(torch.onnx.export)")
#: Operations a program may not call: they read or write files.
FILE_OPS = frozenset({"from_file", "save", "load"})
#: Operation namespaces a TorchScript program may use (the others reach devices, networks,
#: profilers or custom libraries).
OP_NAMESPACES = frozenset({"aten", "prim"})
#: Largest member certify reads into memory to check it: a pickle, a graph, TorchScript code.
MAX_CHECKED_MEMBER = 1 << 30
#: Names a TorchScript program may not use at all (not TorchScript, but never let through).
_FORBIDDEN_NAMES = frozenset({"__import__", "eval", "exec", "compile", "open", "globals",
                              "locals", "vars", "__builtins__", "setattr", "delattr"})
#: What a shape expression of an exported graph may name: sympy's arithmetic and the
#: assumptions torch writes (``Symbol('s77', positive=True, integer=True)``).
_EXPR_NAMES = frozenset({
    "Symbol", "Integer", "Rational", "Float", "positive", "negative", "nonnegative",
    "nonpositive", "integer", "real", "finite", "True", "False", "oo", "zoo", "nan", "Max",
    "Min", "Abs", "FloorDiv", "CeilDiv", "CleanDiv", "Mod", "PythonMod", "ModularIndexing",
    "IntTrueDiv", "FloatTrueDiv", "TruncToInt", "TruncToFloat", "RoundToInt", "RoundDecimal",
    "CeilToInt", "FloorToInt", "ToFloat", "floor", "ceiling", "sqrt", "Pow", "PowByNatural",
    "FloatPow", "Mul", "Add", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not",
    "Piecewise", "LShift", "RShift", "Identity"})
_EXPR_TOKEN = re.compile(r"\s+|[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d+)?(?:e[+-]?\d+)?|"
                         r"'[A-Za-z_][A-Za-z0-9_]*'|\*\*|//|[-+*/%(),=<>!&|~]")
_SYMBOL = re.compile(r"[a-z]+\d+")
#: Graph targets an exported program may call besides aten operations: shape arithmetic.
_OTHER_TARGETS = re.compile(
    r"_operator\.(getitem|add|sub|mul|floordiv|truediv|mod|pow|neg|pos|eq|ne|lt|le|gt|ge|"
    r"and_|or_|not_|abs)|math\.(ceil|floor|trunc|sqrt)|torch\.sym_(max|min|float|int|not|"
    r"sqrt|ite|sum)")
_ATEN_TARGET = re.compile(r"torch\.ops\.aten\.(\w+)\.(\w+)")
#: A FlatBuffer TorchScript program carries this at bytes 4-8 (torch.jit.load checks it first).
_FLATBUFFER = b"PTMF"


def refuse(path: Path, why: str, hint: str = SAVE_A_PROGRAM) -> ModelError:
    """The refusal of a PyTorch file (exit 3): what it holds and why certify will not load it."""
    return ModelError(f"{path.name} is refused: {why}", hint=hint)


class Archive:
    """A zip archive as torch reads it: member names below the top folder, and their bytes
    through torch's own reader (checked to agree with Python's, :func:`read_archive`)."""

    def __init__(self, path: Path, names: list[str], sizes: dict[str, int],
                 read: Callable[[str], bytes]) -> None:
        self.path = path
        self.names = names
        self.sizes = sizes
        self._read = read

    def read(self, name: str, limit: int = MAX_CHECKED_MEMBER) -> bytes:
        """A member's bytes (refused beyond ``limit``: certify does not check what it cannot
        hold)."""
        if self.sizes.get(name, 0) > limit:
            raise refuse(self.path, f"its member {name} holds {self.sizes[name]:,} bytes, more "
                                    "than certify checks")
        return self._read(name)


def read_archive(path: Path) -> Archive:
    """Open ``path`` as torch's loaders will, refusing an archive that Python's zip reader
    and torch's could read differently (see the module's docstring)."""
    with path.open("rb") as f:
        data_head = f.read(8)
    if data_head[4:8] == _FLATBUFFER:
        raise refuse(path, "it holds a FlatBuffer program behind a zip header, which "
                           "torch.jit.load would run without certify reading it")
    size = path.stat().st_size
    with path.open("rb") as f:
        f.seek(max(0, size - 65557))
        tail = f.read()
    end = tail.rfind(b"PK\x05\x06")
    if end < 0 or len(tail) - end < 22:
        raise refuse(path, "it is not a zip archive with an end record", hint="save it again")
    end_at = max(0, size - 65557) + end
    entries, cd_size, cd_offset = struct.unpack("<HII", tail[end + 10:end + 20])
    cd_end = end_at
    locator = tail[end - 20:end] if end >= 20 else b""
    if locator[:4] == b"PK\x06\x07":  # zip64 (torch writes it): its own end record
        (z64_at,) = struct.unpack("<Q", locator[8:16])
        with path.open("rb") as f:
            f.seek(z64_at)
            record = f.read(56)
        if record[:4] != b"PK\x06\x06" or z64_at + 56 > end_at - 20:
            raise refuse(path, "its zip64 end record is not where its locator says")
        cd_size, cd_offset = struct.unpack("<QQ", record[40:56])
        cd_end = z64_at
    elif 0xFFFFFFFF in (cd_size, cd_offset) or entries == 0xFFFF:
        raise refuse(path, "its end record points to a zip64 directory it does not hold")
    if cd_offset + cd_size != cd_end:
        raise refuse(path, "its zip directory does not sit where its end record says (bytes "
                           "before or inside the archive): two zip readers could see two "
                           "different archives")
    with zipfile.ZipFile(path) as z:
        infos = [i for i in z.infolist() if not i.is_dir()]
        if any(i.header_offset + 30 > cd_offset for i in infos):
            raise refuse(path, "a member starts outside the archive's data")
        full = [i.filename for i in infos]
        sizes = {i.filename: i.file_size for i in infos}
    tops = {n.split("/", 1)[0] for n in full}
    if len(tops) != 1 or any("/" not in n for n in full):
        raise refuse(path, "its members are not under one folder, as torch writes them")
    names = [n.split("/", 1)[1] for n in full]
    folded = [n.casefold() for n in names]
    if len(set(folded)) != len(folded):
        raise refuse(path, "two of its members have the same name (or names that differ only "
                           "in case): torch and a checker could read different ones")
    import torch

    reader = torch._C.PyTorchFileReader(str(path))
    if sorted(reader.get_all_records()) != sorted(names):
        raise refuse(path, "torch's zip reader and Python's list different members")
    by_rel = {rel: sizes[f] for rel, f in zip(names, full, strict=True)}
    return Archive(path, names, by_rel, lambda name: bytes(reader.get_record(name)))


def weights_only_readable(data: bytes) -> str | None:
    """``None`` when torch's weights-only unpickler reads ``data`` (a ``torch.save`` archive),
    else why not. Only the restricted unpickler sees the bytes: it builds tensors and plain
    containers and refuses every other callable, so nothing in ``data`` runs."""
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - any refusal of the restricted unpickler
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return first[:200]
    return None


def _checked(scan: Callable[[Path], None]) -> Callable[[Path], None]:
    """A scan whose unexpected failures (a malformed member, bad UTF-8) are refusals too."""
    def run(path: Path) -> None:
        try:
            scan(path)
        except ModelError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever a crafted file makes fail
            raise refuse(path, f"certify could not check it ({type(exc).__name__}: "
                               f"{str(exc)[:160]})", hint="save it again with torch") from None
    run.__doc__ = scan.__doc__
    run.__name__ = scan.__name__
    return run


@_checked
def scan_pt2(path: Path) -> None:
    """Refuse (:class:`ModelError`) a ``.pt2`` archive that could run code when
    ``torch.export.load`` reads it or its program runs (see the module's docstring); return
    when every member is inert."""
    arc = read_archive(path)
    names = set(arc.names)
    models = [n for n in names if re.fullmatch(r"models/[^/]+\.json", n)]
    configs = [n for n in names if re.fullmatch(r"data/(weights|constants)/[^/]+\.json", n)]
    raw: set[str] = set()
    pickled: set[str] = set()
    for name in configs:
        folder = name.rsplit("/", 1)[0]
        config = json.loads(arc.read(name))["config"]
        for fqn, entry in config.items():
            member = entry["path_name"]
            if not isinstance(member, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", member):
                raise refuse(path, f"its payload {fqn!r} names the member {member!r}")
            if member.startswith(("custom_obj", "opaque_obj")):
                raise refuse(path, f"it holds a pickled object {member!r} (not a tensor), "
                                   "which torch unpickles without restriction when it "
                                   "loads the archive: it can run code")
            (pickled if entry.get("use_pickle") else raw).add(f"{folder}/{member}")
    for model in models:  # what torch.export.load reads beside each program
        stem = model[len("models/"):-len(".json")]
        pickled.update(n for n in (f"data/sample_inputs/{stem}.pt", f"data/weights/{stem}.pt",
                                   f"data/constants/{stem}.pt") if n in names)
    folded_raw = {n.casefold() for n in raw}
    both = sorted(n for n in pickled if n.casefold() in folded_raw)
    if both:
        raise refuse(path, f"its member {both[0]} is declared both raw and pickled")
    for name in sorted(pickled):  # first: whatever else a member looks like
        if name not in names:
            raise refuse(path, f"it declares a pickled member {name} it does not hold")
        why = weights_only_readable(arc.read(name))
        if why is not None:
            raise refuse(path, f"its member {name} is a pickle that torch's weights-only "
                               f"unpickler will not read ({why}); torch.export.load would "
                               "unpickle it without restriction, which can run code")
    for model in models:
        why = check_program_json(json.loads(arc.read(model)))
        if why is not None:
            raise refuse(path, f"its program ({model}) {why}",
                         hint="export the model again with torch.export.save")
    inert = {"archive_format", "archive_version", "byteorder", ".data/version",
             ".data/serialization_id", *models, *configs, *raw, *pickled}
    for name in sorted(names - inert):
        if name.startswith("extra/") and "/" not in name[len("extra/"):]:
            continue  # read as text by torch.export.load
        if name.startswith("data/aotinductor/") or name.endswith((".so", ".dll", ".dylib")):
            raise refuse(path, f"it holds native code ({name}, an AOTInductor build), "
                               "which loading would run",
                         hint="save the exported program without AOTInductor "
                              "(torch.export.save)")
        raise refuse(path, f"its member {name} is not one torch.export.save writes "
                           "(certify loads archives it can check member by member)",
                     hint="save the program with torch.export.save")


def _walk(obj: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) pair of a JSON document, depth first."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k, v
            yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)


def expr_refusal(expr: str) -> str | None:
    """Why a shape expression of an exported graph may not be parsed (torch parses it with
    ``sympy.sympify``, which evaluates Python), or ``None`` for plain symbolic arithmetic."""
    pos = 0
    while pos < len(expr):
        m = _EXPR_TOKEN.match(expr, pos)
        if m is None:
            return f"has a shape expression with {expr[pos:pos + 20]!r}"
        token = m.group()
        if token[0].isalpha() or token[0] == "_":
            if token not in _EXPR_NAMES and not _SYMBOL.fullmatch(token):
                return f"has a shape expression that names {token!r}"
        pos = m.end()
    return None


def check_program_json(doc: Any) -> str | None:
    """Why an exported program's serialized graph may not be loaded and run: a call of anything
    but an aten operation that touches no file (and shape arithmetic), or a shape expression
    beyond symbolic arithmetic (:func:`expr_refusal`); ``None`` when it is neither."""
    for key, value in _walk(doc):
        if key == "target" and isinstance(value, str):
            m = _ATEN_TARGET.fullmatch(value)
            if m is not None:
                if m.group(1) in FILE_OPS:
                    return f"calls {value}, which reads or writes files"
            elif not _OTHER_TARGETS.fullmatch(value):
                return f"calls {value}: certify runs programs of aten operations only"
        elif key == "expr_str":
            why = expr_refusal(str(value))
            if why is not None:
                return why
        elif key == "range_constraints" and isinstance(value, dict):
            for symbol in value:
                why = expr_refusal(str(symbol))
                if why is not None:
                    return why
    return None


def _pickle_globals(data: bytes) -> set[tuple[str, str]]:
    """Every ``(module, name)`` a pickle stream names (``GLOBAL``, ``INST``, ``STACK_GLOBAL``),
    read from its opcodes without unpickling it. A ``STACK_GLOBAL`` must take two literal
    strings pushed just before it (memoised or not); anything else raises ValueError."""
    found: set[tuple[str, str]] = set()
    recent: list[tuple[str, Any]] = []
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("GLOBAL", "INST"):
            module, _, name = str(arg).partition(" ")
            found.add((module, name))
        elif op.name == "STACK_GLOBAL":
            if len(recent) < 2 or not all(isinstance(a, str) and o.endswith("UNICODE")
                                          for o, a in recent[-2:]):
                raise ValueError("a STACK_GLOBAL whose names are not literal strings")
            found.add((str(recent[-2][1]), str(recent[-1][1])))
        if op.name not in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT", "FRAME"):
            recent.append((op.name, arg))
            del recent[:-2]
    return found


_MARK = object()


def _literal_pickle(data: bytes) -> Any:
    """The value of a pickle made of literals (ints, floats, strings, bools, None), tuples,
    lists, dicts and calls, read from its opcodes without running anything: a global is
    ``("global", module, name)``, a persistent id ``("persid", pid)``, a call ``("call",
    callable, args)``. Any other opcode raises ValueError."""
    stack: list[Any] = []
    memo: dict[int, Any] = {}

    def to_mark() -> list[Any]:
        k = len(stack) - 1 - stack[::-1].index(_MARK)
        items = stack[k + 1:]
        del stack[k:]
        return items

    for op, arg, _pos in pickletools.genops(data):
        name = op.name
        if name in ("PROTO", "FRAME"):
            continue
        if name == "STOP":
            return stack[-1]
        if name in ("GLOBAL", "INST"):
            module, _, attr = str(arg).partition(" ")
            stack.append(("global", module, attr))
        elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[int(str(arg))] = stack[-1]
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif name in ("BINGET", "LONG_BINGET", "GET"):
            stack.append(memo[int(str(arg))])
        elif name == "MARK":
            stack.append(_MARK)
        elif name in ("EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE"):
            stack.append({} if name == "EMPTY_DICT" else [] if name == "EMPTY_LIST" else ())
        elif name == "TUPLE":
            stack.append(tuple(to_mark()))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            k = int(name[-1])
            packed = tuple(stack[-k:])
            del stack[-k:]
            stack.append(packed)
        elif name in ("BININT", "BININT1", "BININT2", "LONG1", "INT", "LONG", "BINFLOAT",
                      "BINUNICODE", "SHORT_BINUNICODE", "UNICODE", "BINBYTES",
                      "SHORT_BINBYTES"):
            stack.append(arg)
        elif name in ("NEWTRUE", "NEWFALSE", "NONE"):
            stack.append({"NEWTRUE": True, "NEWFALSE": False, "NONE": None}[name])
        elif name == "BINPERSID":
            stack.append(("persid", stack.pop()))
        elif name == "REDUCE":
            args = stack.pop()
            stack.append(("call", stack.pop(), args))
        elif name in ("APPEND", "APPENDS"):
            added = [stack.pop()] if name == "APPEND" else to_mark()
            stack[-1].extend(added)
        elif name in ("SETITEM", "SETITEMS"):
            pairs = stack[-2:] if name == "SETITEM" else to_mark()
            if name == "SETITEM":
                del stack[-2:]
            for k in range(0, len(pairs) - 1, 2):
                stack[-1][pairs[k]] = pairs[k + 1]
        else:
            raise ValueError(f"opcode {name}")
    raise ValueError("no STOP")


def traced_input_shape(path: Path) -> tuple[int, ...] | None:
    """The shape of the example input ``torch.jit.trace`` stored with a TorchScript file
    (``traced_inputs.pkl``: its ``forward``'s first tensor), read from the pickle's opcodes
    without unpickling it; ``None`` where the file has none or it cannot be read so."""
    try:
        arc = read_archive(path)
        member = next((n for n in arc.names if n.endswith("/traced_inputs.pkl")
                       or n == "traced_inputs.pkl"), None)
        if member is None:
            return None
        doc = _literal_pickle(arc.read(member, 1 << 20))
    except (ValueError, IndexError, KeyError, TypeError, AttributeError, ModelError):
        return None

    def first_tensor(obj: Any) -> tuple[int, ...] | None:
        if isinstance(obj, tuple) and len(obj) == 3 and obj[0] == "call":
            fn, args = obj[1], obj[2]
            if fn == ("global", "torch._utils", "_rebuild_tensor_v2") and len(args) > 2:
                size = args[2]
                if isinstance(size, tuple) and all(isinstance(d, int) for d in size):
                    return size
            return first_tensor(args)
        if isinstance(obj, dict):
            obj = obj.get("forward", list(obj.values()))
        if isinstance(obj, (list, tuple)):
            for item in obj:
                found = first_tensor(item)
                if found is not None:
                    return found
        return None

    return first_tensor(doc)


def _torchscript_global(module: str, name: str) -> bool:
    if module == "__torch__" or module.startswith("__torch__."):
        return not module.startswith("__torch__.torch.classes")
    if module == "torch._utils":
        return name in ("_rebuild_tensor_v2", "_rebuild_parameter", "_rebuild_qtensor",
                        "_rebuild_sparse_tensor")
    if module == "collections":
        return name == "OrderedDict"
    if module == "torch.jit._pickle":
        return name.startswith("build_") or name == "restore_type_tag"
    return module == "torch" and name.endswith("Storage")


def _chain(node: ast.AST) -> list[str]:
    """``torch.ops.aten.add`` → ``['torch', 'ops', 'aten', 'add']`` (empty unless rooted at a
    name)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else []


def code_refusal(source: str) -> str | None:
    """Why serialized TorchScript code may not be loaded: ``torch`` or ``ops`` used other than
    as an attribute chain (an alias, ``getattr``), an operation outside ``aten``/``prim``, one
    that reads or writes files, a custom class, or a name that is never TorchScript; or
    ``None``."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return f"its code does not parse ({exc.msg})"
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id in _FORBIDDEN_NAMES:
                return f"it uses {node.id}"
            if node.id in ("torch", "ops") and not isinstance(parents.get(node), ast.Attribute):
                return f"it uses {node.id} other than as torch.NAME or ops.NS.NAME"
        elif isinstance(node, ast.Attribute):
            if node.attr == "from_file":
                return "it calls from_file, which maps a file into memory (and writes it)"
            chain = _chain(node)
            if isinstance(parents.get(node), ast.Attribute) or not chain:
                continue  # judged at the outermost attribute of its chain
            if chain[0] == "torch" and len(chain) > 1:
                if chain[1] in FILE_OPS:
                    return f"it calls torch.{chain[1]}, which reads or writes files"
                if chain[1] == "classes":
                    return "it uses a custom class (torch.classes), native code certify " \
                           "cannot check"
                if chain[1] == "ops":
                    chain = chain[1:]
            if chain[0] == "ops":
                if len(chain) < 3 or chain[1] not in OP_NAMESPACES:
                    return f"it calls {'.'.join(chain)}, outside aten and prim"
                if chain[2] in FILE_OPS:
                    return f"it calls {chain[1]}::{chain[2]}, which reads or writes files"
    return None


@_checked
def scan_torchscript(path: Path) -> None:
    """Refuse (:class:`ModelError`) a TorchScript file whose code or pickles could do more
    than compute (see the module's docstring); return when every member is inert."""
    arc = read_archive(path)
    for name in sorted(arc.names):
        if name.startswith("code/") and name.endswith(".py"):
            why = code_refusal(arc.read(name, 64 << 20).decode("utf-8"))
            if why is not None:
                raise refuse(path, f"{why} ({name}); a TorchScript program runs while it is "
                                   "loaded and evaluated, so certify does not load it",
                             hint="export the model with torch.export (.pt2) or to ONNX")
        elif name.endswith((".pkl", ".debug_pkl")):
            try:
                found = _pickle_globals(arc.read(name))
            except ValueError as exc:
                raise refuse(path, f"its member {name} is not a pickle certify can read "
                                   f"({exc})") from None
            bad = sorted(f"{m}.{n}" for m, n in found if not _torchscript_global(m, n))
            if bad:
                raise refuse(path, f"its member {name} is a pickle that calls "
                                   f"{', '.join(bad[:3])}: not a type TorchScript builds, "
                                   "and unpickling it could run code")
        elif not (name in ("version", "byteorder", ".data/version", ".data/serialization_id")
                  or re.fullmatch(r"(data|constants|traced_inputs)/\d+", name)
                  or (name.startswith("extra/") and "/" not in name[len("extra/"):])):
            raise refuse(path, f"its member {name} is not one torch.jit.save writes",
                         hint="export the model with torch.export (.pt2) or to ONNX")
