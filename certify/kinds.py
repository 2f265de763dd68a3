"""What each check kind *is*, apart from how it computes: its metrics, its family and glance
group, its ``model-index`` export, how ``certify compare`` pairs it, and its card template.

This is what the results schema (:mod:`certify.results`), ``certify verify``, ``certify
compare``, the export and the card read: each kind's headline (one sentence) and figures (inline
SVGs, drawn by :mod:`certify.figures` when asked), and its card template. It imports no torch,
onnxruntime, kornia or scikit-image, so a verifier, a comparison and the card's rendering need
none of them. Each compute class (:mod:`certify.checks`) inherits its kind's description and
adds how the kind is measured; the engine imports the compute classes.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from certify.norms import norm


@dataclass(frozen=True)
class Metric:
    """One metric a check reports: its name, what it means and which way is better.

    ``direction`` is ``higher`` or ``lower`` (better) or ``none`` (a count or a setting);
    ``unit`` says how to read and compare it (``rate`` in [0, 1], ``score`` on its own scale,
    ``count``, ``queries``); ``threshold`` says whether a suite may put a pass threshold on it;
    ``optional`` marks a metric that only some configurations produce.
    """

    name: str
    description: str
    direction: Literal["higher", "lower", "none"] = "none"
    unit: Literal["rate", "score", "count", "queries"] = "rate"
    threshold: bool = False
    optional: bool = False


@dataclass(frozen=True)
class ExportMetric:
    """How a check's headline metric appears in a Hugging Face ``model-index`` entry."""

    metric: str
    type: str
    label: str


class Settlement(BaseModel):
    """Whether a check's figure is final, as the check found it when it summarised its records:
    written by the engine beside ``details`` (the evidence) as the result's typed ``settled``
    field, which the card (its summary and limitations) and ``certify compare`` read.

    All false or null: a figure no stronger search can lower (a plain measurement, or an
    exhaustive grid).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    random_draw: bool = Field(
        default=False, description="a random draw, not a search for the worst case (an attack "
        "at the same bound says what an adversary finds)")
    search_converged: bool | None = Field(
        default=None, description="a searched corruption property: whether its escalated "
        "search converged (or was exhaustive) before its budget ran out; null: not a search")
    attack_converged: bool | None = Field(
        default=None, description="an attack: whether its last run converged; null: not "
        "judged (not an attack, or a grid searched exhaustively)")
    stalled: bool = Field(
        default=False, description="a black-box attack whose last run stalled: the model's "
        "outputs gave it no signal")
    binarization_failed: bool = Field(
        default=False, description="an attack that failed the binarization test: too weak to "
        "trust its robust accuracy")
    short_of_floor: bool = Field(
        default=False, description="a black-box attack short of what a PASS on its own needs "
        "(its query floor, two doubled rounds, the binarization test): evidence, not a PASS")
    statistical: bool = Field(
        default=False, description="a random corruption decided per sample at a stated "
        "confidence from noise draws at its bound: its figure is a statement about the "
        "noise's distribution, not a worst case")

    def converged(self) -> bool | None:
        """Whether the figure's search converged: ``False`` when a search or an attack had not
        (or stalled), ``True`` when one did, ``None`` for a figure that is not a search."""
        if self.search_converged is False or self.attack_converged is False or self.stalled:
            return False
        if self.search_converged or self.attack_converged:
            return True
        return None


class ResultView(Protocol):
    """What a check's presentation reads of its own result (a typed check result)."""

    @property
    def id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def error(self) -> str | None: ...
    @property
    def metrics(self) -> Any: ...  # the kind's own metrics model (its fields: its metrics)
    @property
    def intervals(self) -> Mapping[str, Sequence[float | None]]: ...
    @property
    def details(self) -> Mapping[str, Any]: ...  # JSON, read by the kind that wrote it
    @property
    def warnings(self) -> list[str]: ...


def pct(v: float | None) -> str:
    """A rate as a percentage with one decimal (``–`` when unknown)."""
    return "–" if v is None else f"{100 * float(v):.1f}%"


def interval_text(iv: Any) -> str:
    """``lo–hi`` of a 95% interval of rates."""
    lo, hi = iv
    return f"{pct(lo)}–{pct(hi)}"


class Role(enum.Enum):
    """What a check is for, which the runner reads instead of its class."""

    #: Tests the model itself (determinism, quantisation, a rounding head): runs first, and
    #: its findings qualify the attacks.
    SUSPECT = "suspect-model check"
    #: Accuracy on the unchanged data.
    CLEAN = "clean"
    #: A corruption property (a bounded transform's worst case or a random corruption).
    PROPERTY = "property"
    #: An attack in a threat model (:meth:`certify.checks.AttackCheck.threat_model`): grouped
    #: with the attacks of its threat model, which decide its row together.
    ATTACK = "attack"
    #: A score of the model's behaviour (the brittle score, accuracy at coverage).
    SCORE = "score"
    #: A certified lower bound in a threat model (:class:`certify.checks.certified.Certified`):
    #: put beside the attacks of its threat model, whose row it brackets from below.
    BOUND = "certified bound"


