"""Dataset loaders. Every bad input raises :class:`DataError` naming the path and the row."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from certify.errors import DataError

if TYPE_CHECKING:
    import torch

log = logging.getLogger("certify")

INTERPOLATIONS: dict[str, Image.Resampling] = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "area": Image.Resampling.BOX,
}
LAYOUTS = ("auto", "gtsrb-official", "gtsrb-csv", "folder", "npz")
_IMAGE_SUFFIXES = {".png", ".ppm", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
_OFFICIAL_COLUMNS = ["Filename", "Width", "Height", "Roi.X1", "Roi.Y1", "Roi.X2", "Roi.Y2",
                     "ClassId"]
_CSV_COLUMNS = ["Width", "Height", "Roi.X1", "Roi.Y1", "Roi.X2", "Roi.Y2", "ClassId", "Path"]


@dataclass(frozen=True)
class DataSpec:
    """Where the data is and how to turn it into model inputs (the suite's ``data`` block)."""

    path: str | None = None
    layout: str = "auto"
    roi_crop: bool = True
    interpolation: str = "bilinear"
    samples: int | None = None
    #: Skip this many samples of the seeded stratified order first: ``samples=N, offset=N``
    #: evaluates samples disjoint from ``samples=N`` (a held-out half for release comparisons).
    offset: int = 0


@dataclass
class Dataset:
    """Images ``x`` float32 ``[N, C, H, W]`` in ``[0, 1]``, labels ``y`` int64 ``[N]``."""

    x: torch.Tensor
    y: torch.Tensor
    ids: list[str]
    class_names: list[str]
    source: str
    layout: str
    #: Digest of the evaluated samples' content (:func:`from_arrays`): their pixels at the
    #: model's input size and labels, in order; what ``certify compare`` pairs runs on.
    digest: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: Digest of the whole source the samples were drawn from, by content
    #: (:class:`ContentDigest`): equal for two subsets of one dataset, and for the same images
    #: given as a file, a folder or arrays; the source's name and layout are recorded beside it.
    source_digest: str = ""
    #: How the samples were chosen from the source, in words.
    selection: str = ""
    #: The same two digests by the definition of certify before content digests (file bytes
    #: and the layout's name; the samples' ids), kept so that results written then compare.
    older_digests: dict[str, str] | None = None

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def describe(self) -> dict[str, Any]:
        """Plain-JSON summary for results.json."""
        import torch

        counts = torch.bincount(self.y, minlength=len(self.class_names)).tolist()
        return {
            "source": self.source,
            "layout": self.layout,
            "n": len(self),
            "digest": self.digest,
            "image_shape": list(self.x.shape[1:]),
            "num_classes": len(self.class_names),
            "class_names": list(self.class_names),
            "per_class_counts": counts,
            "source_digest": self.source_digest or self.digest,
            "selection": self.selection or f"all {len(self)} samples",
            "older_digests": self.older_digests,
            **self.extra,
        }


@dataclass(frozen=True)
class _Item:
    path: Path
    label: int
    roi: tuple[int, int, int, int] | None
    where: str  # "file:row" for error messages


class ContentDigest:
    """Digest of a data source by content, whatever holds it (an ``.npz``, a GTSRB layout or
    class folders, arrays from Python, an upload).

    It covers each sample in the source's order (an ``.npz``'s or the arrays' index order; a
    GTSRB CSV's row order; an image folder's sorted class subfolders, each's files sorted by
    name): its decoded pixels as RGB uint8 with their shape, after the annotated region's crop
    where one applies (``roi_crop`` on a GTSRB layout), and its label; then the preprocessing
    that changes pixels: the model's input size, and the interpolation when an image is
    resized to it. File names, formats, the layout and the source's name are not part of it.
    """

    TAG = b"certify.data-content/1\n"

    def __init__(self, input_size: tuple[int, int]) -> None:
        self.input_size = (int(input_size[0]), int(input_size[1]))
        self.resized = False
        self._h = hashlib.sha256(self.TAG)

    def add(self, pixels: np.ndarray, label: int) -> None:
        """One sample: uint8 ``[H, W, 3]`` pixels as decoded (before resizing) and its label."""
        h, w, c = pixels.shape
        self.resized |= (h, w) != self.input_size
        self._h.update(struct.pack("<4q", h, w, c, int(label)))
        self._h.update(np.ascontiguousarray(pixels, dtype=np.uint8).tobytes())

    def add_all(self, x: np.ndarray, y: np.ndarray) -> None:
        """Every sample of uint8 ``[N, H, W, 3]`` images with their ``[N]`` labels."""
        for img, label in zip(x, y, strict=True):
            self.add(img, int(label))

    def hexdigest(self, interpolation: str) -> str:
        """``sha256:…`` of the samples so far and the preprocessing."""
        h = self._h.copy()
        h.update(json.dumps({"input_size": list(self.input_size),
                             "interpolation": interpolation if self.resized else None},
                            sort_keys=True).encode())
        return f"sha256:{h.hexdigest()}"


def stratified_subset(labels: Sequence[int] | np.ndarray, n: int, seed: int,
                      offset: int = 0) -> np.ndarray:
    """Sorted indices of a seeded, class-stratified subset of size ``min(n, len(labels))``.

    Classes take turns in a seeded order, each contributing its next seeded-random member, so
    every class gets ``n // K`` or one more (while it has members left). The subsets of one
    seed are prefixes of one order: a smaller one lies inside a larger one, and ``offset``
    skips the order's first ``offset`` members (so ``offset=n`` gives ``n`` samples disjoint
    from the first ``n``; fewer when the source runs out).
    """
    labels = np.asarray(labels)
    if offset <= 0 and n >= len(labels):
        return np.arange(len(labels))
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5A3]))
    classes = np.unique(labels)
    pools = {int(c): list(rng.permutation(np.flatnonzero(labels == c))) for c in classes}
    order = [int(c) for c in rng.permutation(classes)]
    chosen: list[int] = []
    want = min(offset + n, len(labels))
    while len(chosen) < want:
        for c in order:
            if pools[c] and len(chosen) < want:
                chosen.append(int(pools[c].pop()))
    return np.sort(np.asarray(chosen[offset:], dtype=np.int64))


