"""Result and provenance assembly: the typed, signed result of a run."""

from __future__ import annotations

import math
import platform
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from certify.canonical import JSONLike
from certify.checks import Check, Measurement
from certify.data import Dataset
from certify.device import DeviceChoice
from certify.engine.crosscheck import (
    attack_worst_case,
    no_attack_passes_beside_masking,
    no_certified_sample_broken,
)
from certify.engine.records import recorded_queries
from certify.errors import overall_verdict
from certify.models.base import Model, endpoint_of
from certify.redact import redact_obj
from certify.results import (
    SCHEMA,
    CheckResult,
    DataDoc,
    ModelDoc,
    Outcomes,
    Provenance,
    RunMeasurement,
    RunQueries,
    RunResult,
    Seeds,
    Status,
    SuiteDoc,
    pack_bits,
    verdict_statuses,
)
from certify.rundir import RunDir, SampleRecord
from certify.suite import Suite
from certify.version import __version__

if TYPE_CHECKING:
    from certify.engine.executor import Executor


@dataclass
class RunState:
    """What a run gathered on the way, for the assembly: results, timings, seeds, records."""

    seed: int
    t0: float = field(default_factory=time.perf_counter)
    results: list[CheckResult] = field(default_factory=list)
    durations: dict[str, float] = field(default_factory=dict)
    seeds: dict[str, int] = field(default_factory=dict)
    images: dict[str, np.ndarray] = field(default_factory=dict)
    #: Each evaluated check's merged records (every round's), by check id.
    finals: dict[str, dict[int, SampleRecord]] = field(default_factory=dict)
    #: Each evaluated check's measurement as its summary made it (before canonical form).
    measured: dict[str, Measurement] = field(default_factory=dict)
    #: An endpoint's requests the plan expected before the first query (None: not one).
    planned_requests: int | None = None
    #: The run-time estimate made before the main pass (:mod:`certify.engine.pilot`), or None.
    estimate: dict[str, JSONLike] | None = None


def assemble_result(state: RunState, suite: Suite, skips: dict[str, str], model: Model,
                    reference: Model | None, data: Dataset, device: DeviceChoice,
                    run: RunDir, query_budget: int | None, executor: Executor,
                    model_spec: str, reference_spec: str | None) -> RunResult:
    """The typed result: the deterministic measurement, and the provenance beside it."""
    checks = state.results
    no_certified_sample_broken(suite, state.finals, math.prod(model.info.input_shape))
    worst = attack_worst_case(suite, state.finals, checks, frozenset(skips))
    if any(w.startswith("gradient masking") for row in worst for w in row.warnings):
        # no attack row PASSes beside it; the rows decide again on what is left
        checks = no_attack_passes_beside_masking(checks, worst)
        worst = attack_worst_case(suite, state.finals, checks, frozenset(skips))
    statuses = [c.status for c in checks]
    verdict = overall_verdict(verdict_statuses(checks, worst))
    model_q, ref_q = recorded_queries(run)
    measurement = RunMeasurement(
        certify_version=__version__,
        suite=SuiteDoc(name=suite.name, digest=suite.digest, description=suite.description,
                       decision=typing.cast(Any, suite.decision),
                       release_tolerance=suite.release_tolerance),
        model=_model_doc(model),
        reference_model=None if reference is None else _model_doc(reference),
        data=_data_doc(data),
        device=typing.cast(Any, device.name),
        seeds=Seeds(suite=state.seed, checks=state.seeds),
        queries=RunQueries(total=model_q + ref_q, model=model_q, reference=ref_q,
                           budget=query_budget),
        checks=checks,
        summary={s.lower(): statuses.count(s) for s in typing.get_args(Status)},
        attack_worst_case=worst,
        verdict=typing.cast(Any, verdict),
        decision=("the first of ERROR, FAIL, INCONCLUSIVE, WARN that any evaluated check has, "
                  "an attack row through its threat model's row (an errored attack row "
                  f"directly), else PASS: {verdict}"
                  + (f" ({len(skips)} check(s) skipped: not evaluated, not passed)"
                     if skips else "")),
    )
    traffic = _traffic(model, reference, executor)
    if state.planned_requests is not None and "model" in traffic:
        traffic["model"]["planned_requests"] = state.planned_requests
    provenance = Provenance(**redact_obj(dict(  # every string certify writes about a model
        model_spec=model_spec,
        reference_spec=reference_spec,
        data_source=str(data.source),
        suite_source=suite.source,
        device={"requested": device.requested, "reason": device.reason,
                "provider": model.info.provider},
        environment=_versions(),
        timings={"total_s": time.perf_counter() - state.t0, "checks": state.durations,
                 "resumed_records": run.resumed_records}
        | ({"estimate": state.estimate} if state.estimate is not None else {}),
        traffic=traffic or None,
    )))
    return RunResult(schema=SCHEMA, measurement=measurement, provenance=provenance)


def _versions() -> dict[str, str]:
    import numpy
    import onnxruntime
    import torch

    return {
        "certify": __version__,
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "onnxruntime": onnxruntime.__version__,
        "platform": platform.platform(terse=True),
    }


def outcomes_doc(check: Check[Any], records: list[SampleRecord], n: int) -> Outcomes:
    """A check's per-sample outcomes as packed bitmaps over the dataset (``n`` samples).

    Samples whose model output was not finite have an ``error`` bit and no other outcome.
    """
    good = [r for r in records if r.get("outcome") != "error"]
    errors = [int(r["i"]) for r in records if r.get("outcome") == "error"]
    selected = np.zeros(n, dtype=bool)
    selected[[int(r["i"]) for r in records]] = True
    good_index = [int(r["i"]) for r in good]
    placed = [(name, good_index, flags) for name, flags in check.outcome_bits(good).items()]
    if errors:
        placed.append(("error", errors, [True] * len(errors)))
    bits = {}
    for name, index, flags in placed:
        full = np.zeros(n, dtype=bool)
        full[index] = np.asarray(flags, dtype=bool)
        bits[name] = pack_bits(full)
    pos = {int(r["i"]): k for k, r in enumerate(good)}
    values = {k: [float(vs[pos[int(r["i"])]]) if int(r["i"]) in pos else None
                  for r in records]
              for k, vs in check.sample_values(good).items()}
    return Outcomes(n=n, selected=pack_bits(selected), bits=bits, values=values)


def _traffic(model: Model, reference: Model | None, executor: Executor
             ) -> dict[str, dict[str, JSONLike]]:
    """Endpoint traffic of this invocation per model: this process's, plus the workers'
    (provenance: request counts, and the deadlines and breaker record the endpoint chose)."""
    out: dict[str, dict[str, JSONLike]] = {}
    for name, m in (("model", model), ("reference", reference)):
        endpoint = endpoint_of(m)
        if endpoint is not None:
            out[name] = endpoint.traffic()
    for name, counts in executor.traffic().items():
        if name in out:
            mine = out[name]
            for k, v in counts.items():
                here = mine.get(k, 0)  # the counts are ints on both sides
                mine[k] = (here if isinstance(here, int) else 0) + v
    return out


def _model_doc(model: Model) -> ModelDoc:
    d = model.info.to_dict()
    d.pop("provider", None)  # provenance: the same model gives the same numbers on either
    return ModelDoc(**redact_obj(d))  # an endpoint's URL is part of its name and identity


def _data_doc(data: Dataset) -> DataDoc:
    d = data.describe()
    d["name"] = Path(str(d.pop("source"))).name
    return DataDoc(**d)

