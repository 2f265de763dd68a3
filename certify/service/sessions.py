"""The web UI's sessions and CSRF tokens.

Logging in with an API token makes a row in the ``sessions`` table and sets a cookie holding a
random 256-bit id; the table keeps only the id's sha256 (a copy of the database yields no
usable cookie), the token's id and an expiry. Logging out deletes the row, so a cookie copied
before stops working at once; a session of a revoked or expired token is refused when it is
read. The cookie is not signed: an unguessable random id that must name a row gains nothing
from a MAC, and a stateless signed cookie is what could not be ended at logout.

Every form the UI serves carries a CSRF token derived from the session's id with the
service's session key (HMAC-SHA256); a POST without the matching one is refused. The cookie is
HttpOnly and SameSite=Strict, and Secure when the request came over HTTPS (behind a TLS proxy
that sets X-Forwarded-Proto).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import re
import secrets

from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from certify.service.db import WebSession, utcnow

SESSION_S = 8 * 3600
#: What a cookie this service set looks like (``secrets.token_urlsafe(32)``).
_COOKIE = re.compile(r"^[A-Za-z0-9_-]{43}$")


def _hash(value: str) -> str:
    return hashlib.sha256(value.encode("ascii")).hexdigest()


def _mac(key: bytes, data: bytes) -> str:
    return base64.urlsafe_b64encode(hmac.new(key, data, hashlib.sha256).digest()).decode()


def new_session(factory: sessionmaker[Session], token_id: int, lifetime_s: int = SESSION_S) -> str:
    """Start a session for a logged-in token; returns the cookie's value (shown only here).
    Expired sessions are swept on the way."""
    value = secrets.token_urlsafe(32)
    now = utcnow()
    with factory() as s:
        s.execute(delete(WebSession).where(WebSession.expires < now))
        s.add(WebSession(id_hash=_hash(value), token_id=token_id, created=now,
                         expires=now + dt.timedelta(seconds=lifetime_s)))
        s.commit()
    return value


def session_token(session: Session, value: str) -> int | None:
    """The token id of a live session (``session`` is a database session); None for an
    unknown, ended or expired one. The caller still checks the token itself."""
    if not _COOKIE.match(value):
        return None
    row = session.get(WebSession, _hash(value))
    if row is None or row.expires <= utcnow():
        return None
    return int(row.token_id)


def end_session(factory: sessionmaker[Session], value: str | None) -> None:
    """Log out: delete the session's row (nothing for an unknown one)."""
    if not value or not _COOKIE.match(value):
        return
    with factory() as s:
        s.execute(delete(WebSession).where(WebSession.id_hash == _hash(value)))
        s.commit()


def csrf_token(session_value: str, key: bytes) -> str:
    """The CSRF token of a session (forms carry it; POSTs must send it back)."""
    return _mac(key, b"csrf:" + session_value.encode())


def check_csrf(session_value: str | None, given: str | None, key: bytes) -> bool:
    """Whether ``given`` is the CSRF token of this session."""
    if not session_value or not given:
        return False
    return hmac.compare_digest(csrf_token(session_value, key), given)