def _read_rows(path: Path, delimiter: str, columns: list[str]) -> list[tuple[int, dict[str, str]]]:
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f, delimiter=delimiter)
            header = next(reader, None)
            if header is None:
                raise DataError(f"{path} is empty", hint="expected a header row")
            header = [h.strip() for h in header]
            missing = [c for c in columns if c not in header]
            if missing:
                raise DataError(
                    f"{path}: header lacks column(s) {', '.join(missing)}",
                    hint=f"expected {delimiter.join(columns)}",
                )
            rows = []
            for lineno, row in enumerate(reader, start=2):
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != len(header):
                    raise DataError(
                        f"{path}:{lineno}: malformed row ({len(row)} fields, expected "
                        f"{len(header)})",
                        hint=f"each row needs the columns {delimiter.join(header)}",
                    )
                rows.append((lineno, dict(zip(header, (c.strip() for c in row), strict=True))))
            return rows
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not a UTF-8 text CSV", hint="check the file") from exc
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror}", hint="check the path") from exc


def _int(value: str, path: Path, lineno: int, column: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise DataError(
            f"{path}:{lineno}: column {column} is {value!r}, not an integer",
            hint="fix or remove the row",
        ) from None


def _gtsrb_items(csv_path: Path, official: bool) -> list[_Item]:
    delimiter, columns = (";", _OFFICIAL_COLUMNS) if official else (",", _CSV_COLUMNS)
    items = []
    for lineno, row in _read_rows(csv_path, delimiter, columns):
        label = _int(row["ClassId"], csv_path, lineno, "ClassId")
        x1, y1, x2, y2 = (
            _int(row[c], csv_path, lineno, c) for c in ("Roi.X1", "Roi.Y1", "Roi.X2", "Roi.Y2")
        )
        roi = (x1, y1, x2, y2)
        rel = row["Filename"] if official else row["Path"]
        if not rel:
            raise DataError(f"{csv_path}:{lineno}: empty image path", hint="fix or remove the row")
        items.append(_Item(csv_path.parent / rel, label, roi, f"{csv_path}:{lineno}"))
    return items


def class_folders(root: Path) -> list[Path]:
    """An image folder's class subfolders, sorted by name (hidden folders left out)."""
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def folder_class_names(root: Path) -> list[str] | None:
    """The class names an image folder's subfolders give (sorted, as torchvision's
    ``ImageFolder`` orders them), or ``None`` when every subfolder is an integer class id."""
    names = [d.name for d in class_folders(root)]
    if not names or all(_is_int(n) for n in names):
        return None
    return names


def _is_int(name: str) -> bool:
    try:
        int(name)
    except ValueError:
        return False
    return True


def _folder_labels(root: Path, subdirs: list[Path], class_names: Sequence[str]) -> list[int]:
    """The label of each class subfolder: its integer name, else its name's position in
    ``class_names``, else (as many folders as classes) its sorted position."""
    names = [d.name for d in subdirs]
    if all(_is_int(n) for n in names):
        return [int(n) for n in names]
    index = {n: i for i, n in enumerate(class_names)}
    if len(index) == len(class_names) and all(n in index for n in names):
        return [index[n] for n in names]
    if len(names) == len(class_names):
        log.warning("data: the subfolders of %s do not all match the class names; they are "
                    "labelled in sorted order (folder %r is class 0 %r)", root, names[0],
                    class_names[0])
        return list(range(len(names)))
    missing = next(n for n in names if n not in index)
    raise DataError(
        f"{root}: subfolder {missing!r} is not one of the {len(class_names)} class names, and "
        f"the folder has {len(names)} class subfolders, not {len(class_names)}",
        hint="name each subfolder after its class (as --labels, the suite or the model names "
             "them), or by its integer class id",
    )


def _folder_items(root: Path, class_names: Sequence[str]) -> tuple[list[_Item], list[str]]:
    """The images of an image folder, and the files in its class subfolders that are not
    images (skipped; relative paths)."""
    items = []
    skipped: list[str] = []
    subdirs = class_folders(root)
    for d, label in zip(subdirs, _folder_labels(root, subdirs, class_names), strict=True):
        for f in sorted(d.iterdir()):
            if f.is_file() and f.suffix.lower() in _IMAGE_SUFFIXES \
                    and not f.name.startswith("."):
                items.append(_Item(f, label, None, str(f)))
            else:
                skipped.append(f"{d.name}/{f.name}")
    return items, skipped


def _detect_layout(path: Path) -> tuple[str, Path]:
    if path.is_file():
        if path.suffix == ".npz":
            return "npz", path
        if path.suffix.lower() == ".csv":
            with path.open(encoding="utf-8-sig", errors="replace") as f:
                header = f.readline()
            return ("gtsrb-official" if ";" in header else "gtsrb-csv"), path
        raise DataError(f"cannot tell the data layout of {path}", hint="pass a folder, CSV or .npz")
    if (path / "GT-final_test.csv").is_file():
        return "gtsrb-official", path / "GT-final_test.csv"
    if (path / "Test.csv").is_file():
        return "gtsrb-csv", path / "Test.csv"
    csvs = sorted(path.glob("GT-*.csv"))
    if len(csvs) == 1:
        return "gtsrb-official", csvs[0]
    if any(p.is_dir() for p in path.iterdir()):
        return "folder", path
    raise DataError(
        f"cannot tell the data layout of {path}",
        hint="expected GT-final_test.csv, Test.csv, one subfolder per class id, or an .npz file",
    )


def _read_image(item: _Item, roi_crop: bool) -> tuple[bytes, Image.Image]:
    """The image file's bytes, and its image decoded as RGB and cropped to its annotated region
    when ``roi_crop`` (a region that leaves nothing is not applied)."""
    try:
        body = item.path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{item.where}: image not found: {item.path}",
                        hint="check the path") from None
    except OSError as exc:
        raise DataError(f"{item.where}: cannot read {item.path}: {exc.strerror or exc}",
                        hint="check the file's permissions") from None
    try:
        with Image.open(io.BytesIO(body)) as raw:
            im = raw.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DataError(
            f"{item.where}: unreadable image {item.path} ({type(exc).__name__})",
            hint="replace or remove the file",
        ) from None
    if roi_crop and item.roi is not None:
        x1, y1, x2, y2 = item.roi
        w, h = im.size
        box = (max(0, x1), max(0, y1), min(w, x2 + 1), min(h, y2 + 1))
        if box[2] > box[0] and box[3] > box[1]:
            im = im.crop(box)
    return body, im


