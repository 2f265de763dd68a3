"""Suites: YAML files that say what to test, on which data, and what passes.

A suite is data only. ``load_suite`` accepts a packaged suite name (``gtsrb``) or a path, and
validates everything before any model query: unknown keys and unknown check kinds are errors that
name the valid ones.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib.resources
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import yaml

from certify.checks import CHECKS, Check, attack_of
from certify.data import INTERPOLATIONS, DataSpec
from certify.data.classes import resolve_class_names
from certify.data.loaders import LAYOUTS
from certify.errors import SuiteError
from certify.models.base import ModelInfo, Preprocessing
from certify.norms import Norm
from certify.params import REQUIRED, Param, Params
from certify.results import DEFAULT_RELEASE_TOLERANCE, DecisionRule
from certify.validation import plain_data, plain_keys

#: The decision rules' names (:data:`certify.results.DecisionRule`).
DECISION_RULES: tuple[str, ...] = get_args(DecisionRule)

#: The largest seed (what every random generator certify seeds accepts).
MAX_SEED = 2**63 - 1

# Every key of a suite file, by section: its type, default, range and meaning. The suite's
# validation reads them (unknown keys, types, one-key ranges and choices) and the suite
# reference is generated from them; check params follow each kind's own declaration.
TOP_PARAMS = Params(
    Param("name", str, REQUIRED, "the suite's name"),
    Param("description", str, "", "what the suite evaluates, in words; the card shows it"),
    Param("version", int | float | str, None,
          "the suite's own version, recorded with the results"),
    Param("seed", int, 0,
          "the seed every random draw derives from, with the check id and the sample "
          "(`--seed` overrides it)", low=0, high=MAX_SEED),
    Param("classes", list[str] | int, None,
          "the class names in class-id order, or their number; unset: from `--labels`, the "
          "data (folder names, an npz `class_names`), the model's metadata, else class ids"),
    Param("flip_invariant_classes", list[int], [],
          "the classes a horizontal flip does not change (the flip property tests only "
          "these)"),
    Param("data", dict[Any, Any] | None, None, "where the data is and how it is read (below)"),
    Param("preprocessing", dict[Any, Any] | None, None,
          "what the model expects (below); `certify init` probes it"),
    Param("checks", list[dict[Any, Any]], REQUIRED, "the checks, in the card's order (below)"),
    Param("decision", DecisionRule, "interval",
          "how thresholds decide: `interval` (the metric's 95% interval) or `point` (its "
          "point estimate)"),
    Param("release_tolerance", float, DEFAULT_RELEASE_TOLERANCE,
          "the largest drop `certify compare` accepts per gating row when no `--tolerance` "
          "is given, in percentage points for rates", low=0, high=100),
)
DATA_PARAMS = Params(
    Param("path", str | None, None, "the data, when `--data` does not give it"),
    Param("layout", str, "auto", "how to read the data (`auto`: from what the path holds)",
          choices=LAYOUTS),
    Param("roi_crop", bool, True, "crop GTSRB images to their region of interest"),
    Param("interpolation", str, "bilinear", "how images are resized to the model's input",
          choices=tuple(INTERPOLATIONS)),
    Param("samples", int | None, None,
          "how many samples to evaluate (a seeded, class-stratified subset; `--samples` "
          "overrides it); unset: all", low=1),
)
PRE_PARAMS = Params(
    Param("input_scale", float, 1.0, "the value of a white pixel the model expects (1 or 255)"),
    Param("mean", float | list[float], 0.0,
          "per-channel mean subtracted after scaling (one value or three)"),
    Param("std", float | list[float], 1.0,
          "per-channel standard deviation divided by (one value or three, none 0)"),
    Param("channel_order", str, "RGB",
          "the order of the model's input channels: RGB, or BGR for a model trained on "
          "OpenCV-loaded images", choices=("RGB", "BGR")),
    Param("input_size", list[int] | None, None,
          "[H, W] the images are resized to, where the model does not state it"),
)
CHECK_PARAMS = Params(
    Param("id", str, None,
          "the row's name on the card, unique in the suite (the kind when unset); the seeds "
          "of its draws derive from it"),
    Param("kind", str, REQUIRED, "the check kind (below)"),
    Param("params", dict | None, None, "the kind's parameters (below)"),
    Param("threshold", dict | None, None,
          "`{metric, min, max}`: the metric (the kind's first thresholdable metric when "
          "unset) and at least one bound; no threshold makes the row information"),
    Param("budget", int | None, None, "the most model queries the check may spend in a run",
          low=1),
    Param("samples", int | None, None,
          "how many of the run's samples the check evaluates (the first of one seeded, "
          "class-stratified order shared by all checks)", low=1),
    Param("decision", DecisionRule, None,
          "this check's own decision rule (`interval` or `point`); unset: the suite's"),
)
THRESHOLD_PARAMS = Params(
    Param("metric", str, None,
          "one of the kind's metrics marked *threshold* (the first of them when unset)"),
    Param("min", float, None, "PASS needs the metric at or above it"),
    Param("max", float, None, "PASS needs the metric at or below it"),
)
#: The sections of a suite file (``""``: the top level), as the suite reference lists them.
SECTIONS: dict[str, Params] = {"": TOP_PARAMS, "data": DATA_PARAMS,
                               "preprocessing": PRE_PARAMS, "checks": CHECK_PARAMS,
                               "threshold": THRESHOLD_PARAMS}


@dataclass(frozen=True)
class Threshold:
    """Pass condition on one metric: ``min <= value`` and/or ``value <= max``."""

    metric: str
    min: float | None = None
    max: float | None = None

    def passes(self, value: float) -> bool:
        """Whether ``value`` meets the threshold; NaN and infinities never do."""
        if not math.isfinite(value):
            return False
        if self.min is not None and value < self.min:
            return False
        return not (self.max is not None and value > self.max)

    def describe(self) -> str:
        """Human form, e.g. ``accuracy >= 0.9``."""
        parts = []
        if self.min is not None:
            parts.append(f"{self.metric} ≥ {self.min:g}")
        if self.max is not None:
            parts.append(f"{self.metric} ≤ {self.max:g}")
        return " and ".join(parts)


@dataclass(frozen=True)
class CheckSpec:
    """One entry of the suite's ``checks`` list."""

    id: str
    kind: str
    check: Check[Any]
    threshold: Threshold | None = None
    budget: int | None = None
    samples: int | None = None
    #: How the threshold decides (:data:`DecisionRule`): the check's own, else the suite's.
    decision: str = "interval"


