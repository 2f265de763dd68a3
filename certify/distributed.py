"""Run a suite's checks on a Ray cluster (``--executor ray``).

The runner stays the one place that seeds, budgets, checks and records: this module only moves
batches of samples to Ray actors and their records back. Each actor loads its own copy of the
model (one GPU per actor when the cluster has GPUs, else ``threads`` CPU threads) and runs a
check's ``run_batch`` on the samples it is given. Every random draw comes from (suite seed,
check id, sample index), so where a sample runs does not change its record, and ``--resume``
works across executors: records are the same whoever wrote them.

A worker that dies is replaced and its unfinished batch is given to another actor; only the
driver writes records, so nothing recorded is lost or counted twice. Query budgets (a check's
``budget`` and ``--query-budget``) hold across workers through one ledger actor that every
query is reserved against; an endpoint's ``--concurrency`` is divided between the workers.

Ray is an optional extra, ``certify[ray]`` (``pip install ".[ray]"`` in a checkout). A local
instance started by certify listens on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, TypedDict

import torch

from certify.canonical import JSONLike
from certify.checks import CheckContext
from certify.data import Dataset
from certify.device import DeviceChoice, choose_device
from certify.engine import run_batch_isolating
from certify.engine.executor import Batch
from certify.errors import BudgetExceeded, CertifyError, ModelError, UsageError
from certify.models import HttpOptions, load_model
from certify.models.base import BatchChecked, Model, Preprocessing, QueryCounter, endpoint_of
from certify.rundir import SampleRecord
from certify.suite import CheckSpec


class WorkerReply(TypedDict, total=False):
    """What a worker's ``run_batch`` sends back: the batch's records and the queries each model
    saw, or the error that stopped it (Ray cannot rebuild certify's errors); and, either way,
    the worker's endpoint traffic so far."""

    rows: list[SampleRecord]
    spent: int
    ref_spent: int
    error: str
    message: str
    hint: str | None
    traffic: dict[str, Any]

log = logging.getLogger("certify")

#: Times a dead worker is replaced before the run gives up (per worker slot).
MAX_RESTARTS = 3
MIN_BATCH = 4  # samples: the smallest batch guided scheduling hands out
#: The niceness of the workers of a Ray instance certify starts (Ray's default is 15), the
#: driver's own: the workers are where the run's work is done.
WORKER_NICENESS = 0


@dataclass(frozen=True)
class ModelSource:
    """Everything an actor needs to load its own copy of a model."""

    spec: str
    device: str = "auto"
    preprocessing: Preprocessing | None = None
    input_size: tuple[int, int] | None = None
    num_classes: int | None = None
    http: HttpOptions | None = None
    surrogate: str | None = None  # an endpoint's white-box surrogate (``--surrogate``)

    def load(self, device: DeviceChoice, threads: int) -> Model:
        """Load the model (and its surrogate) on ``device`` with ``threads`` CPU threads."""
        return load_model(self.spec, device, self.preprocessing,
                          input_size=self.input_size, num_classes=self.num_classes,
                          http=self.http, threads=threads, surrogate=self.surrogate)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray needs Ray, which is not installed",
                         hint='the extra certify[ray]: pip install ".[ray]" in a certify '
                              'checkout, or pip install ray') from None
    return ray


def _guided_batches(pending: list[int], batch_size: int, workers: int) -> list[list[int]]:
    """Split ``pending`` into batches that shrink towards the end (guided self-scheduling).

    Each batch takes a ``1 / (2 * workers)`` share of what is left (at most ``batch_size``,
    at least ``MIN_BATCH``), so the first batches are large enough to keep per-call overhead
    low and the last ones small enough that no worker sits idle for long while another
    finishes a big batch: an attack's cost per batch is unknown until it runs.
    """
    batches: list[list[int]] = []
    start = 0
    while start < len(pending):
        left = len(pending) - start
        size = min(batch_size, max(MIN_BATCH, math.ceil(left / (2 * workers))))
        batches.append(pending[start : start + size])
        start += size
    return batches


