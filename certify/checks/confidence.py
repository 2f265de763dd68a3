"""No confident mistakes (Brown et al. 2018).

``coverage``: accuracy at a coverage level, as on the unrestricted-adversarial-examples
leaderboard: abstain on the (1 − coverage) share of inputs with the lowest confidence, and
report accuracy on the rest; plus the confident-mistake rate (wrong with a confidence at or
above a cut-off). A model with an explicit abstain output declares its class id; predicting it
counts as abstaining.

Confidence is scale-free: the margin between the top two logits (between the top two
log-probabilities for a probability output), which a positive scaling of the logits leaves in
the same order, so every ranking by it (coverage, worst-case coverage) and the default cut-off
(the clean inputs' margin at the coverage level, a quantile) move with the scale and give the
same figures. The top-class probability moves with the logits' temperature: it is kept for
display and for a fixed ``confidence_threshold`` a suite asks for, and the card says so.

The suspect-model ``sanity`` check is in :mod:`certify.checks.sanity`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar, TypeVar

from certify.attacks.base import top_two_margin
from certify.checks.base import (
    Check,
    CheckContext,
    Measurement,
    pct,
)
from certify.data import Dataset
from certify.kinds import CoverageKind
from certify.models.base import Model, ModelInfo
from certify.params import Param, Params
from certify.rundir import SampleRecord
from certify.stats import wilson_interval

if TYPE_CHECKING:
    import torch

#: The confidence every coverage figure ranks on (the top-two margin; see the module text).
confidences = top_two_margin


def top_probability(scores: torch.Tensor, output: str) -> torch.Tensor:
    """Top-class probability ``[N]`` (softmax of logits; one-hot labels give 1.0): moves with
    the logits' temperature, so it is shown, not ranked on."""
    import torch

    p = torch.softmax(scores.float(), dim=1) if output == "logits" else scores.float()
    return p.max(dim=1).values


def margin_cutoff(margins: Sequence[float], coverage: float = 0.8) -> float | None:
    """The clean ``coverage`` quantile of the margins: the smallest margin still answered when
    the least confident ``1 - coverage`` share abstains (``None`` for no margins)."""
    ranked = sorted(margins, reverse=True)
    keep = math.ceil(coverage * len(ranked) - 1e-9)
    return ranked[keep - 1] if keep else None


#: The coverage level at which corruption and attack results are also reported.
COVERAGE = 0.8


class ConfidenceRecord(SampleRecord, total=False):
    """A record with the model's confidence on the sample's worst case (``confidence``: the
    top-two margin of :func:`confidences`), its top probability there (``probability``, shown,
    never ranked on) and whether that answer was the model's explicit abstain class
    (``abstained``)."""

    confidence: float
    probability: float
    abstained: bool


#: A record type that carries ``confidence`` and ``abstained``.
C = TypeVar("C", bound=ConfidenceRecord)