def _fit(im: Image.Image, size: tuple[int, int], resample: Any) -> np.ndarray:
    """``im`` as uint8 ``[H, W, 3]`` at ``size`` (H, W)."""
    if im.size != (size[1], size[0]):
        im = im.resize((size[1], size[0]), resample)
    return np.asarray(im, dtype=np.uint8)


def npz_class_names(path: Path) -> list[str] | None:
    """The ``class_names`` array of an ``.npz`` file (strings, in class-id order), or ``None``
    when it has none."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if "class_names" not in z:
                return None
            names = z["class_names"]
    except (OSError, ValueError) as exc:
        raise DataError(f"{path} is not a readable .npz ({exc})", hint="check the file") from None
    if names.ndim != 1 or names.dtype.kind not in "US" or not len(names):
        raise DataError(f"{path}: class_names must be a 1-D array of strings",
                        hint="save with np.savez(..., class_names=np.array(['cat', 'dog']))")
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names.tolist()]


def _load_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            if "x" not in z or "y" not in z:
                raise DataError(f"{path} lacks array 'x' or 'y'", hint="save with np.savez(x=, y=)")
            x, y = z["x"], z["y"]
    except (OSError, ValueError) as exc:
        raise DataError(f"{path} is not a readable .npz ({exc})", hint="check the file") from None
    if x.ndim != 4 or len(x) != len(y) or y.ndim != 1:
        raise DataError(
            f"{path}: x has shape {list(x.shape)} and y {list(y.shape)}",
            hint="x must be [N, H, W, C] or [N, C, H, W] and y [N] with the same N",
        )
    if x.shape[1] in (1, 3) and x.shape[3] not in (1, 3):
        x = x.transpose(0, 2, 3, 1)
    if np.issubdtype(x.dtype, np.floating):
        if x.size and (x.min() < 0 or x.max() > 1):
            raise DataError(f"{path}: float images must lie in [0, 1]", hint="or save uint8")
        x = np.rint(x * 255).astype(np.uint8)
    elif x.dtype != np.uint8:
        raise DataError(f"{path}: x has dtype {x.dtype}", hint="use uint8 or float in [0, 1]")
    if x.shape[3] == 1:
        x = np.repeat(x, 3, axis=3)
    if not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{path}: y has dtype {y.dtype}", hint="labels must be integers")
    return x, y.astype(np.int64)


def load_dataset(
    spec: DataSpec,
    input_size: tuple[int, int],
    class_names: Sequence[str],
    seed: int = 0,
    progress: Any = None,
) -> Dataset:
    """Load, check, subsample and resize a dataset to ``input_size`` (H, W).

    What changed the data on the way is logged (one line each) and recorded in
    ``Dataset.extra`` (the measurement's data section): ``resized`` (images brought to the
    model's input size), ``sample_cap`` (more samples asked for than the data has) and
    ``skipped`` (files of an image folder that are not images). An unreadable image is an
    error, not a skip.
    """
    if spec.path is None:
        raise DataError("no data given", hint="pass --data PATH or set data.path in the suite")
    path = Path(spec.path)
    if not path.exists():
        raise DataError(f"data path not found: {path}", hint="check --data")
    if spec.layout not in LAYOUTS:
        raise DataError(f"unknown data layout {spec.layout!r}", hint=f"use one of {LAYOUTS}")
    if spec.interpolation not in INTERPOLATIONS:
        raise DataError(
            f"unknown interpolation {spec.interpolation!r}",
            hint=f"use one of {', '.join(INTERPOLATIONS)}",
        )
    resample = INTERPOLATIONS[spec.interpolation]
    layout, target = _detect_layout(path) if spec.layout == "auto" else (spec.layout, path)
    if layout in ("gtsrb-official", "gtsrb-csv") and target.is_dir():
        target = target / ("GT-final_test.csv" if layout == "gtsrb-official" else "Test.csv")
    k = len(class_names)
    skipped: list[str] = []

    if layout == "npz":
        x, y, ids, sizes, (source, older_source), total = _array_source(
            *_load_npz(target), target.name, spec, input_size, k, seed)
    else:
        if layout == "folder":
            items, skipped = _folder_items(target, class_names)
        else:
            items = _gtsrb_items(target, layout == "gtsrb-official")
        for it in items:
            if not 0 <= it.label < k:
                raise DataError(
                    f"{it.where}: label {it.label} is outside 0..{k - 1}",
                    hint="the suite names the classes; labels must index them",
                )
        total = len(items)
        idx = _subset(np.array([it.label for it in items], dtype=np.int64), spec, seed)
        chosen = [items[i] for i in idx]
        wanted = set(idx.tolist())
        # every image of the source is decoded once: its pixels make the source's digest,
        # and the chosen samples' are kept (the progress counts every image read)
        content = ContentDigest(input_size)
        older = hashlib.sha256()
        if progress is not None:
            progress.start("load data", total)
        arrays = []
        sizes = []
        for i, it in enumerate(items):
            body, im = _read_image(it, spec.roi_crop)
            older.update(hashlib.sha256(body).digest())
            older.update(json.dumps([it.label, it.roi]).encode())
            content.add(np.asarray(im, dtype=np.uint8), it.label)
            if i in wanted:
                arrays.append(_fit(im, input_size, resample))
                sizes.append((im.size[1], im.size[0]))
            if progress is not None:
                progress.advance(1)
        if progress is not None:
            progress.finish()
        source, older_source = content.hexdigest(spec.interpolation), older.hexdigest()
        x = np.stack(arrays) if arrays else np.zeros((0, *input_size, 3), np.uint8)
        y = np.array([it.label for it in chosen], dtype=np.int64)
        root = target.parent if layout != "folder" else target
        ids = [str(it.path.relative_to(root)) if it.path.is_relative_to(root) else str(it.path)
               for it in chosen]
    if len(y) == 0:
        raise DataError(f"no samples found in {path}", hint="check the data path and layout")
    data = from_arrays(x, y, ids, class_names, str(path), layout)
    data.source_digest = source
    data.older_digests = _older_digests(
        x, y, ids, [older_source, layout, list(input_size), spec.interpolation, spec.roi_crop])
    data.selection = _selection(spec, seed, len(y), total)
    data.extra.update(_changes(spec, layout, input_size, sizes, total, skipped, path.name))
    return data


def _array_source(x_all: np.ndarray, y_all: np.ndarray, name: str, spec: DataSpec,
                  input_size: tuple[int, int], k: int, seed: int
                  ) -> tuple[np.ndarray, np.ndarray, list[str], list[tuple[int, ...]],
                             tuple[str, str], int]:
    """Resize, check and subsample uint8 ``[N, H, W, 3]`` images with their labels: (x, y,
    ids, original sizes, the whole source's digests (by content, and certify's older one of
    the resized arrays), its size)."""
    resample = INTERPOLATIONS[spec.interpolation]
    bad = np.flatnonzero((y_all < 0) | (y_all >= k))
    if len(bad):
        raise DataError(
            f"{name}: label {int(y_all[bad[0]])} at index {int(bad[0])} "
            f"is outside 0..{k - 1}",
            hint="the suite names the classes; labels must index them",
        )
    content = ContentDigest(input_size)
    content.add_all(x_all, y_all)
    was = [tuple(int(v) for v in x_all.shape[1:3])] * len(y_all)
    x_all = _resize_all(x_all, input_size, resample)
    ids_all = [f"{name}[{i}]" for i in range(len(y_all))]
    older = hashlib.sha256()
    older.update(np.ascontiguousarray(x_all, dtype=np.uint8).tobytes())
    older.update(np.ascontiguousarray(y_all, dtype=np.int64).tobytes())
    sources, total = (content.hexdigest(spec.interpolation), older.hexdigest()), len(y_all)
    idx = _subset(y_all, spec, seed)
    return (x_all[idx], y_all[idx], [ids_all[i] for i in idx], [was[i] for i in idx], sources,
            total)


def _older_digests(x: np.ndarray, y: np.ndarray, ids: Sequence[str],
                   prep: list[Any]) -> dict[str, str]:
    """The evaluated samples' and the source's digests as certify computed them before content
    digests: the samples with their ids, and the source's digest (its files' bytes, or its
    resized arrays) with ``prep``, the layout's name and preprocessing. Only results written
    then are compared by them."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(x, dtype=np.uint8).tobytes())
    h.update(np.ascontiguousarray(y, dtype=np.int64).tobytes())
    h.update("\n".join(ids).encode())
    source = hashlib.sha256(json.dumps(prep).encode())
    return {"digest": f"sha256:{h.hexdigest()}", "source_digest": f"sha256:{source.hexdigest()}"}


