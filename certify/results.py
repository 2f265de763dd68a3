"""The typed result of a run: what ``results.json`` holds and what is signed.

A run result has two parts, both signed:

- ``measurement``: deterministic. The same model, data, suite, seed and options give
  byte-identical canonical JSON on the same device kind and library versions, on either
  executor, resumed or not. Every metric and verdict is computed from this part alone.
- ``provenance``: how this particular run happened: timings, environment and library versions,
  host, the arguments as given (paths, URLs with credentials removed), endpoint traffic
  (requests, retries), the renderer's version.

Each check kind's part of the schema (its metrics) is generated from the kinds' light
descriptions (:data:`certify.kinds.KINDS`), so a new check declares its metrics beside its kind
and never edits this module; reading results imports no part of the engine (torch and the
rest), which ``certify verify`` relies on. :func:`json_schema` is the versioned JSON Schema
that ``certify schema`` prints; :func:`parse_result` checks a parsed ``results.json`` against it.

What the card and ``certify compare`` read about a row besides its figures is typed here too,
written by the engine where it decides: ``settled`` (what keeps a figure from being final: a
random draw, a search or an attack that had not converged, a stalled attack, a failed
binarization test, black-box evidence short of its floor) and ``decided_by`` (the rule that made
the status: the interval rule's three outcomes, the point rule, what stopped a pass). ``details``
stays the evidence, and ``decision`` the sentence a reader sees; neither is parsed.

Older formats: ``certify.results/2`` (written before issue 38, without those typed fields) is
read with ``parse_result(doc, older=True)`` through :func:`_read_v2`, which derives them from the
details and decision sentences the way certify read them then; ``certify.results/1`` is refused
with a message that says what to do.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, create_model

from certify.errors import CertifyError
from certify.kinds import KINDS, Settlement
from certify.tolerance import DEFAULT_RELEASE_TOLERANCE  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    import numpy as np

#: The schema version this certify writes and reads.
SCHEMA = "certify.results/3"
#: Older schema versions this certify can still read (``parse_result(doc, older=True)``).
OLDER_SCHEMAS = ("certify.results/2",)
#: Older schema versions: recognised, so that the error can say what to do.
OLD_SCHEMAS = ("certify.results/1", *OLDER_SCHEMAS)

#: A check's status. SKIPPED: not evaluated on this model (the reason is its ``decision``).
Status = Literal["PASS", "FAIL", "INCONCLUSIVE", "WARN", "ERROR", "INFO", "SKIPPED"]

Interval = tuple[float | None, float | None]

#: How a threshold decides: ``interval`` (PASS only when the metric's whole 95% interval meets
#: it, FAIL only when the whole interval misses it, else INCONCLUSIVE) or ``point`` (the point
#: estimate alone decides, as before issue 17). A suite sets it at the top level (default
#: ``interval``) and a check may override it; the results record the rule that decided.
DecisionRule = Literal["interval", "point"]
#: How the card states each decision rule (shown once near the summary).
DECISION_RULE_TEXT: dict[DecisionRule, str] = {
    "interval": ("a threshold PASSes only when the metric's whole 95% interval meets it and "
                 "FAILs only when the whole interval misses it; an interval across the "
                 "threshold is INCONCLUSIVE (not a pass), with the sample size that would "
                 "decide it at the observed value; a metric without an interval is decided on "
                 "its point estimate"),
    "point": "a threshold compares the metric's point estimate; its interval is not used",
}


class SchemaError(CertifyError):
    """A results document that does not follow certify's schema (exit 1)."""

    exit_code = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ThresholdDoc(_Strict):
    """A check's pass condition as the suite stated it."""

    metric: str
    min: float | None
    max: float | None
    text: str
    rule: DecisionRule = Field(
        "point", description="how it decided: on the metric's 95% interval or its point "
        "estimate (results written before the interval rule have none: point)")


class CheckQueries(_Strict):
    """Images sent to each model for this check."""

    total: int = Field(description="images sent to the certified model")
    mean_per_sample: float
    reference: int = Field(0, description="images sent to the reference model")