class _Ledger:
    """Query budgets shared by all workers: ``reserve`` before every model query."""

    def __init__(self) -> None:
        self.limits: dict[str, int | None] = {}
        self.spent: dict[str, int] = {}

    def set_limit(self, key: str, limit: int | None) -> None:
        self.limits[key] = limit
        self.spent[key] = 0

    def reserve(self, keys: list[str], n: int) -> str | None:
        for k in keys:
            limit = self.limits.get(k)
            if limit is not None and self.spent.get(k, 0) + n > limit:
                return (f"query budget of {limit} would be exceeded ({self.spent.get(k, 0)} "
                        f"used, {n} more asked){' for the run' if k == '__run__' else ''}")
        for k in keys:
            self.spent[k] = self.spent.get(k, 0) + n
        return None


class _LedgerCounter(QueryCounter):
    """A QueryCounter whose budget is the cluster-wide ledger's."""

    def __init__(self, model: Model, ledger: Any, keys: list[str]) -> None:
        super().__init__(model, None)
        self._ledger, self._keys = ledger, keys

    def _spend(self, x: torch.Tensor) -> None:
        import ray

        n = int(x.shape[0])
        refused = ray.get(self._ledger.reserve.remote(self._keys, n))
        if refused:
            raise BudgetExceeded(refused, hint="raise the budget or lower the number of samples")
        self.queries += n


def _worker_logging() -> None:
    """certify's log in a Ray worker: warnings and up, to stderr (Ray's worker log), redacted."""
    from certify.redact import install_log_filters

    logger = logging.getLogger("certify")
    logger.setLevel(logging.WARNING)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s certify: %(message)s"))
    install_log_filters(handler)
    logger.handlers[:] = [handler]
    logger.propagate = False


class _Worker:
    """One Ray actor: its own model (and reference model) and device."""

    def __init__(self, model: ModelSource, reference: ModelSource | None, threads: int) -> None:
        _worker_logging()
        device = choose_device(model.device)
        self.device = device.torch_device
        self.model = model.load(device, threads)
        self.reference = None if reference is None else reference.load(device, threads)

    def pid(self) -> int:
        return os.getpid()

    def confirm_batching(self, x: torch.Tensor) -> None:
        """Confirm this worker's copy of the model's batching on the driver's real images
        (the driver's copy confirmed its own on them: the same images give the same
        decision)."""
        for m in (self.model, self.reference):
            inner: object = m
            while isinstance(inner, QueryCounter):
                inner = inner.model
            if isinstance(inner, BatchChecked):
                inner.confirm_batching(x.to(self.device))

    def traffic(self) -> dict[str, dict[str, int]]:
        """This worker's endpoint traffic so far (requests, retries, images), per model."""
        out = {}
        for name, m in (("model", self.model), ("reference", self.reference)):
            endpoint = endpoint_of(m)
            if endpoint is not None:
                d = endpoint.traffic()
                out[name] = {k: _count(d[k]) for k in TRAFFIC_COUNTS}
        return out

    def disable_hedging(self, why: str) -> None:
        """No more hedged requests from this worker's endpoint models."""
        for m in (self.model, self.reference):
            endpoint = endpoint_of(m)
            if endpoint is not None:
                endpoint.disable_hedging(why)

    def run_batch(self, check: Any, x: torch.Tensor, y: torch.Tensor, idx: list[int],
                  ctx: dict[str, Any], ledger: Any, keys: list[str] | None) -> WorkerReply:
        def count(model: Model) -> QueryCounter:
            return QueryCounter(model) if keys is None else _LedgerCounter(model, ledger, keys)

        counter = count(self.model)
        ref = None if self.reference is None else count(self.reference)
        context = CheckContext(device=self.device, reference=ref, **ctx)
        try:
            rows = run_batch_isolating(check, counter, x.to(self.device), y.to(self.device),
                                       idx, context)
        except CertifyError as exc:  # travels back as data: Ray cannot rebuild our errors
            return {"error": type(exc).__name__, "message": exc.message, "hint": exc.hint,
                    "traffic": self.traffic()}
        except Exception as exc:  # noqa: BLE001 - the runner turns it into an ERROR row
            return {"error": "RuntimeError", "message": f"{type(exc).__name__}: {exc}",
                    "hint": None, "traffic": self.traffic()}
        return {"rows": rows, "spent": counter.queries, "traffic": self.traffic(),
                "ref_spent": 0 if ref is None else ref.queries}