def images_from_python(images: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """Images and labels given in Python (numpy arrays or tensors) as uint8 ``[N, H, W, 3]``
    and int64 ``[N]``: ``images`` is ``N×H×W×C`` uint8 or ``N×C×H×W`` float in ``[0, 1]``
    (C = 1 or 3; float images are rounded to 8 bits, as an ``.npz`` of floats is). Anything
    else is refused with a :class:`DataError` that says what was given."""
    x = _as_array(images, "images")
    y = _as_array(labels, "labels")
    if x.ndim != 4:
        raise DataError(f"images have shape {list(x.shape)}, not a batch of images",
                        hint="give N×H×W×C uint8 or N×C×H×W float in [0, 1]")
    if y.ndim != 1 or len(y) != len(x):
        raise DataError(f"labels have shape {list(y.shape)} for {len(x)} images",
                        hint="give one integer label per image")
    if not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"labels have dtype {y.dtype}", hint="labels must be integers")
    if x.dtype == np.uint8:
        if x.shape[3] not in (1, 3):
            raise DataError(f"uint8 images have shape {list(x.shape)}: N×H×W×C with C = 1 "
                            "or 3 is expected", hint="float images are N×C×H×W in [0, 1]")
    elif np.issubdtype(x.dtype, np.floating):
        if x.shape[1] not in (1, 3):
            raise DataError(f"float images have shape {list(x.shape)}: N×C×H×W with C = 1 "
                            "or 3 is expected", hint="uint8 images are N×H×W×C")
        if x.size and not (np.isfinite(x).all() and x.min() >= 0 and x.max() <= 1):
            raise DataError("float images must lie in [0, 1]", hint="or give uint8 images")
        x = np.rint(x.transpose(0, 2, 3, 1) * 255).astype(np.uint8)
    else:
        raise DataError(f"images have dtype {x.dtype}",
                        hint="give N×H×W×C uint8 or N×C×H×W float in [0, 1]")
    if x.shape[3] == 1:
        x = np.repeat(x, 3, axis=3)
    if not len(y):
        raise DataError("no images given", hint="give at least one image per class tested")
    return np.ascontiguousarray(x), y.astype(np.int64)