class Outcomes(_Strict):
    """Per-sample outcomes, packed: one bit per dataset sample (little-endian bit order,
    base64), for paired comparisons between runs on the same data."""

    n: int = Field(description="dataset size: the bitmaps' length in bits")
    selected: str = Field(description="the samples this check evaluated")
    bits: dict[str, str] = Field(default_factory=dict,
                                 description="a bitmap per binary outcome")
    values: dict[str, list[float | None]] = Field(
        default_factory=dict, description="per-sample values, in the order of `selected`")


#: The rule that made a status (:class:`DecidedBy`).
Rule = Literal[
    "interval_within",     # the metric's whole 95% interval meets the threshold
    "interval_outside",    # its whole interval misses it (wholly outside / below / above)
    "interval_straddles",  # the interval straddles it: INCONCLUSIVE
    "point_meets",         # the point estimate meets it (point rule, or no interval)
    "point_misses",        # the point estimate misses it
    "not_a_number",        # the metric is NaN or infinite: INCONCLUSIVE
    "no_threshold",        # informational (INFO, or WARN with warnings)
    "random_draw",         # a random draw beside an attack of the same bound, which decides
    "error",               # the check could not complete
    "skipped",             # not evaluated on this model
    "certified_within",    # a threat model: its certified share's whole interval meets it
    "certified_meets",     # a threat model: its certified share meets it (point rule)
]
#: What stopped a threshold that was met from passing (:class:`DecidedBy`).
Stop = Literal[
    "warning",          # a warning (the row's own, or a rule across checks)
    "sample_errors",    # samples left out for non-finite model outputs
    "no_support",       # a threat model: no attack of it PASSed on its own
    "errored_attack",   # a threat model: an attack of it produced no result
]


class DecidedBy(_Strict):
    """Why a row's status is what it is, as the engine decided it: the rule, what stopped a
    pass, and the clause that says why in words (the card's "why" and ``compare`` read these,
    never the ``decision`` sentence)."""

    rule: Rule
    stopped: list[Stop] = Field(default_factory=list,
                                description="what stopped a met threshold from passing")
    reason: str = Field(
        default="", description="for a straddling interval, what would decide it (or why more "
        "samples would not); for a stopped pass, the first thing that stopped it; else empty")


class CheckResult(_Strict):
    """One check's typed result; each check kind's subclass (:func:`check_result_model`) adds
    ``metrics``, validated against the metrics the kind declares."""

    id: str
    kind: str
    params: dict[str, JsonValue]
    threshold: ThresholdDoc | None
    budget: int | None
    status: Status
    decision: str = Field(description="the rule that made the status")
    intervals: dict[str, Interval]
    details: dict[str, JsonValue]
    warnings: list[str]
    error: str | None
    sample_errors: int = Field(0, description="samples whose model output was not finite")
    queries: CheckQueries
    outcomes: Outcomes | None
    settled: Settlement = Field(description="what keeps the figure from being final")
    decided_by: DecidedBy = Field(description="the rule that made the status")

    if TYPE_CHECKING:
        # Declared by each kind's subclass: a model of the metrics that kind declares (or None
        # when the check measured nothing), so its shape depends on the kind.
        metrics: Any

    def metric(self, name: str) -> float | None:
        """The value of one metric (``None`` when the check measured nothing or the metric is
        optional and absent); a name this check kind does not declare is a KeyError."""
        metrics = getattr(self, "metrics", None)
        declared = {m.name for m in KINDS[self.kind].metrics}
        if name not in declared:
            raise KeyError(f"check kind {self.kind!r} has no metric {name!r}")
        value = None if metrics is None else getattr(metrics, name)
        return None if value is None else float(value)


def _metrics_model(cls: Any) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for m in cls.metrics:
        desc = f"{m.description} ({m.unit}; better: {m.direction})"
        kind: Any = int | None if m.unit == "count" else float | None
        fields[m.name] = (kind, Field(None if m.optional else ..., description=desc))
    return create_model(f"{cls.name}Metrics", __base__=_Strict, **fields)


@functools.cache
def _check_models() -> dict[str, type[CheckResult]]:
    models: dict[str, type[CheckResult]] = {}
    for kind, cls in KINDS.items():
        fields: dict[str, Any] = {"kind": (Literal[kind], ...),
                                  "metrics": (_metrics_model(cls) | None, ...)}
        models[kind] = create_model(f"{cls.name}Result", __base__=CheckResult, **fields)
    return models


