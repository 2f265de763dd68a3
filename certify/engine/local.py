"""The in-process executor: a check's batches in this process, a few lanes at once on threads."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import ClassVar

import torch

from certify.checks import CheckContext
from certify.data import Dataset
from certify.device import DeviceChoice
from certify.engine.executor import Batch
from certify.engine.guards import run_batch_isolating
from certify.engine.records import ROUND_SEP
from certify.models.base import Budget, Model, QueryCounter, endpoint_of
from certify.suite import CheckSpec

# The most bytes of images in one batch when the model runs in this process on the CPU. A batch
# of 256 224x224 images is 154 MB; every tensor that large (a property's output, a gathered
# subset) is mapped fresh from the OS and pays page faults on first touch, which made the
# corruption properties 1.5-5x slower per image than in batches of a few MB, whose memory the
# heap reuses (benchmarks/RESULTS.md). onnxruntime's per-image cost at 224x224 was flat from
# batch 1 up, and whole 224x224 runs were fastest at this cap. 32x32 images (3 MB per 256) keep
# the full batch. Endpoints are left alone: their requests in flight come out of the batch.
CPU_BATCH_BYTES = 4 << 20


#: Sample groups the in-process executor runs at once per request an endpoint may have in
#: flight: a group waiting out a 429's Retry-After or a retry holds no request slot, so the
#: others keep the endpoint busy.
HTTP_LANES_PER_REQUEST = 4



def cpu_batch_size(batch_size: int, image_shape: tuple[int, ...], itemsize: int = 4) -> int:
    """The batch a check gets for an in-process model on the CPU: ``batch_size`` images, fewer
    where that would pass ``CPU_BATCH_BYTES`` (at least one). Records do not depend on it."""
    per_image = itemsize * math.prod(image_shape)
    return max(1, min(batch_size, CPU_BATCH_BYTES // max(1, per_image)))


def lane_batches(pending: list[int], batch_size: int, lanes: int) -> list[list[int]]:
    """Split ``pending`` into equal batches of at most ``batch_size``, a multiple of ``lanes``
    of them, so that every lane gets the same share.

    Not fewer, larger batches: an attack runs until its batch's last sample is broken or out
    of queries, so each batch costs about the same number of iterations whatever its size,
    and each iteration has a fixed cost (Python, a model call). Records do not depend on the
    split (every draw is seeded per sample).
    """
    if lanes <= 1 or not pending:
        return [pending[s : s + batch_size] for s in range(0, len(pending), batch_size)]
    n = lanes * math.ceil(len(pending) / (lanes * batch_size))
    size = math.ceil(len(pending) / n)
    return [pending[s : s + size] for s in range(0, len(pending), size)]


def local_lanes(model: Model, device: DeviceChoice) -> int:
    """How many batches the in-process executor runs at once (threads).

    An endpoint: ``HTTP_LANES_PER_REQUEST ×`` its ``--concurrency``, so that a group of
    samples whose request waits for a retry, a hedge or a Retry-After does not stall the other
    groups (no head-of-line blocking); requests in flight stay within ``--concurrency``.
    A model in this process: the device's lanes (``DeviceChoice.lanes``).
    """
    endpoint = endpoint_of(model)
    if endpoint is not None:
        return max(1, HTTP_LANES_PER_REQUEST * int(endpoint.options.concurrency))
    return device.lanes


class _Stopped(Exception):
    """Raised in a lane's model query once another lane failed or the run was interrupted."""


class _LaneCounter(QueryCounter):
    """A batch's query counter that stops its lane when the executor says so."""

    def __init__(self, model: Model, shared: tuple[Budget, ...], stop: threading.Event
                 ) -> None:
        super().__init__(model, shared=shared)
        self._stop = stop

    def _spend(self, x: torch.Tensor) -> None:
        if self._stop.is_set():
            raise _Stopped("the run is stopping")
        super()._spend(x)


