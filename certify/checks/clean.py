"""Clean accuracy: how often the model is right on unperturbed data."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from certify.checks.base import (
    Check,
    CheckContext,
    Measurement,
)
from certify.data import Dataset
from certify.kinds import CleanAccuracyKind
from certify.models.base import Model
from certify.params import Param, Params
from certify.rundir import SampleRecord
from certify.stats import wilson_interval

if TYPE_CHECKING:
    import torch


class CleanRecord(SampleRecord, total=False):
    """A clean-accuracy record: the label, the predicted class and its score."""

    label: int
    pred: int
    score: float


class CleanAccuracy(CleanAccuracyKind, Check[CleanRecord]):
    """Top-1 accuracy on the evaluation data, with a 95% Wilson interval.

    Threat model: none (clean inputs). One query per sample. Also reports per-class accuracy and
    the ``top_confusions`` most frequent (true, predicted) pairs among the mistakes.
    """


    suite_params: ClassVar[Params] = Params(
        Param("top_confusions", int, 5,
              "how many of the most frequent (true, predicted) pairs among the mistakes the "
              "card lists"),
    )

    def __init__(self, top_confusions: int = 5) -> None:
        self.top_confusions = top_confusions

    def run_batch(
        self, model: Model, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
        ctx: CheckContext,
    ) -> list[CleanRecord]:
        scores = model.predict(x)
        top, pred = scores.max(dim=1)
        return [
            {
                "outcome": "correct" if int(p) == int(t) else "wrong",
                "label": int(t),
                "pred": int(p),
                "score": float(s),
                "queries": 1,
            }
            for p, t, s in zip(pred.tolist(), y.tolist(), top.tolist(), strict=True)
        ]

    def outcome_bits(self, records: list[CleanRecord]) -> dict[str, list[bool]]:
        """``correct`` per sample."""
        return {"correct": [r["outcome"] == "correct" for r in records]}

    def summarize(self, records: list[CleanRecord], data: Dataset) -> Measurement:
        n = len(records)
        correct = sum(r["outcome"] == "correct" for r in records)
        per_class: dict[int, list[int]] = {}
        for r in records:
            c = per_class.setdefault(r["label"], [0, 0])
            c[0] += r["outcome"] == "correct"
            c[1] += 1
        confusions = Counter(
            (r["label"], r["pred"]) for r in records if r["outcome"] != "correct"
        ).most_common(self.top_confusions)
        names = data.class_names
        return Measurement(
            metrics={"accuracy": correct / n if n else 0.0, "n": n, "correct": correct},
            intervals={"accuracy": wilson_interval(correct, n)},
            details={
                "per_class": [
                    {"class": k, "name": names[k], "n": v[1], "accuracy": v[0] / v[1]}
                    for k, v in sorted(per_class.items())
                ],
                "confusions": [
                    {"true": t, "true_name": names[t], "pred": p,
                     "pred_name": names[p] if 0 <= p < len(names) else str(p), "count": c}
                    for (t, p), c in confusions
                ],
            },
        )
