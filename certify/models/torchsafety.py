"""Static checks of PyTorch model files, before torch reads a byte of them.

A PyTorch file can run code when it is loaded: a pickle runs whatever its ``REDUCE`` opcodes
call, ``torch.export.load`` unpickles some members of a ``.pt2`` archive with
``weights_only=False`` (measured with torch 2.13: a ``sample_inputs`` member replaced by a pickle
with a payload ran it), and a TorchScript program runs its ``__setstate__`` methods while it is
loaded and can call operations that write files (``torch.from_file(..., shared=True)``). So
certify reads the archive's members itself first and refuses, with the reason, anything it
cannot show to be inert:

- **pickled checkpoints** (``torch.save`` of a state dict or a module, any other pickle) are
  refused outright: certify never unpickles them;
- **``.pt2`` archives** (:func:`scan_pt2`): every member must be one certify knows: text and
  JSON, raw tensor payloads (``use_pickle: false`` in the archive's own configs), or a pickle
  that torch's weights-only unpickler reads (which refuses every callable it does not list);
  native code (AOTInductor), custom and opaque objects and unknown members are refused;
- **TorchScript files** (:func:`scan_torchscript`): the program's code may use only ``aten`` and
  ``prim`` operations, none that reads or writes files (``from_file``, ``save``) and no custom
  class; its pickles may name only the types TorchScript's own unpickler builds.

Every check reads the zip's members as bytes; none imports, unpickles or runs them (the
weights-only check gives torch's restricted unpickler the bytes of one member, in memory).
"""

from __future__ import annotations

import io
import json
import pickletools
import re
import warnings
import zipfile
from pathlib import Path, PurePosixPath

from certify.errors import ModelError

#: How a loadable program is saved (said with every refusal of a checkpoint or a pickle).
SAVE_A_PROGRAM = ("save a program instead of weights: torch.export.save(torch.export.export("
                  "model.eval(), (example_batch,)), 'model.pt2'), or export to ONNX "
                  "(torch.onnx.export)")
#: A pickle stream of protocol 2 and later starts with this opcode (PROTO).
PICKLE_PROTO = 0x80
#: Operations a TorchScript program may not call: they read or write files.
FILE_OPS = frozenset({"from_file", "save", "load"})
#: Operation namespaces a TorchScript program may use (the others reach devices, networks,
#: profilers or custom libraries).
OP_NAMESPACES = frozenset({"aten", "prim"})
#: Globals a TorchScript pickle may name: the types TorchScript's own unpickler builds.
_TS_GLOBAL_MODULES = ("__torch__", "torch.jit._pickle", "torch._utils", "collections",
                      "torch")
_TS_GLOBAL_NAMES = {"torch._utils": {"_rebuild_tensor_v2", "_rebuild_parameter",
                                     "_rebuild_qtensor", "_rebuild_sparse_tensor"},
                    "collections": {"OrderedDict"}}
#: Largest member certify reads into memory to check it (a pickle of sample inputs or a
#: pickled weight); a larger pickled member is refused rather than read.
MAX_PICKLED_MEMBER = 1 << 30


def refuse(path: Path, why: str, hint: str = SAVE_A_PROGRAM) -> ModelError:
    """The refusal of a PyTorch file (exit 3): what it holds and why certify will not load it."""
    return ModelError(f"{path.name} is refused: {why}", hint=hint)


def _members(path: Path) -> tuple[zipfile.ZipFile, str]:
    """The open archive and its top folder (torch writes every member under one folder)."""
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelError(f"{path.name} is not a readable zip archive ({exc})",
                         hint="check the file was not truncated") from None
    names = z.namelist()
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) != 1 or any("/" not in n for n in names):
        z.close()
        raise refuse(path, "its members are not under one folder, as torch writes them")
    return z, tops.pop()


def _rel(name: str) -> str:
    return name.split("/", 1)[1]


def _read(z: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path) -> bytes:
    if info.file_size > MAX_PICKLED_MEMBER:
        raise refuse(path, f"its member {info.filename} is a pickle of "
                           f"{info.file_size:,} bytes, more than certify checks")
    return z.read(info)


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