class Kind:
    """A check kind's description (subclassed once per kind, then by its compute class)."""

    kind: ClassVar[str] = ""
    #: What the check is for (:class:`Role`).
    role: ClassVar[Role] = Role.SCORE
    #: The compute class's name (the results schema names its models after it).
    name: ClassVar[str] = ""
    #: The card's family heading this check is shown under (and listed as untested without it).
    family: ClassVar[str] = ""
    #: The card's at-a-glance figure groups checks by this
    #: (see :data:`certify.report.glance.GROUPS`).
    glance_group: ClassVar[str] = "Brittleness and other"
    #: Every metric the check reports; the result schema is generated from these.
    metrics: ClassVar[tuple[Metric, ...]] = ()
    #: The metrics a suite threshold may name (derived from ``metrics``).
    metric_names: ClassVar[tuple[str, ...]] = ()
    #: The metric a model-index export reports, if any.
    export: ClassVar[ExportMetric | None] = None
    #: ``certify compare``: metric -> (outcome bitmap, better direction). A metric named here
    #: is compared as the share of the check's selected samples with that outcome set (the
    #: unconditional outcome, e.g. "correct and stays correct" for robustness scores), paired
    #: by McNemar's exact test when both runs evaluated the same samples with the same seed.
    compare_outcomes: ClassVar[dict[str, tuple[str, Literal["higher", "lower"]]]] = {}
    #: ``certify compare``: metric -> the per-sample ``values`` whose mean it is (paired
    #: bootstrap when both runs kept them for the same samples).
    compare_values: ClassVar[dict[str, str]] = {}
    #: How this kind measures its compared figures, when a certify release changed it (empty:
    #: as first released). Written to the result's ``details["method"]``; ``certify compare``
    #: lists a check measured by another method as not comparable rather than calling the
    #: difference a change of the model.
    method: ClassVar[str] = ""
    #: A top-1 accuracy this check reports that sits at chance level when the model is fed
    #: the wrong preprocessing (``None``: none). The runner then probes other preprocessings
    #: (:mod:`certify.probe`) and, when one is clearly better, names it in a warning.
    chance_metric: ClassVar[str | None] = None
    #: What a status means on this kind's rows, where it says more than the status's general
    #: meaning (:data:`certify.errors.STATUS_MEANINGS`); the suite reference prints both.
    statuses: ClassVar[Mapping[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "metrics" in cls.__dict__:
            cls.metric_names = tuple(m.name for m in cls.metrics if m.threshold)

    @classmethod
    def partial(cls) -> str:
        """The template of this kind's card section."""
        return f"checks/{cls.kind}.html.j2"

    @classmethod
    def headline(cls, result: ResultView) -> str:
        """One line that says what the check measured (card summary and CLI)."""
        return ", ".join(f"{k}={v}" for k, v in dict(result.metrics).items())

    @classmethod
    def figures(cls, result: ResultView) -> dict[str, str]:
        """Inline SVG figures for the card section, by name (none by default)."""
        return {}

    @classmethod
    def section_figures(cls, results: Sequence[ResultView]) -> dict[str, str]:
        """Inline SVG figures over all of this kind's checks, by name (none by default)."""
        return {}


CONFIDENCE_FAMILY = "Coverage, confident mistakes and suspect-model checks"
CORRUPTION_FAMILY = "Corruption properties (noise, geometric, colour, stickers)"

#: The metrics :func:`certify.checks.confidence.worst_case_coverage` adds to a check's result.
WORST_CASE_METRICS = (
    Metric("worst_case_accuracy_at_coverage", "accuracy at the coverage level over each "
           "sample's worst case (Brown et al. 2018)", "higher"),
    Metric("worst_case_coverage", "the coverage level of the worst-case accuracy", unit="score"),
)

#: The brittle score's decision-target variant, in words.
DECISION_VARIANT = ("decision-target variant (not Vora et al.'s target): the same LIME fit on 1 "
                    "where the masked image's top class is still the model's top class on the "
                    "unmasked image, else 0; a positive scaling of the logits leaves it "
                    "unchanged")


class SanityKind(Kind):
    """The sanity probe (:class:`certify.checks.sanity.Sanity`)."""

    name: ClassVar[str] = "Sanity"
    kind: ClassVar[str] = "sanity"
    role: ClassVar[Role] = Role.SUSPECT
    glance_group: ClassVar[str] = "Clean, coverage and confidence"
    family: ClassVar[str] = CONFIDENCE_FAMILY
    metrics: ClassVar[tuple[Metric, ...]] = (
        Metric("nondeterministic_share", "share of samples whose repeated queries differ, on "
               "the sample or near its decision boundary", "lower", threshold=True),
        Metric("boundary_nondeterministic_share", "share of samples whose repeated queries "
               "differ near the decision boundary", "lower", optional=True),
        Metric("saturated_share", "share of samples with a saturated top probability", "lower",
               threshold=True),
        Metric("label_flip_share", "share of samples whose label changed between repeats, on "
               "the sample or near its decision boundary", "lower"),
        Metric("one_hot_share", "share of samples answered one-hot", "lower"),
        Metric("boundary_margin_median", "median top-2 probability margin of the "
               "near-boundary inputs", unit="score", optional=True),
        Metric("quantised", "1 when small random noise moved the outputs in steps or not at "
               "all (quantised scores), else 0", unit="count", optional=True),
        Metric("quantisation_identical_share", "share of the quantisation probe's noise draws "
               "answered bit-identically", optional=True),
        Metric("n", "samples evaluated", unit="count"),
    )
    statuses: ClassVar[Mapping[str, str]] = {
        "WARN": "a suspect behaviour was found, one warning each: randomised outputs (repeated "
                "queries differ, on the sample or near its decision boundary), saturated or "
                "one-hot outputs, probabilities instead of logits, quantised scores. On a "
                "randomised model no attack row can PASS (WARN at best); with quantised scores "
                "no score-based attack row can PASS on its own",
        "INFO": "no threshold, and no suspect behaviour found",
        "PASS": "a threshold on nondeterministic_share or saturated_share is met and nothing "
                "warned",
    }


    @classmethod
    def headline(cls, result: ResultView) -> str:
        """How many suspect behaviours were found."""
        found = len(result.warnings)
        probe = (" and near their decision boundaries"
                 if result.metrics.boundary_nondeterministic_share is not None else "")
        return (f"{found} suspect behaviour(s) found" if found else "no suspect behaviour "
                "found (randomness, saturation, probability outputs)") + \
            f" on {result.metrics.n} samples{probe}, {result.details['repeats']} repeats each"


class CleanAccuracyKind(Kind):
    """Clean accuracy (:class:`certify.checks.clean.CleanAccuracy`)."""

    name: ClassVar[str] = "CleanAccuracy"
    kind: ClassVar[str] = "clean_accuracy"
    role: ClassVar[Role] = Role.CLEAN
    glance_group: ClassVar[str] = "Clean, coverage and confidence"
    family: ClassVar[str] = "Clean accuracy"
    metrics: ClassVar[tuple[Metric, ...]] = (
        Metric("accuracy", "top-1 accuracy on clean data", "higher", threshold=True),
        Metric("n", "samples evaluated", unit="count"),
        Metric("correct", "correctly classified samples", unit="count"),
    )
    compare_outcomes = {"accuracy": ("correct", "higher")}
    export: ClassVar[ExportMetric | None] = ExportMetric("accuracy", "accuracy", "Clean accuracy")
    chance_metric: ClassVar[str | None] = "accuracy"
    statuses: ClassVar[Mapping[str, str]] = {
        "PASS": "the accuracy's Wilson interval meets the threshold",
        "INCONCLUSIVE": "the interval straddles the threshold: the row gives about how many "
                        "samples would decide it at the observed accuracy",
        "WARN": "a warning, e.g. an accuracy at chance level where another input "
                "preprocessing is clearly better (the warning names it)",
    }


    @classmethod
    def headline(cls, result: ResultView) -> str:
        """Accuracy with its interval."""
        return (f"accuracy {pct(result.metrics.accuracy)} "
                f"(95% CI {interval_text(result.intervals['accuracy'])})")

    @classmethod
    def figures(cls, result: ResultView) -> dict[str, str]:
        """Per-class accuracy as a bar chart."""
        from certify.figures import per_class_svg

        return {"per_class": per_class_svg(result.details["per_class"])}


class CoverageKind(Kind):
    """Accuracy at a coverage level and confident mistakes
    (:class:`certify.checks.confidence.Coverage`)."""

    name: ClassVar[str] = "Coverage"
    kind: ClassVar[str] = "coverage"
    glance_group: ClassVar[str] = "Clean, coverage and confidence"
    family: ClassVar[str] = CONFIDENCE_FAMILY
    metrics: ClassVar[tuple[Metric, ...]] = (
        Metric("accuracy_at_coverage", "accuracy on the answered inputs", "higher",
               threshold=True),
        Metric("confident_mistake_rate", "share of inputs that are wrong with a confidence at "
               "or above the cut-off", "lower", threshold=True),
        Metric("coverage", "share of inputs answered", unit="score"),
        Metric("answered", "inputs answered", unit="count"),
        Metric("n", "samples evaluated", unit="count"),
        Metric("explicit_abstentions", "predictions of the abstain class", unit="count"),
        Metric("confident_mistakes", "confident mistakes", unit="count"),
        Metric("accuracy_full_coverage", "accuracy without abstaining", "higher"),
    )
    compare_outcomes = {"confident_mistake_rate": ("confident_mistake", "lower")}
    method: ClassVar[str] = ("2: confidence is the top-two margin; a confident mistake is at or "
                             "above the clean coverage quantile unless a fixed threshold is set")
    # typed as what it is: accuracy on the answered share is not the model's accuracy
    export: ClassVar[ExportMetric | None] = ExportMetric(
        "accuracy_at_coverage", "accuracy_at_coverage", "Accuracy at coverage")
    statuses: ClassVar[Mapping[str, str]] = {
        "PASS": "the threshold (usually a most confident_mistake_rate) is met on its interval",
        "SKIPPED": "the model returns labels only: there is no confidence to abstain on",
    }


    @classmethod
    def headline(cls, result: ResultView) -> str:
        """Accuracy at coverage and the confident-mistake rate."""
        m, d = result.metrics, result.details
        return (f"accuracy {pct(m.accuracy_at_coverage)} at {pct(m.coverage)} coverage "
                f"(full coverage {pct(m.accuracy_full_coverage)}); confident mistakes "
                f"{pct(m.confident_mistake_rate)} ({d.get('cutoff_rule') or 'at ≥ '}"
                f"{'' if d.get('cutoff_rule') else format(d['confidence_threshold'], 'g')})")


class _CorruptionFamily(Kind):
    """What a corruption property and a pair of them share: their family and glance group."""

    role: ClassVar[Role] = Role.PROPERTY
    family: ClassVar[str] = CORRUPTION_FAMILY
    glance_group: ClassVar[str] = "Corruptions"


class CorruptionKind(_CorruptionFamily):
    """One corruption property within a bound (:class:`certify.checks.corruption.Corruption`)."""

    name: ClassVar[str] = "Corruption"
    kind: ClassVar[str] = "corruption"
    metrics: ClassVar[tuple[Metric, ...]] = (
        Metric("robustness_score", "share of correctly classified samples that stay correct "
               "for every transform the search tried within the bound", "higher",
               threshold=True),
        *WORST_CASE_METRICS,
        Metric("n_evaluated", "correctly classified samples searched", unit="count"),
        Metric("n_robust", "samples robust within the bound", unit="count"),
        Metric("n_misclassified", "samples wrong before any transform", unit="count"),
        Metric("n_not_applicable", "samples the property does not apply to", unit="count"),
        Metric("candidates", "transforms tried per sample at most (every round)",
               unit="count"),
        # optional: results written before the search had rounds (issue 29) lack them
        Metric("rounds", "search rounds run", unit="count", optional=True),
        Metric("late_breaks", "samples first broken by the last round", unit="count",
               optional=True),
        # random corruptions (issue 40): decided per sample at a stated confidence
        Metric("n_undecided", "samples neither shown robust nor not robust within max_draws "
               "draws (a random corruption)", unit="count", optional=True),
        Metric("mean_accuracy_under_noise", "average accuracy under the noise at the bound "
               "over all samples (each sample's first draws; a random corruption)", "higher",
               threshold=True, optional=True),
        Metric("delta", "the failure probability a robust sample may have under the noise",
               optional=True),
        Metric("confidence", "the confidence of each sample's decision", optional=True),
        Metric("mean_draws", "noise draws per searched sample at the bound, on average",
               unit="queries", optional=True),
    )
    compare_outcomes = {"robustness_score": ("robust", "higher")}
    export: ClassVar[ExportMetric | None] = ExportMetric("robustness_score", "robustness_score",
                                                         "Robustness score")
    method: ClassVar[str] = ("2: searched in rounds under the convergence rule; worst case the "
                             "most confident mistake")
    statuses: ClassVar[Mapping[str, str]] = {
        "PASS": "a bounded transform: the search converged (or was exhaustive) and the "
                "robustness score's interval meets the threshold; noise: the decided-robust "
                "share's interval, undecided samples counted on both sides, meets it",
        "WARN": "the search stopped on its budget before it converged (a stronger search can "
                "only lower the score), or another warning",
        "INCONCLUSIVE": "the interval straddles the threshold; for noise because of undecided "
                        "samples, which a larger max_draws would decide",
        "INFO": "no threshold: random_linf and random_l0 are information beside the attacks "
                "of the same bound, which search the worst case",
    }


    @classmethod
    def headline(cls, result: ResultView) -> str:
        """Score with its interval, the bound, the sample count and the search."""
        m, d = result.metrics, result.details
        st = d.get("statistical")
        if st:
            text = (f"robust at δ = {pct(st['delta'])} with confidence {pct(st['confidence'])}: "
                    f"{pct(m.robustness_score)} (95% CI "
                    f"{interval_text(result.intervals['robustness_score'])}, undecided counted "
                    f"both ways) at {d['bound']:g} {d['unit']}, n={m.n_evaluated}, "
                    f"{st['undecided']} undecided; average accuracy under the noise "
                    f"{pct(m.mean_accuracy_under_noise)}")
            for c in d.get("worst_case_comparison") or ():
                text += (f"; {pct(c['surviving_share'])} survive the worst-case search "
                         f"{c['attack_check']} at the same bound")
            return text
        text = (f"robustness {pct(m.robustness_score)} (95% CI "
                f"{interval_text(result.intervals['robustness_score'])}) within "
                f"{d['bound']:g} {d['unit']}, n={m.n_evaluated}")
        st = d.get("search_rounds")
        if st:
            text += (f"; searched in {len(st['rounds'])} round(s), "
                     f"{st['spent']:,} of ≤{st['budget']:,} queries per sample: "
                     + st["why"].split(":")[0])
        for c in d.get("worst_case_comparison") or ():
            text += (f"; a random draw: {pct(c['surviving_share'])} survive the worst-case "
                     f"search {c['attack_check']} at the same bound")
        return text

    @classmethod
    def figures(cls, result: ResultView) -> dict[str, str]:
        """The robustness curve over the bound, and over the search's queries."""
        from certify.figures import curve_svg, failure_bound_svg, queries_curve_svg

        st = result.details.get("statistical")
        if st:  # a random corruption: the failure probability's bound per intensity
            return {"curve": failure_bound_svg(result.details["curve"], result.details["unit"],
                                               float(st["confidence"]))}
        out = {"curve": curve_svg(result.details["curve"], result.details["unit"])}
        st = result.details.get("search_rounds")
        if st and len(st["rounds"]) > 1 and st.get("evaluated"):
            n, left, spent = st["evaluated"], st["evaluated"], 0
            curve: list[dict[str, Any]] = [{"queries": 0, "robust_accuracy": 1.0}]
            for r in st["rounds"]:  # the robust share after each round's total queries
                left, spent = left - r["broken"], spent + r["candidates"]
                curve.append({"queries": spent, "robust_accuracy": left / n})
            out["search"] = queries_curve_svg(curve, [int(p["queries"]) for p in curve[1:]])
        return out


class CorruptionPairKind(_CorruptionFamily):
    """Two corruption properties combined (:class:`certify.checks.corruption.CorruptionPair`)."""

    name: ClassVar[str] = "CorruptionPair"
    kind: ClassVar[str] = "corruption_pair"
    metrics: ClassVar[tuple[Metric, ...]] = (
        Metric("robustness_score", "share of correctly classified samples that stay correct "
               "over the joint grid of both properties", "higher", threshold=True),
        Metric("change_vs_weaker", "joint score minus the weaker property's own score",
               "higher", unit="score", threshold=True),
        Metric("score_first", "the first property's own score on its grid", "higher"),
        Metric("score_second", "the second property's own score on its grid", "higher"),
        *WORST_CASE_METRICS,
        Metric("n_evaluated", "correctly classified samples searched", unit="count"),
        Metric("n_robust", "samples robust to the combination", unit="count"),
        Metric("joint_only_failures", "samples only the combination breaks", unit="count"),
        Metric("candidates", "transforms tried per sample at most", unit="count"),
        Metric("n_undecided", "samples undecided within max_draws draws (a pair with a random "
               "corruption)", unit="count", optional=True),
    )
    compare_outcomes = {"robustness_score": ("robust", "higher")}
    export: ClassVar[ExportMetric | None] = ExportMetric("robustness_score", "robustness_score",
                                                         "Joint robustness score")
    statuses: ClassVar[Mapping[str, str]] = {
        "PASS": "the joint score's interval meets the threshold (or change_vs_weaker meets "
                "its own)",
        "INCONCLUSIVE": "the interval straddles the threshold; with noise in the pair, also "
                        "because of undecided samples",
    }


    @classmethod
    def headline(cls, result: ResultView) -> str:
        """Joint score, each property alone, and the change against the weaker."""
        m = result.metrics
        st = result.details.get("statistical")
        if st:
            return (f"joint robustness at δ = {pct(st['delta'])} with confidence "
                    f"{pct(st['confidence'])}: {pct(m.robustness_score)} (95% CI "
                    f"{interval_text(result.intervals['robustness_score'])}, "
                    f"{st['undecided']} undecided); alone {pct(m.score_first)} and "
                    f"{pct(m.score_second)}; change vs weaker "
                    f"{100 * m.change_vs_weaker:+.1f} points; {result.details['how']}")
        return (f"joint robustness {pct(m.robustness_score)}; alone "
                f"{pct(m.score_first)} and {pct(m.score_second)}; change vs weaker "
                f"{100 * m.change_vs_weaker:+.1f} points")

    @classmethod
    def section_figures(cls, results: Sequence[ResultView]) -> dict[str, str]:
        """The matrix of the combinations' joint robustness scores (checks that ran)."""
        from certify.figures import pair_matrix_svg

        pairs = [(r.details["first"], r.details["second"], float(r.metrics.robustness_score))
                 for r in results if r.status not in ("ERROR", "SKIPPED")]
        return {"matrix": pair_matrix_svg(pairs)} if pairs else {}


class AttackKind(Kind):
    """An attack validated by the binarization test (:class:`certify.checks.attack.AttackCheck`)."""

    name: ClassVar[str] = "AttackCheck"
    kind: ClassVar[str] = "attack"
    role: ClassVar[Role] = Role.ATTACK
    glance_group: ClassVar[str] = "Attacks"
    family: ClassVar[str] = "Query-based attacks validated by the binarization test"
    metrics: ClassVar[tuple[Metric, ...]] = (
        Metric("robust_accuracy", "share of all samples correct and not broken by the attack "
               "(an empirical upper bound)", "higher", threshold=True),
        Metric("attack_success_rate", "share of correctly classified samples the attack broke",
               "lower", threshold=True),
        Metric("binarization_score", "the attack's success rate on planted problems "
               "(Zimmermann et al. 2022)", "higher", threshold=True, optional=True),
        Metric("binarization_rasr", "random sampling's success rate on the same problems",
               optional=True),
        Metric("binarization_tested", "planted problems run", unit="count", optional=True),
        Metric("binarization_setup_failed", "samples where no planted problem could be built",
               unit="count", optional=True),
        Metric("n_start_failed", "samples counted robust only because the attack found no "
               "adversarial starting point (HopSkipJump)", unit="count", optional=True),
        Metric("clean_accuracy", "share of samples correct before the attack", "higher"),
        Metric("n", "samples evaluated", unit="count"),
        Metric("n_robust", "samples robust to the attack", unit="count"),
        Metric("n_broken", "samples the attack broke", unit="count"),
        Metric("queries_median", "median attack queries per attacked sample", unit="queries"),
        Metric("queries_mean", "mean attack queries per attacked sample", unit="queries"),
        Metric("queries_max", "most attack queries on one sample", unit="queries"),
        Metric("query_budget", "attack queries per sample a never-broken sample got, over all "
               "rounds", unit="queries"),
        Metric("rounds", "attack rounds run (max_queries: auto doubles the total per round)",
               unit="count"),
        Metric("gradient_evaluations", "white-box attacks: gradient evaluations of the torch "
               "copy over all samples (not model queries)", unit="count", optional=True),
        Metric("late_breaks", "samples first broken in the last half of the budget",
               unit="count", optional=True),
        Metric("approaching", "unbroken samples still being approached: their gap to success "
               "(margin, or distance beyond ε) fell in the last half by at least what is left",
               unit="count", optional=True),
        Metric("stalled", "unbroken samples with no accepted improvement in the last half of "
               "the latest run's budget", unit="count", optional=True),
        *(dataclasses.replace(m, optional=True) for m in WORST_CASE_METRICS),
        Metric("first_break_accuracy_at_coverage", "accuracy at the coverage level with each "
               "broken sample at the confidence of its first break (before the confident-"
               "mistake search): inflated, shown for comparison", optional=True),
        Metric("confident_queries_total", "queries spent raising broken samples' wrong-class "
               "confidence", unit="count", optional=True),
        Metric("worst_case_abstentions", "samples whose worst case is the model's explicit "
               "abstain class", unit="count", optional=True),
    )
    #: compare: both rates pair on "correct and not broken" over all samples
    compare_outcomes = {"robust_accuracy": ("robust", "higher"),
                        "attack_success_rate": ("robust", "higher")}
    export: ClassVar[ExportMetric | None] = ExportMetric("robust_accuracy", "robust_accuracy",
                                                         "Robust accuracy")
    statuses: ClassVar[Mapping[str, str]] = {
        "PASS": "an attack row is evidence for its threat model's row, which carries the "
                "verdict; it PASSes on its own only when its interval meets the threshold and "
                "the attack converged, passed the binarization test and (black-box) ran at "
                "least its query floor without stalling; a white-box APGD-CE row also needs a "
                "sane ε sweep",
        "WARN": "budget not converged, the binarization test failed, the ε sweep found the "
                "attack unreliable, gradient masking suspected (a black-box attack broke "
                "samples no white-box attack broke), a randomised model, or a row that is "
                "evidence and cannot PASS on its own (short of its query floor, stalled, a "
                "transfer attack from a surrogate)",
        "INCONCLUSIVE": "the interval straddles the threshold; for an unconverged or stalled "
                        "attack the row says a stronger attack can only lower it",
        "SKIPPED": "the model cannot be attacked this way: a score-based attack on a "
                   "labels-only model, a white-box attack without a torch copy or gradients "
                   "(the reason names the way out), or a decision-based attack where a "
                   "score-based one already had the scores' signal",
    }


    @classmethod
    def headline(cls, result: ResultView) -> str:
        """Robust accuracy with its interval, the threat model and the binarization test."""
        m, d = result.metrics, result.details
        bound = norm(d["norm"]).headline(d["epsilon"])
        wb = d.get("white_box")
        effort = (("transfer from the surrogate" if wb.get("transfer") else "white-box")
                  + f", {wb['iterations']} iterations × {wb['restarts']} restart(s)"
                  + (f" × {wb['targets']} target(s)" if wb.get("targets") else "")
                  + ", judged on the model" if wb else f"≤{int(m.query_budget):,} queries")
        runs = [int(r["budget"]) for r in (d.get("convergence") or {}).get("rounds", [])]
        if not wb and len(runs) > 1:
            effort = (f"runs of {', '.join(f'{b:,}' for b in runs)} queries per sample (each "
                      "round from scratch)")
        text = (f"robust accuracy {pct(m.robust_accuracy)} (95% CI "
                f"{interval_text(result.intervals['robust_accuracy'])}) under {d['attack']} at "
                f"{bound}, {effort}")
        conv = d.get("convergence")
        if conv:
            text += (f" in {int(m.rounds)} round(s), " if conv["auto"] else ", ") + \
                ("converged" if conv["converged"] else "budget not converged")
        bt = d.get("binarization")
        if bt:
            ci = result.intervals.get("binarization_score")
            ci_text = f", 95% CI {interval_text(ci)}" if ci else ""
            hardest = bt.get("hardest_passed")
            text += (f"; binarization test {m.binarization_score:.2f}{ci_text} "
                     f"(R-ASR {m.binarization_rasr:.2f}); hardest configuration passed: "
                     f"{hardest['label'] if hardest else 'none'}")
        elif d.get("binarization_note"):
            text += "; binarization test not available for L0 threat models"
        ev = d.get("evidence")
        if ev and ev.get("stalled"):
            text += "; stalled: the model's outputs gave the attack no signal"
        if ev and ev.get("short_of_pass"):
            text += "; evidence, not a PASS on its own"
        return text

    @classmethod
    def figures(cls, result: ResultView) -> dict[str, str]:
        """Robust accuracy against queries per sample, with the rounds' totals marked."""
        from certify.figures import queries_curve_svg

        conv = result.details.get("convergence")
        if not conv or result.details.get("white_box"):
            return {}
        return {"convergence": queries_curve_svg(conv["curve"],
                                                 [r["total"] for r in conv["rounds"]])}


class BrittlenessKind(Kind):
    """The LIME brittle score (:class:`certify.checks.brittleness.Brittleness`)."""

    name: ClassVar[str] = "Brittleness"
    kind: ClassVar[str] = "brittleness"
    family: ClassVar[str] = "Black-box brittle score (LIME)"
    metrics: ClassVar[tuple[Metric, ...]] = (
        Metric("brittle_score", "mean L1 norm of LIME weights per superpixel (Vora et al. "
               "2023, Eq. 2), SLIC superpixels; its target, the probability of the top class, "
               "moves with the scale of the logits", "lower", unit="score", threshold=True),
        Metric("relative_improvement", "R.I. = (reference - model) / reference (Eq. 3) on the "
               "decision-target variant (brittle_score_decision), which a positive scaling of "
               "the logits leaves unchanged; SLIC; positive: this model scores lower",
               "higher", unit="score", threshold=True, optional=True),
        Metric("reference_brittle_score", "the reference model's brittle score", "lower",
               unit="score", optional=True),
        Metric("brittle_score_grid", "brittle score on a regular grid of square cells",
               "lower", unit="score"),
        Metric("relative_improvement_grid", "R.I. on the decision-target variant, grid "
               "segmentation", "higher", unit="score", optional=True),
        Metric("reference_brittle_score_grid", "the reference model's grid brittle score",
               "lower", unit="score", optional=True),
        Metric("n", "samples explained", unit="count"),
        Metric("superpixels_mean", "mean superpixels per sample", unit="score"),
        Metric("brittle_score_decision", f"brittle score, {DECISION_VARIANT}; SLIC superpixels",
               "lower", unit="score", threshold=True, optional=True),
        Metric("reference_brittle_score_decision", "the reference model's brittle score, "
               "decision-target variant", "lower", unit="score", optional=True),
        Metric("brittle_score_decision_grid", "brittle score, decision-target variant, on the "
               "grid segmentation", "lower", unit="score", optional=True),
        Metric("reference_brittle_score_decision_grid", "the reference model's brittle "
               "score, decision-target variant, grid segmentation", "lower", unit="score",
               optional=True),
        Metric("relative_improvement_probability", "Vora et al.'s R.I. (Eq. 3) on their "
               "target (brittle_score, the probability of the top class): moves with the "
               "scale of the logits; SLIC", "higher", unit="score", threshold=True,
               optional=True),
        Metric("relative_improvement_probability_grid", "Vora et al.'s R.I. on the grid "
               "segmentation: moves with the scale of the logits", "higher", unit="score",
               optional=True),
    )
    compare_values = {"brittle_score": "l1_per_dim", "brittle_score_grid": "grid_l1_per_dim",
                      "brittle_score_decision": "decision_l1_per_dim",
                      "brittle_score_decision_grid": "grid_decision_l1_per_dim"}
    export: ClassVar[ExportMetric | None] = ExportMetric("brittle_score", "brittle_score",
                                                         "Brittle score (LIME)")
    statuses: ClassVar[Mapping[str, str]] = {
        "INFO": "no threshold: the brittle score is a hypothesis (Vora et al.: lower tracks "
                "adversarial robustness), shown as information",
        "SKIPPED": "the model returns labels only: the brittle score is defined on scores",
    }


    @classmethod
    def headline(cls, result: ResultView) -> str:
        """The brittle score with its interval; the decision-target variant; and the
        comparison with the reference in words (or "no difference resolved"), saying which
        target R.I. is on."""
        m, iv = result.metrics, result.intervals
        text = f"brittle score {m.brittle_score:.4g}"
        if iv.get("brittle_score"):
            lo, hi = iv["brittle_score"]
            text += f" (95% CI {lo:.4g}–{hi:.4g})"
        text += f" on {m.n} samples"
        variant = getattr(m, "brittle_score_decision", None)
        if variant is None:  # a result from before the variant: R.I. is Vora et al.'s
            if m.relative_improvement is not None:
                words = result.details.get("comparison", {}).get("words", "")
                text += (f"; reference {m.reference_brittle_score:.4g}, "
                         f"R.I. {100 * m.relative_improvement:+.1f}%: {words}")
            return text
        if m.relative_improvement_probability is not None:
            text += (f", reference {m.reference_brittle_score:.4g} (Vora et al.'s R.I. "
                     f"{100 * m.relative_improvement_probability:+.1f}%, which moves with the "
                     "scale of the logits)")
        text += f"; decision-target variant {variant:.4g}"
        if m.relative_improvement is not None:
            words = result.details.get("comparison", {}).get("words", "")
            text += (f", reference {m.reference_brittle_score_decision:.4g}: R.I. "
                     f"{100 * m.relative_improvement:+.1f}% on the decision-target variant, "
                     f"which a positive scaling of the logits leaves unchanged: {words}")
        return text

#: The bound methods' names on the card, weakest first (:mod:`certify.models.bound_ops`).
CERTIFIED_METHODS = {"ibp": "IBP", "crown": "CROWN", "alpha": "α-CROWN"}


class CertifiedKind(Kind):
    """A certified lower bound of robust accuracy by bound propagation
    (:class:`certify.checks.certified.Certified`)."""

    name: ClassVar[str] = "Certified"
    kind: ClassVar[str] = "certified"
    role: ClassVar[Role] = Role.BOUND
    glance_group: ClassVar[str] = "Attacks"
    family: ClassVar[str] = "Certified robustness (bound propagation)"
    metrics: ClassVar[tuple[Metric, ...]] = (
        Metric("certified_accuracy", "share of all samples correct and proved robust within "
               "the threat model (a lower bound of robust accuracy)", "higher", threshold=True),
        Metric("clean_accuracy", "share of samples correct before any perturbation", "higher"),
        Metric("n", "samples evaluated", unit="count"),
        Metric("n_certified", "samples proved robust", unit="count"),
        Metric("n_certified_ibp", "samples interval bounds (IBP) prove robust", unit="count",
               optional=True),
        Metric("n_certified_crown", "samples IBP or CROWN prove robust", unit="count",
               optional=True),
        Metric("n_certified_alpha", "samples IBP, CROWN or α-CROWN prove robust",
               unit="count", optional=True),
        Metric("n_budget", "correct samples left unproved because the time budget ran out "
               "before their last method (counted as not certified)", unit="count"),
    )
    compare_outcomes = {"certified_accuracy": ("certified", "higher")}
    export: ClassVar[ExportMetric | None] = ExportMetric(
        "certified_accuracy", "certified_accuracy", "Certified robust accuracy")
    statuses: ClassVar[Mapping[str, str]] = {
        "PASS": "the certified share's interval meets the threshold: proved, per sample, for "
                "every perturbation of the threat model",
        "INFO": "no threshold: the certified share brackets its threat model's row from below",
        "SKIPPED": "certified: not available: the model is not a graph certify can bound (a "
                   "TorchScript program or an endpoint), or its graph has an operator without "
                   "a relaxation (named)",
    }

    @classmethod
    def headline(cls, result: ResultView) -> str:
        """Certified accuracy with its interval, the threat model and the strongest method."""
        m, d = result.metrics, result.details
        bound = norm(d["norm"]).headline(d["epsilon"])
        text = (f"certified accuracy {pct(m.certified_accuracy)} (95% CI "
                f"{interval_text(result.intervals['certified_accuracy'])}) at {bound} by "
                f"{' → '.join(d['methods'])}")
        if m.n_budget:
            text += f"; {int(m.n_budget)} sample(s) unproved when the time budget ran out"
        return text


#: Every check kind's description, by its suite ``kind``, in the card's order.
KINDS: dict[str, type[Kind]] = {
    k.kind: k
    for k in (SanityKind, CleanAccuracyKind, CoverageKind, CorruptionKind, CorruptionPairKind,
              AttackKind, CertifiedKind, BrittlenessKind)
}
