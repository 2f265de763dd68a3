"""``certify init``: probe a model's preprocessing on labelled samples and write a suite.

The written suite is the packaged generic ``image-classification`` suite with the preprocessing
that gave the best clean accuracy on a few class-stratified samples of the data
(:mod:`certify.probe`), the class names and, where the model does not state it, the input
size filled in, each with a comment that says where it came from. The user edits it (its
thresholds are defaults) and runs it with ``certify run``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from certify.data import DataSpec, load_dataset
from certify.data.classes import (
    FROM_IDS,
    ClassNames,
    data_class_names,
    preliminary_count,
    read_labels,
    resolve_class_names,
)
from certify.device import DeviceChoice, choose_device
from certify.errors import DataError, ModelError, UsageError
from certify.models import Model, ModelInfo, load_model
from certify.models.registry import is_endpoint
from certify.probe import (
    PROBE_SAMPLES,
    Candidate,
    ProbeReport,
    layouts_of,
    pct,
    probe_preprocessing,
)
from certify.progress import NullProgress, Progress
from certify.suite import parse_suite, read_suite_yaml, resolve_suite_path
from certify.version import __version__

if TYPE_CHECKING:
    from certify.models.http import HttpOptions

#: The packaged suite ``certify init`` starts from.
BASE_SUITE = "image-classification"
#: Retries of an endpoint's requests during ``certify init`` (a run's default is 5).
RETRIES = 1


@dataclass(frozen=True)
class InitOptions:
    """Everything ``certify init`` takes."""

    model: str
    data: str
    out: Path = Path("suite.yaml")
    labels: Path | None = None
    #: labelled samples to probe (class-stratified, seeded)
    samples: int = PROBE_SAMPLES
    input_size: tuple[int, int] | None = None
    device: str = "auto"
    http: HttpOptions | None = None
    seed: int = 0
    #: overwrite ``out`` when it exists
    force: bool = False


@dataclass(frozen=True)
class InitResult:
    """What ``certify init`` found and wrote."""

    report: ProbeReport
    chosen: Candidate
    path: Path
    text: str
    model: ModelInfo
    input_size: tuple[int, int]
    #: where the input size came from, in words
    input_size_source: str
    classes: ClassNames
    data_notes: list[str] = field(default_factory=list)

    def summary(self) -> list[str]:
        """Why this preprocessing, in sentences (for the terminal)."""
        lines = self.report.explanation()
        lines.append(f"layout {self.chosen.layout}, batch {self.model.batch}, input size "
                     f"{self.input_size[0]}×{self.input_size[1]} ({self.input_size_source})")
        lines.append(f"classes: {len(self.classes.names)} from {self.classes.source}")
        return lines + self.data_notes


def init_suite(opts: InitOptions, progress: Progress | None = None) -> InitResult:
    """Probe ``opts.model`` on ``opts.samples`` labelled samples of ``opts.data`` over the
    candidate preprocessings, and write the generic suite with the best one to ``opts.out``.

    Refused before any query: an existing ``out`` without ``force`` (:class:`UsageError`),
    missing data or labels (:class:`DataError`); an unreadable model or an unreachable
    endpoint is a :class:`ModelError` (exit 3).
    """
    progress = progress or NullProgress()
    out = Path(opts.out)
    if out.exists() and not opts.force:
        raise UsageError(f"{out} exists", hint="pass --force to overwrite it, or another --out")
    if out.parent != Path() and not out.parent.is_dir():
        raise UsageError(f"folder {out.parent} does not exist", hint="create it first")
    if opts.samples < 2:
        raise UsageError("--samples must be at least 2", hint=f"e.g. {PROBE_SAMPLES}")
    data_path = Path(opts.data)
    if not data_path.exists():
        raise DataError(f"data path not found: {data_path}", hint="check --data")
    labels = None if opts.labels is None else read_labels(opts.labels)
    data_names = data_class_names(str(data_path)) if labels is None else None
    device = choose_device(opts.device)
    model, size_source = _load(opts, device, preliminary_count(None, labels, data_names))
    try:
        info = model.info
        classes = resolve_class_names(
            num_classes=info.num_classes, labels=labels,
            labels_source=f"--labels {opts.labels.name}" if opts.labels else "--labels",
            data=data_names, metadata=info.metadata)
        size = (int(info.input_shape[1]), int(info.input_shape[2]))
        data = load_dataset(DataSpec(path=str(data_path), roi_crop=False,
                                     samples=opts.samples), size, classes.names,
                            seed=opts.seed, progress=progress)
        progress.start("probe preprocessing", 1)
        report = probe_preprocessing(model, data.x, data.y, info.num_classes,
                                     layouts=layouts_of(model))
        progress.advance(1)
        progress.finish()
    finally:
        close = getattr(model, "close", None)
        if close is not None:
            close()
    chosen = report.best.candidate
    text = render_suite(opts, report, info, classes, size, size_source)
    parse_suite(read_suite_yaml(text, str(out)), str(out))  # never write a suite that fails
    out.write_text(text, encoding="utf-8")
    return InitResult(report, chosen, out, text, info, size, size_source, classes,
                      list(data.extra.get("notes", [])))


def _load(opts: InitOptions, device: DeviceChoice, count: int | None) -> tuple[Model, str]:
    """The model, and where its input size came from: the model itself, ``--input-size``,
    or (when the model does not state it) the data's first image.

    An endpoint is retried at most :data:`RETRIES` times: ``init`` is interactive, and an
    unreachable URL is better said at once.
    """
    if is_endpoint(opts.model):
        from certify.models.http import HttpOptions

        http = opts.http or HttpOptions()
        opts = dataclasses.replace(opts, http=dataclasses.replace(
            http, retries=min(http.retries, RETRIES)))
    try:
        return _load_sized(opts, device, count)
    except ModelError as exc:
        if exc.hint and "--resume" in exc.hint:  # a run's hint: init keeps no records
            raise ModelError(exc.message, hint="check the URL and that the server is up") \
                from exc
        raise


def _load_sized(opts: InitOptions, device: DeviceChoice, count: int | None
                ) -> tuple[Model, str]:
    if opts.input_size is not None:
        return (load_model(opts.model, device, input_size=opts.input_size, num_classes=count,
                           http=opts.http), "--input-size")
    try:
        return (load_model(opts.model, device, num_classes=count, http=opts.http),
                "the model's input shape")
    except ModelError as exc:
        if "input_size" not in (exc.hint or ""):
            raise
    size = data_image_size(Path(opts.data))
    return (load_model(opts.model, device, input_size=size, num_classes=count, http=opts.http),
            "the data's images: the model does not state it")


def data_image_size(path: Path) -> tuple[int, int]:
    """``(H, W)`` of the data's first image (an image folder's or an ``.npz`` file's)."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    from certify.data.loaders import class_folders

    try:
        if path.is_file() and path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                shape = z["x"].shape
            hw = shape[1:3] if shape[-1] in (1, 3) else shape[2:4]
            return int(hw[0]), int(hw[1])
        if path.is_dir():
            for d in class_folders(path):
                for f in sorted(d.iterdir()):
                    if f.is_file() and not f.name.startswith("."):
                        try:
                            with Image.open(f) as im:
                                return int(im.size[1]), int(im.size[0])
                        except (UnidentifiedImageError, OSError):
                            continue
    except (OSError, KeyError, ValueError):
        pass
    raise DataError(f"cannot tell the image size of {path}, and the model does not state it",
                    hint="pass --input-size H W")