def scan_pt2(path: Path) -> None:
    """Refuse (:class:`ModelError`) a ``.pt2`` archive with a member that could run code when
    ``torch.export.load`` reads it (see the module's docstring); return when every member is
    inert."""
    z, top = _members(path)
    with z:
        infos = {_rel(i.filename): i for i in z.infolist() if not i.is_dir()}
        raw: set[str] = set()
        pickled: set[str] = set()
        for name in [n for n in infos if re.fullmatch(r"data/(weights|constants)/[^/]+\.json",
                                                       n)]:
            folder = str(PurePosixPath(name).parent)
            try:
                config = json.loads(z.read(infos[name]))["config"]
                entries = [(str(v["path_name"]), bool(v.get("use_pickle"))) for v in
                           config.values()]
            except (ValueError, KeyError, TypeError, AttributeError):
                raise refuse(path, f"its member {name} is not a payload configuration torch "
                                   "writes") from None
            for member, use_pickle in entries:
                if member.startswith(("custom_obj", "opaque_obj")):
                    raise refuse(path, f"it holds a pickled object {member!r} (not a tensor), "
                                       "which torch unpickles without restriction when it "
                                       "loads the archive: it can run code")
                (pickled if use_pickle else raw).add(f"{folder}/{member}")
        for name, info in sorted(infos.items()):
            if name in ("archive_format", "archive_version", "byteorder", ".data/version",
                        ".data/serialization_id") or name.endswith(".json") \
                    or name.startswith("extra/") or name in raw:
                continue
            if name in pickled or re.fullmatch(r"data/sample_inputs/[^/]+\.pt", name):
                why = weights_only_readable(_read(z, info, path))
                if why is not None:
                    raise refuse(path, f"its member {name} is a pickle that torch's "
                                       f"weights-only unpickler will not read ({why}); "
                                       "torch.export.load would unpickle it without "
                                       "restriction, which can run code")
                continue
            if name.startswith("data/aotinductor/") or name.endswith((".so", ".dll",
                                                                      ".dylib")):
                raise refuse(path, f"it holds native code ({name}, an AOTInductor build), "
                                   "which loading would run",
                             hint="save the exported program without AOTInductor "
                                  "(torch.export.save)")
            raise refuse(path, f"its member {name} is not one torch.export.save writes "
                               "(certify loads archives it can check member by member)",
                         hint="save the program with torch.export.save")
    del top


def _pickle_globals(data: bytes) -> set[tuple[str, str]]:
    """Every ``(module, name)`` a pickle stream names (``GLOBAL`` and ``STACK_GLOBAL``),
    read from its opcodes without unpickling it. Raises ValueError for a malformed stream."""
    found: set[tuple[str, str]] = set()
    strings: list[str] = []
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("GLOBAL", "INST"):
            module, _, name = str(arg).partition(" ")
            found.add((module, name))
        elif op.name == "STACK_GLOBAL":
            if len(strings) < 2:
                raise ValueError("STACK_GLOBAL without its names")
            found.add((strings[-2], strings[-1]))
        elif isinstance(arg, str):
            strings.append(arg)
    return found


def _torchscript_global(module: str, name: str) -> bool:
    if module == "__torch__" or module.startswith("__torch__."):
        return not module.startswith("__torch__.torch.classes")
    if module in _TS_GLOBAL_NAMES:
        return name in _TS_GLOBAL_NAMES[module]
    if module == "torch.jit._pickle":
        return name.startswith("build_") or name == "restore_type_tag"
    return module == "torch" and name.endswith("Storage")


_OP_CALL = re.compile(r"\bops\.(\w+)\.(\w+)")
_TORCH_CALL = re.compile(r"\btorch\.(\w+)\b")


def code_refusal(source: str) -> str | None:
    """Why TorchScript code may not be loaded (an operation that reads or writes files, one
    outside ``aten``/``prim``, a custom class), or ``None``."""
    for m in _OP_CALL.finditer(source):
        ns, op = m.group(1), m.group(2)
        if ns not in OP_NAMESPACES:
            return f"it calls the operation {ns}::{op}, outside aten and prim"
        if op in FILE_OPS:
            return f"it calls {ns}::{op}, which reads or writes files"
    for m in _TORCH_CALL.finditer(source):
        if m.group(1) in FILE_OPS:
            return f"it calls torch.{m.group(1)}, which reads or writes files"
        if m.group(1) == "classes":
            return "it uses a custom class (torch.classes), native code certify cannot check"
    return None


def scan_torchscript(path: Path) -> None:
    """Refuse (:class:`ModelError`) a TorchScript file whose code or pickles could do more
    than compute (see the module's docstring); return when every member is inert."""
    z, _ = _members(path)
    with z:
        for info in z.infolist():
            if info.is_dir():
                continue
            name = _rel(info.filename)
            if name.startswith("code/") and name.endswith(".py"):
                source = z.read(info).decode("utf-8", errors="replace")
                why = code_refusal(source)
                if why is not None:
                    raise refuse(path, f"{why} ({name}); a TorchScript program runs while it "
                                       "is loaded and evaluated, so certify does not load it",
                                 hint="export the model with torch.export (.pt2) or to ONNX")
            elif name.endswith(".pkl") or name.endswith(".debug_pkl"):
                try:
                    names = _pickle_globals(_read(z, info, path))
                except ValueError as exc:
                    raise refuse(path, f"its member {name} is not a readable pickle ({exc})"
                                 ) from None
                bad = sorted(f"{m}.{n}" for m, n in names if not _torchscript_global(m, n))
                if bad:
                    raise refuse(path, f"its member {name} is a pickle that calls "
                                       f"{', '.join(bad[:3])}: not a type TorchScript builds, "
                                       "and unpickling it could run code")
            elif not (name in ("version", "byteorder", ".data/version",
                               ".data/serialization_id")
                      or re.fullmatch(r"(data|constants)/\d+", name)
                      or name.startswith("extra/")):
                raise refuse(path, f"its member {name} is not one torch.jit.save writes",
                             hint="export the model with torch.export (.pt2) or to ONNX")