#: Where a suite's class names came from when the suite lists them itself.
FROM_SUITE = "the suite's classes list"


@dataclass(frozen=True)
class Suite:
    """A validated suite; ``digest`` is the sha256 of its canonical JSON form.

    ``classes`` is empty for a suite that does not list its classes (the generic
    ``image-classification`` suite, or ``classes: K``): the run resolves them
    (:func:`certify.data.classes.resolve_class_names`: ``--labels``, the data's folder names or
    ``class_names`` array, the model's metadata, else class ids) and continues with
    :meth:`with_classes`. ``class_count`` is the count a suite states (``classes: 10``) or the
    length of its list; ``None`` when the model's output decides it.
    """

    name: str
    source: str
    digest: str
    seed: int
    classes: tuple[str, ...]
    data: DataSpec
    preprocessing: Preprocessing
    input_size: tuple[int, int] | None
    checks: tuple[CheckSpec, ...]
    flip_invariant_classes: frozenset[int] = frozenset()
    description: str = ""
    #: The suite's decision rule (:data:`DecisionRule`); checks may override it.
    decision: str = "interval"
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    class_count: int | None = None
    #: Where ``classes`` came from, in words (:data:`FROM_SUITE` for a listed suite).
    classes_source: str = FROM_SUITE
    #: The largest drop a release may take per gating row in ``certify compare``: percentage
    #: points for rates, percent of the old value for scores (``release_tolerance``).
    release_tolerance: float = DEFAULT_RELEASE_TOLERANCE

    def with_classes(self, names: Sequence[str], source: str) -> Suite:
        """This suite with its class names resolved (``source`` says where they came from).

        Refused (:class:`SuiteError`) when the suite states another count than ``names``
        has, or a flip-invariant class id outside them.
        """
        k = len(names)
        if self.class_count is not None and self.class_count != k:
            raise SuiteError(f"suite {self.name!r} has {self.class_count} classes but {source} "
                             f"names {k}",
                             hint="make the class names and the suite's classes agree")
        bad = sorted(c for c in self.flip_invariant_classes if c >= k)
        if bad:
            raise SuiteError(f"suite {self.name!r}: flip_invariant_classes {bad} are not class "
                             f"ids of the {k} classes", hint=f"integers in 0..{k - 1}")
        return dataclasses.replace(self, classes=tuple(names), class_count=k,
                                   classes_source=source)

    def every_sample(self) -> Suite:
        """This suite with no sample limit anywhere (``--samples all``): the data's
        ``samples`` and each check's are dropped, so every check evaluates every sample of the
        data (an attack: every correctly classified one). The digest is the changed suite's,
        so the card and ``--resume`` tell the two apart."""
        raw = copy.deepcopy(self.raw)
        if isinstance(raw.get("data"), dict):
            raw["data"].pop("samples", None)
        for c in raw.get("checks", []):
            if isinstance(c, dict):
                c.pop("samples", None)
        suite = self._rehashed(raw)
        return dataclasses.replace(
            suite, data=dataclasses.replace(self.data, samples=None),
            checks=tuple(dataclasses.replace(c, samples=None) for c in self.checks))

    def with_samples(self, samples: dict[str, int]) -> Suite:
        """This suite with the checks of ``samples`` (check id -> samples) evaluating that
        many samples (``--time-budget``'s choice); the digest is the changed suite's."""
        raw = copy.deepcopy(self.raw)
        for c in raw.get("checks", []):
            if isinstance(c, dict) and c.get("id") in samples:
                c["samples"] = int(samples[c["id"]])
        return dataclasses.replace(
            self._rehashed(raw),
            checks=tuple(dataclasses.replace(c, samples=samples[c.id]) if c.id in samples
                         else c for c in self.checks))

    def _rehashed(self, raw: dict[str, Any]) -> Suite:
        """This suite with ``raw`` as its source form, and its digest."""
        canonical = json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return dataclasses.replace(
            self, raw=raw, digest="sha256:" + hashlib.sha256(canonical.encode()).hexdigest())

    @property
    def abstain_class(self) -> int | None:
        """The model's explicit abstain class, as the suite's ``coverage`` check declares it.

        Every check's coverage figures count a prediction of it as an abstention.
        """
        declared = (getattr(c.check, "abstain_class", None) for c in self.checks)
        return next((int(a) for a in declared if a is not None), None)

    def check_thresholds(self, reference: bool) -> None:
        """Refuse a threshold on a metric that no check of this run will report.

        ``reference`` says whether the run has a reference model (``--reference``):
        ``relative_improvement`` exists only then.
        """
        for i, spec in enumerate(self.checks):
            if spec.threshold is not None:
                _threshold_reported(spec.threshold, spec.check, spec.id, reference,
                                    f"{self.source}: checks[{i}].threshold")

    def validate_for(self, info: ModelInfo, reference: bool | None = None) -> None:
        """Refuse a model this suite cannot test, before any query is spent on the data.

        With ``reference`` (whether a reference model is given), thresholds are checked too
        (:meth:`check_thresholds`).
        """
        if reference is not None:
            self.check_thresholds(reference)
        if self.classes and info.output != "labels" and info.num_classes != len(self.classes):
            raise SuiteError(
                f"model {info.name} outputs {info.num_classes} scores but suite {self.name!r} "
                f"names {len(self.classes)} classes",
                hint="use the suite that matches the model's classes",
            )
        for spec in self.checks:
            spec.check.validate(info)
        skipped = self.skips(info)
        if skipped and len(skipped) == len(self.checks):
            first = next(iter(skipped.values()))
            raise SuiteError(
                f"every check of suite {self.name!r} would be skipped on {info.name}, so "
                f"nothing would be evaluated ({first})",
                hint="add checks that need only labels (clean_accuracy, corruption, "
                     "hopskipjump, random, spatial_grid attacks)")

    def skips(self, info: ModelInfo) -> dict[str, str]:
        """Check id -> why the check is skipped on this model (SKIPPED rows, no queries).

        A skipped attack's reason names the suite's attacks that still run under the same
        norm (e.g. HopSkipJump for L2 on a labels-only endpoint), or says that none does.
        """
        out: dict[str, str] = {}
        for spec in self.checks:
            why = spec.check.skip_reason(info)
            if why is not None:
                out[spec.id] = why
        for spec in self.checks:
            norm = _attack_norm(spec.check)
            if spec.id not in out or norm is None:
                continue
            cover = [o.id for o in self.checks
                     if o.id not in out and _attack_norm(o.check) == norm]
            out[spec.id] += (f"; {', '.join(cover)} cover{'s' if len(cover) == 1 else ''} "
                             f"{norm} here" if cover else
                             f"; no attack of this suite covers {norm} on this model")
        return out


