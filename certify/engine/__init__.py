"""The engine: runs a suite's checks on a model and assembles the signed result.

``run`` (run_suite: seeding, budgets, rounds, records, resume), ``executor`` (the seam),
``local`` (the in-process executor), ``guards`` (non-finite outputs), ``verdicts`` (thresholds),
``crosscheck`` (rules across checks), ``assemble`` (measurement and provenance), ``records``
(record keys). :mod:`certify.distributed` is the Ray executor.
"""

from __future__ import annotations

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

__all__ = ["CPU_BATCH_BYTES", "HTTP_LANES_PER_REQUEST", "NON_FINITE", "ROUND_SEP", "SUBSET_KEY",
           "Batch", "Executor", "LocalExecutor", "SuiteOutcome", "Verdict", "attack_worst_case",
           "check_seed", "cpu_batch_size", "decide", "judge", "lane_batches", "local_lanes",
           "no_attack_passes_when_randomised", "outcomes_doc", "round_key",
           "run_batch_isolating", "run_fingerprint", "run_suite"]
