"""The check interface.

A check is built from its suite parameters (the constructor stores them and does nothing else),
validated against the :class:`~certify.models.ModelInfo` when the suite loads, then run by the
runner one batch of samples at a time. ``run_batch`` returns one record per sample; ``summarize``
turns all records of the check into a :class:`Measurement`. Thresholds, verdicts, seeding, query
budgets, timing and error handling belong to the runner, not to checks.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np

from certify.canonical import JSONLike
from certify.data import Dataset
from certify.errors import SuiteError
from certify.kinds import Kind
from certify.kinds import ResultView as ResultView  # re-exported for the checks
from certify.kinds import Role as Role  # re-exported: the runner reads it
from certify.kinds import Settlement as Settlement  # re-exported: the checks build it
from certify.kinds import interval_text as interval_text
from certify.kinds import pct as pct
from certify.models.base import Model, ModelInfo
from certify.norms import Norm
from certify.params import Param, Params
from certify.perturbations.base import mix_seed, mix_seeds
from certify.rundir import SampleRecord

if TYPE_CHECKING:
    import torch


@dataclass
class Measurement:
    """What a check measured: headline metrics, their intervals, and detail for the card.

    ``images`` (digest -> ``[H, W, 3]`` uint8 pixels) are what the card shows; ``details``
    names them by digest only, so no image enters the signed payload.
    """

    metrics: dict[str, float]
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    details: dict[str, JSONLike] = field(default_factory=dict)
    #: Reasons not to trust the measured value (the runner turns a PASS into WARN).
    warnings: list[str] = field(default_factory=list)
    images: dict[str, np.ndarray] = field(default_factory=dict)
    #: Why more samples would not settle an interval that straddles the threshold (e.g. an
    #: attack that has not converged); None when they would.
    unsettled: str | None = None
    #: What keeps the figure from being final (the result's typed ``settled`` field).
    settled: Settlement = field(default_factory=lambda: Settlement())


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
    #: The model's explicit abstain class, if it has one (a suite's ``coverage`` check declares
    #: it): every check's coverage figures count predicting it as abstaining.
    abstain_class: int | None = None
    #: The dataset indices this check evaluates, in order (empty when not known), so a check
    #: can pick a fixed share of its own samples whichever batch or shard they fall in.
    selected: tuple[int, ...] = ()
    #: Attack checks: samples an earlier attack of the same threat model broke (dataset index
    #: -> what that attack's merged record said: ``by`` (its check id), ``adv_pred``,
    #: ``confidence``, ``probability``). They are not attacked again: the worst case is over
    #: attacks, and a broken sample stays broken.
    broken_before: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    #: Names the step of the check that starts now on the progress display, with how many
    #: there are (shown as "binarization test, 3 of 20"); ``None`` where nothing shows it (a
    #: Ray worker).
    step: Callable[[str, int], None] | None = field(default=None, compare=False, repr=False)

    def say_step(self, label: str, total: int) -> None:
        """One more step ``label`` (of ``total`` in this check) starts: shown where a display
        is attached."""
        if self.step is not None:
            self.step(label, total)

    def seed(self, sample_index: int, *more: int) -> int:
        """The seed of one random draw: from (suite seed, check id), the sample and ``more``.

        Independent of batching and sharding, so a sample's result never depends on which
        other samples were processed with it.
        """
        return mix_seed(self.check_seed, sample_index, *more)

    def seeds(self, samples: Sequence[int], *more: int | Sequence[int]) -> torch.Tensor:
        """:meth:`seed` for many draws at once (``samples`` and any sequence in ``more`` of
        equal length, scalars broadcast), as an int64 tensor."""
        return mix_seeds(self.check_seed, list(samples), *(m if isinstance(m, int) else list(m)
                                                           for m in more))


#: The record type of one check kind (a :class:`~certify.rundir.SampleRecord` extended).
R = TypeVar("R", bound=SampleRecord)


class Check(Kind, Generic[R]):
    """Base class of all checks; subclasses set ``kind`` and write ``run_batch``/``summarize``.

    ``R`` is the kind's record type: a :class:`~certify.rundir.SampleRecord` with the kind's
    own fields, which ``run_batch`` returns one per sample and ``summarize`` reads back.

    What a kind *is* and shows (its metrics, family, export, how compare pairs it, its
    headline, figures and card template) is its light description in :mod:`certify.kinds`,
    which each compute class inherits; the compute class adds how it is measured. The report
    layer iterates over the descriptions; it never switches on kinds.
    """

    #: At most this many samples per batch, so that a kill loses little work (``None``: the
    #: runner's batch size). Set by checks whose per-sample work is long (attacks, LIME).
    record_batch: ClassVar[int | None] = None
    #: The suite parameters (the ``__init__`` parameters, in order): type, default, range and
    #: meaning. The suite's validation (:meth:`from_params`, :meth:`check_params`) and the
    #: suite reference of the documentation (:meth:`parameters`) read it; a test holds it to
    #: the constructor's signature.
    suite_params: ClassVar[Params] = Params()

    def next_round(self, records: dict[int, R], done: int
                   ) -> tuple[Check[R], list[int]] | None:
        """Another round after rounds ``0..done`` (``records``: merged so far): the check that
        runs it and the sample indices it runs on; None when the check is done. Most checks run
        one round; attacks with ``max_queries: auto`` grow their budget in rounds."""
        return None

    def max_queries_per_sample(self) -> int | None:
        """The most queries one sample can cost this check, every round included, when the
        check can say before it runs (``None``: it cannot). The runner logs the plan up front,
        so that a paid endpoint's owner sees the cost before any query."""
        return None

    def plan_note(self) -> str | None:
        """What the most queries per sample are made of, in words, for the run's query plan
        line (``None``: nothing to add)."""
        return None

    def merge_round(self, records: dict[int, R], new: dict[int, R], r: int) -> dict[int, R]:
        """Fold round ``r``'s records into the merged records (checks with rounds only)."""
        raise NotImplementedError(f"{type(self).__name__} runs a single round")

    def outcome_bits(self, records: list[R]) -> dict[str, list[bool]]:
        """Per-sample binary outcomes kept (as packed bitmaps) for later comparisons.

        By default one bitmap per value of the records' ``outcome`` field.
        """
        cats = sorted({str(r["outcome"]) for r in records if "outcome" in r})
        return {c: [r.get("outcome") == c for r in records] for c in cats}

    def sample_values(self, records: list[R]) -> dict[str, list[float]]:
        """Per-sample continuous values kept for paired comparisons (none by default)."""
        return {}

    @classmethod
    def parameters(cls) -> list[Param]:
        """The kind's suite parameters in constructor order: name, type, default, range and
        meaning (:attr:`suite_params`)."""
        return list(cls.suite_params)

    def get_params(self) -> dict[str, Any]:
        """The constructor parameters, exactly as given in the suite (scikit-learn style)."""
        sig = inspect.signature(type(self).__init__)
        return {name: getattr(self, name) for name in sig.parameters if name != "self"}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    @classmethod
    def from_params(cls, params: dict[str, Any], where: str) -> Check[Any]:
        """Build from suite params; unknown parameters are errors naming the valid ones.

        Every value is checked against its declaration (:attr:`suite_params`): its type (``bool``
        is not an ``int``; a string or a date is not a ``float``, as deep as the annotation
        goes) and its range.
        """
        cls.suite_params.refuse_unknown(params, where, f"check kind {cls.kind!r}")
        cls.suite_params.validate(params, f"{where}.params")
        try:
            return cls(**params)
        except TypeError as exc:
            raise SuiteError(f"{where}: {exc}", hint="check the parameter types") from None

    def random_norm(self) -> Norm | None:
        """The norm whose ball the check draws random noise from, where it does (the attack
        of that norm at the check's bound then gives the worst case beside it): ``None``."""
        return None

    def check_params(self, where: str) -> None:
        """Validate the parameters themselves when the suite loads (raise SuiteError): each
        against its declaration here; a kind adds the rules that tie several together (and
        calls this first)."""
        self.suite_params.validate({p.name: getattr(self, p.name) for p in self.suite_params},
                                   f"{where}.params")

    def produced_metrics(self, reference: bool) -> set[str]:
        """The thresholdable metrics this configuration reports.

        ``reference`` says whether a reference model is given. The suite refuses, when it
        loads, a threshold on a metric of ``metric_names`` that is not in this set: such a
        threshold could never be evaluated.
        """
        return set(self.metric_names)

    def validate(self, info: ModelInfo) -> None:
        """Refuse, before any query, a model this check cannot run on (raise SuiteError)."""

    def unavailable(self, model: Model) -> str | None:
        """Why this check cannot be evaluated on this model as read from the model itself (its
        graph), before any query, or ``None``: the runner records a SKIPPED row with it, as
        for :meth:`skip_reason`."""
        return None

    def skip_reason(self, info: ModelInfo) -> str | None:
        """Why this check cannot be evaluated on this model, or ``None`` when it can.

        A check that needs scores says so for a labels-only model: the runner then records a
        SKIPPED row with this reason and sends the model no query for it. Unlike
        :meth:`validate`, a skip does not refuse the suite; a suite whose every check is
        skipped is refused (:meth:`certify.suite.Suite.validate_for`).
        """
        return None

    def run_batch(
        self, model: Model, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
        ctx: CheckContext,
    ) -> list[R]:
        """One record per sample of the batch (``index`` are dataset indices)."""
        raise NotImplementedError

    def summarize(self, records: list[R], data: Dataset) -> Measurement:
        """Aggregate all records of this check (in dataset order)."""
        raise NotImplementedError