def _as_array(value: Any, what: str) -> np.ndarray:
    import torch

    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return (value.float() if value.dtype in (torch.bfloat16, torch.float16)
                else value).numpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{what} are not an array ({type(value).__name__})",
                        hint="give numpy arrays or tensors") from exc


def load_arrays(x_all: np.ndarray, y_all: np.ndarray, spec: DataSpec,
                input_size: tuple[int, int], class_names: Sequence[str], seed: int = 0,
                name: str = "arrays") -> Dataset:
    """:func:`load_dataset` for images already in memory (:func:`images_from_python`):
    resized, checked and subsampled the same way as an ``.npz`` file's."""
    x, y, ids, sizes, (source, older_source), total = _array_source(
        x_all, y_all, name, spec, input_size, len(class_names), seed)
    data = from_arrays(x, y, ids, class_names, name, "arrays")
    data.source_digest = source
    data.older_digests = _older_digests(
        x, y, ids, [older_source, "arrays", list(input_size), spec.interpolation])
    data.selection = _selection(spec, seed, len(y), total)
    data.extra.update(_changes(spec, "arrays", input_size, sizes, total, [], name))
    return data


def _resize_all(x: np.ndarray, size: tuple[int, int], resample: Any) -> np.ndarray:
    if x.shape[1:3] == size or not len(x):
        return x
    return np.stack([np.asarray(Image.fromarray(im).resize((size[1], size[0]), resample))
                     for im in x])