def _local_batches(spec: CheckSpec, model: Model, reference: Model | None,
                   shared: tuple[Budget, ...], data: Dataset, batches: list[list[int]],
                   ctx: CheckContext, lanes: int
                   ) -> Iterator[Batch]:
    """Run batches in this process, ``lanes`` at once on threads: yields (indices, records,
    queries the model saw, queries the reference model saw) as batches finish.

    Each batch has its own counters charged to the ``shared`` budgets. After a batch fails no
    new batch starts; the running ones stop at their next model query (their records are
    dropped, as an interrupted batch's are) and the first failure is raised.
    """
    stop = threading.Event()

    def one(idx: list[int]) -> Batch:
        if idx[-1] - idx[0] == len(idx) - 1:  # contiguous (the usual case): a view, no copy
            x, y = data.x[idx[0] : idx[-1] + 1], data.y[idx[0] : idx[-1] + 1]
        else:
            x, y = data.x[idx], data.y[idx]
        counter = _LaneCounter(model, shared, stop)
        ref = None if reference is None else _LaneCounter(reference, shared, stop)
        with contextlib.ExitStack() as lanes_of:  # each endpoint's queue knows its lanes
            for m in (model, reference):
                endpoint = endpoint_of(m)
                if endpoint is not None:
                    lanes_of.enter_context(endpoint.lane())
            rows = run_batch_isolating(spec.check, counter, x.to(ctx.device),
                                       y.to(ctx.device), idx,
                                       dataclasses.replace(ctx, reference=ref))
        return idx, rows, counter.queries, 0 if ref is None else ref.queries

    if lanes <= 1:
        for idx in batches:
            yield one(idx)
        return
    todo = list(reversed(batches))
    running: set[Future[Batch]] = set()
    failure: BaseException | None = None
    with ThreadPoolExecutor(max_workers=lanes, thread_name_prefix="certify-lane") as pool:
        try:
            while todo or running:
                while todo and failure is None and len(running) < lanes:
                    running.add(pool.submit(one, todo.pop()))
                if not running:
                    break
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for f in done:
                    exc = f.exception()
                    if exc is None:
                        yield f.result()
                    elif failure is None or isinstance(failure, _Stopped):
                        failure = exc
                        stop.set()
        finally:
            stop.set()  # an interrupt or a closed generator: lanes stop at their next query
    if failure is not None:
        raise failure



class LocalExecutor:
    """:class:`~certify.engine.executor.Executor` in this process: ``lanes`` batches at once.

    Each batch gets its own counters, charged live to the check's budget and the run's
    ``run_budget`` (shared with the runner), so a budget holds across lanes as queries are
    made. An endpoint's batches are at most its request size; its request queue packs what
    the lanes ask at once into full requests (:mod:`certify.models.request_queue`).
    """

    live_budget: ClassVar[bool] = True

    def __init__(self, model: Model, reference: Model | None, run_budget: Budget,
                 lanes: int) -> None:
        self.model = model
        self.reference = reference
        self.run_budget = run_budget
        self.lanes = lanes

    def start(self, run_budget: int | None) -> None:
        """Nothing to start: the run's budget is the shared ``run_budget`` object."""

    def run_check(self, spec: CheckSpec, data: Dataset, pending: list[int], batch_size: int,
                  ctx: CheckContext, budget: int | None) -> Iterator[Batch]:
        """Run ``pending`` in batches, ``lanes`` at once, yielding them as they finish."""
        check_budget = Budget(budget, f"query budget of check {spec.id.split(ROUND_SEP)[0]}")
        endpoint = endpoint_of(self.model)
        if endpoint is not None:
            # batches of one request's images, not cut smaller to feed every lane: the
            # endpoint's queue packs what the lanes ask at once into full requests, and an
            # attack's batch steps all its active samples in one request per iteration
            size = min(batch_size, int(endpoint.options.batch))
            batches = [pending[s : s + size] for s in range(0, len(pending), size)]
        else:
            batches = lane_batches(pending, batch_size, self.lanes)
        return _local_batches(spec, self.model, self.reference, (check_budget, self.run_budget),
                              data, batches, ctx, self.lanes)

    def confirm_batching(self, x: torch.Tensor) -> None:
        """Nothing to do: the batches run on the run's own model, already confirmed."""

    def traffic(self) -> dict[str, dict[str, int]]:
        """The models' own traffic counts are read by the runner: nothing extra here."""
        return {}

    def disable_hedging(self, why: str) -> None:
        """The models are this process's: the runner turns their hedging off directly."""
