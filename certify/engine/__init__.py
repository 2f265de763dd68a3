"""The engine: runs a suite's checks on a model and assembles the signed result.

``run`` (run_suite: seeding, budgets, rounds, records, resume), ``executor`` (the seam),
``local`` (the in-process executor), ``guards`` (non-finite outputs), ``verdicts`` (thresholds),
``crosscheck`` (rules across checks), ``assemble`` (measurement and provenance), ``records``
(record keys). :mod:`certify.distributed` is the Ray executor.

The names below are imported from their modules when first asked for (PEP 562): a reader of
one light module does not pay for the runner's imports, torch among them (issue 53). What the
card reads of a verdict lives with the signed results (:func:`certify.results.verdict_statuses`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from certify.engine.assemble import outcomes_doc
    from certify.engine.crosscheck import attack_worst_case, no_attack_passes_when_randomised
    from certify.engine.executor import Batch, Executor
    from certify.engine.guards import NON_FINITE, run_batch_isolating
    from certify.engine.local import (
        CPU_BATCH_BYTES,
        HTTP_LANES_PER_REQUEST,
        LocalExecutor,
        cpu_batch_size,
        lane_batches,
        local_lanes,
    )
    from certify.engine.records import ROUND_SEP, SUBSET_KEY, round_key
    from certify.engine.run import SuiteOutcome, check_seed, run_fingerprint, run_suite
    from certify.engine.verdicts import Verdict, decide, judge

#: Each public name and the module that defines it.
_HOMES = {
    "outcomes_doc": "assemble",
    "attack_worst_case": "crosscheck", "no_attack_passes_when_randomised": "crosscheck",
    "Batch": "executor", "Executor": "executor",
    "NON_FINITE": "guards", "run_batch_isolating": "guards",
    "CPU_BATCH_BYTES": "local", "HTTP_LANES_PER_REQUEST": "local", "LocalExecutor": "local",
    "cpu_batch_size": "local", "lane_batches": "local", "local_lanes": "local",
    "ROUND_SEP": "records", "SUBSET_KEY": "records", "round_key": "records",
    "SuiteOutcome": "run", "check_seed": "run", "run_fingerprint": "run", "run_suite": "run",
    "Verdict": "verdicts", "decide": "verdicts", "judge": "verdicts",
}


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


__all__ = ["CPU_BATCH_BYTES", "HTTP_LANES_PER_REQUEST", "NON_FINITE", "ROUND_SEP", "SUBSET_KEY",
           "Batch", "Executor", "LocalExecutor", "SuiteOutcome", "Verdict", "attack_worst_case",
           "check_seed", "cpu_batch_size", "decide", "judge", "lane_batches", "local_lanes",
           "no_attack_passes_when_randomised", "outcomes_doc", "round_key",
           "run_batch_isolating", "run_fingerprint", "run_suite"]
