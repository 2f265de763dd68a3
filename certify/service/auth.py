"""API tokens: created by the operator, stored only as sha256, with roles, expiry and limits.

Roles are ordered: ``read`` (look at runs and cards) < ``submit`` (also submit and cancel runs)
< ``admin`` (everything, every token's runs). A token is shown once, at creation.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from certify.errors import UsageError
from certify.service.db import Token, utcnow

ROLES = ("read", "submit", "admin")
PREFIX = "cfy_"


def hash_token(token: str) -> str:
    """The stored form of a token."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def parse_duration(text: str) -> dt.timedelta:
    """``90d``, ``12h``, ``30m`` → a timedelta (UsageError otherwise)."""
    m = re.fullmatch(r"\s*(\d+)\s*([dhm])\s*", text)
    if not m or int(m.group(1)) == 0:
        raise UsageError(f"--expires {text!r} is not a duration", hint="e.g. 90d, 12h or 30m")
    n, unit = int(m.group(1)), m.group(2)
    return {"d": dt.timedelta(days=n), "h": dt.timedelta(hours=n),
            "m": dt.timedelta(minutes=n)}[unit]


def create_token(session: Session, name: str, role: str, expires: dt.timedelta | None,
                 query_budget: int | None = None, max_concurrent: int = 4) -> tuple[str, Token]:
    """A new token (the plaintext, returned only here) and its stored row."""
    if role not in ROLES:
        raise UsageError(f"unknown role {role!r}", hint=f"one of {', '.join(ROLES)}")
    plain = PREFIX + secrets.token_urlsafe(32)
    row = Token(name=name, role=role, token_hash=hash_token(plain), created=utcnow(),
                expires=None if expires is None else utcnow() + expires, revoked=False,
                query_budget=query_budget, queries_used=0, max_concurrent=max_concurrent)
    session.add(row)
    session.commit()
    return plain, row


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's id, name and role."""

    token_id: int
    name: str
    role: str

    def allows(self, role: str) -> bool:
        """Whether this principal's role includes ``role``."""
        return ROLES.index(self.role) >= ROLES.index(role)


def authenticate(session: Session, token: str) -> Principal | None:
    """The principal of a valid token; None for unknown, revoked or expired tokens."""
    if not token.startswith(PREFIX) or len(token) > 200:
        return None
    row = session.scalar(select(Token).where(Token.token_hash == hash_token(token)))
    if row is None or row.revoked or (row.expires is not None and row.expires <= utcnow()):
        return None
    return Principal(row.id, row.name, row.role)


def revoke(session: Session, token_id: int) -> bool:
    """Revoke a token by id; False if there is none."""
    row = session.get(Token, token_id)
    if row is None:
        return False
    row.revoked = True
    session.commit()
    return True
