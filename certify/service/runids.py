"""The service's run ids: one format, stated once, that the service makes and the client checks.

A run id is 32 lowercase hexadecimal digits (the hex of a random UUID, 122 random bits). The
service answers any other id with 404; the client (``certify submit``, ``certify runs``)
refuses to send or accept one, so a server cannot make the client name a folder, a URL or a
message after text of its choosing.
"""

from __future__ import annotations

import re
import uuid

#: The format, as a regular expression over the whole id.
RUN_ID_PATTERN = r"[0-9a-f]{32}"

#: The format in words (the API's path parameters and the docs say it).
RUN_ID_FORMAT = "32 lowercase hexadecimal digits, a random UUID's hex"

_RUN_ID = re.compile(RUN_ID_PATTERN)


def new_run_id() -> str:
    """A fresh run id."""
    return uuid.uuid4().hex


def is_run_id(value: object) -> bool:
    """Whether ``value`` is a run id in the service's format (a str, and nothing else)."""
    return isinstance(value, str) and _RUN_ID.fullmatch(value) is not None
