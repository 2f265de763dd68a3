"""Output guards: a batch whose model answers hold NaN or infinite scores."""

from __future__ import annotations

from typing import Any

import torch

from certify.checks import Check, CheckContext
from certify.errors import NonFiniteOutput
from certify.models.base import QueryCounter
from certify.rundir import SampleRecord

#: The ``error`` of a sample record whose model answer held NaN or infinite scores.
NON_FINITE = "non-finite model output"


def run_batch_isolating(check: Check[Any], model: QueryCounter, x: torch.Tensor,
                        y: torch.Tensor, idx: list[int], ctx: CheckContext
                        ) -> list[SampleRecord]:
    """``check.run_batch``, where a non-finite model answer makes error records, not a crash.

    If any query of the batch gets NaN or infinite scores back (:class:`NonFiniteOutput`), the
    batch's samples are rerun one at a time (seeds do not depend on the batch, so the other
    samples' records are those of a batched run) and each sample that fails again becomes
    ``{"outcome": "error", "error": NON_FINITE, "queries": spent}``. The queries of the
    abandoned batch attempt are charged to the error records (``batch_queries``), so the records
    still claim exactly the queries the model saw. Used in-process and by the Ray workers.
    """
    ref = ctx.reference

    def spent() -> tuple[int, int]:
        return model.queries, 0 if ref is None else ref.queries

    before = spent()
    try:
        return check.run_batch(model, x, y, idx, ctx)
    except NonFiniteOutput:
        now = spent()
        wasted = (now[0] - before[0], now[1] - before[1])
    rows: list[SampleRecord] = []
    errors: list[SampleRecord] = []
    if len(idx) == 1:
        rows = errors = [{"outcome": "error", "error": NON_FINITE, "queries": 0}]
    else:
        for j, i in enumerate(idx):
            start = spent()
            try:
                rows.extend(check.run_batch(model, x[j : j + 1], y[j : j + 1], [i], ctx))
            except NonFiniteOutput:
                end = spent()
                rows.append({"outcome": "error", "error": NON_FINITE,
                             "queries": end[0] - start[0]})
                if end[1] - start[1]:
                    rows[-1]["ref_queries"] = end[1] - start[1]
                errors.append(rows[-1])
    # Alone, every sample may answer finitely (a batch-dependent model): then all share it.
    charged = errors or rows
    for k, r in enumerate(charged):
        if wasted[0]:
            share = _share(wasted[0], k, len(charged))
            r["queries"] = int(r.get("queries", 0)) + share
            r["batch_queries"] = share
        if wasted[1]:
            share = _share(wasted[1], k, len(charged))
            r["ref_queries"] = int(r.get("ref_queries", 0)) + share
            r["batch_ref_queries"] = share
    return rows


def _share(total: int, k: int, n: int) -> int:
    """Record ``k``'s share of ``total`` queries split as evenly as possible over ``n``."""
    return total // n + (1 if k < total % n else 0)