def worst_case_coverage(records: Sequence[C], right: Callable[[C], bool],
                        coverage: float = COVERAGE) -> dict[str, float]:
    """Accuracy at ``coverage`` over each sample's worst case (Brown et al. 2018).

    Each record carries ``confidence`` (the model's top-two margin on the sample's worst case:
    the most confident mistake found, or the least confident correct answer);
    ``right(record)`` says whether the model was right there. The least confident
    ``1 - coverage`` share abstains. A record marked ``abstained`` (its worst case is the
    model's explicit abstain class) ranks below every answer and is never counted as answered,
    as in the clean :class:`Coverage` check.
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
    """A coverage record: the label and the predicted class (``confidence`` is its margin,
    ``probability`` its top probability)."""

    label: int
    pred: int


class Coverage(CoverageKind, Check[CoverageRecord]):
    """Accuracy at a coverage level and the confident-mistake rate on clean data.

    Parameters: ``coverage`` (share of inputs answered; 0.8), ``confidence_threshold`` (unset:
    a confident mistake is a mistake the model answers at the coverage level, i.e. with a
    top-two margin at or above the clean ``coverage`` quantile of the margins, which does not
    move with the logits' scale; a number in (0, 1]: a fixed cut-off on the top-class
    probability, which does, and the card says so), ``abstain_class`` (class id of an explicit
    abstain output, if the model has one). One query per sample.
    """


    suite_params: ClassVar[Params] = Params(
        Param("coverage", float, COVERAGE,
              "the share of inputs answered; the model abstains on the rest, its least "
              "confident by the top-two margin", low=0, low_open=True, high=1),
        Param("confidence_threshold", float | None, None,
              "unset: a confident mistake is a mistake answered at the coverage level (top-two "
              "margin at or above the clean coverage quantile, which a positive scaling of the "
              "logits keeps); a number: a fixed cut-off on the top-class probability, which "
              "moves with the logits' scale (the card says so)",
              low=0, low_open=True, high=1),
        Param("abstain_class", int | None, None,
              "the class id of the model's explicit abstain output, if it has one: predicting "
              "it counts as abstaining in every check's coverage figures, never as an answer",
              low=0),
    )

    def __init__(self, coverage: float = COVERAGE, confidence_threshold: float | None = None,
                 abstain_class: int | None = None) -> None:
        self.coverage = coverage
        self.confidence_threshold = confidence_threshold
        self.abstain_class = abstain_class

    def skip_reason(self, info: ModelInfo) -> str | None:
        """A labels-only model has no confidence to abstain on: skipped."""
        if info.output == "labels":
            return (f"coverage needs scores to rank inputs by confidence; {info.name} returns "
                    "labels only")
        return None

    def run_batch(self, model: Model, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
                  ctx: CheckContext) -> list[CoverageRecord]:
        scores = model.predict(x).cpu()
        conf = confidences(scores, model.info.output)
        prob = top_probability(scores, model.info.output)
        pred = scores.argmax(1)
        return [{"pred": int(p), "label": int(t), "confidence": float(c),
                 "probability": float(q), "queries": 1,
                 "abstained": self.abstain_class is not None and int(p) == self.abstain_class}
                for p, t, c, q in zip(pred.tolist(), y.cpu().tolist(), conf.tolist(),
                                      prob.tolist(), strict=True)]

    def _confident(self, records: Sequence[CoverageRecord]) -> tuple[list[bool], float | None]:
        """Per record: a confident mistake; and the margin cut-off (``None`` for a fixed
        probability threshold or no answered input)."""
        correct = [r["pred"] == r["label"] and not r["abstained"] for r in records]
        t = self.confidence_threshold
        if t is not None:  # a fixed top-class probability (older records: the confidence)
            return [not c and not r["abstained"] and r.get("probability", r["confidence"]) >= t
                    for c, r in zip(correct, records, strict=True)], None
        cut = margin_cutoff([r["confidence"] for r in records if not r["abstained"]],
                            self.coverage)
        return [cut is not None and not c and not r["abstained"] and r["confidence"] >= cut
                for c, r in zip(correct, records, strict=True)], cut

    def outcome_bits(self, records: list[CoverageRecord]) -> dict[str, list[bool]]:
        """Per sample: correct, and a confident mistake."""
        correct = [r["pred"] == r["label"] and not r["abstained"] for r in records]
        return {"correct": correct, "confident_mistake": self._confident(records)[0]}

    def summarize(self, records: list[CoverageRecord], data: Dataset) -> Measurement:
        n = len(records)
        # explicit abstentions rank below every answer; then the least confident abstain
        conf = [float("-inf") if r["abstained"] else r["confidence"] for r in records]
        correct = [r["pred"] == r["label"] and not r["abstained"] for r in records]
        keep = math.ceil(self.coverage * n - 1e-9)
        kept = [i for i in sorted(range(n), key=lambda i: (-conf[i], i))[:keep]
                if not records[i]["abstained"]]
        hits = sum(correct[i] for i in kept)
        confident, cut = self._confident(records)
        wrong_confident = sum(confident)
        fixed = self.confidence_threshold is not None
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
                     "margin_cutoff": cut,
                     "cutoff_rule": None if fixed else
                     f"margin ≥ the clean {pct(self.coverage)}-coverage quantile",
                     "fixed_threshold": fixed,
                     "abstain_class": self.abstain_class,
                     "confidence": CONFIDENCE_TEXT,
                     "scale": ("a fixed top-class probability: moves with the logits' scale "
                               "(temperature)" if fixed else
                               "scale-free: a positive scaling of the logits changes no "
                               "figure")},
        )


#: What "confidence" means on the card.
CONFIDENCE_TEXT = ("the margin between the top two logits (log-probabilities for a probability "
                   "output); a positive scaling of the logits keeps its order")


class WorstSeen:
    """Per sample of a batch, over the candidates (or draws) tried in order: the first that
    broke it (-1 if none) and its prediction, the most confident mistake (-1 if none) with its
    prediction, margin and top probability, and the least confident correct answer's margin
    and probability. What a corruption search and a random corruption's draws both keep."""

    def __init__(self, b: int) -> None:
        import torch

        self.first = torch.full((b,), -1, dtype=torch.long)
        self.first_pred = torch.full((b,), -1, dtype=torch.long)
        self.worst = torch.full((b,), -1, dtype=torch.long)
        self.worst_pred = torch.full((b,), -1, dtype=torch.long)
        self.worst_conf = torch.full((b,), -math.inf)
        self.worst_prob = torch.full((b,), math.nan)
        self.least_conf = torch.full((b,), math.inf)
        self.least_prob = torch.full((b,), math.nan)

    def update(self, rows: torch.Tensor, t: int, bad: torch.Tensor, conf: torch.Tensor,
               pred: torch.Tensor, prob: torch.Tensor) -> None:
        """Candidate ``t``'s answers for the samples ``rows``: failed, margin, prediction and
        top probability, each ``[len(rows)]``."""
        new = bad & (self.first[rows] < 0)
        self.first[rows[new]] = t
        self.first_pred[rows[new]] = pred[new]
        more = bad & (conf > self.worst_conf[rows])
        self.worst[rows[more]] = t
        self.worst_pred[rows[more]] = pred[more]
        self.worst_conf[rows[more]] = conf[more]
        self.worst_prob[rows[more]] = prob[more]
        less = ~bad & (conf < self.least_conf[rows])
        self.least_conf[rows[less]] = conf[less]
        self.least_prob[rows[less]] = prob[less]

    def finish(self) -> None:
        """NaN margins where no mistake, or no correct answer, was seen."""
        self.worst_conf[self.worst < 0] = math.nan
        self.least_conf[self.least_conf.isinf()] = math.nan