def _attack_norm(check: Check[Any]) -> Norm | None:
    """The norm of an attack check's threat model (``None`` for other checks)."""
    attack = attack_of(check)
    return attack.threat_model().norm if attack is not None else None


def _threshold_reported(t: Threshold, check: Check[Any], cid: str, reference: bool,
                        where: str) -> None:
    produced = check.produced_metrics(reference)
    if t.metric in produced:
        return
    if not reference and t.metric in check.produced_metrics(True):
        raise SuiteError(f"{where}: {t.metric} of check {cid!r} needs a reference model",
                         hint="pass --reference MODEL, or remove the threshold")
    raise SuiteError(
        f"{where}: check {cid!r} does not report {t.metric} in this configuration",
        hint=f"it reports {', '.join(sorted(produced)) or 'no thresholdable metric'}; "
             "remove the threshold or turn on what reports it")


def packaged_suites() -> dict[str, Path]:
    """Names and paths of the suites shipped with certify."""
    root = importlib.resources.files("certify._suites")
    return {
        Path(str(p)).stem: Path(str(p))
        for p in root.iterdir()
        if str(p).endswith(".yaml")
    }


def _unknown(where: str, got: dict[str, Any], valid: Params) -> None:
    unknown = sorted(set(got) - set(valid.names()))
    if unknown:
        raise SuiteError(
            f"{where}: unknown key(s) {', '.join(unknown)}",
            hint=f"valid keys: {', '.join(sorted(valid.names()))}",
        )


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SuiteError(f"{where} must be a mapping, got {type(value).__name__}",
                         hint="see `certify suites show gtsrb` for an example")
    return value


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SuiteError(f"{where} must be a number, got {value!r}", hint="fix the suite")
    return float(value)


