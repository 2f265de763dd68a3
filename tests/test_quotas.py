"""A token's quotas hold under concurrent submissions, the queue is fair across tokens, and a
request through a trusted proxy is never "this host" for /metrics (issue 38, points 4 and 5).

One real ``certify serve`` on 127.0.0.1 with ``--workers 0``, so nothing runs and the tests
claim runs from the database themselves (claim order, not timing). Submissions name an
endpoint, a packaged suite and a registered dataset: no upload, the cheapest submission.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
from pg import postgres_cluster
from service_fixture import Service, small_inputs
from sqlalchemy import select

from certify.service import queue
from certify.service.db import (
    DONE,
    QUEUED,
    RUNNING,
    Run,
    make_engine,
    migrate,
    sessions,
    sqlite_url,
)

pytestmark = pytest.mark.e2e

ENDPOINT = "http://127.0.0.1:9/predict"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("quotas")
    _suite, data = small_inputs(root / "in")
    svc = Service(root / "home", "--workers", "0", "--dataset", f"small={data}",
                  "--allow-endpoint", "127.0.0.1:9", "--trusted-proxy", "127.0.0.1").start()
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def factory(served: Service) -> Iterator[Any]:
    """The served database, opened by the test (as a second process would)."""
    engine = make_engine(sqlite_url(served.home))
    yield sessions(engine)
    engine.dispose()


def _token(factory: Any, role: str = "submit", **limits: Any) -> str:
    """A new token, made in the served database (as ``certify serve token create`` makes
    one, without its process)."""
    from certify.service import auth

    with factory() as s:
        plain, _ = auth.create_token(s, "t", role, None, **limits)
    return plain


def _submit(svc: Service, token: str, seed: int) -> requests.Response:
    return svc.post("/runs", token, data={"endpoint": ENDPOINT, "suite": "gtsrb",
                                          "dataset": "small", "seed": str(seed)})


def _at_once(svc: Service, token: str, n: int) -> list[requests.Response]:
    """``n`` submissions of one token, released together from ``n`` threads."""
    start = threading.Barrier(n)

    def one(i: int) -> requests.Response:
        start.wait()
        return _submit(svc, token, i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def _token_id(factory: Any, run_id: str) -> int:
    with factory() as s:
        return int(s.scalar(select(Run.token_id).where(Run.id == run_id)))


def _live(factory: Any, token_id: int) -> list[Run]:
    with factory() as s:
        return list(s.scalars(select(Run).where(Run.token_id == token_id,
                                                Run.state.in_((QUEUED, RUNNING)))))


def test_20_concurrent_submissions_against_a_limit_of_4_accept_exactly_4(served, factory):
    """The issue's reproduction: limit 4, 20 at once, 17 were accepted."""
    token = _token(factory, max_concurrent=4)
    answers = _at_once(served, token, 20)
    codes = sorted(r.status_code for r in answers)
    assert codes == [202] * 4 + [429] * 16, [r.text for r in answers if r.status_code >= 500]
    accepted = [r.json()["id"] for r in answers if r.status_code == 202]
    live = _live(factory, _token_id(factory, accepted[0]))
    assert sorted(r.id for r in live) == sorted(accepted)
    assert all("limit is 4" in r.json()["detail"] for r in answers if r.status_code == 429)


def test_two_submissions_cannot_both_take_a_budget_that_covers_one(served, factory):
    """``--query-budget 100`` was granted twice over: each run holds what was left."""
    token = _token(factory, query_budget=100, max_concurrent=10)
    answers = _at_once(served, token, 10)
    accepted = [r.json()["id"] for r in answers if r.status_code == 202]
    assert len(accepted) == 1, [(r.status_code, r.text) for r in answers]
    assert {r.status_code for r in answers if r.status_code != 202} == {429}
    live = _live(factory, _token_id(factory, accepted[0]))
    assert [r.options["query_budget"] for r in live] == [100]  # the whole budget, once


def test_a_token_s_queue_does_not_delay_another_s_first_run(served, factory):
    """Token A queues 20 runs, token B then one: B's run is claimed before A's second."""
    a = _token(factory, max_concurrent=20)
    b = _token(factory)
    a_runs = [_submit(served, a, i) for i in range(20)]
    assert all(r.status_code == 202 for r in a_runs), a_runs[-1].text
    a_ids = [r.json()["id"] for r in a_runs]
    b_run = _submit(served, b, 0)
    assert b_run.status_code == 202, b_run.text
    b_id = b_run.json()["id"]
    claimed: list[str] = []
    while b_id not in claimed:  # other tests' runs may be queued too: claim up to B's
        run = queue.claim(factory, "test-worker", 600)
        assert run is not None, "B's run was never claimed"
        claimed.append(run.id)
    mine = [rid for rid in claimed if rid in a_ids]
    assert mine == a_ids[:1], "A's second run was claimed before B's first"
    # A's runs are then taken in A's submission order
    nxt = queue.claim(factory, "test-worker", 600)
    while nxt is not None and nxt.id not in a_ids:
        nxt = queue.claim(factory, "test-worker", 600)
    assert nxt is not None and nxt.id == a_ids[1]


