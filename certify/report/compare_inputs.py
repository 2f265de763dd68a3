"""What ``certify compare`` compares: two runs' results, loaded (verified first when asked), and
whether they and each of their checks can be compared at all.

Runs on different subsets of one dataset (``--samples``, ``--sample-offset``, other seeds) are
comparable, unpaired. Runs of different suite versions (a card from an older certify) are
compared on the checks both have with the same parameters (and the same certify method); the
others are listed as not comparable. Two runs on different source data or with different
reference models, or with no check in common, are not comparable: :class:`NotComparable`
(exit 4) says which. Results of the older format ``certify.results/2`` are read through
:func:`certify.results.parse_result` with ``older=True``.

The rows and the gate built on these are :mod:`certify.report.compare`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import JsonValue

from certify.errors import (
    EXIT_NOT_COMPARABLE,
    CertifyError,
    UntrustedError,
    UsageError,
    VerificationError,
)
from certify.results import (
    OLDER_SCHEMAS,
    SCHEMA,
    CheckResult,
    DataDoc,
    RunResult,
    parse_result,
    unpack_bits,
)

if TYPE_CHECKING:
    import numpy as np


class NotComparable(CertifyError):
    """The two runs cannot be compared: different suite, data, threat model, reference model or
    results schema (exit 4)."""

    exit_code = EXIT_NOT_COMPARABLE


# --- loading ------------------------------------------------------------------------------

def _document_text(path: Path) -> str:
    """The results JSON a results.json, card.html or card.pdf holds (unverified)."""
    from certify.report import sign

    suffix = path.suffix.lower()
    if suffix == ".json":
        return path.read_text(encoding="utf-8")
    if suffix in (".html", ".htm"):
        parts = sign.embedded_parts(path.read_text(encoding="utf-8"))
        if "results" not in parts:
            raise UsageError(f"{path} carries no certify results", hint="not a card?")
        return parts["results"]
    if suffix == ".pdf":
        from pypdf import PdfReader

        files = PdfReader(str(path)).attachments
        if "results.json" not in files:
            raise UsageError(f"{path} carries no results.json", hint="not a card?")
        return files["results.json"][0].decode("utf-8")
    raise UsageError(f"{path}: not a run folder, results.json, card.html or card.pdf",
                     hint="pass what `certify run --out` wrote")


def raw_document(path: Path) -> dict[str, JsonValue]:
    """The results document of a run folder, results.json, card.html or card.pdf (unverified)."""
    if path.is_dir():
        path = path / "results.json"
    if not path.is_file():
        raise UsageError(f"{path} not found",
                         hint="pass a run folder, results.json, card.html or card.pdf")
    try:
        doc = json.loads(_document_text(path))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path} cannot be read as certify results ({exc})",
                         hint="was it edited or cut short?") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path} is not a certify results document", hint="not a card?")
    return doc


def load_run(path: Path, pubkey: Path | None = None) -> tuple[dict[str, JsonValue], RunResult]:
    """The raw and typed results of ``path``; verified first when ``pubkey`` is given: an
    unsigned, tampered or other key's file raises :class:`~certify.errors.UntrustedError`
    (exit 9: a gate must tell "this card is not what it claims" from a regression, 1).
    Results of an older format this certify still reads
    (:data:`~certify.results.OLDER_SCHEMAS`) are read through its adapter; any other schema is
    not comparable."""
    if pubkey is not None:
        from certify.report.sign import load_public_key, verify_file

        key = load_public_key(pubkey)  # a missing or bad key file stays a usage error
        target = path / "results.json" if path.is_dir() else path
        try:
            verify_file(target, key)
        except VerificationError as exc:
            raise UntrustedError.from_error(exc, "untrusted card, not compared: ") from None
    doc = raw_document(path)
    if doc.get("schema") not in (SCHEMA, *OLDER_SCHEMAS):
        raise NotComparable(f"incompatible certify schema: {path} is {doc.get('schema')!r}, "
                            f"this certify compares {' and '.join((SCHEMA, *OLDER_SCHEMAS))}",
                            hint="rerun the older release's suite with this certify")
    return doc, parse_result(doc, older=True)


# --- comparability of the runs --------------------------------------------------------------

def short_digest(d: str) -> str:
    """The first 12 characters of a digest, without its algorithm."""
    return d.split(":")[-1][:12]


#: A run's data digests: (the source dataset's, the evaluated samples').
Digests = tuple[str, str]


def _own_digests(data: DataDoc) -> Digests:
    """The source dataset's digest and the evaluated samples'; results written before the
    source's was recorded name only the evaluated samples, so those compare only with the
    same samples."""
    return str(data.source_digest or data.digest), str(data.digest)


def _older_digests(data: DataDoc) -> Digests:
    """:func:`_own_digests` by the definition of certify before content digests: results
    written since carry them as ``older_digests``; results written before are of it."""
    older = data.older_digests
    return _own_digests(data) if older is None else (older.source_digest, older.digest)


def data_digests(old: DataDoc, new: DataDoc) -> tuple[Digests, Digests, list[str]]:
    """OLD's and NEW's data digests (source, evaluated samples) by one definition, and the
    sides written by a certify before content digests (their definition is then used: file
    bytes and the layout's name, so there the same images as a file and as arrays differ)."""
    before = [side for side, d in (("OLD", old), ("NEW", new)) if d.older_digests is None]
    if not before:
        return _own_digests(old), _own_digests(new), before
    return _older_digests(old), _older_digests(new), before


def same_samples(old: DataDoc, new: DataDoc) -> bool:
    """Whether two runs evaluated the very same samples, in the same order (by content)."""
    o, n, _ = data_digests(old, new)
    return o[1] == n[1]


def _data_differs(old: RunResult, new: RunResult) -> NotComparable | None:
    """Why two runs' source data differ, or ``None`` when it is the same."""
    mo, mn = old.measurement, new.measurement
    (src_o, _), (src_n, _), before = data_digests(mo.data, mn.data)
    if src_o == src_n:
        return None
    why, hint = "", ("evaluate both releases on the same dataset (subsets of one dataset, "
                     "e.g. --samples/--sample-offset, are comparable)")
    if before:
        why = (f"; {' and '.join(before)} {'was' if len(before) == 1 else 'were'} written "
               "by a certify whose data digest covered the image files' bytes and the "
               "layout's name, not the decoded images, so the digests are compared by "
               "that definition")
        whose = "the older release's model" if len(before) == 1 else "both releases' models"
        hint = (f"rerun {whose} with this certify on the same data: its digest is of the "
                "decoded images and labels, so the same images as a file, a folder or "
                "arrays from Python compare")
    return NotComparable(
        f"the data digest differs: OLD {short_digest(src_o)} ({mo.data.name}, "
        f"{mo.data.n} samples), NEW {short_digest(src_n)} ({mn.data.name}, "
        f"{mn.data.n} samples){why}", hint=hint)


def check_comparable(old: RunResult, new: RunResult) -> None:
    """Raise :class:`NotComparable` naming the first difference that rules a comparison out:
    the source data, the reference model, or no check in common (same id, kind and
    parameters). Other differences of the suite leave the checks both have comparable."""
    mo, mn = old.measurement, new.measurement
    differs = _data_differs(old, new)
    if differs is not None:
        raise differs
    if not any(why_not_comparable(c, n) is None for c, n in paired_checks(old, new)):
        raise NotComparable(
            f"no check in common: OLD ran {mo.suite.name} ({short_digest(mo.suite.digest)}), "
            f"NEW ran {mn.suite.name} ({short_digest(mn.suite.digest)}), and no check has "
            "the same id, kind and parameters in both", hint="compare runs of the same suite")
    ro, rn = mo.reference_model, mn.reference_model
    if (ro and ro.identity) != (rn and rn.identity):
        raise NotComparable(
            f"the reference model differs: OLD {ro.identity if ro else 'none'}, NEW "
            f"{rn.identity if rn else 'none'}", hint="use the same --reference for both")


# --- comparability of one check -------------------------------------------------------------

#: One check in OLD and in NEW (``None`` where a run lacks it).
CheckPair = tuple[CheckResult | None, CheckResult | None]


def paired_checks(old: RunResult, new: RunResult) -> list[CheckPair]:
    """OLD's checks with NEW's of the same id (``None`` where a run lacks it), OLD's order
    first, then NEW's checks that OLD lacks."""
    ids_n = {c.id: c for c in new.checks}
    ids_o = {c.id for c in old.checks}
    return ([(c, ids_n.get(c.id)) for c in old.checks]
            + [(None, c) for c in new.checks if c.id not in ids_o])


def why_not_comparable(co: CheckResult | None, cn: CheckResult | None) -> str | None:
    """Why one check of two runs cannot be compared (``None`` when it can)."""
    if co is None or cn is None:
        return f"only in {'NEW' if co is None else 'OLD'} (another suite version)"
    # a parameter a later release added, left at its default (None), is the same threat model
    keys = set(co.params) | set(cn.params)
    if co.kind != cn.kind or any(co.params.get(k) != cn.params.get(k) for k in keys):
        return (f"another threat model: {co.kind} {co.params} in OLD, {cn.kind} {cn.params} "
                "in NEW")
    # how each measured its figures (empty: as first released)
    mo, mn = co.details.get("method", ""), cn.details.get("method", "")
    if mo != mn:
        return (f"measured by another certify method: {mo or 'as first released'} in OLD, "
                f"{mn or 'as first released'} in NEW (a difference would not be the model's)")
    return None


def converged(c: CheckResult) -> bool | None:
    """Whether a check's search converged, from its typed ``settled`` field: ``False`` for an
    attack whose last run did not converge or stalled, or a corruption property whose search
    stopped on its budget; ``None`` for a check that is not a search."""
    return c.settled.converged()


def converged_all(checks: list[CheckResult]) -> bool | None:
    """Whether a threat model's search converged: ``False`` when any of its attacks did not
    (or stalled), ``True`` when at least one is a search and all converged, else ``None``."""
    states = [converged(c) for c in checks]
    if any(s is False for s in states):
        return False
    return True if any(s for s in states) else None


def inherited_from(c: CheckResult) -> list[str]:
    """The attacks of its threat model whose breaks an attack row took over (samples an
    earlier attack broke are not attacked again), from its details."""
    inherited = c.details.get("inherited")
    by = (inherited.get("by") if isinstance(inherited, dict) else None) or {}
    return [str(k) for k in by] if isinstance(by, dict) else []


def threat_model_of(c: CheckResult) -> tuple[str, float] | None:
    """The (norm, ε) an attack row's details name, or ``None`` (a SKIPPED row records none)."""
    norm, epsilon = c.details.get("norm"), c.details.get("epsilon")
    if norm is None or epsilon is None or not isinstance(epsilon, (int, float, str)):
        return None
    return str(norm), float(epsilon)


# --- per-sample outcomes --------------------------------------------------------------------

def selected_samples(c: CheckResult) -> np.ndarray | None:
    """The samples a check evaluated, less those whose evaluation errored (``None`` when it
    kept no per-sample outcomes)."""
    o = c.outcomes
    if o is None:
        return None
    sel = unpack_bits(o.selected, o.n)
    if "error" in o.bits:
        sel = sel & ~unpack_bits(o.bits["error"], o.n)
    return sel


def outcome_bits(c: CheckResult, bit: str) -> np.ndarray:
    """A check's bitmap of one outcome (an outcome no sample had has no bitmap: the default
    bitmaps are the outcomes seen). The check must have kept its per-sample outcomes."""
    import numpy as np

    o = c.outcomes
    assert o is not None, f"{c.id} kept no per-sample outcomes"
    return unpack_bits(o.bits[bit], o.n) if bit in o.bits else np.zeros(o.n, dtype=bool)


def outcome_values(c: CheckResult, key: str) -> dict[int, float]:
    """A check's per-sample ``values[key]`` by sample index (samples without a value left
    out). The check must have kept its per-sample outcomes."""
    import numpy as np

    o = c.outcomes
    assert o is not None, f"{c.id} kept no per-sample outcomes"
    idx = np.flatnonzero(unpack_bits(o.selected, o.n))
    return {int(i): float(v) for i, v in zip(idx, o.values[key], strict=False) if v is not None}
