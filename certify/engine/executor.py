"""The executor seam: where a check's batches run (this process, or Ray workers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar, Protocol

import torch

from certify.checks import CheckContext
from certify.data import Dataset
from certify.rundir import SampleRecord
from certify.suite import CheckSpec

#: One finished batch: (sample indices, records, queries the model saw, queries the reference
#: model saw).
Batch = tuple[list[int], list[SampleRecord], int, int]


class Executor(Protocol):
    """Runs a check's pending samples somewhere else (e.g. Ray actors), batch by batch.

    ``run_check`` yields (sample indices, records, queries the model saw, queries the reference
    model saw) as batches finish, in any order; the runner checks and records them. Seeds come
    from ``ctx``, so where a sample runs does not change its record.
    """

    #: True when the executor's own counters charge the run's query budget as queries are
    #: made (in this process); otherwise the runner charges each finished batch.
    live_budget: ClassVar[bool]

    def start(self, run_budget: int | None) -> None:
        """Called once before the first check with the run's remaining query budget."""
        ...

    def run_check(self, spec: CheckSpec, data: Dataset, pending: list[int], batch_size: int,
                  ctx: CheckContext, budget: int | None
                  ) -> Iterator[Batch]:
        """Yield the finished batches of ``pending``."""
        ...


    def confirm_batching(self, x: torch.Tensor) -> None:
        """Called once before the first check with the real images the run's model confirmed
        its batching on (:func:`certify.engine.plan.prepare`): where the batches run on other
        copies of the model, they confirm theirs on the same images, so that every copy runs
        the graph the same way."""
        ...

    def traffic(self) -> dict[str, dict[str, int]]:
        """Endpoint traffic counted where the batches ran, per model (empty: none)."""
        ...

    def disable_hedging(self, why: str) -> None:
        """Stop hedged requests wherever the batches run (a randomised model)."""
        ...