def _changes(spec: DataSpec, layout: str, input_size: tuple[int, int],
             sizes: Sequence[tuple[int, ...]],
             total: int, skipped: Sequence[str], name: str) -> dict[str, Any]:
    """What loading did to the data beyond reading it, logged once each and recorded for the
    card: ``resized``, ``sample_cap`` and ``skipped`` (``None`` when it did not happen), and
    ``notes``, the same in sentences."""
    h, w = input_size
    notes: list[str] = []
    resized = None
    moved = Counter(s for s in sizes if tuple(s) != (h, w))
    if moved:
        count = sum(moved.values())
        common = [[int(a), int(b)] for (a, b), _ in moved.most_common(3)]
        resized = {"count": count, "of": len(sizes), "to": [h, w], "from": common,
                   "distinct_sizes": len(moved), "interpolation": spec.interpolation}
        shown = ", ".join(f"{a}×{b}" for a, b in common)
        more = f" and {len(moved) - 3} other sizes" if len(moved) > 3 else ""
        crop = " after cropping to the annotated sign region" if spec.roi_crop \
            and layout in ("gtsrb-official", "gtsrb-csv") else ""
        notes.append(f"{count} of {len(sizes)} images were resized from {shown}{more} to "
                     f"{h}×{w} ({spec.interpolation}){crop} to fit the model's input.")
    cap = None
    available = max(0, total - spec.offset)
    if spec.samples is not None and spec.samples > len(sizes):
        cap = {"requested": spec.samples, "available": available, "used": len(sizes)}
        after = f" after skipping {spec.offset}" if spec.offset else ""
        notes.append(f"{spec.samples} samples were asked for (--samples or the suite's "
                     f"data.samples) but the data has {available}{after}: the run used "
                     f"{len(sizes)}.")
    skip = None
    if skipped:
        skip = {"count": len(skipped), "reason": "not an image file", "examples":
                list(skipped[:5])}
        notes.append(f"{len(skipped)} file(s) in the image folder are not images and were "
                     f"skipped (e.g. {', '.join(skipped[:3])}).")
    for line in notes:
        log.info("data %s: %s", name, line)
    return {"resized": resized, "sample_cap": cap, "skipped": skip, "notes": notes}


