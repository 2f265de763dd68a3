"""Issue 61 point 1: one request queue per endpoint packs what concurrent callers ask into
requests of at most ``--http-batch`` images (certify/models/request_queue.py), on a recording
fake transport. The same against a real MLServer: tests/test_endpoint_queue.py."""

from __future__ import annotations

import functools
import threading
import time

import numpy as np
import pytest

from certify.models.request_queue import LINGER_S, RequestQueue

import builders

pytestmark = pytest.mark.unit


class Recorder:
    """A transport that answers each image with (its value, its value × 2) and records each
    request's size; ``fail`` raises for requests whose first image has that value."""

    def __init__(self, slots: threading.Semaphore, fail: float | None = None,
                 delay: float = 0.0) -> None:
        self.slots, self.fail, self.delay = slots, fail, delay
        self.sizes: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, arr: np.ndarray, slot_held: bool) -> np.ndarray:
        try:
            with self.lock:
                self.sizes.append(len(arr))
            time.sleep(self.delay)
            if self.fail is not None and self.fail in arr[:, 0]:
                raise RuntimeError(f"request with {len(arr)} images failed")
            return np.stack([arr[:, 0], 2 * arr[:, 0]], axis=1)
        finally:
            if slot_held:
                self.slots.release()


def _queue(batch: int = 64, concurrency: int = 4, **kw: object) -> tuple[RequestQueue,
                                                                         Recorder]:
    slots = threading.BoundedSemaphore(concurrency)
    rec = Recorder(slots, **kw)  # type: ignore[arg-type]
    return RequestQueue(rec, slots, batch, concurrency), rec


def _images(values: range | list[int]) -> np.ndarray:
    return np.asarray(list(values), dtype=np.float32)[:, None]


def _lanes(q: RequestQueue, asks: list[np.ndarray]) -> list[np.ndarray | BaseException]:
    """Each of ``asks`` from its own registered lane, all at once; their answers."""
    return builders.in_lanes(q.lane, [functools.partial(q.submit, a) for a in asks], 10)


def test_concurrent_lanes_go_in_one_request_and_each_gets_its_own_rows():
    q, rec = _queue()
    asks = [_images(range(10 * k, 10 * k + 6)) for k in range(8)]  # 8 lanes x 6 images
    try:
        answers = _lanes(q, asks)
    finally:
        q.close()
    assert rec.sizes == [48], rec.sizes  # every lane waited: one request, no linger
    for ask, got in zip(asks, answers, strict=True):
        assert isinstance(got, np.ndarray)
        np.testing.assert_array_equal(got, np.concatenate([ask, 2 * ask], axis=1))
    assert (q.requests, q.images) == (1, 48)


def test_a_large_ask_is_split_into_full_requests_in_order():
    q, rec = _queue(batch=64, concurrency=2)
    try:
        got = q.submit(_images(range(150)))
    finally:
        q.close()
    assert sorted(rec.sizes) == [22, 64, 64]
    np.testing.assert_array_equal(got[:, 0], np.arange(150))


def test_a_caller_outside_any_lane_is_not_kept_waiting_for_the_linger():
    q, rec = _queue()
    try:
        for k in range(20):
            q.submit(_images([k]))
    finally:
        q.close()
    assert rec.sizes == [1] * 20
    assert q.lingered == 0  # no request waited out the linger


def test_a_lane_still_computing_is_waited_for_at_most_the_linger():
    """Two lanes registered, one asks, the other never does: the request goes after the
    linger, with the one lane's images."""
    q, rec = _queue()
    try:
        with q.lane(), q.lane():
            started = time.perf_counter()
            got = q.submit(_images([1, 2, 3]))
            took = time.perf_counter() - started
    finally:
        q.close()
    assert rec.sizes == [3] and got.shape == (3, 2)
    assert q.lingered == 1 and took >= LINGER_S * 0.9, took


def test_a_failed_request_fails_every_caller_in_it_and_no_other():
    """The stated rule: one answer cannot tell whose images it garbled, so every caller with
    images in a failed request gets its error; a caller in another request is answered."""
    q, rec = _queue(batch=8, concurrency=1, fail=3.0, delay=0.02)
    asks = [_images([1, 2, 3]), _images([4, 5]), _images([10, 11, 12, 13, 14, 15, 16, 17])]
    try:
        answers = _lanes(q, asks)
    finally:
        q.close()
    # the first request packs the oldest asks; the one holding image 3 fails for all in it
    failed = [k for k, a in enumerate(answers) if isinstance(a, BaseException)]
    answered = [k for k, a in enumerate(answers) if isinstance(a, np.ndarray)]
    assert 0 in failed and failed and answered, (rec.sizes, answers)
    for k in failed:
        assert "failed" in str(answers[k])
    for k in answered:
        np.testing.assert_array_equal(answers[k][:, 0], asks[k][:, 0])  # type: ignore[index]
