"""The durable run queue: runs are rows; workers claim them with a lease renewed by heartbeat.

Every transition is one conditional UPDATE, so it is atomic on SQLite and PostgreSQL alike: a
claim succeeds only if the row is still queued (or its lease has expired), and a heartbeat or
finish only while the caller still holds the lease. A server killed mid-run leaves its runs
``running`` with a lease that expires; the next claim takes them up again (and resumes them).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from certify.service.db import CANCELLED, QUEUED, RUNNING, Run, utcnow


def enqueue(session: Session, **fields: Any) -> Run:
    """Insert a queued run (``fields`` are Run columns); returns it with its id and order."""
    for _ in range(20):
        seq = (session.scalar(select(func.max(Run.seq))) or 0) + 1
        run = Run(id=uuid.uuid4().hex, seq=seq, state=QUEUED, created=utcnow(), updated=utcnow(),
                  cancel_requested=False, attempts=0, progress={}, **fields)
        session.add(run)
        try:
            session.commit()
            return run
        except IntegrityError:  # another submission took this seq: take the next
            session.rollback()
    raise RuntimeError("could not allocate a run number after 20 tries")


def _claimable(now: dt.datetime) -> Any:
    return or_(Run.state == QUEUED,
               and_(Run.state == RUNNING, Run.lease_expires < now))


def claim(factory: sessionmaker[Any], owner: str, lease_s: float) -> Run | None:
    """Take the oldest queued run, or a running one whose lease expired; None if there is none."""
    with factory() as s:
        now = utcnow()
        # A run cancelled while its worker was gone (server killed) ends now.
        s.execute(update(Run).where(Run.state == RUNNING, Run.lease_expires < now,
                                    Run.cancel_requested.is_(True))
                  .values(state=CANCELLED, lease_owner=None, lease_expires=None, updated=now,
                          error="cancelled while its server was down"))
        s.commit()
        ids = s.scalars(select(Run.id).where(_claimable(now), Run.cancel_requested.is_(False))
                        .order_by(Run.seq).limit(8)).all()
        for rid in ids:
            res = s.execute(update(Run).where(Run.id == rid, _claimable(now))
                            .values(state=RUNNING, lease_owner=owner, attempts=Run.attempts + 1,
                                    lease_expires=now + dt.timedelta(seconds=lease_s),
                                    updated=now))
            s.commit()
            if res.rowcount == 1:
                return s.get(Run, rid, populate_existing=True)
        return None


def heartbeat(factory: sessionmaker[Any], run_id: str, owner: str, lease_s: float,
              progress: dict[str, Any] | None = None) -> tuple[bool, bool]:
    """Renew the lease (and store progress); returns (still held, cancel requested)."""
    with factory() as s:
        now = utcnow()
        values: dict[str, Any] = {"lease_expires": now + dt.timedelta(seconds=lease_s),
                                  "updated": now}
        if progress is not None:
            values["progress"] = progress
        res = s.execute(update(Run).where(Run.id == run_id, Run.lease_owner == owner,
                                          Run.state == RUNNING).values(**values))
        s.commit()
        cancel = bool(s.scalar(select(Run.cancel_requested).where(Run.id == run_id)))
        return res.rowcount == 1, cancel


def finish(factory: sessionmaker[Any], run_id: str, owner: str, **values: Any) -> bool:
    """Move a run this owner holds to a final state; False if the lease was lost."""
    with factory() as s:
        res = s.execute(update(Run).where(Run.id == run_id, Run.lease_owner == owner,
                                          Run.state == RUNNING)
                        .values(lease_owner=None, lease_expires=None, updated=utcnow(),
                                **values))
        s.commit()
        return res.rowcount == 1


def request_cancel(session: Session, run_id: str) -> str:
    """Cancel a run: a queued run ends at once, a running one at its worker's next heartbeat.

    Returns the run's state after the request.
    """
    now = utcnow()
    res = session.execute(update(Run).where(Run.id == run_id, Run.state == QUEUED)
                          .values(state=CANCELLED, cancel_requested=True, updated=now,
                                  error="cancelled before it started"))
    if res.rowcount == 0:  # type: ignore[attr-defined]
        session.execute(update(Run).where(Run.id == run_id, Run.state == RUNNING)
                        .values(cancel_requested=True, updated=now))
    session.commit()
    return str(session.scalar(select(Run.state).where(Run.id == run_id)))
