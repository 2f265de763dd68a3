"""The check interface.

A check is built from its suite parameters (the constructor stores them and does nothing else),
validated against the :class:`~certify.models.ModelInfo` when the suite loads, then run by the
runner one batch of samples at a time. ``run_batch`` returns one record per sample; ``summarize``
turns all records of the check into a :class:`Measurement`. Thresholds, verdicts, seeding, query
budgets, timing and error handling belong to the runner, not to checks.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from certify.data import Dataset
from certify.errors import SuiteError
from certify.models.base import Model, ModelInfo
from certify.perturbations.base import mix_seed
from certify.validation import expect


@dataclass
class Measurement:
    """What a check measured: headline metrics, their intervals, and detail for the card."""

    metrics: dict[str, float]
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    #: Reasons not to trust the measured value (the runner turns a PASS into WARN).
    warnings: list[str] = field(default_factory=list)


@dataclass
class CheckContext:
    """What the runner gives a check for one batch: seeds, device and class names."""

    check_seed: int
    device: torch.device
    class_names: Sequence[str]
    flip_invariant_classes: frozenset[int] = frozenset()
    n_samples: int = 0
    #: A reference model to compare against (``--reference``), counted separately.
    reference: Any = None

    def seed(self, sample_index: int, *more: int) -> int:
        """The seed of one random draw: from (suite seed, check id), the sample and ``more``.

        Independent of batching and sharding, so a sample's result never depends on which
        other samples were processed with it.
        """
        return mix_seed(self.check_seed, sample_index, *more)


class Check:
    """Base class of all checks; subclasses set ``kind`` and write ``run_batch``/``summarize``."""

    kind: ClassVar[str] = ""
    #: The metrics a suite threshold may name.
    metric_names: ClassVar[tuple[str, ...]] = ()

    def get_params(self) -> dict[str, Any]:
        """The constructor parameters, exactly as given in the suite (scikit-learn style)."""
        sig = inspect.signature(type(self).__init__)
        return {name: getattr(self, name) for name in sig.parameters if name != "self"}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    @classmethod
    def from_params(cls, params: dict[str, Any], where: str) -> Check:
        """Build from suite params; unknown parameters are errors naming the valid ones.

        Every value is checked against the constructor's type annotation (``bool`` is not an
        ``int``; a string or a date is not a ``float``), as deep as the annotation goes.
        """
        sig = inspect.signature(cls.__init__)
        valid = [n for n in sig.parameters if n != "self"]
        unknown = sorted(set(params) - set(valid))
        if unknown:
            raise SuiteError(
                f"{where}: unknown parameter(s) {', '.join(unknown)} for check kind {cls.kind!r}",
                hint=f"valid parameters: {', '.join(valid) or '(none)'}",
            )
        hints = typing.get_type_hints(cls.__init__)
        for name, value in params.items():
            expect(value, hints.get(name, Any), f"{where}.params.{name}")
        try:
            return cls(**params)
        except TypeError as exc:
            raise SuiteError(f"{where}: {exc}", hint="check the parameter types") from None

    def check_params(self, where: str) -> None:
        """Validate the parameters themselves when the suite loads (raise SuiteError)."""

    def produced_metrics(self, reference: bool) -> set[str]:
        """The thresholdable metrics this configuration reports.

        ``reference`` says whether a reference model is given. The suite refuses, when it
        loads, a threshold on a metric of ``metric_names`` that is not in this set: such a
        threshold could never be evaluated.
        """
        return set(self.metric_names)

    def validate(self, info: ModelInfo) -> None:
        """Refuse, before any query, a model this check cannot run on (raise SuiteError)."""

    def run_batch(
        self, model: Model, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
        ctx: CheckContext,
    ) -> list[dict[str, Any]]:
        """One record per sample of the batch (``index`` are dataset indices)."""
        raise NotImplementedError

    def summarize(self, records: list[dict[str, Any]], data: Dataset) -> Measurement:
        """Aggregate all records of this check (in dataset order)."""
        raise NotImplementedError
