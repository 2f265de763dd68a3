"""Output guards: a batch whose model answers hold NaN or infinite scores."""

from __future__ import annotations

from typing import Any

import torch

from certify.checks import Check, CheckContext
from certify.errors import NonFiniteOutput
from certify.models.base import QueryCounter

#: The ``error`` of a sample record whose model answer held NaN or infinite scores.
NON_FINITE = "non-finite model output"


def run_batch_isolating(check: Check, model: QueryCounter, x: torch.Tensor, y: torch.Tensor,
                        idx: list[int], ctx: CheckContext) -> list[dict[str, Any]]:
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
    rows: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
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
    for key, total in zip(("queries", "ref_queries"), wasted, strict=True):
        if not total:
            continue
        for k, r in enumerate(charged):
            share = total // len(charged) + (1 if k < total % len(charged) else 0)
            r[key] = int(r.get(key, 0)) + share
            r[f"batch_{key}"] = share
    return rows