def check_result_model(kind: str) -> type[CheckResult]:
    """The typed result class of one check kind."""
    return _check_models()[kind]


if TYPE_CHECKING:
    AnyCheckResult = CheckResult
else:
    #: Any check kind's result, told apart by ``kind`` (the union of the registered kinds).
    AnyCheckResult = Annotated[Union[tuple(_check_models().values())],  # noqa: UP007
                               Field(discriminator="kind")]




class SuiteDoc(_Strict):
    """The suite, identified by content."""

    name: str
    digest: str
    description: str
    decision: DecisionRule = Field(
        "point", description="the suite's decision rule for thresholds (checks may override)")
    release_tolerance: float | None = Field(
        None, ge=0, le=100, description="the largest drop a release may take per gating row "
        "in `certify compare` (percentage points for rates, percent of the old value for "
        "scores), as the suite states it or certify's default; null in results written "
        "before certify recorded it")


class ModelDoc(_Strict):
    """What was certified: identity and input/output conventions (no local path)."""

    name: str
    identity: str
    input_shape: list[int]
    num_classes: int
    output: Literal["logits", "probs", "labels"]
    layout: str
    batch: str
    preprocessing: dict[str, JsonValue]
    metadata: dict[str, str]
    white_box: str = Field("unavailable: not recorded (a run before white-box attacks)",
                           description="'available' when white-box attacks can take gradients "
                           "of a torch copy of the graph, else why not")


class ResizeDoc(_Strict):
    """Images brought to the model's input size when the data was loaded."""

    count: int = Field(description="images resized")
    of: int = Field(description="images loaded")
    to: list[int] = Field(description="[H, W] they were resized to (the model's input size)")
    from_: list[list[int]] = Field(alias="from", description="the most common original "
                                   "sizes [H, W] (at most 3)")
    distinct_sizes: int = Field(description="how many different original sizes were resized")
    interpolation: str


class SampleCapDoc(_Strict):
    """More samples were asked for (``--samples`` or the suite's ``data.samples``) than the
    data has: the run used what there is."""

    requested: int
    available: int
    used: int


class SkippedDoc(_Strict):
    """Files of the data that were left out."""

    count: int
    reason: str
    examples: list[str] = Field(description="the first few, relative to the data folder")


class OlderDigestsDoc(_Strict):
    """The data's digests by the definition of certify before content digests."""

    digest: str = Field(description="the evaluated samples with their ids")
    source_digest: str = Field(description="the source's file bytes (or resized arrays) with "
                               "the layout's name and the preprocessing")


class DataDoc(_Strict):
    """The evaluation data, identified by content (its local path is provenance)."""

    digest: str = Field(description="digest of the evaluated samples' content: their pixels at "
                        "the model's input size and labels, in order (their ids and the "
                        "source's name are not part of it)")
    layout: str
    n: int
    image_shape: list[int]
    num_classes: int
    per_class_counts: list[int]
    name: str
    source_digest: str | None = Field(
        default=None, description="digest of the whole source dataset the samples were drawn "
        "from, by content: each image's decoded RGB pixels with their shape (after the ROI crop "
        "where one applies) and its label, in the source's order, with the model's input size "
        "and, when images are resized, the interpolation. The same images as an .npz, a folder "
        "or arrays from Python share it (the layout and name are recorded beside it, not in "
        "it), and so do runs on different subsets of one dataset")
    selection: str | None = Field(default=None,
                                  description="how the samples were chosen from the source")
    older_digests: OlderDigestsDoc | None = Field(
        default=None, description="the same digests by the definition of certify before "
        "content digests (file bytes and the layout's name), so that results written then "
        "(which lack this field) are still compared, by that definition")
    class_names: list[str] | None = Field(
        default=None, description="the class names, in class-id order (runs by releases "
        "before class names were recorded have none)")
    class_names_source: str | None = Field(
        default=None, description="where the class names came from: the suite, --labels, the "
        "data (image-folder names, an npz class_names array), the model's metadata, or class "
        "ids when nothing named them")
    resized: ResizeDoc | None = Field(
        default=None, description="images resized to the model's input size (none: no image "
        "was resized)")
    sample_cap: SampleCapDoc | None = Field(
        default=None, description="more samples were asked for than the data has")
    skipped: SkippedDoc | None = Field(
        default=None, description="files of the data left out (an unreadable image is an "
        "error, not a skip)")
    notes: list[str] = Field(
        default_factory=list, description="resizing, sample caps and skipped files in "
        "sentences, for the card")


