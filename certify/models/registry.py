"""Which formats certify reads a model from, how each is recognised, and how it is loaded.

A format registers how it is recognised (a URL scheme, a suffix, the file's first bytes or the
members of its zip archive) and a loader. :func:`identify` names the format of a model argument
and :func:`load` loads it; everything else asks the format (is it an endpoint, may the service
take it as an upload) instead of testing strings. A file no format recognises is refused with
the list of formats certify reads; a pickled PyTorch checkpoint is recognised in order to be
refused, with how to save a loadable program instead (certify never unpickles a file).
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from certify.errors import ModelError

if TYPE_CHECKING:
    from certify.device import DeviceChoice
    from certify.models.base import Model, Preprocessing
    from certify.models.http import HttpOptions

#: How many leading bytes of a file recognition may look at.
HEAD_BYTES = 64
#: The first bytes of a legacy (pre-zip) ``torch.save`` file: a pickled magic number.
_LEGACY_TORCH_SAVE = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"


@dataclass(frozen=True)
class LoadRequest:
    """What every loader is given besides the model argument."""

    device: DeviceChoice
    preprocessing: Preprocessing | None = None
    input_size: tuple[int, int] | None = None
    num_classes: int | None = None
    http: HttpOptions | None = None
    threads: int = 0


@dataclass(frozen=True)
class Source:
    """A model argument as recognition sees it: the URL scheme (``""`` for a file), the
    lower-case suffix, the file's first bytes and, for a zip archive, its member names with
    the top folder cut (``None`` for anything else)."""

    spec: str
    scheme: str
    suffix: str
    head: bytes = b""
    members: frozenset[str] | None = None


@dataclass(frozen=True)
class ModelFormat:
    """One way certify reads a model."""

    #: short name (``onnx``, ``pt2``, ``torchscript``, ``http``, ...)
    name: str
    #: how the error listing the formats names it
    title: str
    recognise: Callable[[Source], bool]
    load: Callable[[str, LoadRequest], Model]
    #: a remote model (an inference API), not a file
    endpoint: bool = False
    #: ``certify serve`` accepts it as an upload
    uploadable: bool = False
    #: recognised only to be refused (its loader raises the reason)
    refused: bool = False


_FORMATS: list[ModelFormat] = []


def register(fmt: ModelFormat) -> ModelFormat:
    """Add a format; formats are tried in registration order (a later one with the same
    name replaces the earlier)."""
    _FORMATS[:] = [f for f in _FORMATS if f.name != fmt.name]
    _FORMATS.append(fmt)
    return fmt


def formats() -> list[ModelFormat]:
    """The registered formats, in the order they are tried."""
    return list(_FORMATS)


def source_of(spec: str) -> Source:
    """Read what recognition needs: a URL's scheme, or a file's suffix, head and members."""
    scheme, sep, _ = spec.partition("://")
    if sep and scheme.isalpha():
        return Source(spec, scheme.lower(), "")
    path = Path(spec)
    if path.is_dir():
        raise ModelError(f"{spec} is a directory, not a model file",
                         hint=f"pass a model file: {readable()}")
    if not path.is_file():
        raise ModelError(f"model file not found: {spec}", hint="check the MODEL path")
    try:
        with path.open("rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError as exc:
        raise ModelError(f"cannot read {spec}: {exc.strerror or exc}",
                         hint="check the file's permissions") from None
    members = None
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as z:
                members = frozenset(n.split("/", 1)[1] for n in z.namelist() if "/" in n)
        except Exception:  # noqa: BLE001 - any unreadable archive: recognised as nothing
            members = frozenset()
    return Source(spec, "", path.suffix.lower(), head, members)


def identify(spec: str) -> ModelFormat:
    """The format of ``spec``; :class:`ModelError` (listing what certify reads) when none
    recognises it."""
    src = source_of(spec)
    for fmt in _FORMATS:
        if fmt.recognise(src):
            return fmt
    what = f"a {src.scheme}:// URL" if src.scheme else f"{Path(spec).name}"
    raise ModelError(f"{what} is not a model format certify reads",
                     hint=f"certify reads {readable()}")


def is_endpoint(spec: str) -> bool:
    """Whether ``spec`` names a remote model (decided by the formats' URL schemes, without
    reading anything)."""
    scheme, sep, _ = spec.partition("://")
    if not (sep and scheme.isalpha()):
        return False
    src = Source(spec, scheme.lower(), "")
    return any(f.endpoint and f.recognise(src) for f in _FORMATS)


def readable() -> str:
    """The formats certify reads, in words (for errors and help)."""
    return "; ".join(f.title for f in _FORMATS if not f.refused)


def load(spec: str, request: LoadRequest) -> Model:
    """Load ``spec`` with the loader of its format."""
    return identify(spec).load(spec, request)


# -- the formats --------------------------------------------------------------------------------

def _http(spec: str, r: LoadRequest) -> Model:
    from certify.models.http import HttpModel

    return HttpModel(spec, r.device, r.preprocessing, input_size=r.input_size,
                     num_classes=r.num_classes, options=r.http)


def _grpc(spec: str, r: LoadRequest) -> Model:
    from certify.models.grpc_oip import GrpcModel

    return GrpcModel(spec, r.device, r.preprocessing, input_size=r.input_size,
                     num_classes=r.num_classes, options=r.http)


def _onnx(spec: str, r: LoadRequest) -> Model:
    from certify.models.onnx import OnnxModel

    return OnnxModel(Path(spec), r.device, r.preprocessing, input_size=r.input_size,
                     num_classes=r.num_classes, threads=r.threads)


def _pt2(spec: str, r: LoadRequest) -> Model:
    from certify.models.torchprog import load_pt2

    return load_pt2(Path(spec), r.device, r.preprocessing, r.input_size, r.num_classes)


def _torchscript(spec: str, r: LoadRequest) -> Model:
    from certify.models.torchprog import load_torchscript

    return load_torchscript(Path(spec), r.device, r.preprocessing, r.input_size,
                            r.num_classes)


def _refuse_pickle(spec: str, r: LoadRequest) -> Model:
    from certify.models.torchsafety import refuse

    raise refuse(Path(spec), "it is a pickle (a torch.save checkpoint: a state dict or a "
                             "pickled module), and unpickling can run any code, so certify "
                             "never unpickles it; a state dict holds weights without the "
                             "program that uses them")


def _looks_onnx(src: Source) -> bool:
    """An ONNX ModelProto starts with field 1 (``ir_version``, a small varint)."""
    return src.suffix == ".onnx" or (len(src.head) > 1 and src.head[0] == 0x08
                                     and 1 <= src.head[1] <= 32 and src.members is None)


def _pickle(src: Source) -> bool:
    if src.members is not None:  # a torch.save zip: a pickle and its storages, no code
        return "data.pkl" in src.members and not any(m.startswith("code/")
                                                       for m in src.members)
    return src.head.startswith(_LEGACY_TORCH_SAVE) or (len(src.head) > 1 and
                                                       src.head[0] == 0x80
                                                       and src.head[1] <= 5)


register(ModelFormat("http", "an inference API (http:// or https:// URL)",
                     lambda s: s.scheme in ("http", "https"), _http, endpoint=True))
register(ModelFormat("grpc", "an inference API over gRPC (grpc:// or grpcs:// URL, the Open "
                             "Inference Protocol)",
                     lambda s: s.scheme in ("grpc", "grpcs"), _grpc, endpoint=True))
# a file named .onnx is read as ONNX whatever it holds (the service takes .onnx uploads only)
register(ModelFormat("onnx", "an ONNX file (.onnx)", _looks_onnx, _onnx, uploadable=True))
register(ModelFormat("pt2", "a PyTorch exported program (.pt2, torch.export.save)",
                     lambda s: s.members is not None and "archive_format" in s.members,
                     _pt2))
register(ModelFormat("torchscript", "a TorchScript program (.pt/.pth, torch.jit.save)",
                     lambda s: s.members is not None and "constants.pkl" in s.members
                     and any(m.startswith("code/") for m in s.members), _torchscript))
register(ModelFormat("pickle", "a pickled checkpoint (torch.save)", _pickle, _refuse_pickle,
                     refused=True))