def render_suite(opts: InitOptions, report: ProbeReport, info: ModelInfo,
                 classes: ClassNames, size: tuple[int, int], size_source: str) -> str:
    """The generic suite's text with the probe's choice, the classes and the input size
    filled in (with comments saying where each came from)."""
    text = resolve_suite_path(BASE_SUITE).read_text(encoding="utf-8")
    best, second = report.best, report.runner_up
    pre = best.candidate.preprocessing
    model_name = Path(opts.model).name if not is_endpoint(opts.model) \
        else info.name
    fit = ("" if best.mean_loglik is None else
           f" and a mean log-probability of the labels of {best.mean_loglik:.3f} nats")
    why = [f"# Chosen by `certify init` on {best.n} labelled samples: {best.candidate.label()} "
           f"gave {pct(best.accuracy)} clean accuracy{fit}"]
    if second is not None and report.tie_broken_by_prior:
        why.append(f"# (the runner-up, {second.candidate.label()}, at {pct(second.accuracy)}, is "
                   f"not clearly worse: the prior for {report.prior_reason} decided).")
    elif second is not None:
        clear = "clearly" if report.clearly_better(best, second) else "NOT clearly"
        why.append(f"# ({clear} better than the runner-up, {second.candidate.label()}, at "
                   f"{pct(second.accuracy)}).")
    if report.near_chance(best):
        why.append("# WARNING: even the best is at chance level: check the labels and classes.")
    why.append(f"# Layout {best.candidate.layout} and batch '{info.batch}' are the model's;")
    why.append(f"# the input size {size[0]}x{size[1]} comes from {size_source}.")
    if best.candidate.layout != info.layout or _guessed(info, opts):
        why.append(f"# This endpoint publishes no layout: pass --input-layout "
                   f"{best.candidate.layout} to certify run.")
    block = [
        "# How the model wants its pixels: input = ((x * input_scale) - mean) / std, x in "
        "[0, 1] RGB.",
        *why,
        "preprocessing:",
        f"  input_scale: {_num(pre.input_scale)}",
        f"  mean: [{', '.join(_num(v) for v in pre.mean)}]",
        f"  std: [{', '.join(_num(v) for v in pre.std)}]",
        f"  channel_order: {pre.channel_order}",
    ]
    if size_source != "the model's input shape":
        block.append(f"  input_size: [{size[0]}, {size[1]}]")
    text = _replace_block(text, "preprocessing", "\n".join(block) + "\n")
    if classes.source == FROM_IDS:
        names = (f"# {len(classes.names)} classes (the model's outputs), named by their ids: "
                 "list their names here\n# (classes: [name, ...]) or pass --labels FILE.\n"
                 f"classes: {len(classes.names)}\n")
    else:
        dumped = yaml.safe_dump({"classes": list(classes.names)}, allow_unicode=True,
                                default_flow_style=False, sort_keys=False)
        names = f"# The model's {len(classes.names)} classes, from {classes.source}.\n{dumped}"
    text = text.replace("\nchecks:\n", f"\n{names}checks:\n", 1)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(model_name).stem).strip("-") or "model"
    text = re.sub(r"^name: .*$", f"name: {stem}-image-classification", text, count=1,
                  flags=re.M)
    header = (f"# Written by `certify init` (certify {__version__}) for {model_name} "
              "from the packaged\n# image-classification suite. Edit it: every threshold is a "
              "default. Then:\n#   certify run MODEL --suite THIS_FILE --data DATA --out "
              "RUN_FOLDER\n#\n")
    return header + text


def _guessed(info: ModelInfo, opts: InitOptions) -> bool:
    return info.metadata.get("protocol", "").startswith("v1") and (
        opts.http is None or opts.http.layout is None)


def _num(v: float) -> str:
    return str(int(v)) if float(v) == int(v) else f"{v:g}"


def _replace_block(text: str, key: str, new: str) -> str:
    """``text`` with the top-level ``key:`` block (and the comment lines right above it)
    replaced by ``new``."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{key}:"))
    end = start + 1
    while end < len(lines) and lines[end].startswith((" ", "\t")):
        end += 1
    while start > 0 and lines[start - 1].startswith("#"):
        start -= 1
    return "".join(lines[:start]) + new + "".join(lines[end:])
