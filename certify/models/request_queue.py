"""One queue per endpoint: every caller's images packed into full requests (issue 61).

An endpoint is paid per request (its server's overhead, a cloud's price, a quota), and the
engine asks it from several lanes at once, each with as many images as its step needs: a
corruption search's candidates, an attack's current iteration of its active samples. Sent as
asked, 430 images in 16 lanes went 27 per request and Square's 30 samples 2 per request. Here
every caller enqueues its images and blocks; senders pack the waiting images, oldest first,
into requests of at most ``batch`` images, ``concurrency`` at once (dynamic batching on the
client's side, as Triton's scheduler does on the server's), and hand each caller its rows.

When a request goes out (the packing rule, stated once): a sender first takes a request slot
(so that while every slot is busy, images accumulate into the next requests), then sends as
soon as ``batch`` images wait, or every lane the engine registered (:meth:`RequestQueue.lane`)
is blocked waiting for an answer (nobody will add more), or :data:`LINGER_S` passed since it
started waiting with images in hand. A caller outside any registered lane (a probe, the Python
API) therefore never waits for the linger.

Below the query counter: budgets stay per image and per lane; retries, hedges, deadlines and
the circuit breaker apply to the packed request (:meth:`certify.models.http.HttpModel._call`).
A failed packed request (its retries spent, or an error that is not retried, a malformed
answer's included) fails every caller with images in it, with the same error: one answer
cannot tell whose images it garbled.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

#: The longest a sender waits for more images once it holds some (seconds): short beside an
#: endpoint's round trip (milliseconds on a loopback, 20-100 ms in a cloud), long enough for
#: the lanes an answer just woke to ask their next step.
LINGER_S = 0.01


class _Job:
    """One caller's images: taken into requests in order, answered piece by piece."""

    __slots__ = ("arr", "taken", "left", "pieces", "error", "done")

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr
        self.taken = 0  # images handed to senders so far
        self.left = len(arr)  # images not answered yet
        self.pieces: list[tuple[int, np.ndarray]] = []
        self.error: BaseException | None = None
        self.done = threading.Event()


#: A piece of a request: (job, first image, end) of the job's images.
Piece = tuple[_Job, int, int]


