"""Text from outside (a server's answer, a file's metadata) made safe to print on a terminal.

A string a certify service (or anyone answering as one) sends may hold ANSI escape sequences
that rewrite what the terminal shows ("verdict: FAIL" overwritten by "PASS"), carriage returns
that do the same, or bidirectional overrides that reorder it. :func:`printable` escapes every
such character as Python writes it in a string literal, so what is printed is what was sent,
visibly.
"""

from __future__ import annotations

import unicodedata

#: Unicode categories escaped: controls (C0, DEL, C1), format characters (bidirectional
#: overrides and isolates, zero-width joiners), line and paragraph separators, private use,
#: surrogates and unassigned code points.
ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn"})


def _escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(value: object, limit: int | None = 500) -> str:
    """``value`` as text with every control, format and separator character escaped
    (``\\x1b``, ``\\r``, ``\\u202e``), at most ``limit`` characters of it (``None``: all),
    an ellipsis marking the cut."""
    text = str(value)
    if limit is not None and len(text) > limit:
        text = text[:limit] + "…"
    if text.isprintable():  # the common case: nothing to escape
        return text
    return "".join(_escape(ch) if unicodedata.category(ch) in ESCAPED_CATEGORIES else ch
                   for ch in text)
