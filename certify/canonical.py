"""The signed thing is data: the canonical JSON form of a results document.

Canonical means: keys sorted, floats written with 10 significant digits, NaN and infinities as
null, UTF-8, one-space indentation (one value per line, so two results diff line by line).
``results.json`` is exactly these bytes; the card embeds the same document, and a verifier
recomputes the bytes from whatever it parsed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Union

#: A value a check may put in its measurement's ``details``: JSON, read covariantly (tuples and
#: other sequences allowed; :func:`normalize` turns them into plain JSON values).
JSONLike = Union[  # noqa: UP007 - a recursive alias needs the Union form on Python 3.10
    str, int, float, bool, None, Sequence["JSONLike"], Mapping[str, "JSONLike"]]


def normalize(obj: Any) -> Any:
    """Turn a results document into plain JSON values with fixed float precision."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        if not math.isfinite(obj):
            return None
        value = float(f"{obj:.10g}")
        return int(value) if value.is_integer() and abs(value) < 2**53 else value
    if isinstance(obj, dict):
        return {str(k): normalize(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [normalize(v) for v in obj]
    if hasattr(obj, "item"):  # numpy and torch scalars
        return normalize(obj.item())
    raise TypeError(f"cannot put {type(obj).__name__} into results.json")


def canonical_json(obj: Any) -> bytes:
    """The canonical bytes of a results document (what is written and what is signed)."""
    text = json.dumps(normalize(obj), sort_keys=True, indent=1, ensure_ascii=False,
                      allow_nan=False)
    return (text + "\n").encode("utf-8")


def script_safe_json(obj: Any) -> str:
    """JSON that can sit inside an HTML ``<script>`` element without closing it."""
    text = json.dumps(normalize(obj), sort_keys=True, ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
