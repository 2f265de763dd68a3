"""Untrusted uploads, checked before anything runs on them.

A model is one ``.onnx`` file, or one ``.onnx`` with its external-data files, or one archive
(``.tar``, ``.tar.gz``/``.tgz``, ``.zip``) holding them. Its files are laid out in a fresh folder
under sanitised base names; archives are unpacked member by member (regular files only, flat or
under one top folder, counted and size-limited as they are written: headers are never trusted).
The ONNX file is then parsed *without* loading external data, and checked before any
onnxruntime session exists: every external-data reference must name a file of the upload
(no absolute path, no ``..``, no link, offsets inside the file), operator domains must be
standard or allowed, and the graph must be within size limits.
"""

from __future__ import annotations

import os
import re
import stat
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from certify.errors import CertifyError

STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,199}$")


class UploadError(CertifyError):
    """An upload the service refuses; ``status`` is the HTTP status it answers with."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None, status: int = 422) -> None:
        super().__init__(message, hint)
        self.status = status


@dataclass(frozen=True)
class Limits:
    """What one submission may upload."""

    max_model_bytes: int = 200 * 2**20
    max_total_bytes: int = 200 * 2**20
    max_dataset_bytes: int = 64 * 2**20
    #: Decompressed arrays of an uploaded .npz, in all.
    max_dataset_array_bytes: int = 1024 * 2**20
    max_suite_bytes: int = 256 * 2**10
    max_nodes: int = 20_000
    max_initializer_bytes: int = 1024 * 2**20
    max_archive_members: int = 64
    allowed_domains: tuple[str, ...] = field(default=STANDARD_DOMAINS)


def safe_name(name: str) -> str:
    """A client-given file name, accepted only as a plain base name."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    if base != name or not _NAME.match(base) or base in (".", ".."):
        raise UploadError(f"file name {name[:100]!r} is not a plain file name",
                          hint="letters, digits, . _ + -; no folders, no leading dot")
    return base


ARCHIVES = (".tar", ".tar.gz", ".tgz", ".zip")


def _is_archive(name: str) -> bool:
    return name.lower().endswith(ARCHIVES)


def prepare_model(files: list[tuple[str, Path]], dest: Path, limits: Limits) -> Path:
    """Lay one model's uploaded files out in ``dest`` (new); returns its ``.onnx`` path."""
    if not files:
        raise UploadError("no model file was uploaded")
    dest.mkdir(parents=True)
    if len(files) == 1 and _is_archive(files[0][0]):
        _unpack(files[0][0], files[0][1], dest, limits)
    else:
        for name, src in files:
            if _is_archive(name):
                raise UploadError(f"{name}: an archive must be the model's only upload")
            target = dest / safe_name(name)
            if target.exists():
                raise UploadError(f"two uploaded files are named {target.name}")
            _copy(src.open("rb"), target, limits.max_model_bytes, target.name)
    onnx_files = sorted(p for p in dest.iterdir() if p.suffix == ".onnx")
    if not onnx_files and len(files) == 1:
        _refuse_other_format(next(dest.iterdir(), None))
    if len(onnx_files) != 1:
        found = ", ".join(p.name for p in onnx_files) or "none"
        raise UploadError(f"the upload must hold exactly one .onnx file (found: {found})",
                          hint="upload the model and its external-data files")
    return onnx_files[0]


def _refuse_other_format(path: Path | None) -> None:
    """Name the format of a single upload that is not ONNX (a PyTorch program, a pickle),
    read from its first bytes and zip member names only: the service loads ONNX only."""
    from certify.errors import ModelError
    from certify.models.registry import identify

    if path is None or not path.is_file():
        return
    try:
        fmt = identify(str(path))
    except ModelError:
        return
    if not fmt.uploadable:
        raise UploadError(f"{path.name} is {fmt.title}: certify serve takes ONNX models only",
                          hint="export the model to ONNX (torch.onnx.export), or run "
                               "`certify run` on it locally")


def _copy(src: BinaryIO, target: Path, limit: int, name: str) -> int:
    n = 0
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with src, os.fdopen(fd, "wb") as out:
        while chunk := src.read(1 << 20):
            n += len(chunk)
            if n > limit:
                raise UploadError(f"{name} unpacks to more than {limit // 2**20} MB",
                                  status=413)
            out.write(chunk)
    return n