class ModelCardDoc(_Strict):
    """What the team that ships the model states about it (the Model Card Toolkit's and
    Hugging Face model cards' model details): given on ``certify run``/``submit`` or the
    service's form, never inferred. ``None``: not stated (the card says so)."""

    name: str | None = Field(default=None, description="the model's name as its team calls it")
    version: str | None = Field(default=None, description="the model version evaluated")
    owner: str | None = Field(default=None, description="who ships the model")
    license: str | None = Field(default=None, description="the model's license")
    intended_use: str | None = Field(default=None, description="what the model is for, in "
                                     "its team's words (never the suite's description)")

    def any(self) -> bool:
        """True when at least one field was stated."""
        return any(v is not None for v in self.model_dump().values())


class Seeds(_Strict):
    """The seeds of a run: the suite's, and each check's derived from it and the check id."""

    suite: int
    checks: dict[str, int]


class RunQueries(_Strict):
    """Images sent to the models over the whole run, resumed records included."""

    total: int = Field(description="images sent to all models")
    model: int
    reference: int
    budget: int | None


class CertifiedFloor(_Strict):
    """A threat model's certified floor: the share of its samples a ``certified`` check proved
    robust (bound propagation), on the samples the row and that check share."""

    check: str = Field(description="the certified check's id")
    n: int = Field(description="samples the row and the certified check share")
    n_certified: int
    share: float = Field(description="certified share of the n samples (a lower bound of "
                         "robust accuracy)")
    interval: list[float] = Field(default_factory=list, description="95% Wilson interval")
    methods: list[str] = Field(default_factory=list, description="the methods, weakest first")
    by_method: dict[str, int] = Field(default_factory=dict, description="of the n samples, "
                                      "those proved by each method or a weaker one")
    n_budget: int = Field(0, description="correct samples left unproved by the time budget")
    n_unevaluated: int = Field(0, description="of the n samples, those the certified check did "
                               "not evaluate (counted as not certified)")


class WorstCase(_Strict):
    """A threat model's headline row: robust accuracy against all of the suite's attacks of
    that threat model at once (a sample is robust only if every attack failed on it), decided
    against the strictest ``robust_accuracy`` threshold of those attacks' rows.

    Its ``status`` stands in the run's verdict for the attack rows it summarises (they stay on
    the card as evidence); ``support`` names the attack rows whose own PASS allows it to PASS.
    """

    norm: str
    epsilon: float
    attacks: list[str]
    n: int
    robust_accuracy: float
    n_robust: int = 0
    interval: list[float] = Field(default_factory=list, description="95% Wilson interval")
    threshold: float | None = Field(default=None, description="robust_accuracy min, the "
                                    "strictest of the threat model's attack rows")
    status: Literal["PASS", "FAIL", "INCONCLUSIVE", "WARN", "INFO", "ERROR"] = "INFO"
    decision: str = ""
    support: list[str] = Field(default_factory=list)
    white_box: list[str] = Field(default_factory=list, description="white-box attacks")
    transfer: list[str] = Field(default_factory=list, description="white-box attacks run on "
                                "an endpoint's surrogate (transfer): their breaks count, "
                                "they never support a PASS")
    broken_by: dict[str, int] = Field(default_factory=dict,
                                      description="samples each attack broke, on these n")
    warnings: list[str] = Field(default_factory=list)
    decided_by: DecidedBy = Field(default_factory=lambda: DecidedBy(rule="no_threshold"),
                                  description="the rule that made the status")
    certified: CertifiedFloor | None = Field(
        default=None, description="the certified floor under the attacked robust accuracy "
        "(a certified check of the same threat model); null when the suite has none")