#: How long the driver waits for a worker's unfinished batch or its traffic counts.
DRAIN_TIMEOUT_S = 300

#: The traffic counts a worker reports and the driver adds up.
TRAFFIC_COUNTS = ("requests", "retries", "images", "hedges", "hedge_wins", "hedged_images",
                  "timeouts",
                  "connection_errors", "overloaded", "server_errors", "malformed",
                  "health_probes", "inference_requests", "bytes_sent", "bytes_received")

_ERRORS: dict[str, type[CertifyError]] = {"BudgetExceeded": BudgetExceeded,
                                          "ModelError": ModelError}


#: The fields of a check's context that the worker supplies itself (a worker shows no
#: progress steps: the driver's bar advances as batches return).
_WORKER_FIELDS = frozenset({"device", "reference", "step"})


def context_fields(ctx: CheckContext) -> dict[str, Any]:
    """Every field of ``ctx`` a worker needs to rebuild it, as plain picklable values: all
    but the device, the reference model and the progress step (:data:`_WORKER_FIELDS`).
    Issue 62: a field left out here, the samples an earlier attack of the threat model
    broke, made a Ray run attack them again, and its rows differed from the local run's."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(ctx):
        if f.name in _WORKER_FIELDS:
            continue
        v = getattr(ctx, f.name)
        if f.name == "broken_before":
            v = {int(i): dict(said) for i, said in v.items()}
        elif f.name == "class_names":
            v = list(v)
        out[f.name] = v
    return out


def _count(v: JSONLike) -> int:
    """A traffic count as an int (the endpoint reports counts as ints)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"expected a traffic count, got {v!r}")
    return v


