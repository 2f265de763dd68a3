"""What each check kind *is*, apart from how it computes: its metrics, its family and glance
group, its ``model-index`` export, how ``certify compare`` pairs it, and its card template.

This is what the results schema (:mod:`certify.results`), ``certify verify``, ``certify
compare`` and the export read; it imports no torch, onnxruntime, kornia or scikit-image, so a
verifier needs none of them. Each compute class (:mod:`certify.checks`) inherits its kind's
description; the engine imports the compute classes. The card's per-kind text (headline and
figures) is drawn by the compute classes, which rendering imports.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


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
        "confidence from noise draws at its bound (issue 40): its figure is a statement about "
        "the noise's distribution, not a worst case")

    def converged(self) -> bool | None:
        """Whether the figure's search converged: ``False`` when a search or an attack had not
        (or stalled), ``True`` when one did, ``None`` for a figure that is not a search."""
        if self.search_converged is False or self.attack_converged is False or self.stalled:
            return False
        if self.search_converged or self.attack_converged:
            return True
        return None


class Kind:
    """A check kind's description (subclassed once per kind, then by its compute class)."""

    kind: ClassVar[str] = ""
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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "metrics" in cls.__dict__:
            cls.metric_names = tuple(m.name for m in cls.metrics if m.threshold)

    @classmethod
    def partial(cls) -> str:
        """The template of this kind's card section."""
        return f"checks/{cls.kind}.html.j2"


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


class CleanAccuracyKind(Kind):
    """Clean accuracy (:class:`certify.checks.clean.CleanAccuracy`)."""

    name: ClassVar[str] = "CleanAccuracy"
    kind: ClassVar[str] = "clean_accuracy"
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


class CorruptionKind(Kind):
    """One corruption property within a bound (:class:`certify.checks.corruption.Corruption`)."""

    name: ClassVar[str] = "Corruption"
    kind: ClassVar[str] = "corruption"
    family: ClassVar[str] = CORRUPTION_FAMILY
    glance_group: ClassVar[str] = "Corruptions"
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


class CorruptionPairKind(Kind):
    """Two corruption properties combined (:class:`certify.checks.corruption.CorruptionPair`)."""

    name: ClassVar[str] = "CorruptionPair"
    kind: ClassVar[str] = "corruption_pair"
    family: ClassVar[str] = CORRUPTION_FAMILY
    glance_group: ClassVar[str] = "Corruptions"
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


class AttackKind(Kind):
    """An attack validated by the binarization test (:class:`certify.checks.attack.AttackCheck`)."""

    name: ClassVar[str] = "AttackCheck"
    kind: ClassVar[str] = "attack"
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


#: Every check kind's description, by its suite ``kind``, in the card's order.
KINDS: dict[str, type[Kind]] = {
    k.kind: k
    for k in (SanityKind, CleanAccuracyKind, CoverageKind, CorruptionKind, CorruptionPairKind,
              AttackKind, BrittlenessKind)
}
