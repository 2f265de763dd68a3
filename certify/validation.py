"""Type checks of suite values against type annotations, before anything runs.

YAML guesses types: ``2024-06-01`` is a date, ``8/255`` a string, ``yes`` a boolean, ``.nan`` a
float. A suite value of the wrong type must be refused when the suite loads, with the key path
(``checks[3].params.epsilon``) and the expected type, not discovered mid-run. ``expect`` checks a
value against an annotation (``float | None``, ``dict[str, Any] | bool``, ``list[int]`` …);
``bool`` is never an integer and a string or a date is never a number. ``plain_data`` refuses
what JSON cannot hold (dates, binary, sets, non-string keys, NaN and infinities) anywhere.
"""

from __future__ import annotations

import collections.abc
import datetime
import math
import types
from typing import Any, Literal, Union, get_args, get_origin

from certify.errors import SuiteError

_HINT = ("fix the suite: YAML reads 2024-06-01 as a date, 8/255 as a string and yes/no as "
         "booleans; write numbers as decimals and quote strings")


def describe(hint: Any) -> str:
    """The expected type in words, e.g. ``a number or null``."""
    if hint is Any:
        return "any value"
    if hint is None or hint is type(None):
        return "null"
    words = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
             dict: "a mapping", list: "a list"}
    if hint in words:
        return words[hint]
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in get_args(hint))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(hint))
    if origin in (dict, collections.abc.Mapping):
        args = get_args(hint)
        return "a mapping" if not args or args[1] is Any else f"a mapping of {describe(args[1])}"
    if origin in (list, tuple, collections.abc.Sequence):
        items = [a for a in get_args(hint) if a is not Ellipsis]
        if not items or items[0] is Any:
            return "a list"
        return f"a list of {_plural(describe(items[0]))}"
    return getattr(hint, "__name__", str(hint))


def _plural(words: str) -> str:
    for a, b in (("an integer", "integers"), ("a number", "numbers"), ("a string", "strings"),
                 ("a mapping", "mappings"), ("a list", "lists")):
        words = words.replace(a, b)
    return words


def shown(value: Any) -> str:
    """A value as the error message shows it: its YAML type and the value."""
    if isinstance(value, datetime.datetime):
        return f"a date-time ({value.isoformat()})"
    if isinstance(value, datetime.date):
        return f"a date ({value.isoformat()})"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value!r}"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"


def _outer_ok(value: Any, hint: Any) -> bool:
    """Whether ``value``'s own type fits ``hint``, not looking inside containers."""
    if hint is Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_outer_ok(value, a) for a in get_args(hint))
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in get_args(hint))
    if hint is dict or origin in (dict, collections.abc.Mapping):
        return isinstance(value, dict)
    if hint in (list, tuple) or origin in (list, tuple, collections.abc.Sequence):
        return isinstance(value, list)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # an annotation this checker does not know: the check's own validation decides


def expect(value: Any, hint: Any, path: str) -> None:
    """Raise :class:`SuiteError` naming ``path`` unless ``value`` fits the annotation ``hint``.

    Containers are checked as deep as the annotation goes (``dict[str, float]`` checks every
    value, ``dict[str, Any]`` only that it is a mapping).
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise SuiteError(f"{path} must be a finite number, got {value!r}", hint=_HINT)
    if not _outer_ok(value, hint):
        raise SuiteError(f"{path} must be {describe(hint)}, got {shown(value)}", hint=_HINT)
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        first = next(a for a in get_args(hint) if _outer_ok(value, a))
        expect(value, first, path)
    elif origin in (dict, collections.abc.Mapping):
        args = get_args(hint)
        if args:
            for k, v in value.items():
                expect(k, args[0], f"{path} key {k!r}")
                expect(v, args[1], f"{path}.{k}")
    elif origin in (list, collections.abc.Sequence):
        args = get_args(hint)
        if args:
            for i, v in enumerate(value):
                expect(v, args[0], f"{path}[{i}]")
    elif origin is tuple:
        args = get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            for i, v in enumerate(value):
                expect(v, args[0], f"{path}[{i}]")
        elif args:
            if len(value) != len(args):
                raise SuiteError(f"{path} must be a list of {len(args)} values, got "
                                 f"{len(value)}", hint=_HINT)
            for i, (v, a) in enumerate(zip(value, args, strict=True)):
                expect(v, a, f"{path}[{i}]")


def expect_keys(where: str, mapping: dict[str, Any], hints: dict[str, Any]) -> None:
    """Check each key of ``mapping`` that ``hints`` names; ``where`` prefixes the key path
    (``suite.yaml:`` gives ``suite.yaml: seed``, ``suite.yaml: data`` gives ``….data.samples``)."""
    for key, hint in hints.items():
        if key in mapping:
            sep = " " if where.endswith(":") else "."
            expect(mapping[key], hint, f"{where}{sep}{key}" if where else key)


def plain_keys(raw: dict[str, Any], source: str) -> None:
    """Refuse a mapping key that is not a string, anywhere (YAML allows ``1: x``)."""
    _walk(raw, source, keys_only=True)


def plain_data(raw: dict[str, Any], source: str) -> None:
    """Refuse anything JSON cannot hold exactly: dates, binary, sets, non-string keys, NaN, ∞.

    The suite's digest is the sha256 of its canonical JSON, and every value ends up in the
    results; such values would otherwise crash that or be read as something else. Typed values
    are refused with their expected type first (:func:`expect`); this catches the rest, e.g.
    inside a parameter annotated ``Any``. Paths in errors read ``SOURCE: checks[3].params.x``.
    """
    _walk(raw, source, keys_only=False)


def _walk(raw: dict[str, Any], source: str, keys_only: bool) -> None:
    for k, v in raw.items():
        if not isinstance(k, str):
            raise SuiteError(f"{source}: key {shown(k)} must be a string", hint=_HINT)
        _plain(v, f"{source}: {k}", keys_only)


def _plain(value: Any, path: str, keys_only: bool) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise SuiteError(f"{path}: key {shown(k)} must be a string", hint=_HINT)
            _plain(v, f"{path}.{k}", keys_only)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _plain(v, f"{path}[{i}]", keys_only)
    elif keys_only:
        return
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise SuiteError(f"{path} must be a finite number, got {value!r}", hint=_HINT)
    elif value is not None and not isinstance(value, str | int | bool):
        raise SuiteError(f"{path} must be a number, string, boolean, list or mapping, got "
                         f"{shown(value)}", hint=_HINT)
