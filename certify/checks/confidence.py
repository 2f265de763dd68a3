"""No confident mistakes (Brown et al. 2018).

``coverage``: accuracy at a coverage level, as on the unrestricted-adversarial-examples
leaderboard: abstain on the (1 − coverage) share of inputs with the lowest top score, and
report accuracy on the rest; plus the confident-mistake rate (wrong with top score at or above
a threshold). A model with an explicit abstain output declares its class id; predicting it
counts as abstaining.

The suspect-model ``sanity`` check is in :mod:`certify.checks.sanity`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import ClassVar, TypeVar

import torch

from certify.checks.base import (
    Check,
    CheckContext,
    ExportMetric,
    Measurement,
    Metric,
    ResultView,
    pct,
)
from certify.data import Dataset
from certify.errors import SuiteError
from certify.models.base import Model, ModelInfo
from certify.rundir import SampleRecord
from certify.stats import wilson_interval


def confidences(scores: torch.Tensor, output: str) -> torch.Tensor:
    """Top-class probability ``[N]`` (softmax of logits; one-hot labels give 1.0)."""
    p = torch.softmax(scores.float(), dim=1) if output == "logits" else scores.float()
    return p.max(dim=1).values


FAMILY = "Coverage, confident mistakes and suspect-model checks"

#: The coverage level at which corruption and attack results are also reported.
COVERAGE = 0.8


#: The metrics :func:`worst_case_coverage` adds to a check's result.
WORST_CASE_METRICS = (
    Metric("worst_case_accuracy_at_coverage", "accuracy at the coverage level over each "
           "sample's worst case (Brown et al. 2018)", "higher"),
    Metric("worst_case_coverage", "the coverage level of the worst-case accuracy", unit="score"),
)


class ConfidenceRecord(SampleRecord, total=False):
    """A record with the model's top probability on the sample's worst case (``confidence``)
    and whether that answer was the model's explicit abstain class (``abstained``)."""

    confidence: float
    abstained: bool


#: A record type that carries ``confidence`` and ``abstained``.
C = TypeVar("C", bound=ConfidenceRecord)


def worst_case_coverage(records: Sequence[C], right: Callable[[C], bool],
                        coverage: float = COVERAGE) -> dict[str, float]:
    """Accuracy at ``coverage`` over each sample's worst case (Brown et al. 2018).

    Each record carries ``confidence`` (the model's top probability on the sample's worst case:
    the breaking input, or the least confident correct one); ``right(record)`` says whether the
    model was right there. The least confident ``1 - coverage`` share abstains. A record marked
    ``abstained`` (its worst case is the model's explicit abstain class) ranks below every
    answer and is never counted as answered, as in the clean :class:`Coverage` check.
    """
    rows = [(float("-inf") if r.get("abstained") else r["confidence"],
             bool(right(r)) and not r.get("abstained"), bool(r.get("abstained")))
            for r in records
            if r.get("confidence") is not None and r.get("outcome") != "not_applicable"]
    keep = math.ceil(coverage * len(rows) - 1e-9)
    kept = [i for i in sorted(range(len(rows)), key=lambda i: (-rows[i][0], i))[:keep]
            if not rows[i][2]]
    return {"worst_case_accuracy_at_coverage":
            sum(rows[i][1] for i in kept) / len(kept) if kept else 0.0,
            "worst_case_coverage": coverage}


class CoverageRecord(ConfidenceRecord, total=False):
    """A coverage record: the label and the predicted class (``confidence`` is its score)."""

    label: int
    pred: int


