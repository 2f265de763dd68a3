"""``GET /metrics``: the service's state in the Prometheus text exposition format (0.0.4).

Runs by state and the queue's depth are read from the database at each scrape, with a
histogram of finished runs' durations (submission to end); HTTP responses by status class and
card verifications are counted by this process since it started. Readable with an admin token,
or from the loopback address (a Prometheus on the same host); from anywhere else it is refused.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import TYPE_CHECKING

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from certify.service.db import DONE, ERROR, FINAL_STATES, QUEUED, RUNNING, Run, Worker, db_now

if TYPE_CHECKING:
    from certify.service.store import Store

#: Upper bounds (seconds) of the run-duration histogram's buckets.
DURATION_BUCKETS = (10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0)
STATES = (QUEUED, RUNNING, *FINAL_STATES)


class Counters:
    """What this process counts: HTTP responses by status class, verifications by outcome."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.responses: Counter[str] = Counter()
        self.verifications: Counter[str] = Counter()
        #: the last probe's round trip to the store, in seconds
        self.store_seconds: float | None = None

    def response(self, status: int) -> None:
        """Count one HTTP response."""
        with self._lock:
            self.responses[f"{status // 100}xx"] += 1

    def verification(self, outcome: str) -> None:
        """Count one card verification (``valid``, ``visible_not_checked``, ``invalid`` or
        ``refused``)."""
        with self._lock:
            self.verifications[outcome] += 1

    def store_latency(self, seconds: float) -> None:
        """Record one round trip to the store (a readiness or metrics probe)."""
        with self._lock:
            self.store_seconds = seconds

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        """(responses by status class, verifications by outcome) as of now."""
        with self._lock:
            return dict(self.responses), dict(self.verifications)


class CountResponses:
    """ASGI middleware: every HTTP response's status class into :class:`Counters`."""

    def __init__(self, app: ASGIApp, counters: Counters) -> None:
        self.app, self.counters = app, counters

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # noqa: D102
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.counters.response(int(message["status"]))
            await send(message)

        await self.app(scope, receive, counted)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def exposition(factory: sessionmaker[Session], counters: Counters,
               store: Store | None = None) -> str:
    """The metrics document; with ``store``, one probe of it gives the store's latency."""
    lines: list[str] = []

    def metric(name: str, kind: str, text: str,
               samples: list[tuple[dict[str, str], float]]) -> None:
        lines.extend([f"# HELP {name} {text}", f"# TYPE {name} {kind}"])
        for labels, value in samples:
            tag = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{tag}}} {value:g}" if tag else f"{name} {value:g}")

    with factory() as s:
        by_state = dict(s.execute(select(Run.state, func.count()).group_by(Run.state)).all())
        ended = list(s.execute(select(Run.created, Run.updated).where(
            Run.state.in_((DONE, ERROR)))).all())
        now = db_now(s)
        workers = list(s.scalars(select(Worker).order_by(Worker.id)))
    metric("certify_runs", "gauge", "Runs by state.",
           [({"state": st}, float(by_state.get(st, 0))) for st in STATES])
    metric("certify_queue_depth", "gauge", "Runs waiting to be claimed.",
           [({}, float(by_state.get(QUEUED, 0)))])
    durations = [max(0.0, (u - c).total_seconds()) for c, u in ended]
    buckets = [({"le": f"{b:g}"}, float(sum(d <= b for d in durations)))
               for b in DURATION_BUCKETS] + [({"le": "+Inf"}, float(len(durations)))]
    lines.extend(["# HELP certify_run_duration_seconds Finished runs (done or error), "
                  "from submission to end.",
                  "# TYPE certify_run_duration_seconds histogram"])
    for labels, value in buckets:
        lines.append(f'certify_run_duration_seconds_bucket{{le="{labels["le"]}"}} {value:g}')
    lines.append(f"certify_run_duration_seconds_sum {sum(durations):g}")
    lines.append(f"certify_run_duration_seconds_count {len(durations)}")
    responses, verifications = counters.snapshot()
    metric("certify_http_responses_total", "counter",
           "HTTP responses by status class since the service started.",
           [({"class": c}, float(responses.get(c, 0)))
            for c in ("2xx", "3xx", "4xx", "5xx")])
    metric("certify_verifications_total", "counter",
           "Card verifications by outcome since the service started.",
           [({"outcome": o}, float(verifications.get(o, 0)))
            for o in ("valid", "visible_not_checked", "invalid", "refused")])
    metric("certify_worker_heartbeat_age_seconds", "gauge",
           "Seconds since each worker's last heartbeat, on the database's clock (a worker "
           "that stopped cleanly is not listed; a lost one ages for an hour, then goes).",
           [({"worker": w.id, "host": w.host, "device": w.device},
             max(0.0, (now - w.last_seen).total_seconds())) for w in workers])
    metric("certify_worker_slots", "gauge", "Runs each worker may hold at once.",
           [({"worker": w.id}, float(w.slots)) for w in workers])
    metric("certify_worker_running", "gauge", "Runs each worker holds now.",
           [({"worker": w.id}, float(w.running)) for w in workers])
    if store is not None:
        import time

        started = time.perf_counter()
        try:
            store.ping()
            up, latency = 1.0, time.perf_counter() - started
            counters.store_latency(latency)
        except Exception:  # noqa: BLE001 - any failure means the store is down
            up, latency = 0.0, time.perf_counter() - started
        metric("certify_store_up", "gauge", "Whether the store answered this scrape's probe.",
               [({"store": store.description.split("://", 1)[0]}, up)])
        metric("certify_store_latency_seconds", "gauge",
               "Seconds of this scrape's probe of the store (a list of one key).",
               [({}, latency)])
    return "\n".join(lines) + "\n"