class RequestQueue:
    """Packs callers' images into requests of at most ``batch`` images, ``concurrency``
    in flight, each sent with ``send(images, slot_held)`` (which releases the request slot,
    held for its first attempt, when that attempt ends)."""

    def __init__(self, send: Callable[[np.ndarray, bool], np.ndarray],
                 slots: threading.Semaphore, batch: int, concurrency: int,
                 linger_s: float = LINGER_S) -> None:
        self._send = send
        self._slots = slots
        self.batch = max(1, batch)
        self.linger_s = linger_s
        self._cv = threading.Condition()
        self._waiting: deque[_Job] = deque()
        self._queued = 0  # images waiting, not yet taken
        self._lanes = 0  # lanes the engine registered
        self._blocked = 0  # callers blocked in submit()
        self._closed = False
        # twice the slots: a request waiting out a Retry-After or a backoff holds a sender but
        # no slot, and the others keep the endpoint busy
        self._senders = 2 * max(1, concurrency)
        self._pool: ThreadPoolExecutor | None = None
        #: packed requests answered, and the images they carried; requests sent because the
        #: linger ran out (a registered lane was still computing)
        self.requests = 0
        self.images = 0
        self.lingered = 0

    @contextlib.contextmanager
    def lane(self) -> Iterator[None]:
        """Register the calling engine lane while it runs a batch: a request goes out early
        once every registered lane is blocked waiting for an answer."""
        with self._cv:
            self._lanes += 1
        try:
            yield
        finally:
            with self._cv:
                self._lanes -= 1
                self._cv.notify_all()

    def submit(self, arr: np.ndarray) -> np.ndarray:
        """The endpoint's rows for ``arr`` (one per image, in order), sent in packed
        requests; raises the error of a request that carried any of its images."""
        job = _Job(arr)
        with self._cv:
            if self._closed:
                raise RuntimeError("the endpoint's request queue is closed")
            self._start()
            self._waiting.append(job)
            self._queued += len(arr)
            self._blocked += 1
            self._cv.notify_all()
        try:
            job.done.wait()
        finally:
            with self._cv:
                self._blocked -= 1
        if job.error is not None:
            raise job.error
        job.pieces.sort(key=lambda p: p[0])
        return np.concatenate([p[1] for p in job.pieces])

    def close(self) -> None:
        """Stop the senders (waiting callers get an error)."""
        with self._cv:
            self._closed = True
            for job in self._waiting:
                job.error = RuntimeError("the endpoint's request queue was closed")
                job.done.set()
            self._waiting.clear()
            self._cv.notify_all()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # -- senders ------------------------------------------------------------------------
    def _start(self) -> None:
        if self._pool is None:  # called with the lock held
            self._pool = ThreadPoolExecutor(max_workers=self._senders,
                                            thread_name_prefix="certify-request")
            for _ in range(self._senders):
                self._pool.submit(self._sender)

    def _sender(self) -> None:
        while True:
            with self._cv:  # no slot is held while nothing waits (a retry may need one)
                while not self._waiting and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
            self._slots.acquire()  # images go on accumulating while every slot is busy
            try:
                pieces = self._take()
            except BaseException:
                self._slots.release()
                raise
            if not pieces:  # another sender took them, or the queue closed
                self._slots.release()
                if pieces is None:
                    return
                continue
            self._deliver(pieces)

    def _ready(self, since: float) -> bool:
        """Whether the images waiting should go now (see the module's packing rule)."""
        return (self._queued >= self.batch or self._blocked >= self._lanes
                or time.monotonic() - since >= self.linger_s)

    def _take(self) -> list[Piece] | None:
        """With a request slot held: linger by the packing rule (at most :data:`LINGER_S`)
        and take up to ``batch`` waiting images, oldest first; ``[]`` when none waits any
        more, ``None`` once closed."""
        with self._cv:
            if self._closed:
                return None
            if not self._waiting:
                return []
            since = time.monotonic()
            while not self._ready(since):
                self._cv.wait(max(0.0, self.linger_s - (time.monotonic() - since)))
                if self._closed:
                    return None
            lingered = self._queued < self.batch and self._blocked < self._lanes
            pieces: list[Piece] = []
            room = self.batch
            while room and self._waiting:
                job = self._waiting[0]
                n = min(room, len(job.arr) - job.taken)
                pieces.append((job, job.taken, job.taken + n))
                job.taken += n
                room -= n
                self._queued -= n
                if job.taken == len(job.arr):
                    self._waiting.popleft()
            if self._waiting:
                self._cv.notify_all()  # another sender may take the rest
            if pieces and lingered:
                self.lingered += 1  # sent because the linger ran out
            return pieces

    def _deliver(self, pieces: list[Piece]) -> None:
        """Send one packed request (its first attempt in the slot this sender holds) and
        hand each caller its rows, or the request's error."""
        arr = (pieces[0][0].arr[pieces[0][1]:pieces[0][2]] if len(pieces) == 1 else
               np.concatenate([job.arr[a:b] for job, a, b in pieces]))
        try:
            out = self._send(arr, True)
        except BaseException as exc:  # noqa: BLE001 - every caller in it gets the error
            with self._cv:
                for job, _a, _b in pieces:
                    job.error = exc
                    job.done.set()
            return
        with self._cv:  # a job's pieces may come back on several senders at once
            self.requests += 1
            self.images += len(arr)
            at = 0
            for job, a, b in pieces:
                job.pieces.append((a, out[at:at + b - a]))
                at += b - a
                job.left -= b - a
                if job.left == 0 and job.error is None:
                    job.done.set()
