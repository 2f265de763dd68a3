"""Suite parameters, declared once: name, type, default, range and meaning (issue 63).

Every check kind, every attack and every section of a suite file declares what a suite may
give it as :class:`Params`, an ordered set of :class:`Param` (in the spirit of scikit-learn's
``_parameter_constraints``, with the default and the meaning beside the constraint). The suite's
validation is derived from the declaration: an unknown name is refused with the valid ones, a
value of the wrong type by :func:`~certify.validation.expect`, a value out of its range or its
choices with them; and the suite reference of the documentation is generated from it, so what
is accepted, what is refused and what is documented cannot drift apart. A test holds every
check's and attack's declaration to its constructor's signature (names, types and defaults).

A rule that ties parameters together (``initial_queries`` only with ``max_queries: auto``, a
grid that must fit its budget) stays in its owner's ``check_params``. Imports no torch.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Union, get_args, get_origin

from certify.errors import SuiteError
from certify.validation import describe, expect, shown


class _Required:
    """The default of a parameter that has none (the suite must give it)."""

    def __repr__(self) -> str:
        return "REQUIRED"


#: The default of a required parameter.
REQUIRED: Final[Any] = _Required()


def annotation_text(hint: Any) -> str:
    """A type as a constructor's annotation writes it: ``int | Literal['auto']``,
    ``dict[str, Any] | None``."""
    if hint is None or hint is type(None):
        return "None"
    if hint is Any:
        return "Any"
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return " | ".join(annotation_text(a) for a in get_args(hint))
    if origin is Literal:
        return f"Literal[{', '.join(repr(a) for a in get_args(hint))}]"
    if origin is not None:
        args = get_args(hint)
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(annotation_text(a) for a in args)}]" if args else name
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "")


def value_text(value: Any) -> str:
    """A default as a suite writes it: ``true``, ``null``, ``'auto'``, ``0.5``."""
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else repr(value)


def _number(v: float) -> str:
    """A bound as the messages write it (``2^63 - 1`` for the largest seed)."""
    if isinstance(v, int) and v > 1 << 32 and (v + 1) & v == 0:
        return f"2^{v.bit_length()} - 1"
    return str(v) if isinstance(v, int) else f"{v:g}"


def _options(hint: Any) -> tuple[Any, ...]:
    """The alternatives of a union (the type itself otherwise)."""
    return get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)


@dataclass(frozen=True)
class Param:
    """One suite parameter: its ``name``, ``type`` (an annotation :func:`expect` checks),
    ``default`` (:data:`REQUIRED` when the suite must give it), ``meaning`` (what the suite
    reference says), and the values it takes beyond its type: numbers in ``[low, high]`` (an
    end left ``None`` is open-ended; ``low_open``/``high_open`` exclude the end itself), or
    one of ``choices``. ``None`` (unset) is never held to the range or the choices: the type
    says whether it is allowed."""

    name: str
    type: Any
    default: Any
    meaning: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[Any, ...] | None = None

    @property
    def required(self) -> bool:
        """Whether the suite must give it (no default)."""
        return self.default is REQUIRED

    @property
    def annotation(self) -> str:
        """Its type as its constructor's annotation writes it."""
        return annotation_text(self.type)

    def range_text(self) -> str:
        """The numeric range in words: ``>= 10``, ``> 0``, ``in (0, 1]``; '' when none."""
        lo, hi = self.low, self.high
        if lo is not None and hi is not None:
            return (f"in {'(' if self.low_open else '['}{_number(lo)}, {_number(hi)}"
                    f"{')' if self.high_open else ']'}")
        if lo is not None:
            return f"{'>' if self.low_open else '>='} {_number(lo)}"
        if hi is not None:
            return f"{'<' if self.high_open else '<='} {_number(hi)}"
        return ""

    def allowed(self) -> str:
        """The values it takes beyond its type, in words ('' when its type says all)."""
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        return self.range_text()

    def expected(self) -> str:
        """What a value must be, in words: its type with the range on its numbers
        (``an integer >= 2 or 'auto'``) or its choices (``one of 'RGB', 'BGR'``)."""
        words = []
        for option in _options(self.type):
            if option in (int, float) and self.range_text():
                words.append(f"{describe(option)} {self.range_text()}")
            elif option is str and self.choices is not None:
                words.append(self.allowed())
            elif get_origin(option) is Literal and len(get_args(option)) == 1:
                words.append(repr(get_args(option)[0]))
            else:
                words.append(describe(option))
        return " or ".join(words)

    def hint(self) -> str:
        """What a refusal suggests: the parameter's meaning and its default."""
        unset = "" if self.required or self.default is None else \
            f"; {value_text(self.default)} when unset"
        return f"{self.name}: {self.meaning}{unset}"

    def validate(self, value: Any, path: str) -> None:
        """Raise :class:`SuiteError` naming ``path`` (``checks[3].params.epsilon``) unless
        ``value`` has the declared type and lies in the declared range or choices."""
        expect(value, self.type, path)
        if value is None:
            return
        if self.choices is not None and isinstance(value, str | int | float) and not any(
                value == c and type(value) is type(c) for c in self.choices):
            raise SuiteError(f"{path} must be {self.expected()}, got {shown(value)}",
                             hint=self.hint())
        if isinstance(value, bool) or not isinstance(value, int | float):
            return
        low_out = self.low is not None and (value <= self.low if self.low_open
                                            else value < self.low)
        high_out = self.high is not None and (value >= self.high if self.high_open
                                              else value > self.high)
        if low_out or high_out:
            raise SuiteError(f"{path} must be {self.expected()}, got {shown(value)}",
                             hint=self.hint())


class Params:
    """The declared parameters of one owner (a check kind, an attack, a section of a suite
    file), in order; indexed by name."""

    __slots__ = ("_by_name",)

    def __init__(self, *params: Param) -> None:
        names = [p.name for p in params]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"parameters declared twice: {', '.join(twice)}")
        self._by_name = {p.name: p for p in params}

    def __iter__(self) -> Iterator[Param]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> Param:
        return self._by_name[name]

    def __repr__(self) -> str:
        return f"Params({', '.join(self._by_name)})"

    def names(self) -> list[str]:
        """The parameters' names, in declared order."""
        return list(self._by_name)

    def required(self) -> set[str]:
        """The names the suite must give."""
        return {p.name for p in self if p.required}

    def types(self) -> dict[str, Any]:
        """Name -> declared type."""
        return {p.name: p.type for p in self}

    def refuse_unknown(self, given: Iterable[str], where: str, owner: str) -> None:
        """Raise :class:`SuiteError` at ``where`` when ``given`` names a parameter ``owner``
        (``check kind 'attack'``, ``attack apgd_ce``) does not declare, listing the valid
        ones."""
        unknown = sorted(set(given) - set(self._by_name))
        if unknown:
            raise SuiteError(f"{where}: unknown parameter(s) {', '.join(unknown)} for {owner}",
                             hint=f"valid parameters: {', '.join(self.names()) or '(none)'}")

    def validate(self, values: Mapping[str, Any], where: str) -> None:
        """Validate each declared parameter of ``values`` (:meth:`Param.validate`); the
        paths read ``WHERE.name`` (``WHERE name`` after a ``where`` ending in ``:``)."""
        sep = " " if where.endswith(":") else "."
        for name, value in values.items():
            if name in self._by_name:
                self._by_name[name].validate(value, f"{where}{sep}{name}" if where else name)