def _subset(labels: np.ndarray, spec: DataSpec, seed: int) -> np.ndarray:
    if spec.samples is not None and spec.samples <= 0:
        raise DataError(f"--samples must be positive, got {spec.samples}",
                        hint="e.g. --samples 430")
    if spec.offset < 0:
        raise DataError(f"--sample-offset must be >= 0, got {spec.offset}")
    if spec.offset >= len(labels) > 0:
        raise DataError(f"--sample-offset {spec.offset} skips all {len(labels)} samples",
                        hint=f"use an offset below {len(labels)}")
    if spec.samples is None and spec.offset == 0:
        return np.arange(len(labels))
    n = len(labels) if spec.samples is None else spec.samples
    return stratified_subset(labels, n, seed, offset=spec.offset)


def _selection(spec: DataSpec, seed: int, n: int, total: int) -> str:
    """The sample selection in words, for the card and for ``certify compare``."""
    if n == total:
        return f"all {total} samples"
    skip = f" after skipping the first {spec.offset}" if spec.offset else ""
    return (f"{n} of {total} samples, class-stratified in a seeded order (seed {seed}){skip}")


def from_arrays(
    x: np.ndarray,
    y: np.ndarray,
    ids: Sequence[str],
    class_names: Sequence[str],
    source: str,
    layout: str,
) -> Dataset:
    """Build a :class:`Dataset` from uint8 ``[N, H, W, 3]`` images; computes the digest of
    their content (shape, pixels and labels, in order; the ids and the source's name are
    not part of it, so the same samples from a file or from Python have one digest)."""
    import torch

    h = hashlib.sha256(b"certify.data-samples/1\n")
    h.update(struct.pack("<4q", *np.shape(x)))
    h.update(np.ascontiguousarray(x, dtype=np.uint8).tobytes())
    h.update(np.ascontiguousarray(y, dtype=np.int64).tobytes())
    tx = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).float().div_(255.0)
    return Dataset(
        x=tx,
        y=torch.from_numpy(np.asarray(y, dtype=np.int64)),
        ids=list(ids),
        class_names=list(class_names),
        source=source,
        layout=layout,
        digest=f"sha256:{h.hexdigest()}",
    )
