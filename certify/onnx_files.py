"""An ONNX model's files, without loading it: the tensors its graph stores, the external-data
files it references, and its identity. Needs only ``onnx`` (no onnxruntime, no torch), so
``certify submit`` and the service's upload checks can read a model's files cheaply."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath

import onnx

from certify.errors import ModelError


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor stored in a graph: initializers (sparse ones too), the tensors of its
    nodes' attributes (a ``Constant``'s value) and those of subgraphs."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield from (attr.sparse_tensor.values, attr.sparse_tensor.indices)
            for sparse in attr.sparse_tensors:
                yield from (sparse.values, sparse.indices)
            if attr.HasField("g"):
                yield from graph_tensors(attr.g)
            for g in attr.graphs:
                yield from graph_tensors(g)


def external_data_files(path: str | Path) -> list[str]:
    """The external-data files an ONNX graph references, relative to its folder, sorted.

    Raises :class:`ModelError` for a location outside the model's folder (absolute, or with
    ``..``) and for a referenced file that is missing.
    """
    path = Path(path)
    locations = external_data_locations(path)
    for loc in locations:
        if not (path.parent / loc).is_file():
            raise ModelError(f"{path.name} references external data {loc!r}, which is missing "
                             f"from {path.parent}", hint="copy the weights file beside the model")
    return locations


def external_data_locations(path: str | Path) -> list[str]:
    """The external-data locations an ONNX graph references, relative to its folder, sorted,
    whether or not the files are there (:func:`external_data_files` checks that they are).

    Raises :class:`ModelError` for an unreadable graph and for a location outside the model's
    folder (absolute, or with ``..``).
    """
    path = Path(path)
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - any parse failure means a corrupt file
        raise ModelError(
            f"{path} is not a readable ONNX model ({type(exc).__name__})",
            hint="re-export the model, and check the file was not truncated",
        ) from exc
    locations: set[str] = set()
    for tensor in graph_tensors(proto.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        loc = next((e.value for e in tensor.external_data if e.key == "location"), "")
        rel = PurePosixPath(loc.replace("\\", "/"))
        if not loc or rel.is_absolute() or PureWindowsPath(loc).drive or ".." in rel.parts:
            raise ModelError(
                f"{path.name} references external data {loc!r} outside its folder",
                hint="save the weights beside the model with a relative location "
                     "(onnx.save_model(..., location='weights.bin'))",
            )
        locations.add(rel.as_posix())
    return sorted(locations)


def model_identity(path: str | Path) -> str:
    """The model's identity, ``sha256:<hex>``: what the card and ``--resume`` vouch for.

    For a self-contained file it is the file's sha256. A graph with external data gets the
    sha256 of a manifest listing the graph file's sha256 and each external-data file's
    (relative location and sha256), so changing any weight changes the identity.
    """
    path = Path(path)
    graph = sha256_file(path)
    files = external_data_files(path)
    if not files:
        return f"sha256:{graph}"
    manifest = "certify-onnx-manifest-v1\n" + f"{graph}  {path.name}\n" + "".join(
        f"{sha256_file(path.parent / loc)}  {loc}\n" for loc in files)
    return "sha256:" + hashlib.sha256(manifest.encode()).hexdigest()
