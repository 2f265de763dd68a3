"""Where a run's class names come from, for a suite that does not list them.

In order of precedence: ``--labels FILE`` (one name per line, in class-id order), the suite's
own ``classes`` list, the data (an image folder's subfolder names, sorted as torchvision's
``ImageFolder`` sorts them; an ``.npz`` file's ``class_names`` array), the model's metadata (an
ONNX ``metadata_props`` entry ``labels``, ``class_names``, ``classes`` or ``names``), and
otherwise the class ids themselves (``0``, ``1``, …). The number of classes is the model's
(its score vector's length); names of another count are refused, naming where they came from.

Folder names give names, not class ids: a folder is labelled by the position of its name among
the run's class names (so when the model's metadata names the same classes, its order wins and
the folders are matched by name), and by its sorted position only when the names come from the
folders themselves.
"""

from __future__ import annotations

import ast
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from certify.errors import DataError, SuiteError

if TYPE_CHECKING:
    pass

log = logging.getLogger("certify")

#: ONNX metadata keys that may hold the class names, in the order they are tried.
METADATA_KEYS = ("labels", "class_names", "classes", "names")
#: The longest labels file read (a name per line; ImageNet-21k's is under 1 MB).
MAX_LABELS_BYTES = 4 << 20
#: ``class_names_source`` when nothing named the classes.
FROM_IDS = "class ids (no names given: pass --labels FILE to name them)"


@dataclass(frozen=True)
class ClassNames:
    """A run's class names and where they came from (in words, for the card)."""

    names: tuple[str, ...]
    source: str


def read_labels(path: str | Path) -> list[str]:
    """Class names from a labels file: one per line in class-id order, UTF-8; blank lines at
    the end are ignored. Raises :class:`DataError` for a missing, empty or ambiguous file."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_LABELS_BYTES:
            raise DataError(f"labels file {path} is larger than {MAX_LABELS_BYTES >> 20} MB",
                            hint="one class name per line")
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise DataError(f"labels file not found: {path}", hint="check --labels") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read labels file {path}: {exc}",
                        hint="a UTF-8 text file with one class name per line") from None
    names = [line.strip() for line in text.splitlines()]
    while names and not names[-1]:
        names.pop()
    if not names:
        raise DataError(f"labels file {path} names no class", hint="one class name per line")
    empty = next((i for i, n in enumerate(names) if not n), None)
    if empty is not None:
        raise DataError(f"{path}:{empty + 1}: empty class name",
                        hint="one class name per line, in class-id order, no blank lines")
    _distinct(names, str(path))
    return names


def _distinct(names: Sequence[str], where: str) -> None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise DataError(f"{where} names the class {n!r} twice",
                            hint="class names must be distinct")
        seen.add(n)


def metadata_class_names(metadata: Mapping[str, str]) -> tuple[list[str], str] | None:
    """Class names from a model's metadata (ONNX ``metadata_props``), and the key they were
    under, or ``None``.

    A value may be a JSON or Python list of names, a mapping of class id to name (as
    Ultralytics writes ``names``), or names one per line or separated by commas.
    """
    for key in METADATA_KEYS:
        raw = metadata.get(key)
        if raw is None or not raw.strip():
            continue
        names = _parse_names(raw)
        if names:
            return names, key
    return None


def _parse_names(raw: str) -> list[str] | None:
    value: object = None
    try:
        value = json.loads(raw)
    except ValueError:
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            value = None
    if isinstance(value, dict):
        try:
            ordered = sorted((int(k), v) for k, v in value.items())
        except (TypeError, ValueError):
            return None
        if [k for k, _ in ordered] != list(range(len(ordered))):
            return None
        value = [v for _, v in ordered]
    if isinstance(value, list | tuple):
        names = [str(v).strip() for v in value]
    else:
        sep = "\n" if "\n" in raw.strip() else ","
        names = [n.strip() for n in raw.strip().split(sep)]
    if not names or not all(names) or len(set(names)) != len(names):
        return None
    return names


def data_class_names(path: str | None, layout: str = "auto") -> tuple[list[str], str] | None:
    """Class names the data itself gives, and their source in words, or ``None``: an image
    folder's named subfolders (sorted), or an ``.npz`` file's ``class_names`` array."""
    from certify.data.loaders import folder_class_names, npz_class_names

    if path is None:
        return None
    p = Path(path)
    if layout in ("auto", "npz") and p.is_file() and p.suffix == ".npz":
        names = npz_class_names(p)
        if names is not None:
            _distinct(names, f"{p.name} class_names")
            return names, f"the data ({p.name}'s class_names array)"
        return None
    if layout in ("auto", "folder") and p.is_dir() and not _gtsrb_folder(p):
        folders = folder_class_names(p)
        if folders is not None:
            return folders, "the data (its image-folder names, sorted)"
    return None


def _gtsrb_folder(p: Path) -> bool:
    return (p / "GT-final_test.csv").is_file() or (p / "Test.csv").is_file() \
        or len(list(p.glob("GT-*.csv"))) == 1


def preliminary_count(suite_count: int | None, labels: Sequence[str] | None,
                      data: tuple[list[str], str] | None) -> int | None:
    """The class count known before the model is loaded (what a labels-only model needs),
    or ``None``: from ``--labels``, the suite, else the data."""
    if labels is not None:
        return len(labels)
    if suite_count is not None:
        return suite_count
    return None if data is None else len(data[0])


def resolve_class_names(
    *,
    num_classes: int,
    suite_names: Sequence[str] = (),
    suite_source: str = "the suite",
    labels: Sequence[str] | None = None,
    labels_source: str = "--labels",
    data: tuple[list[str], str] | None = None,
    metadata: Mapping[str, str] | None = None,
) -> ClassNames:
    """The run's class names by the precedence in this module's docstring.

    ``num_classes`` is the model's class count. Names of another count are refused
    (:class:`SuiteError`, exit 2) naming their source, except names the data gives: when the
    data shows another number of classes (some folders of a larger set), the model's metadata
    may name the classes instead (the loader then matches the folders by name).
    """
    given: list[tuple[Sequence[str], str]] = []
    if labels is not None:
        given.append((labels, labels_source))
    if suite_names:
        given.append((suite_names, suite_source))
    for names, source in given:
        if len(names) != num_classes:
            raise SuiteError(f"the model outputs {num_classes} scores but {source} names "
                             f"{len(names)} classes",
                             hint="use the suite that matches the model's classes"
                             if source == suite_source else
                             "give one class name per model output, in class-id order")
        return ClassNames(tuple(names), source)
    from_meta = metadata_class_names(metadata or {})
    if from_meta is not None and data is not None and len(from_meta[0]) == num_classes \
            and set(data[0]) <= set(from_meta[0]):
        # the same names: the model's order is its class ids; the folders match by name
        return ClassNames(tuple(from_meta[0]), f"the model's metadata ({from_meta[1]!r}), "
                          "matching the data's folder names")
    if data is not None and len(data[0]) == num_classes:
        return ClassNames(tuple(data[0]), data[1])
    if from_meta is not None:
        names, key = from_meta
        if len(names) == num_classes:
            return ClassNames(tuple(names), f"the model's metadata ({key!r})")
    if data is not None:
        raise SuiteError(
            f"the model outputs {num_classes} scores but {data[1]} names {len(data[0])} "
            "classes, and nothing else names the model's classes",
            hint=f"pass --labels FILE with the model's {num_classes} class names (one per line, "
                 "in class-id order); the data's folders are then matched by name")
    return ClassNames(tuple(str(i) for i in range(num_classes)), FROM_IDS)