def test_a_worker_that_finishes_one_run_turns_to_the_token_that_waited(tmp_path):
    """One worker: A's first run ends, and B's run (queued behind A's 5) goes before A's
    second; a run whose lease expired is claimed again."""
    engine = make_engine(sqlite_url(tmp_path))
    try:
        migrate(engine)
        factory = sessions(engine)
        fields: dict[str, Any] = {"model_kind": "http", "model_ref": ENDPOINT, "model_name": "m",
                  "suite": "gtsrb", "suite_name": "gtsrb", "dataset": "small", "options": {}}
        with factory() as s:
            a = [queue.enqueue(s, token_id=1, **fields).id for _ in range(5)]
            b = queue.enqueue(s, token_id=2, **fields).id
        first = queue.claim(factory, "w", 600)
        assert first is not None and first.id == a[0]
        assert queue.finish(factory, first.id, "w", state=DONE)
        second = queue.claim(factory, "w", 600)
        assert second is not None and second.id == b  # not a[1]: it ties on rank and is older
        assert queue.finish(factory, b, "w", state=DONE)
        lost = queue.claim(factory, "w", -1)  # its lease is over at once: a dead worker's
        assert lost is not None and lost.id == a[1]
        again = queue.claim(factory, "w2", 600)
        assert again is not None and again.id == a[1] and again.attempts == 2
    finally:
        engine.dispose()


def test_quotas_hold_under_concurrency_on_postgresql():
    """The same atomic admission on PostgreSQL (row lock on the token): 20 inserts at once
    against a limit of 4, and a budget that covers one run."""
    from fastapi import HTTPException

    from certify.service import auth
    from certify.service.submit_checks import admit

    with postgres_cluster() as url:
        engine = make_engine(url)
        try:
            migrate(engine)
            factory = sessions(engine)
            with factory() as s:
                _, limited = auth.create_token(s, "limited", "submit", None, max_concurrent=4)
                _, budget = auth.create_token(s, "budget", "submit", None, query_budget=100,
                                              max_concurrent=10)

            def insert_at_once(token_id: int, n: int) -> list[Run | int]:
                start = threading.Barrier(n)

                def one(i: int) -> Run | int:
                    start.wait()
                    with factory() as s:
                        try:
                            return queue.enqueue(
                                s, admit=admit, token_id=token_id, model_kind="http",
                                model_ref=ENDPOINT, model_name="m", suite="gtsrb",
                                suite_name="gtsrb", dataset="small",
                                options={"seed": i, "query_budget": 100})
                        except HTTPException as exc:
                            return exc.status_code

                with ThreadPoolExecutor(n) as pool:
                    return list(pool.map(one, range(n)))

            out = insert_at_once(limited.id, 20)
            assert sum(isinstance(o, Run) for o in out) == 4
            assert sorted(o for o in out if isinstance(o, int)) == [429] * 16
            out = insert_at_once(budget.id, 6)
            runs = [o for o in out if isinstance(o, Run)]
            assert [r.options["query_budget"] for r in runs] == [100]
            # the fair order on PostgreSQL: the limited token's first, then the other's
            firsts = [queue.claim(factory, "w", 600) for _ in range(2)]
            assert [r.token_id for r in firsts if r is not None] == [limited.id, budget.id]
        finally:
            engine.dispose()


def _get_from(svc: Service, source: str, path: str, headers: dict[str, str]) -> int:
    """GET ``path`` from the local address ``source`` (the socket's peer the server sees)."""
    conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=10,
                                      source_address=(source, 0))
    try:
        conn.request("GET", path, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def test_metrics_through_a_trusted_proxy_on_this_host_need_an_admin(served, factory):
    """The issue's reproduction: behind a local proxy (127.0.0.1, --trusted-proxy) every
    request counted as loopback. The proxy's clients are elsewhere, whatever they claim."""
    proxy = "127.0.0.1"
    assert _get_from(served, proxy, "/metrics", {}) == 401
    assert _get_from(served, proxy, "/metrics", {"X-Forwarded-For": "127.0.0.1"}) == 401
    admin = {"Authorization": f"Bearer {_token(factory, 'admin')}"}
    assert _get_from(served, proxy, "/metrics", admin) == 200
    # another loopback address, not a proxy: this host, no token needed
    assert _get_from(served, "127.0.0.2", "/metrics", {}) == 200


def test_a_run_that_ends_gives_its_place_back(served, factory):
    """A token at its limit is refused until one of its runs ends."""
    token = _token(factory, max_concurrent=1)
    first = _submit(served, token, 0)
    assert first.status_code == 202
    assert _submit(served, token, 1).status_code == 429
    with factory() as s:
        queue.request_cancel(s, first.json()["id"])
    assert _submit(served, token, 2).status_code == 202