def _triple(value: Any, where: str) -> tuple[float, ...]:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (float(value),) * 3
    if not isinstance(value, list) or len(value) not in (1, 3):
        raise SuiteError(f"{where} must be a number or a list of 3 numbers", hint="fix the suite")
    vals = tuple(_number(v, where) for v in value)
    return vals * 3 if len(vals) == 1 else vals


def resolve_suite_path(name_or_path: str) -> Path:
    """A packaged suite name or a path to a YAML file."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise SuiteError(f"suite file not found: {path}", hint="check the --suite path")
        return path
    suites = packaged_suites()
    if name_or_path not in suites:
        raise SuiteError(
            f"unknown suite {name_or_path!r}",
            hint=f"packaged suites: {', '.join(sorted(suites))}; or pass a path to a YAML file",
        )
    return suites[name_or_path]


#: A suite file's largest size, and the bounds of its YAML: nesting depth, aliases, and the
#: number of values once aliases are expanded (a suite is a few hundred values; an alias bomb of
#: 460 bytes expands to tens of millions, which every later walk of the document would pay for).
MAX_SUITE_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_ALIASES = 200
MAX_VALUES = 100_000


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the suite's bounds on depth and aliases, checked while the
    document is composed (before a deep document exhausts the recursion limit)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0
        self.aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D102
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise SuiteError(f"more than {MAX_ALIASES} YAML aliases",
                                 hint="write the values out; a suite needs few aliases")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise SuiteError(f"nested deeper than {MAX_DEPTH} levels",
                             hint="a suite's values are a few levels deep")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def read_suite_yaml(text: str, source: str) -> Any:
    """A suite's YAML text parsed within the bounds above (:class:`SuiteError` otherwise):
    what ``certify run --suite`` and the service's uploads both read suites with."""
    if len(text) > MAX_SUITE_BYTES:
        raise SuiteError(f"{source}: larger than {MAX_SUITE_BYTES // 1024} KB",
                         hint="a suite is a short YAML file")
    try:  # the reader refuses control characters as it is made, before any parsing
        loader = _BoundedLoader(text)
    except yaml.YAMLError as exc:
        raise SuiteError(f"{source}: not valid YAML ({exc})",
                         hint="a suite is plain text: remove control characters") from None
    try:
        raw = loader.get_single_data()
    except SuiteError as exc:
        raise SuiteError(f"{source}: {exc.message}", hint=exc.hint) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise SuiteError(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)})",
                         hint="check indentation and quoting") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise SuiteError(f"{source}: a value cannot be read ({str(exc)[:120]})",
                         hint="numbers in a suite are short") from None
    finally:
        loader.dispose()
    if _expanded_size(raw, {}) > MAX_VALUES:
        raise SuiteError(f"{source}: more than {MAX_VALUES:,} values once its YAML aliases are "
                         "expanded", hint="write the values out; a suite needs few aliases")
    return raw