class Coverage(Check[CoverageRecord]):
    """Accuracy at a coverage level and the confident-mistake rate on clean data.

    Parameters: ``coverage`` (share of inputs answered; 0.8), ``confidence_threshold`` (a
    mistake at or above it is a confident mistake; 0.9), ``abstain_class`` (class id of an
    explicit abstain output, if the model has one). One query per sample.
    """

    kind: ClassVar[str] = "coverage"
    glance_group: ClassVar[str] = "Clean, coverage and confidence"
    family: ClassVar[str] = FAMILY
    metrics: ClassVar[tuple[Metric, ...]] = (
        Metric("accuracy_at_coverage", "accuracy on the answered inputs", "higher",
               threshold=True),
        Metric("confident_mistake_rate", "share of inputs that are wrong with a top probability "
               "at or above the confidence threshold", "lower", threshold=True),
        Metric("coverage", "share of inputs answered", unit="score"),
        Metric("answered", "inputs answered", unit="count"),
        Metric("n", "samples evaluated", unit="count"),
        Metric("explicit_abstentions", "predictions of the abstain class", unit="count"),
        Metric("confident_mistakes", "confident mistakes", unit="count"),
        Metric("accuracy_full_coverage", "accuracy without abstaining", "higher"),
    )
    compare_outcomes = {"confident_mistake_rate": ("confident_mistake", "lower")}
    # typed as what it is: accuracy on the answered share is not the model's accuracy
    export: ClassVar[ExportMetric | None] = ExportMetric(
        "accuracy_at_coverage", "accuracy_at_coverage", "Accuracy at coverage")

    def __init__(self, coverage: float = 0.8, confidence_threshold: float = 0.9,
                 abstain_class: int | None = None) -> None:
        self.coverage = coverage
        self.confidence_threshold = confidence_threshold
        self.abstain_class = abstain_class

    def check_params(self, where: str) -> None:
        """Validate the parameters when the suite loads."""
        if not isinstance(self.coverage, int | float) or not 0 < self.coverage <= 1:
            raise SuiteError(f"{where}: coverage must be in (0, 1]", hint="e.g. 0.8")
        if not isinstance(self.confidence_threshold, int | float) or not \
                0 < self.confidence_threshold <= 1:
            raise SuiteError(f"{where}: confidence_threshold must be in (0, 1]", hint="e.g. 0.9")
        if self.abstain_class is not None and (not isinstance(self.abstain_class, int)
                                               or self.abstain_class < 0):
            raise SuiteError(f"{where}: abstain_class must be a class id", hint="e.g. 43")

    def skip_reason(self, info: ModelInfo) -> str | None:
        """A labels-only model has no confidence to abstain on: skipped."""
        if info.output == "labels":
            return (f"coverage needs scores to rank inputs by confidence; {info.name} returns "
                    "labels only")
        return None

    def run_batch(self, model: Model, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
                  ctx: CheckContext) -> list[CoverageRecord]:
        scores = model.predict(x)
        conf = confidences(scores, model.info.output).cpu()
        pred = scores.argmax(1).cpu()
        return [{"pred": int(p), "label": int(t), "confidence": float(c), "queries": 1,
                 "abstained": self.abstain_class is not None and int(p) == self.abstain_class}
                for p, t, c in zip(pred.tolist(), y.cpu().tolist(), conf.tolist(), strict=True)]

    @classmethod
    def headline(cls, result: ResultView) -> str:
        """Accuracy at coverage and the confident-mistake rate."""
        m = result.metrics
        return (f"accuracy {pct(m.accuracy_at_coverage)} at {pct(m.coverage)} coverage "
                f"(full coverage {pct(m.accuracy_full_coverage)}); confident mistakes "
                f"{pct(m.confident_mistake_rate)} at ≥ "
                f"{result.details['confidence_threshold']:g}")

    def outcome_bits(self, records: list[CoverageRecord]) -> dict[str, list[bool]]:
        """Per sample: correct, and a confident mistake."""
        correct = [r["pred"] == r["label"] and not r["abstained"] for r in records]
        return {"correct": correct,
                "confident_mistake": [not c and not r["abstained"]
                                      and r["confidence"] >= self.confidence_threshold
                                      for c, r in zip(correct, records, strict=True)]}

    def summarize(self, records: list[CoverageRecord], data: Dataset) -> Measurement:
        n = len(records)
        # explicit abstentions rank below every answer; then the least confident abstain
        conf = [float("-inf") if r["abstained"] else r["confidence"] for r in records]
        correct = [r["pred"] == r["label"] and not r["abstained"] for r in records]
        keep = math.ceil(self.coverage * n - 1e-9)
        kept = [i for i in sorted(range(n), key=lambda i: (-conf[i], i))[:keep]
                if not records[i]["abstained"]]
        hits = sum(correct[i] for i in kept)
        wrong_confident = sum(not correct[i] and not records[i]["abstained"]
                              and conf[i] >= self.confidence_threshold for i in range(n))
        return Measurement(
            metrics={"accuracy_at_coverage": hits / len(kept) if kept else 0.0,
                     "coverage": self.coverage, "answered": len(kept), "n": n,
                     "explicit_abstentions": sum(r["abstained"] for r in records),
                     "confident_mistake_rate": wrong_confident / n if n else 0.0,
                     "confident_mistakes": wrong_confident,
                     "accuracy_full_coverage": sum(correct) / n if n else 0.0},
            intervals={"accuracy_at_coverage": wilson_interval(hits, len(kept)),
                       "confident_mistake_rate": wilson_interval(wrong_confident, n)},
            details={"confidence_threshold": self.confidence_threshold,
                     "abstain_class": self.abstain_class,
                     "confidence": "top-class probability (softmax of logits)"},
        )
