"""The durable run queue: runs are rows; workers claim them with a lease renewed by heartbeat.

Every transition is one conditional UPDATE, so it is atomic on SQLite and PostgreSQL alike: a
claim succeeds only if the row is still queued (or its lease has expired), and a heartbeat or
finish only while the caller still holds the lease. A server killed mid-run leaves its runs
``running`` with a lease that expires; the next claim takes them up again (and resumes them).

An insert can be guarded by an admission step that runs in the insert's own transaction (a
token's quotas: :func:`certify.service.submit_checks.admit`), so that checking a limit and
taking a place under it are one step. The claim order is fair across tokens
(:func:`_claim_order`): a token with many queued runs delays another token's first run by at
most one run per worker.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable

from sqlalchemy import ColumnElement, and_, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from certify.service.db import (
    CANCELLED,
    FINAL_STATES,
    QUEUED,
    RUNNING,
    Run,
    Token,
    Worker,
    changed_rows,
    db_now,
    utcnow,
)
from certify.service.runids import new_run_id

#: Called inside the insert's transaction before the row is added: it may lock rows, check
#: limits (raising to refuse: the transaction is rolled back) and return the fields to insert.
Admit = Callable[[Session, dict[str, object]], dict[str, object]]

_listeners: list[Callable[[], None]] = []
_listeners_lock = threading.Lock()


def on_enqueue(listener: Callable[[], None]) -> Callable[[], None]:
    """Call ``listener`` after each run this process puts on the queue (a worker pool in the
    API's process claims it at once instead of at its next poll; a worker elsewhere still
    polls). Returns the function that unregisters it."""
    with _listeners_lock:
        _listeners.append(listener)

    def remove() -> None:
        with _listeners_lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return remove


def notify_enqueued() -> None:
    """Tell this process's listeners (:func:`on_enqueue`) that a run is claimable."""
    with _listeners_lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener()


def enqueue(session: Session, admit: Admit | None = None, run_id: str | None = None,
            **fields: object) -> Run:
    """Insert a queued run (``fields`` are Run columns); returns it with its id and order.

    ``admit`` runs first in the same transaction, and again on each retry: whatever it checked
    still holds when the row is committed, provided it locked what it read (a token's row).
    ``run_id`` is the run's id when the caller needs it before the insert (to encrypt the run's
    secret with it, so that the run is never claimable without its secret).
    """
    rid = run_id or new_run_id()
    for _ in range(20):
        try:
            values = admit(session, dict(fields)) if admit is not None else fields
            seq = (session.scalar(select(func.max(Run.seq))) or 0) + 1
            run = Run(id=rid, seq=seq, state=QUEUED, created=utcnow(), updated=utcnow(),
                      cancel_requested=False, attempts=0, progress={}, **values)
            session.add(run)
            session.commit()
            notify_enqueued()
            return run
        except IntegrityError:  # another submission took this seq: take the next
            session.rollback()
        except BaseException:
            session.rollback()
            raise
    raise RuntimeError("could not allocate a run number after 20 tries")


def _claimable(now: dt.datetime, device: str | None = None) -> ColumnElement[bool]:
    """Queued runs, and running ones whose lease expired; with ``device``, only those a
    worker with that device may run: a run that asked for none, or for that device. A run's
    first claim pins it to its worker's device (:func:`claim`), so that a resumed run goes on
    where its records were computed."""
    live = or_(Run.state == QUEUED, and_(Run.state == RUNNING, Run.lease_expires < now))
    if device is None:
        return live
    return and_(live, or_(Run.device.is_(None), Run.device == device))


def _claim_order(s: Session, now: dt.datetime, limit: int = 8, device: str | None = None
                 ) -> list[str]:
    """Ids of the claimable runs in the order workers take them, at most ``limit``.

    Fair across tokens rather than first in, first out: first the runs of the token with the
    fewest runs running now (a live lease), then of the token served longest ago (its last
    started run that ended, ended first; never served comes first), then by the run's rank
    among its token's claimable runs, then by submission order. A token with many queued runs
    therefore takes one worker before another token's first run is next, and a worker that
    finishes one of its runs turns to the token that waited (which the rank and submission
    order alone would not do: the same token's next run would tie on both and be older).
    """
    cands = s.execute(select(Run.id, Run.token_id, Run.seq)
                      .where(_claimable(now, device), Run.cancel_requested.is_(False))
                      .order_by(Run.seq)).all()
    tokens = {c.token_id for c in cands}
    if len(tokens) <= 1:  # one token (or none): its own submission order
        return [c.id for c in cands[:limit]]
    running = dict(s.execute(
        select(Run.token_id, func.count()).where(
            Run.state == RUNNING, Run.lease_expires >= now, Run.token_id.in_(tokens))
        .group_by(Run.token_id)).all())
    served = dict(s.execute(
        select(Run.token_id, func.max(Run.updated)).where(
            Run.state.in_(FINAL_STATES), Run.attempts > 0, Run.token_id.in_(tokens))
        .group_by(Run.token_id)).all())
    # a run without a token (none is made by the API today) is one more queue of its own
    ranks: dict[int | None, int] = {}
    keyed = []
    for c in cands:
        ranks[c.token_id] = rank = ranks.get(c.token_id, 0) + 1
        last = served.get(c.token_id)
        keyed.append(((running.get(c.token_id, 0), last is not None, last or now, rank, c.seq),
                      c.id))
    keyed.sort(key=lambda k: k[0])
    return [rid for _key, rid in keyed[:limit]]