def _expanded_size(node: Any, seen: dict[int, int]) -> int:
    """How many values ``node`` holds with every alias expanded (shared objects counted once
    per use, computed once each: linear in the document as parsed)."""
    if id(node) in seen:
        return seen[id(node)]
    n = 1
    if isinstance(node, dict):
        for k, v in node.items():
            n += _expanded_size(k, seen) + _expanded_size(v, seen)
            if n > MAX_VALUES:
                break
    elif isinstance(node, list):
        for v in node:
            n += _expanded_size(v, seen)
            if n > MAX_VALUES:
                break
    seen[id(node)] = n
    return n


def load_suite(name_or_path: str) -> Suite:
    """Load and validate a suite by packaged name or path."""
    path = resolve_suite_path(name_or_path)
    try:
        if path.stat().st_size > MAX_SUITE_BYTES:
            raise SuiteError(f"{path}: larger than {MAX_SUITE_BYTES // 1024} KB",
                             hint="a suite is a short YAML file")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SuiteError(f"cannot read suite {path}: {exc}", hint="check the file") from None
    return parse_suite(read_suite_yaml(text, str(path)), str(path))


def parse_suite(raw: Any, source: str) -> Suite:
    """Validate a suite's parsed YAML; ``source`` names it in errors."""
    raw = _mapping(raw, source)
    plain_keys(raw, source)
    _unknown(source, raw, TOP_PARAMS)
    TOP_PARAMS.validate(raw, f"{source}:")
    missing = sorted(TOP_PARAMS.required() - set(raw))
    if missing:
        raise SuiteError(f"{source}: missing key(s) {', '.join(missing)}",
                         hint="a suite needs name and checks")
    classes, class_count = _classes(raw.get("classes"), source)
    seed = raw.get("seed", 0)

    d = _mapping(raw.get("data"), f"{source}: data")
    _unknown(f"{source}: data", d, DATA_PARAMS)
    DATA_PARAMS.validate(d, f"{source}: data")
    layout = d.get("layout", "auto")
    interp = d.get("interpolation", "bilinear")
    samples = d.get("samples")
    data = DataSpec(
        path=d.get("path"),
        layout=layout,
        roi_crop=bool(d.get("roi_crop", True)),
        interpolation=interp,
        samples=samples,
    )

    p = _mapping(raw.get("preprocessing"), f"{source}: preprocessing")
    _unknown(f"{source}: preprocessing", p, PRE_PARAMS)
    PRE_PARAMS.validate(p, f"{source}: preprocessing")
    order = p.get("channel_order", "RGB")
    std = _triple(p.get("std", 1.0), f"{source}: preprocessing.std")
    if any(s == 0 for s in std):
        raise SuiteError(f"{source}: preprocessing.std must not be 0", hint="fix the suite")
    pre = Preprocessing(
        input_scale=_number(p.get("input_scale", 1.0), f"{source}: preprocessing.input_scale"),
        mean=_triple(p.get("mean", 0.0), f"{source}: preprocessing.mean"),
        std=std,
        channel_order=order,
    )
    size = p.get("input_size")
    if size is not None and (not isinstance(size, list) or len(size) != 2
                             or not all(isinstance(v, int) and v > 0 for v in size)):
        raise SuiteError(f"{source}: preprocessing.input_size must be [H, W]", hint="e.g. [32, 32]")

    checks_raw = raw["checks"]
    if not isinstance(checks_raw, list) or not checks_raw:
        raise SuiteError(f"{source}: checks must be a non-empty list", hint="see gtsrb.yaml")
    rule = raw.get("decision", "interval")
    specs: list[CheckSpec] = []
    seen: set[str] = set()
    for i, c in enumerate(checks_raw):
        where = f"{source}: checks[{i}]"
        c = _mapping(c, where)
        _unknown(where, c, CHECK_PARAMS)
        CHECK_PARAMS.validate(c, where)
        kind = c.get("kind")
        if kind not in CHECKS:
            raise SuiteError(f"{where}: unknown check kind {kind!r}",
                             hint=f"valid kinds: {', '.join(sorted(CHECKS))}")
        cid = c.get("id", kind)
        if not isinstance(cid, str) or not cid or cid in seen:
            raise SuiteError(f"{where}: check id {cid!r} is empty or repeated",
                             hint="give each check a unique id")
        if "#" in cid:  # the runner keys a check's later rounds as <id>#round<r>
            raise SuiteError(f"{where}: check id {cid!r} contains '#'",
                             hint="use letters, digits, '_', '-', '+' or '.'")
        seen.add(cid)
        cls = CHECKS[kind]
        check = cls.from_params(_mapping(c.get("params"), f"{where}.params"), where)
        check.check_params(where)
        threshold = None
        if c.get("threshold") is not None:
            t = _mapping(c["threshold"], f"{where}.threshold")
            _unknown(f"{where}.threshold", t, THRESHOLD_PARAMS)
            THRESHOLD_PARAMS.validate(t, f"{where}.threshold")
            metric = t.get("metric", cls.metric_names[0] if cls.metric_names else None)
            if metric not in cls.metric_names:
                raise SuiteError(f"{where}.threshold: metric {metric!r} is not reported by {kind}",
                                 hint=f"valid metrics: {', '.join(cls.metric_names)}")
            if "min" not in t and "max" not in t:
                raise SuiteError(f"{where}.threshold needs min or max", hint="e.g. min: 0.9")
            threshold = Threshold(
                metric=metric,
                min=_number(t["min"], f"{where}.threshold.min") if "min" in t else None,
                max=_number(t["max"], f"{where}.threshold.max") if "max" in t else None,
            )
            if threshold.min is not None and threshold.max is not None and \
                    threshold.min > threshold.max:
                raise SuiteError(f"{where}.threshold: min {threshold.min:g} is above max "
                                 f"{threshold.max:g}, so nothing can pass",
                                 hint="swap them or drop one")
            # reference=True: the most a check can report; without --reference it is checked
            # again by Suite.check_thresholds before any model is loaded.
            _threshold_reported(threshold, check, cid, True, f"{where}.threshold")
        budget = c.get("budget")
        n_samples = c.get("samples")
        specs.append(CheckSpec(cid, kind, check, threshold, budget, n_samples,
                               c.get("decision", rule)))

    flips = raw.get("flip_invariant_classes", [])
    top = class_count if class_count is not None else MAX_SEED
    if not isinstance(flips, list) or not all(
        isinstance(c, int) and not isinstance(c, bool) and 0 <= c < top for c in flips
    ):
        raise SuiteError(f"{source}: flip_invariant_classes must list class ids",
                         hint="integers from 0" + (f" to {top - 1}" if top != MAX_SEED else ""))

    tolerance = raw.get("release_tolerance", DEFAULT_RELEASE_TOLERANCE)

    plain_data(raw, source)  # what no annotation typed: dates, binary, NaN under Any
    canonical = json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return Suite(
        name=str(raw["name"]),
        source=source,
        digest="sha256:" + hashlib.sha256(canonical.encode()).hexdigest(),
        seed=seed,
        classes=tuple(classes),
        data=data,
        preprocessing=pre,
        input_size=tuple(size) if size else None,
        checks=tuple(specs),
        flip_invariant_classes=frozenset(flips),
        description=str(raw.get("description", "")),
        decision=rule,
        raw=raw,
        class_count=class_count,
        release_tolerance=float(tolerance),
    )


