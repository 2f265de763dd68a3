"""The one redaction function: no secret in any message, log line or output file.

``redact(text)`` removes credentials from anything certify writes or says about a model
endpoint: ``scheme://user:password@`` user info, the values of credential-like query parameters
(``api_key=``, ``token=``, ``sig=``, ``X-Amz-Signature=`` …, case-insensitive) and every secret
value registered with :func:`register_secret` (the value of ``--auth-env``). It is applied once
per channel: :class:`certify.errors.CertifyError` messages and hints, :class:`RedactingFilter` on
certify's log handlers (the CLI's and the Ray workers', installed by
:func:`install_log_filters`, which also covers urllib3's retry warnings), and
:func:`redact_obj` over what the runner writes about a model (results, the run fingerprint).
"""

from __future__ import annotations

import base64
import logging
import re
import threading
from typing import Any

MASK = "***"

# Query (or fragment, or ;matrix) parameters whose value is a credential.
_PARAM_NAMES = (
    "api[_-]?key", "apikey", "key", "token", "access[_-]?token", "id[_-]?token",
    "refresh[_-]?token", "auth", "authorization", "sig", "signature", "password", "passwd",
    "pwd", "secret", "client[_-]?secret", "x-amz-signature", "x-amz-credential",
    "x-amz-security-token", "x-goog-signature", "x-goog-credential", "code",
)
_PARAM = re.compile(
    r"(?P<lead>[?&;#]\s*)(?P<name>(?:" + "|".join(_PARAM_NAMES) + r"))(?P<eq>=|%3D)"
    r"(?P<value>[^&#\s\"'<>]*)",
    re.IGNORECASE,
)
# scheme://user[:password]@host: the user info goes, whatever it holds.
_USERINFO = re.compile(r"(?P<scheme>\b[a-z][a-z0-9+.-]*://)[^/@\s\"'<>?#]+@", re.IGNORECASE)

_secrets: set[str] = set()
_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Mask every later occurrence of ``value`` (e.g. an auth header's value) in output.

    A ``Bearer xyz`` value also masks ``xyz`` alone; values shorter than 4 characters are
    ignored (masking them would garble ordinary text).
    """
    if not value:
        return
    parts = {value.strip()}
    words = value.split()
    if len(words) == 2:  # "Bearer xyz", "Basic xyz": the scheme word is no secret
        parts.add(words[1])
    with _lock:
        _secrets.update(p for p in parts if len(p) >= 4)


def register_url_secrets(url: str) -> None:
    """Register a URL's password and credential-like query values (servers echo them)."""
    m = re.match(r"[a-z][a-z0-9+.-]*://(?P<info>[^/@\s?#]+)@", url, re.IGNORECASE)
    if m:
        from urllib.parse import unquote

        info = unquote(m["info"])
        register_secret(info.partition(":")[2] or info)
        # requests sends it as HTTP Basic auth, which a server may echo back in an error
        register_secret(base64.b64encode(info.encode()).decode())
    for p in _PARAM.finditer(url):
        register_secret(p["value"])


def has_credentials(url: str) -> bool:
    """Whether ``url`` holds user info or a credential-like query value."""
    return bool(_USERINFO.search(url) or _PARAM.search(url))


def redact(text: str) -> str:
    """``text`` without URL credentials, credential-like query values or registered secrets."""
    if not text:
        return text
    out = _USERINFO.sub(r"\g<scheme>", text)
    out = _PARAM.sub(lambda m: f"{m['lead']}{m['name']}{m['eq']}{MASK}", out)
    if _secrets:
        with _lock:
            secrets = sorted(_secrets, key=len, reverse=True)
        for s in secrets:
            out = out.replace(s, MASK)
    return out


def redact_obj(obj: Any) -> Any:
    """A copy of a JSON-like value with :func:`redact` applied to every string and key."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {redact(k) if isinstance(k, str) else k: redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(redact_obj(v) for v in obj)
    return obj


class RedactingFilter(logging.Filter):
    """A logging filter that redacts each record's formatted message (and its traceback)."""

    def filter(self, record: logging.LogRecord) -> bool:  # noqa: D102
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string: leave it to the handler
            return True
        record.msg, record.args = redact(message), None
        if record.exc_info and record.exc_info[1] is not None:
            import traceback

            record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)))
            record.exc_info = None
        return True


# Third-party loggers that put request URLs into their messages (urllib3 logs each retry with
# the path and query at WARNING).
THIRD_PARTY_LOGGERS = ("urllib3", "urllib3.connectionpool", "urllib3.util.retry", "requests")


def install_log_filters(*handlers: logging.Handler) -> None:
    """Redact every log line this process writes: call once at an edge (CLI, Ray worker).

    Adds one :class:`RedactingFilter` to ``handlers``, to Python's last-resort stderr handler
    and to the loggers of libraries that log URLs (:data:`THIRD_PARTY_LOGGERS`).
    """
    targets: list[logging.Handler | logging.Logger] = [*handlers]
    if logging.lastResort is not None:
        targets.append(logging.lastResort)
    targets += [logging.getLogger(name) for name in THIRD_PARTY_LOGGERS]
    for t in targets:
        if not any(isinstance(f, RedactingFilter) for f in t.filters):
            t.addFilter(RedactingFilter())