class RayExecutor:
    """Shards each check's pending samples across ``workers`` Ray actors.

    ``address`` is an existing cluster's address (``ray://…`` or ``host:port``); without it a
    local instance bound to 127.0.0.1 is started with ``workers × threads`` CPUs.
    """

    #: Workers charge their own counters; the runner charges the run budget per batch.
    live_budget: ClassVar[bool] = False

    def __init__(self, model: ModelSource, reference: ModelSource | None = None,
                 address: str | None = None, workers: int = 2, threads: int = 1) -> None:
        if workers < 1 or threads < 1:
            raise UsageError("--workers and --threads must be at least 1")
        if model.http is not None:
            per = model.http.concurrency // workers
            if per < 1:
                raise UsageError(
                    f"--workers {workers} exceeds the endpoint's --concurrency "
                    f"{model.http.concurrency}",
                    hint="the concurrency limit holds across all workers: raise it or use "
                         "fewer workers")
            cap = model.http.max_requests
            http = dataclasses.replace(model.http, concurrency=per,
                                       max_requests=None if cap is None
                                       else max(1, cap // workers))
            model = dataclasses.replace(model, http=http)
            if reference is not None and reference.http is not None:
                reference = dataclasses.replace(reference, http=http)
        self.model, self.reference = model, reference
        self.address, self.workers, self.threads = address, workers, threads
        self._ray: Any = None
        self._started_here = False
        self._actors: list[Any] = []
        self._restarts = 0
        #: Endpoint traffic per worker (the latest cumulative counts each one reported).
        self._traffic: dict[Any, dict[str, dict[str, int]]] = {}
        self._ledger: Any = None
        self._budgeted = False
        self._batching_images: torch.Tensor | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> RayExecutor:
        if self.address is None:
            # Ray resolves 127.0.0.1 to the host's public address unless clusters are off;
            # this must be set before ray is imported.
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        ray = self._ray = _import_ray()
        if not ray.is_initialized():
            try:
                if self.address is None:
                    # Ray starts its workers at niceness 15 by default: on a machine with
                    # other work they then get a few percent of a core (a small demo suite
                    # beside two busy processes: 365 s against 46 s; benchmarks/RESULTS.md,
                    # "Ray workers at niceness 0").
                    # Here the workers do the run's work while the driver waits. (Ray's reason
                    # for 15 is CPU for its own servers while the workers are busy; the Ray
                    # tests, a killed worker's replacement included, pass at 0.)
                    ray.init(num_cpus=self.workers * self.threads, include_dashboard=False,
                             log_to_driver=False, _node_ip_address="127.0.0.1",
                             configure_logging=False,
                             _system_config={"worker_niceness": WORKER_NICENESS})
                else:
                    ray.init(address=self.address, log_to_driver=False,
                             configure_logging=False)
            except Exception as exc:  # noqa: BLE001 - Ray raises many kinds
                raise UsageError(f"could not start or reach Ray: {str(exc).splitlines()[0]}",
                                 hint="check --ray-address (e.g. ray://head:10001)") from None
            self._started_here = True
        gpus = int(ray.cluster_resources().get("GPU", 0))
        self._actor_options = ({"num_gpus": 1, "num_cpus": 1} if gpus >= self.workers
                               else {"num_cpus": self.threads})
        log.info("ray: %d workers (%s each)", self.workers,
                 "1 GPU" if "num_gpus" in self._actor_options else f"{self.threads} CPU")
        self._ledger = ray.remote(num_cpus=0)(_Ledger).remote()
        self._actors = [self._new_actor() for _ in range(self.workers)]
        ray.get([a.pid.remote() for a in self._actors])  # fail early if a model cannot load
        return self

    def __exit__(self, *exc: object) -> None:
        ray = self._ray
        if ray is None:
            return
        for a in self._actors:
            ray.kill(a)
        if self._started_here:
            ray.shutdown()

    def _new_actor(self) -> Any:
        cls = self._ray.remote(max_restarts=0)(_Worker)
        actor = cls.options(**self._actor_options).remote(self.model, self.reference,
                                                          self.threads)
        if self._batching_images is not None:  # a replacement: before its first batch
            actor.confirm_batching.remote(self._batching_images)
        return actor

    def actor_pids(self) -> list[int]:
        """Process ids of the live workers (used by tests that kill one)."""
        return self._ray.get([a.pid.remote() for a in self._actors])

    # -- the executor interface -----------------------------------------------------------
    def confirm_batching(self, x: torch.Tensor) -> None:
        """Every worker confirms its model's batching on ``x`` (and every replacement will)."""
        self._batching_images = x.detach().cpu()
        self._ray.get([a.confirm_batching.remote(self._batching_images)
                       for a in self._actors])

    def start(self, run_budget: int | None) -> None:
        """Set the run-wide budget on the ledger."""
        self._budgeted = run_budget is not None
        self._ray.get(self._ledger.set_limit.remote("__run__", run_budget))

    def run_check(self, spec: CheckSpec, data: Dataset, pending: list[int], batch_size: int,
                  ctx: CheckContext, budget: int | None
                  ) -> Iterator[Batch]:
        """Yield finished batches of ``pending`` as the actors return them."""
        ray = self._ray
        if not pending:
            return
        queue = _guided_batches(pending, batch_size, self.workers)
        keys: list[str] | None = None
        if budget is not None or self._budgeted:
            ray.get(self._ledger.set_limit.remote(spec.id, budget))
            keys = [spec.id, "__run__"]
        fields = context_fields(ctx)
        check_ref = ray.put(spec.check)
        in_flight: dict[Any, tuple[int, list[int]]] = {}

        def submit(slot: int) -> None:
            idx = queue.pop(0)
            ref = self._actors[slot].run_batch.remote(
                check_ref, data.x[idx], data.y[idx], idx, fields, self._ledger, keys)
            in_flight[ref] = (slot, idx)

        for slot in range(len(self._actors)):
            for _ in range(2):  # two per actor: one running, one waiting
                if queue:
                    submit(slot)
        try:
            while in_flight:
                done, _ = ray.wait(list(in_flight), num_returns=1)
                slot, idx = in_flight.pop(done[0])
                try:
                    out: WorkerReply = ray.get(done[0])
                except ray.exceptions.RayActorError:
                    self._replace(slot, idx, queue)
                    for ref, (s, other) in list(in_flight.items()):
                        if s == slot:  # the dead actor's other batch is lost too
                            in_flight.pop(ref)
                            queue.insert(0, other)
                    submit(slot)
                    if queue:
                        submit(slot)
                    continue
                self._note_traffic(self._actors[slot], out["traffic"])
                if "error" in out:
                    err = _ERRORS.get(out["error"])
                    if err is not None:
                        raise err(out["message"], hint=out["hint"])
                    raise RuntimeError(out["message"])
                if queue:
                    submit(slot)
                yield idx, out["rows"], int(out["spent"]), int(out["ref_spent"])
        finally:
            self._drain(in_flight)

    def _drain(self, in_flight: dict[Any, tuple[int, list[int]]]) -> None:
        """Cancel the batches still queued and wait for the running ones, so that the workers
        are idle and their traffic counts are final before the next check or the run's end."""
        ray = self._ray
        for ref in in_flight:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=False)
        for ref, (slot, _) in in_flight.items():
            try:
                out = ray.get(ref, timeout=DRAIN_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - cancelled, dead or stuck: asked again below
                continue
            if isinstance(out, dict) and "traffic" in out:
                self._note_traffic(self._actors[slot], out["traffic"])

    def disable_hedging(self, why: str) -> None:
        """Tell every worker to send no more hedged requests."""
        self._ray.get([a.disable_hedging.remote(why) for a in self._actors],
                      timeout=DRAIN_TIMEOUT_S)

    def _note_traffic(self, actor: Any, counts: dict[str, dict[str, int]]) -> None:
        """Keep a worker's cumulative traffic counts: the larger of each, since two replies of
        one worker can be read in either order (``ray.wait`` returns whichever is ready)."""
        seen = self._traffic.get(actor, {})
        self._traffic[actor] = {
            name: {k: max(c[k], seen.get(name, {}).get(k, 0)) for k in TRAFFIC_COUNTS}
            for name, c in counts.items()}

    def traffic(self) -> dict[str, dict[str, int]]:
        """Endpoint traffic of all workers: the live ones asked now (twice before giving up),
        dead ones as they last reported.

        Counts as last reported miss what a worker sent after its last batch reply (a batch
        cancelled at a check's end, whose reply Ray discards, or a worker replaced mid-batch):
        such counts are a lower bound, and the totals say so: ``workers_counted_early`` is the
        number of workers (live ones whose counts could not be read, and replaced ones) whose
        counts are as of an earlier reply."""
        early = self._restarts
        for slot, actor in enumerate(self._actors):
            for attempt in (1, 2):
                try:
                    self._note_traffic(actor, self._ray.get(actor.traffic.remote(),
                                                            timeout=DRAIN_TIMEOUT_S))
                    break
                except Exception as exc:  # noqa: BLE001 - said, and counted as a lower bound
                    if attempt == 2:
                        early += 1
                        log.warning("ray worker %d: its final endpoint traffic counts could not "
                                    "be read (%s: %s); the card counts its requests as of its "
                                    "last reply", slot, type(exc).__name__, exc)
        total: dict[str, dict[str, int]] = {}
        for per_model in self._traffic.values():
            for name, counts in per_model.items():
                t = total.setdefault(name, dict.fromkeys(TRAFFIC_COUNTS, 0))
                for k in TRAFFIC_COUNTS:
                    t[k] += counts[k]
        for t in total.values():
            t["workers_counted_early"] = early
        return total

    def _replace(self, slot: int, idx: list[int], queue: list[list[int]]) -> None:
        self._restarts += 1
        if self._restarts > MAX_RESTARTS * self.workers:
            raise ModelError(f"Ray workers died {self._restarts} times",
                             hint="check the workers' memory and logs (ray logs)")
        log.warning("ray worker %d died; replacing it and redoing %d samples", slot, len(idx))
        self._ray.kill(self._actors[slot])
        self._actors[slot] = self._new_actor()
        queue.insert(0, idx)