def _classes(value: Any, source: str) -> tuple[list[str], int | None]:
    """A suite's ``classes``: a list of names (in class-id order), a count, or absent.

    A count or no value leaves the names to the run (``--labels``, the data, the model's
    metadata, else class ids).
    """
    if value is None:
        return [], None
    if isinstance(value, int):  # expect_keys has refused a boolean already
        if value < 1:
            raise SuiteError(f"{source}: classes must be a positive count, got {value}",
                             hint="e.g. classes: 10, or a list of class names")
        return [], value
    if not value:
        raise SuiteError(f"{source}: classes must be a non-empty list of names",
                         hint="list one name per class id, in class-id order; or give the "
                              "count (classes: 10) and take the names from --labels or the data")
    return list(value), len(value)


def classes_for_run(suite: Suite, info: ModelInfo, *, labels: Sequence[str] | None = None,
                    labels_source: str = "--labels",
                    data: tuple[list[str], str] | None = None) -> Suite:
    """``suite`` with the run's class names resolved for the loaded model (``info``): by the
    precedence of :func:`resolve_class_names`; logged when they do not come from the suite."""
    got = resolve_class_names(num_classes=info.num_classes, suite_names=suite.classes,
                              suite_source=FROM_SUITE, labels=labels,
                              labels_source=labels_source, data=data,
                              metadata=info.metadata)
    if got.source != FROM_SUITE:
        shown = ", ".join(got.names[:5]) + (", …" if len(got.names) > 5 else "")
        logging.getLogger("certify").info("classes: %d from %s (%s)", len(got.names),
                                          got.source, shown)
    return suite.with_classes(got.names, got.source)