def claim(factory: sessionmaker[Session], owner: str, lease_s: float, device: str | None = None
          ) -> Run | None:
    """Take the next run in the fair order (:func:`_claim_order`) that a worker with
    ``device`` may run (None: any): a queued one, or a running one whose lease expired; None
    if there is none. Times are the database's (:func:`certify.service.db.db_now`)."""
    with factory() as s:
        now = db_now(s)
        # A run cancelled while its worker was gone (server killed) ends now.
        s.execute(update(Run).where(Run.state == RUNNING, Run.lease_expires < now,
                                    Run.cancel_requested.is_(True))
                  .values(state=CANCELLED, lease_owner=None, lease_expires=None, updated=now,
                          error="cancelled while its server was down"))
        s.commit()
        for rid in _claim_order(s, now, device=device):
            taken = changed_rows(s, update(Run).where(Run.id == rid, _claimable(now, device),
                                                      Run.cancel_requested.is_(False))
                                 .values(state=RUNNING, lease_owner=owner,
                                         attempts=Run.attempts + 1,
                                         device=func.coalesce(Run.device, device),
                                         lease_expires=now + dt.timedelta(seconds=lease_s),
                                         updated=now))
            s.commit()
            if taken == 1:
                return s.get(Run, rid, populate_existing=True)
        return None


def heartbeat(factory: sessionmaker[Session], run_id: str, owner: str, lease_s: float,
              progress: dict[str, object] | None = None) -> tuple[bool, bool]:
    """Renew the lease (and store progress); returns (still held, cancel requested)."""
    with factory() as s:
        now = db_now(s)
        values: dict[str, object] = {"lease_expires": now + dt.timedelta(seconds=lease_s),
                                  "updated": now}
        if progress is not None:
            values["progress"] = progress
        held = changed_rows(s, update(Run).where(Run.id == run_id, Run.lease_owner == owner,
                                                 Run.state == RUNNING).values(**values))
        s.commit()
        cancel = bool(s.scalar(select(Run.cancel_requested).where(Run.id == run_id)))
        return held == 1, cancel


def finish(factory: sessionmaker[Session], run_id: str, owner: str, charge: int = 0,
           **values: object) -> bool:
    """Move a run this owner holds to a final state; False if the lease was lost.

    ``charge`` model queries are added to the run's token's spent queries in the same
    transaction: the budget a live run holds is released only as what it spent is charged, so
    a submission admitted meanwhile never sees that budget twice.
    """
    with factory() as s:
        held = changed_rows(s, update(Run).where(Run.id == run_id, Run.lease_owner == owner,
                                                 Run.state == RUNNING)
                            .values(lease_owner=None, lease_expires=None, updated=db_now(s),
                                    **values)) == 1
        if held and charge:
            token_id = s.scalar(select(Run.token_id).where(Run.id == run_id))
            if token_id is not None:
                s.execute(update(Token).where(Token.id == token_id)
                          .values(queries_used=Token.queries_used + int(charge)))
        s.commit()
        return held


def request_cancel(session: Session, run_id: str) -> str:
    """Cancel a run: a queued run ends at once, a running one at its worker's next heartbeat.

    Returns the run's state after the request.
    """
    now = utcnow()
    if not changed_rows(session, update(Run).where(Run.id == run_id, Run.state == QUEUED)
                        .values(state=CANCELLED, cancel_requested=True, updated=now,
                                error="cancelled before it started")):
        session.execute(update(Run).where(Run.id == run_id, Run.state == RUNNING)
                        .values(cancel_requested=True, updated=now))
    session.commit()
    return str(session.scalar(select(Run.state).where(Run.id == run_id)))


#: A worker that has not sent a heartbeat for this long is no longer listed in ``/metrics``.
WORKER_FORGOTTEN = dt.timedelta(hours=1)


def worker_heartbeat(factory: sessionmaker[Session], worker_id: str, host: str, device: str,
                     slots: int, running: int) -> None:
    """Record that worker ``worker_id`` is alive (its slots, and the runs it holds), on the
    database's clock; the first heartbeat registers it. Workers silent for
    :data:`WORKER_FORGOTTEN` (lost with their machine) are forgotten."""
    with factory() as s:
        now = db_now(s)
        s.execute(delete(Worker).where(Worker.last_seen < now - WORKER_FORGOTTEN))
        if not changed_rows(s, update(Worker).where(Worker.id == worker_id)
                            .values(last_seen=now, running=running, slots=slots,
                                    device=device)):
            s.add(Worker(id=worker_id, host=host[:200], device=device, started=now,
                         last_seen=now, slots=slots, running=running))
        s.commit()


def worker_gone(factory: sessionmaker[Session], worker_id: str) -> None:
    """Remove a worker that stopped cleanly (a killed one ages out of ``/metrics``)."""
    with factory() as s:
        s.execute(delete(Worker).where(Worker.id == worker_id))
        s.commit()