class RunMeasurement(BaseModel):
    """The deterministic, signed measurement."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    certify_version: str
    suite: SuiteDoc
    model: ModelDoc
    reference_model: ModelDoc | None
    data: DataDoc
    device: Literal["cpu", "cuda"]
    seeds: Seeds
    queries: RunQueries
    checks: list[AnyCheckResult]
    summary: dict[str, int]
    model_card: ModelCardDoc | None = Field(
        default=None, description="model details as stated by the model's team (name, "
        "version, owner, license, intended use); null when none was stated")
    attack_worst_case: list[WorstCase]
    verdict: Literal["PASS", "FAIL", "INCONCLUSIVE", "WARN", "ERROR"]
    decision: str


class Provenance(BaseModel):
    """How this run happened: signed, but never the source of a metric or verdict."""

    model_config = ConfigDict(extra="allow", frozen=True)

    model_spec: str
    reference_spec: str | None
    data_source: str
    suite_source: str
    device: dict[str, str]
    environment: dict[str, str]
    timings: dict[str, JsonValue]
    traffic: dict[str, JsonValue] | None
    renderer: dict[str, str] = Field(default_factory=dict)


class RunResult(BaseModel):
    """``results.json``: schema version, measurement and provenance."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_version: str = Field(alias="schema")
    measurement: RunMeasurement
    provenance: Provenance

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values (what :func:`certify.canonical.canonical_json` serialises)."""
        return self.model_dump(mode="json", by_alias=True)

    @property
    def checks(self) -> list[CheckResult]:
        """The typed check results, in suite order."""
        return list(self.measurement.checks)


def verdict_statuses(checks: Sequence[CheckResult], worst: Sequence[WorstCase]
                     ) -> list[Status]:
    """The statuses the run's verdict is made of: each check's, except that an attack row
    summarised by a threat model's headline row counts through that row (the attack rows are
    its evidence); an errored attack row still counts itself.

    The engine decides the verdict from these; the card counts them, from the signed rows."""
    grouped = {i for w in worst for i in w.attacks}
    own: list[Status] = [c.status for c in checks if c.id not in grouped or c.status == "ERROR"]
    return own + [w.status for w in worst]


def _known_kinds(doc: dict[str, Any]) -> None:
    """Refuse a check of a kind this certify does not know, saying what to do."""
    measurement = doc.get("measurement")
    raw = measurement.get("checks") if isinstance(measurement, dict) else None
    models = _check_models()
    for i, c in enumerate(raw if isinstance(raw, list) else []):
        kind = c.get("kind") if isinstance(c, dict) else None
        if kind not in models:
            raise SchemaError(f"checks[{i}]: unknown check kind {kind!r}",
                              hint="made by a newer certify? upgrade certify to read it")


def parse_result(doc: Any, *, older: bool = False) -> RunResult:
    """A typed :class:`RunResult` from a parsed ``results.json`` (raises SchemaError).

    ``older``: also read the formats of :data:`OLDER_SCHEMAS`, through :func:`_read_v2`. The
    typed result of an older document is a reading of it (its ``schema`` stays the older one),
    not its bytes: what was signed is the document as it was written.
    """
    if not isinstance(doc, dict):
        raise SchemaError("the results are not a JSON object", hint="not a certify results file")
    version = doc.get("schema")
    if older and version in OLDER_SCHEMAS:
        doc = _read_v2(doc)
    elif version in OLD_SCHEMAS:
        raise SchemaError(f"results schema {version!r} is from an older certify; this one "
                          f"reads {SCHEMA!r}", hint="rerun the suite with this certify")
    elif version != SCHEMA:
        raise SchemaError(f"unknown results schema version {version!r} (this certify reads "
                          f"{SCHEMA!r})", hint="use the certify version that wrote it")
    _known_kinds(doc)
    try:
        return RunResult.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise SchemaError(f"results do not follow {version}: {where}: {first['msg']}",
                          hint="the file was altered or written by another tool") from None


# --- the older format certify.results/2 ------------------------------------------------------
# Written before issue 38: what keeps a figure from being final and why a status was decided
# were not typed fields then. Certify read them from ``details`` keys and decision sentences;
# this section does the same, once, for documents of that format only. Nothing else parses a
# decision sentence.

def _read_v2(doc: dict[str, Any]) -> dict[str, Any]:
    """OLDER FORMAT (``certify.results/2``): the document with the typed fields of
    ``certify.results/3`` derived the way certify read them before issue 38: ``settled`` from
    the ``details`` keys (``search_rounds``, ``convergence``, ``evidence``, ``binarization``),
    ``decided_by`` from the ``decision`` sentences ("wholly outside", "straddles … (interval
    rule): why", "; but …"). ``schema`` stays ``certify.results/2``; ``doc`` is not changed."""
    measurement = doc.get("measurement")
    if not isinstance(measurement, dict):
        return doc

    def details_of(c: dict[str, Any]) -> dict[str, Any]:
        d = c.get("details")
        return d if isinstance(d, dict) else {}

    def settled(d: dict[str, Any]) -> dict[str, Any]:
        rounds, conv = d.get("search_rounds"), d.get("convergence")
        ev, bt = d.get("evidence"), d.get("binarization")
        rounds = rounds if isinstance(rounds, dict) else None
        ev = ev if isinstance(ev, dict) else {}
        return {
            "random_draw": rounds is not None and rounds.get("searched") is False,
            "search_converged": (bool(rounds.get("converged"))
                                 if rounds is not None and rounds.get("searched", True)
                                 else None),
            "attack_converged": (bool(conv.get("converged", True)) if isinstance(conv, dict)
                                 else None),
            "stalled": bool(ev.get("stalled")),
            "binarization_failed": isinstance(bt, dict) and bt.get("trusted") is False,
            "short_of_floor": bool(ev.get("short_of_pass")),
        }

    def decided_by(status: Any, decision: Any, warnings: Any) -> dict[str, Any]:
        text = decision if isinstance(decision, str) else ""
        rule: str
        reason = ""
        if status in ("ERROR", "SKIPPED"):
            rule = status.lower()
        elif text.startswith("informational: "):
            rule = "random_draw"
            reason = "the attack row" + text.split("the attack row", 1)[-1].split(" (by ")[0]
        elif any(f"wholly {w}" in text for w in ("outside", "below", "above")):
            rule = "interval_outside"
        elif "straddles" in text:
            rule = "interval_straddles"
            reason = text.split("): ", 1)[-1]
        elif "wholly within" in text:
            rule = "interval_within"
        elif "is not a number" in text:
            rule = "not_a_number"
        elif " does not meet " in text or " misses robust_accuracy" in text:
            rule = "point_misses"
        elif " meets " in text:
            rule = "point_meets"
        else:
            rule = "no_threshold"
        stopped = [stop for stop, words in (
            ("warning", "a warning stops it from passing"), ("warning", "; but check "),
            ("warning", "gradient masking suspected"), ("sample_errors", "non-finite outputs"),
            ("errored_attack", "produced no result"),
            ("no_support", "PASSed on its own")) if words in text and status != "PASS"]
        if "a warning stops it from passing" in text and warnings:
            reason = str(warnings[0])
        elif stopped and "; but " in text:
            reason = text.split("; but ", 1)[1]
        return {"rule": rule, "stopped": list(dict.fromkeys(stopped)), "reason": reason}

    checks = [c if not isinstance(c, dict) else {
        **c, "settled": settled(details_of(c)),
        "decided_by": decided_by(c.get("status"), c.get("decision"), c.get("warnings"))}
        for c in measurement.get("checks") or []]
    worst = [w if not isinstance(w, dict) else {
        **w, "decided_by": decided_by(w.get("status"), w.get("decision"), w.get("warnings"))}
        for w in measurement.get("attack_worst_case") or []]
    return {**doc, "measurement": {**measurement, "checks": checks,
                                   "attack_worst_case": worst}}


def json_schema() -> dict[str, Any]:
    """The JSON Schema of ``results.json`` for this certify (``certify schema``)."""
    schema = RunResult.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://certify.dev/schema/{SCHEMA}.json"
    schema["title"] = f"certify results ({SCHEMA})"
    schema["properties"]["schema"]["const"] = SCHEMA
    return schema


def pack_bits(flags: np.ndarray) -> str:
    """A boolean vector as base64 of its little-endian packed bits."""
    import numpy as np  # here, not at the top: reading results (verify) needs no numpy

    return base64.b64encode(np.packbits(flags.astype(bool), bitorder="little").tobytes()
                            ).decode("ascii")


def unpack_bits(text: str, n: int) -> np.ndarray:
    """The boolean vector of length ``n`` packed by :func:`pack_bits`."""
    import numpy as np

    raw = np.frombuffer(base64.b64decode(text), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[:n].astype(bool)