def _members(archive_name: str, path: Path) -> Iterator[tuple[str, bool, Any]]:
    """(member name, is a regular file, opener) of an archive; links and devices say so."""
    low = archive_name.lower()
    try:
        if low.endswith(".zip"):
            with zipfile.ZipFile(path) as z:
                for info in z.infolist():
                    if info.is_dir():
                        continue
                    mode = info.external_attr >> 16
                    regular = stat.S_IFMT(mode) in (0, stat.S_IFREG)
                    yield info.filename, regular, (lambda i=info: z.open(i))
        else:
            with tarfile.open(path, "r:*") as t:
                for m in t:
                    if m.isdir():
                        continue
                    yield m.name, m.isreg(), (lambda m=m: t.extractfile(m))
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as exc:
        raise UploadError(f"{archive_name} is not a readable archive ({exc})") from None


def _unpack(archive_name: str, path: Path, dest: Path, limits: Limits) -> None:
    total, count, top = 0, 0, None
    for raw_name, regular, opener in _members(archive_name, path):
        if raw_name.endswith("/"):
            continue
        count += 1
        if count > limits.max_archive_members:
            raise UploadError(f"{archive_name} holds more than {limits.max_archive_members} "
                              "files", status=413)
        if not regular:
            raise UploadError(f"{archive_name}: {raw_name[:100]!r} is a link or special file",
                              hint="archives may hold regular files only")
        parts = raw_name.split("/")
        if raw_name.startswith("/") or ".." in parts or "\\" in raw_name or len(parts) > 2:
            raise UploadError(f"{archive_name}: member {raw_name[:100]!r} is not a plain file "
                              "name", hint="a flat archive, or one with a single top folder")
        if len(parts) == 2:
            if top is None:
                top = parts[0]
            if parts[0] != top:
                raise UploadError(f"{archive_name} has more than one top folder")
        name = safe_name(parts[-1])
        target = dest / name
        if target.exists():
            raise UploadError(f"{archive_name} holds two files named {name}")
        src = opener()
        if src is None:
            raise UploadError(f"{archive_name}: cannot read {name}")
        total += _copy(src, target, limits.max_total_bytes - total, name)


@dataclass(frozen=True)
class OnnxSummary:
    """What the static checks saw in an ONNX model."""

    nodes: int
    opsets: dict[str, int]
    inputs: list[tuple[str, list[Any]]]
    outputs: list[tuple[str, list[Any]]]
    external_files: list[str]
    size: int


def _graphs(graph: Any) -> Iterator[Any]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.g is not None and attr.HasField("g"):
                yield from _graphs(attr.g)
            for g in attr.graphs:
                yield from _graphs(g)


def check_onnx(path: Path, limits: Limits) -> OnnxSummary:
    """Check an uploaded ONNX model statically (UploadError 422 with the reason)."""
    import onnx
    from onnx import TensorProto

    from certify.onnx_files import graph_tensors

    folder = path.parent.resolve()
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises many kinds for junk
        raise UploadError(f"{path.name} is not an ONNX model: {type(exc).__name__}",
                          hint="upload the .onnx file the model was exported to") from None
    if not model.HasField("graph") or not model.graph.node:
        raise UploadError(f"{path.name} is not an ONNX model: it has no graph",
                          hint="upload the .onnx file the model was exported to")
    opsets = {o.domain: int(o.version) for o in model.opset_import}
    nodes, init_bytes, external = 0, 0, set()
    for g in _graphs(model.graph):
        nodes += len(g.node)
        for node in g.node:
            if node.domain not in limits.allowed_domains:
                raise UploadError(f"{path.name} uses the custom operator domain "
                                  f"{node.domain!r} (operator {node.op_type})",
                                  hint="the service's operator must allow it with "
                                       "--allow-domain")
    # every tensor, subgraphs' and node attributes' too (a Constant's value may point at
    # external data like a weight)
    for t in graph_tensors(model.graph):
        if t.data_location == TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            init_bytes += _check_external(info, t.name, folder, path.name)
            external.add(info["location"])
        else:
            init_bytes += len(t.raw_data) + 4 * (len(t.float_data) + len(t.int32_data)) \
                + 8 * (len(t.int64_data) + len(t.double_data))
    for domain in opsets:
        if domain not in limits.allowed_domains:
            raise UploadError(f"{path.name} imports the custom operator domain {domain!r}",
                              hint="the service's operator must allow it with --allow-domain")
    if nodes > limits.max_nodes:
        raise UploadError(f"{path.name} has {nodes} nodes, over the limit of "
                          f"{limits.max_nodes}", status=413)
    if init_bytes > limits.max_initializer_bytes:
        raise UploadError(f"{path.name}'s weights take {init_bytes / 2**20:.0f} MB, over the "
                          f"limit of {limits.max_initializer_bytes / 2**20:.0f} MB", status=413)
    for p in folder.iterdir():
        if p.is_symlink():
            raise UploadError(f"{p.name} is a link")

    def shape(v: Any) -> list[Any]:
        return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in v.type.tensor_type.shape.dim]

    return OnnxSummary(nodes, opsets, [(v.name, shape(v)) for v in model.graph.input],
                       [(v.name, shape(v)) for v in model.graph.output], sorted(external),
                       path.stat().st_size)


