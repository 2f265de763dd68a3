"""The web UI's session cookie and CSRF token.

Logging in with an API token sets a cookie holding the token's *id* and an expiry, signed with
HMAC-SHA256 under the service's session key (never the token itself). Every form the UI serves
carries a CSRF token derived from the session cookie; a POST without the matching one is
refused. The cookie is HttpOnly and SameSite=Strict, and Secure when the request came over
HTTPS (behind a TLS proxy that sets X-Forwarded-Proto).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

SESSION_S = 8 * 3600


def _mac(key: bytes, data: bytes) -> str:
    return base64.urlsafe_b64encode(hmac.new(key, data, hashlib.sha256).digest()).decode()


def make_session(token_id: int, key: bytes, lifetime_s: int = SESSION_S) -> str:
    """A signed cookie value for a logged-in token."""
    body = base64.urlsafe_b64encode(json.dumps(
        {"t": token_id, "exp": int(time.time()) + lifetime_s}).encode()).decode()
    return f"{body}.{_mac(key, body.encode())}"


def read_session(value: str, key: bytes) -> int | None:
    """The token id of a valid, unexpired cookie; None otherwise."""
    body, _, mac = value.partition(".")
    if not mac or not hmac.compare_digest(mac, _mac(key, body.encode())):
        return None
    try:
        doc = json.loads(base64.urlsafe_b64decode(body.encode()))
        if int(doc["exp"]) < time.time():
            return None
        return int(doc["t"])
    except (ValueError, KeyError, TypeError):
        return None


def csrf_token(session_value: str, key: bytes) -> str:
    """The CSRF token of a session (forms carry it; POSTs must send it back)."""
    return _mac(key, b"csrf:" + session_value.encode())


def check_csrf(session_value: str | None, given: str | None, key: bytes) -> bool:
    """Whether ``given`` is the CSRF token of this session."""
    if not session_value or not given:
        return False
    return hmac.compare_digest(csrf_token(session_value, key), given)