def _check_external(info: dict[str, str], tensor: str, folder: Path, model: str) -> int:
    loc = info.get("location", "")
    where = f"{model}: weight {tensor[:60]!r} points at external data {loc[:120]!r}"
    if (not loc or loc.startswith(("/", "\\")) or ".." in loc.replace("\\", "/").split("/")
            or "/" in loc or "\\" in loc or "\0" in loc):
        raise UploadError(f"{where}: only a file uploaded beside the model is allowed",
                          hint="no paths: the external-data file must be uploaded with it")
    target = folder / loc
    if target.is_symlink() or not target.is_file():
        raise UploadError(f"{where}, which is not among the uploaded files",
                          hint="upload the external-data files with the model (`certify "
                               "submit` finds them beside it; --external-data PATH names "
                               "one kept elsewhere)")
    if target.resolve().parent != folder:
        raise UploadError(f"{where}, outside the upload")
    size = target.stat().st_size
    try:
        offset = int(info.get("offset", "0"))
        length = int(info["length"]) if "length" in info else size - offset
    except ValueError:
        raise UploadError(f"{where} with a malformed offset or length") from None
    if offset < 0 or length < 0 or offset + length > size:
        raise UploadError(f"{where} at bytes {offset}..{offset + length}, beyond its "
                          f"{size} bytes")
    return length


def check_npz(path: Path, limits: Limits) -> tuple[int, tuple[int, ...]]:
    """Check an uploaded .npz (x: images, y: labels) without unpickling or inflating it."""
    try:
        with zipfile.ZipFile(path) as z:
            headers = {}
            for info in z.infolist():
                with z.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    if version == (1, 0):
                        shp, _, dtype = np.lib.format.read_array_header_1_0(f)
                    else:
                        shp, _, dtype = np.lib.format.read_array_header_2_0(f)
                headers[info.filename.removesuffix(".npy")] = (tuple(shp), np.dtype(dtype))
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise UploadError(f"the dataset is not a readable .npz ({exc})",
                          hint="save it with np.savez(path, x=images, y=labels)") from None
    if "x" not in headers or "y" not in headers:
        raise UploadError("the dataset .npz lacks array 'x' or 'y'",
                          hint="save it with np.savez(path, x=images, y=labels)")
    if any(dt.hasobject for _, dt in headers.values()):
        raise UploadError("the dataset .npz holds Python objects (pickles), which the service "
                          "does not load", hint="save plain numeric arrays")
    nbytes = sum(int(np.prod(s)) * dt.itemsize for s, dt in headers.values())
    if nbytes > limits.max_dataset_array_bytes:
        raise UploadError(f"the dataset inflates to {nbytes / 2**20:.0f} MB, over the limit of "
                          f"{limits.max_dataset_array_bytes / 2**20:.0f} MB", status=413)
    (xs, xt), (ys, yt) = headers["x"], headers["y"]
    if len(xs) != 4 or len(ys) != 1 or xs[0] != ys[0]:
        raise UploadError(f"the dataset's x has shape {list(xs)} and y {list(ys)}",
                          hint="x must be [N, H, W, C] or [N, C, H, W] and y [N], same N")
    if not (xt == np.uint8 or np.issubdtype(xt, np.floating)):
        raise UploadError(f"the dataset's x has dtype {xt}", hint="uint8, or float in [0, 1]")
    if not np.issubdtype(yt, np.integer):
        raise UploadError(f"the dataset's y has dtype {yt}", hint="labels must be integers")
    return int(xs[0]), xs


def check_suite_yaml(text: bytes, limits: Limits) -> str:
    """Parse and validate an uploaded suite as ``certify run`` would; returns its name."""
    from certify.suite import parse_suite, read_suite_yaml

    if len(text) > limits.max_suite_bytes:
        raise UploadError(f"the suite is larger than {limits.max_suite_bytes // 1024} KB",
                          status=413)
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError:
        raise UploadError("the suite is not UTF-8 text") from None
    try:
        raw = read_suite_yaml(decoded, "uploaded suite")  # the CLI's bounds
        suite = parse_suite(raw, "uploaded suite")
    except CertifyError as exc:
        raise UploadError(exc.message, hint=exc.hint) from None
    if isinstance(raw, dict) and isinstance(raw.get("data"), dict) and raw["data"].get("path"):
        raise UploadError("the uploaded suite names a data path; the service takes the data "
                          "from the submission", hint="remove data.path; pass dataset")
    return str(suite.name)
