"""``certify compare OLD NEW``: did a release get less robust than the last one?

Two runs of the same suite on the same data are compared on **the rows that decide their
cards**: one row per threat model (``measurement.attack_worst_case``: a sample is robust under
(norm, ε) only if every attack of that threat model failed on it) and every check that is not an
attack row summarised by a threat model. The attack rows are compared too, as **evidence**:
shown beside their threat model's row, never gating.

Each row is compared on one metric (a threat model on its worst-case robust accuracy; a check
on its threshold's metric, else its exported headline metric):

- a rate with per-sample outcomes (a check's ``Check.compare_outcomes``; a threat model's
  "robust to every attack", from its attack rows' outcome bitmaps) is compared as the share of
  the evaluated samples with that outcome, unconditionally (for robustness: "correct and stays
  correct" over all samples, so each model's own set of correct samples does not break the
  pairing). When both runs evaluated the same samples with the same seeds the comparison is
  **paired**: McNemar's exact test on the discordant samples, and Newcombe's hybrid score
  interval for a paired difference (his method 10). Otherwise it is **unpaired**: Newcombe's
  hybrid score interval for two independent proportions (method 10).
- a score with per-sample values in both runs (``Check.compare_values``) is compared by the
  bootstrap of the mean difference, paired over the common samples when the pairing holds;
- anything else by the normal approximation of the two runs' own 95% intervals.

**A gate, per gating row** (``--tolerance``: percentage points for rates, percent of the old
value for scores):

- *no change*: the same samples with identical per-sample outcomes (exit 0);
- *regression*: Holm's step-down correction at family-wise level 0.05 across the compared
  gating rows rejects "no change", and the interval at the level Holm used for it
  (``1 - 0.05 / (m - rank)``) lies wholly beyond the tolerance on the worse side (exit 1);
- *non-inferior*: the change's 95% interval lies within the tolerance on the worse side
  (showing every row non-inferior needs no multiplicity correction: an intersection-union
  test) and NEW's search converged (exit 0); an *improvement* is non-inferior and resolved
  beyond the tolerance on the better side by Holm, with both runs' searches converged;
- *inconclusive*: neither shown (exit 6): a regression too small to resolve, or a sample too
  small to show non-inferiority at this tolerance.

An evidence row is shown at its threat model's level (the one Holm used for that row) and
labelled the same way, outside the Holm family and the exit code.

A row whose OLD or NEW search did not converge says so: its robust accuracy is an
overestimate, so it is never a resolved improvement, and NEW's must have converged for a
non-inferior row. A threat model converged when every one of its attacks did (none stalled).
Convergence is read from the rows' typed ``settled`` field, never from ``details``. The exit
code follows the gating rows with a threshold: 1 for a regression, else 6 for an inconclusive
or uncompared row that blocks, else 0.

**Rows a run did not evaluate.** A check SKIPPED in both runs, or only in OLD, is listed as not
compared and neither gates nor blocks; one OLD evaluated and NEW SKIPPED blocks (the release
dropped evidence the last one had), and so does an ERROR in either run. An attack row is
evidence (never a gate) unless it errored. A threat model with an attack only one run
evaluated is compared on the attacks both evaluated, unless one of those took over breaks of
the attack left out (later attacks of a threat model do not attack samples an earlier one
broke), which blocks.

**The tolerance** (``--tolerance``): :data:`certify.tolerance.TOLERANCE_RULE`, "Without
--tolerance, the gate's tolerance is the smaller of OLD's and NEW's release_tolerance, a run
whose results state none counting as certify's default of 2, so the release under test can
narrow its gate but never widen it." An undecided row says about how many samples would decide
it (:func:`samples_to_decide`).

Runs on different subsets of one dataset (``--samples``, ``--sample-offset``, other seeds) are
comparable, unpaired. Runs of different suite versions (a card from an older certify) are
compared on the checks both have with the same parameters, and on the threat models whose
attacks are those same checks; the others are listed as not comparable. A threat model one of
whose attacks errored in a run is not compared (its worst case left that attack out), which
keeps the gate open. Two runs on different source data or with different reference models, or
with no check in common, are not comparable: :class:`NotComparable` (exit 4) says which.

Results of the older format ``certify.results/2`` are read through
:func:`certify.results.parse_result` with ``older=True``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from certify.errors import (
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    EXIT_NOT_COMPARABLE,
    EXIT_OK,
    CertifyError,
    UntrustedError,
    UsageError,
    VerificationError,
)
from certify.kinds import KINDS
from certify.report.glance import threat_name
from certify.results import (
    OLDER_SCHEMAS,
    SCHEMA,
    RunResult,
    parse_result,
    unpack_bits,
)
from certify.stats import (
    BOOTSTRAP,
    bootstrap_diffs,
    bootstrap_interval,
    bootstrap_p,
    holm,
    mcnemar_exact,
    newcombe_paired,
    newcombe_unpaired,
    normal_interval,
    p_from_interval,
    two_sided_z,
)
from certify.tolerance import TOLERANCE_RULE, gate_tolerance

#: Family-wise error rate of the comparison (Holm).
ALPHA = 0.05
#: Schema of the comparison's JSON output.
COMPARE_SCHEMA = "certify.compare/2"


class NotComparable(CertifyError):
    """The two runs cannot be compared: different suite, data, threat model, reference model or
    results schema (exit 4)."""

    exit_code = EXIT_NOT_COMPARABLE


# --- loading ------------------------------------------------------------------------------

def _raw_document(path: Path) -> dict[str, Any]:
    """The results document of a run folder, results.json, card.html or card.pdf (unverified)."""
    from certify.report import sign

    if path.is_dir():
        path = path / "results.json"
    if not path.is_file():
        raise UsageError(f"{path} not found",
                         hint="pass a run folder, results.json, card.html or card.pdf")
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            text = path.read_text(encoding="utf-8")
        elif suffix in (".html", ".htm"):
            parts = sign.embedded_parts(path.read_text(encoding="utf-8"))
            if "results" not in parts:
                raise UsageError(f"{path} carries no certify results", hint="not a card?")
            text = parts["results"]
        elif suffix == ".pdf":
            from pypdf import PdfReader

            files = PdfReader(str(path)).attachments
            if "results.json" not in files:
                raise UsageError(f"{path} carries no results.json", hint="not a card?")
            text = files["results.json"][0].decode("utf-8")
        else:
            raise UsageError(f"{path}: not a run folder, results.json, card.html or card.pdf",
                             hint="pass what `certify run --out` wrote")
        doc = json.loads(text)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path} cannot be read as certify results ({exc})",
                         hint="was it edited or cut short?") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path} is not a certify results document", hint="not a card?")
    return doc


def load_run(path: Path, pubkey: Path | None = None) -> tuple[dict[str, Any], RunResult]:
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
    doc = _raw_document(path)
    if doc.get("schema") not in (SCHEMA, *OLDER_SCHEMAS):
        raise NotComparable(f"incompatible certify schema: {path} is {doc.get('schema')!r}, "
                            f"this certify compares {' and '.join((SCHEMA, *OLDER_SCHEMAS))}",
                            hint="rerun the older release's suite with this certify")
    return doc, parse_result(doc, older=True)


# --- comparability ------------------------------------------------------------------------

def _short(d: str) -> str:
    return d.split(":")[-1][:12]


def _own_digests(data: Any) -> tuple[str, str]:
    """The source dataset's digest and the evaluated samples'; results written before the
    source's was recorded name only the evaluated samples, so those compare only with the
    same samples."""
    return str(data.source_digest or data.digest), str(data.digest)


def _older_digests(data: Any) -> tuple[str, str]:
    """:func:`_own_digests` by the definition of certify before content digests: results
    written since carry them as ``older_digests``; results written before are of it."""
    older = getattr(data, "older_digests", None)
    return _own_digests(data) if older is None else (older.source_digest, older.digest)


def data_digests(old: Any, new: Any) -> tuple[tuple[str, str], tuple[str, str], list[str]]:
    """OLD's and NEW's data digests (source, evaluated samples) by one definition, and the
    sides written by a certify before content digests (their definition is then used: file
    bytes and the layout's name, so there the same images as a file and as arrays differ)."""
    before = [side for side, d in (("OLD", old), ("NEW", new))
              if getattr(d, "older_digests", None) is None]
    if not before:
        return _own_digests(old), _own_digests(new), before
    return _older_digests(old), _older_digests(new), before


def same_samples(old: Any, new: Any) -> bool:
    """Whether two runs evaluated the very same samples, in the same order (by content)."""
    o, n, _ = data_digests(old, new)
    return o[1] == n[1]


def check_comparable(old: RunResult, new: RunResult) -> None:
    """Raise :class:`NotComparable` naming the first difference that rules a comparison out:
    the source data, the reference model, or no check in common (same id, kind and
    parameters). Other differences of the suite leave the checks both have comparable."""
    mo, mn = old.measurement, new.measurement
    (src_o, _), (src_n, _), before = data_digests(mo.data, mn.data)
    if src_o != src_n:
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
        raise NotComparable(
            f"the data digest differs: OLD {_short(src_o)} ({mo.data.name}, "
            f"{mo.data.n} samples), NEW {_short(src_n)} ({mn.data.name}, "
            f"{mn.data.n} samples){why}", hint=hint)
    if not any(why_not_comparable(c, n) is None for c, n in paired_checks(old, new)):
        raise NotComparable(
            f"no check in common: OLD ran {mo.suite.name} ({_short(mo.suite.digest)}), NEW "
            f"ran {mn.suite.name} ({_short(mn.suite.digest)}), and no check has the same id, "
            "kind and parameters in both", hint="compare runs of the same suite")
    ro, rn = mo.reference_model, mn.reference_model
    if (ro and ro.identity) != (rn and rn.identity):
        raise NotComparable(
            f"the reference model differs: OLD {ro.identity if ro else 'none'}, NEW "
            f"{rn.identity if rn else 'none'}", hint="use the same --reference for both")


def paired_checks(old: RunResult, new: RunResult) -> list[tuple[Any, Any]]:
    """OLD's checks with NEW's of the same id (``None`` where a run lacks it), OLD's order
    first, then NEW's checks that OLD lacks."""
    ids_n = {c.id: c for c in new.checks}
    ids_o = {c.id for c in old.checks}
    return ([(c, ids_n.get(c.id)) for c in old.checks]
            + [(None, c) for c in new.checks if c.id not in ids_o])


def why_not_comparable(co: Any, cn: Any) -> str | None:
    """Why one check of two runs cannot be compared (``None`` when it can)."""
    if co is None or cn is None:
        return f"only in {'NEW' if co is None else 'OLD'} (another suite version)"
    # a parameter a later release added, left at its default (None), is the same threat model
    keys = set(co.params) | set(cn.params)
    if co.kind != cn.kind or any(co.params.get(k) != cn.params.get(k) for k in keys):
        return (f"another threat model: {co.kind} {co.params} in OLD, {cn.kind} {cn.params} "
                "in NEW")
    mo, mn = (c.details.get("method", "") if isinstance(c.details, dict) else ""
              for c in (co, cn))
    if mo != mn:
        return (f"measured by another certify method: {mo or 'as first released'} in OLD, "
                f"{mn or 'as first released'} in NEW (a difference would not be the model's)")
    return None


def converged(c: Any) -> bool | None:
    """Whether a check's search converged, from its typed ``settled`` field: ``False`` for an
    attack whose last run did not converge or stalled, or a corruption property whose search
    stopped on its budget; ``None`` for a check that is not a search."""
    converged_: bool | None = c.settled.converged()
    return converged_


def converged_all(checks: list[Any]) -> bool | None:
    """Whether a threat model's search converged: ``False`` when any of its attacks did not
    (or stalled), ``True`` when at least one is a search and all converged, else ``None``."""
    states = [converged(c) for c in checks]
    if any(s is False for s in states):
        return False
    return True if any(s for s in states) else None


# --- one check ----------------------------------------------------------------------------

#: A row's role: it gates (a threat model's row, or a check that is not an attack row
#: summarised by one), or it is evidence for a threat model's row (shown, not gating).
GATE = "gate"
EVIDENCE = "evidence"


@dataclass
class Row:
    """One row's comparison: a check's, or a threat model's (``kind`` ``threat_model``)."""

    id: str
    kind: str
    metric: str
    unit: str
    direction: str
    has_threshold: bool
    old: float | None
    old_interval: list[float | None]
    new: float | None
    new_interval: list[float | None]
    compared: str = ""
    method: str = ""
    paired: bool = False
    n_old: int = 0
    n_new: int = 0
    discordant: dict[str, int] | None = None
    old_value: float | None = None
    new_value: float | None = None
    change: float | None = None
    change_interval: list[float] | None = None
    confidence: float | None = None
    p: float | None = None
    p_holm: float | None = None
    tolerance: float = 0.0
    outcome: str = "not compared"
    reason: str = ""
    converged_old: bool | None = None
    converged_new: bool | None = None
    role: str = GATE
    evidence_for: str | None = None
    #: Whether this row, when not decided, keeps the gate open (exit 6): ``False`` for a row
    #: one run did not evaluate (SKIPPED, or a threat model all of whose attacks were SKIPPED
    #: in one run), which is listed as not compared with why, and neither gates nor blocks.
    blocks: bool = True
    #: Inconclusive rows: about how many samples (paired: pairs) would decide the row at the
    #: observed change, with 80% power (see :func:`samples_to_decide`).
    samples_needed: int | None = None
    attacks: list[str] = field(default_factory=list)
    #: Attacks of the threat model left out of its comparison because one run did not
    #: evaluate them (the rows are compared on the attacks both runs evaluated).
    left_out: list[str] = field(default_factory=list)
    norm: str | None = None
    epsilon: float | None = None
    _interval: Any = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values."""
        d = asdict(self)
        d.pop("_interval")
        return d


def _metric_of(c: Any) -> Any:
    cls = KINDS[c.kind]
    name = (c.threshold.metric if c.threshold is not None
            else cls.export.metric if cls.export is not None else None)
    if name is None:
        name = next((m.name for m in cls.metrics if m.threshold and m.direction != "none"), None)
    return next((m for m in cls.metrics if m.name == name), None)


def _selected(c: Any) -> np.ndarray | None:
    o = c.outcomes
    if o is None:
        return None
    sel = unpack_bits(o.selected, o.n)
    if "error" in o.bits:
        sel = sel & ~unpack_bits(o.bits["error"], o.n)
    return sel


def _row(co: Any, cn: Any, seeds_equal: bool, tolerance: float) -> Row:
    metric = _metric_of(co)
    cls = KINDS[co.kind]
    base = dict(id=co.id, kind=co.kind, has_threshold=co.threshold is not None)
    if metric is None:
        return Row(**base, metric="", unit="", direction="none", old=None, old_interval=[],
                   new=None, new_interval=[], reason="no metric with a direction to compare")
    name = metric.name

    def val(c: Any) -> tuple[float | None, list[float | None]]:
        v = None if c.metrics is None else getattr(c.metrics, name, None)
        iv = c.intervals.get(name)
        return (None if v is None else float(v)), (list(iv) if iv else [None, None])

    (vo, io), (vn, inn) = val(co), val(cn)
    row = Row(**base, metric=name, unit=metric.unit, direction=metric.direction, old=vo,
              old_interval=io, new=vn, new_interval=inn)
    for c, which in ((co, "OLD"), (cn, "NEW")):
        if c.status == "ERROR" or (c.metrics is None and c.status != "SKIPPED"):
            row.reason = (f"{which} has no measurement ({c.status}): its evaluation failed, "
                          "so the gate stays open")
            return row
    if cn.status == "SKIPPED":
        row.reason = f"NEW did not evaluate it: {_skip_reason(cn)}"
        # skipped in both runs, nothing was lost; evaluated in OLD and not in NEW, the
        # release dropped evidence the last one had: the gate stays open
        row.blocks = co.status != "SKIPPED" and co.threshold is not None
        if row.blocks:
            row.reason += (f" (OLD evaluated it: {co.status}), so the release dropped evidence "
                           "and the gate stays open")
        return row
    if co.status == "SKIPPED":
        row.reason, row.blocks = f"OLD did not evaluate it: {_skip_reason(co)}", False
        return row
    same_samples = seeds_equal
    so, sn = _selected(co), _selected(cn)
    if so is not None and sn is not None:
        same_samples = same_samples and so.shape == sn.shape and bool(
            (unpack_bits(co.outcomes.selected, co.outcomes.n)
             == unpack_bits(cn.outcomes.selected, cn.outcomes.n)).all())
    else:
        same_samples = False
    if name in cls.compare_outcomes:
        _binary(row, co, cn, so, sn, same_samples, *cls.compare_outcomes[name])
    elif name in cls.compare_values and all(
            c.outcomes is not None and cls.compare_values[name] in c.outcomes.values
            for c in (co, cn)):
        _continuous(row, co, cn, cls.compare_values[name], same_samples)
    else:
        # a rate with no per-sample outcome (its denominator is the check's own, e.g. the
        # answered inputs) or a score without per-sample values: from the runs' intervals
        _normal_approx(row)
    if row.change is not None:
        row.tolerance = (tolerance / 100 if row.unit == "rate"
                         else tolerance / 100 * abs(row.old_value or 0.0))
    return row


def _skip_reason(c: Any) -> str:
    """Why a run SKIPPED a check: its decision sentence, cut to 160 characters."""
    text = str(getattr(c, "decision", "") or "SKIPPED").strip()
    return text if len(text) <= 160 else text[:157].rstrip() + "…"


def _set_binary(row: Row, ko: int, no: int, kn: int, nn: int,
                table: tuple[int, int, int, int] | None) -> None:
    row.n_old, row.n_new = no, nn
    row.old_value, row.new_value = ko / no, kn / nn
    row.change = row.new_value - row.old_value
    if table is None:
        row._interval = lambda conf: newcombe_unpaired(ko, no, kn, nn, conf)
        row.p = p_from_interval(row._interval)
    else:
        both, old_only, new_only, neither = table
        row._interval = lambda conf: newcombe_paired(both, old_only, new_only, neither, conf)
        # worse/better in the direction of the compared outcome
        worse, better = ((old_only, new_only) if row.direction == "higher"
                         else (new_only, old_only))
        row.discordant = {"worse": worse, "better": better}
        row.p = mcnemar_exact(worse, better)


def _binary(row: Row, co: Any, cn: Any, so: np.ndarray | None, sn: np.ndarray | None,
            paired: bool, bit: str, direction: str) -> None:
    metric_direction, metric_unit = row.direction, row.unit
    row.direction = direction
    row.unit = "rate"
    row.compared = f"share of all samples '{bit}'"
    if so is None or sn is None:  # no per-sample outcomes kept
        row.direction, row.unit = metric_direction, metric_unit
        _normal_approx(row)
        return
    _binary_outcomes(row, so, sn, _bits(co, bit), _bits(cn, bit), paired)


def _bits(c: Any, bit: str) -> np.ndarray:
    """A check's bitmap of one outcome (an outcome no sample had has no bitmap: the default
    bitmaps are the outcomes seen)."""
    o = c.outcomes
    return unpack_bits(o.bits[bit], o.n) if bit in o.bits else np.zeros(o.n, dtype=bool)


def _binary_outcomes(row: Row, so: np.ndarray, sn: np.ndarray, bo: np.ndarray, bn: np.ndarray,
                     paired: bool) -> None:
    """Compare the share of the evaluated samples (``so``, ``sn``) with an outcome (``bo``,
    ``bn``), paired over the common samples or unpaired."""
    if paired:
        common = so & sn
        a, b = bo[common], bn[common]
        table = (int((a & b).sum()), int((a & ~b).sum()), int((~a & b).sum()),
                 int((~a & ~b).sum()))
        n = int(common.sum())
        if n == 0:
            row.reason = "no sample evaluated in both runs"
            return
        row.paired = True
        row.method = "paired: McNemar exact, Newcombe paired interval"
        _set_binary(row, int(a.sum()), n, int(b.sum()), n, table)
    else:
        no, nn = int(so.sum()), int(sn.sum())
        if no == 0 or nn == 0:
            row.reason = "a run evaluated no sample"
            return
        row.method = "unpaired: Newcombe hybrid score interval"
        _set_binary(row, int(bo[so].sum()), no, int(bn[sn].sum()), nn, None)


def _continuous(row: Row, co: Any, cn: Any, key: str, paired: bool) -> None:
    def values(c: Any) -> dict[int, float]:
        o = c.outcomes
        idx = np.flatnonzero(unpack_bits(o.selected, o.n))
        vals = o.values[key]
        return {int(i): float(v) for i, v in zip(idx, vals, strict=False) if v is not None}

    vo, vn = values(co), values(cn)
    row.compared = f"mean of per-sample {key}"
    if paired:
        common = sorted(set(vo) & set(vn))
        if len(common) < 2:
            paired = False
        else:
            a = np.array([vo[i] for i in common])
            b = np.array([vn[i] for i in common])
    if not paired:
        a = np.array(list(vo.values()))
        b = np.array(list(vn.values()))
        if len(a) < 2 or len(b) < 2:
            row.reason = "too few per-sample values"
            return
    row.paired = paired
    row.method = f"{'paired' if paired else 'unpaired'} bootstrap ({BOOTSTRAP} resamples)"
    row.n_old, row.n_new = len(a), len(b)
    row.old_value, row.new_value = float(a.mean()), float(b.mean())
    row.change = row.new_value - row.old_value
    boot = bootstrap_diffs(a, b, paired)
    row.p = bootstrap_p(boot)
    row._interval = bootstrap_interval(boot)


def _normal_approx(row: Row) -> None:
    """The change from the two runs' own 95% intervals (normal approximation)."""
    z95 = two_sided_z(0.95)
    ses = []
    for v, iv in ((row.old, row.old_interval), (row.new, row.new_interval)):
        if v is None or len(iv) != 2 or iv[0] is None or iv[1] is None:
            row.reason = "no interval to compare with"
            return
        ses.append((float(iv[1]) - float(iv[0])) / (2 * z95))
    se = math.hypot(*ses)
    row.compared = f"{row.metric} (from the runs' 95% intervals)"
    row.method = "unpaired: normal approximation"
    row.old_value, row.new_value = row.old, row.new
    assert row.old is not None and row.new is not None
    row.change = row.new - row.old
    if se == 0:
        row.reason = "both intervals have zero width"
        row.change = None
        return
    row._interval = normal_interval(row.change, se)
    row.p = p_from_interval(row._interval)


# --- threat models -------------------------------------------------------------------------

def threat_row_id(norm: str, epsilon: float) -> str:
    """A threat model's row id: ``threat model L∞ 8/255`` (the card's name for it)."""
    return f"threat model {threat_name(norm, epsilon)}"


def _threat_models(old: RunResult, new: RunResult) -> list[tuple[str, Any, Any]]:
    """Each threat model of either run with its row in OLD and in NEW (``None`` where a run
    has none), OLD's order first; ids made unique by ε where two share a name."""
    rows: dict[tuple[str, float], list[Any]] = {}
    for k, run in enumerate((old, new)):
        for w in run.measurement.attack_worst_case:
            rows.setdefault((w.norm, float(w.epsilon)), [None, None])[k] = w
    names = [threat_row_id(norm, eps) for norm, eps in rows]
    out = []
    for ((_, eps), (wo, wn)), name in zip(rows.items(), names, strict=True):
        if names.count(name) > 1:
            name += f" (ε={eps:g})"
        out.append((name, wo, wn))
    return out


def _threat_outcomes(checks: list[Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """A threat model's evaluated samples and its robust ones (robust to every attack), from
    its attack rows' per-sample outcomes; ``None`` when a row kept none."""
    sel: np.ndarray | None = None
    robust: np.ndarray | None = None
    for c in checks:
        s = _selected(c)
        if s is None or (sel is not None and s.shape != sel.shape):
            return None
        r = _bits(c, "robust")
        sel = s if sel is None else sel & s
        robust = r if robust is None else robust & r
    if sel is None or robust is None:
        return None
    return sel, robust & sel


def _threat_row(tm_id: str, wo: Any, wn: Any, old: RunResult, new: RunResult,
                tolerance: float) -> Row:
    """One threat model's comparison (``wo``, ``wn``: its worst-case rows, either may be
    ``None``), on the share of samples robust to every attack of it that both runs evaluated.

    An attack one run SKIPPED (the scheduler found it adds nothing there, or the model gives
    no gradients) is left out of both sides, and the row says so; an attack that errored in
    a run keeps the row from being compared (its worst case left it out), which keeps the gate
    open. A threat model with no attack both runs evaluated is not compared and, when that is
    because of SKIPPED attacks only, does not block.
    """
    w = wo if wo is not None else wn
    checks_o = {c.id: c for c in old.checks}
    checks_n = {c.id: c for c in new.checks}
    ids = list(dict.fromkeys([*(wo.attacks if wo else []), *(wn.attacks if wn else [])]))
    row = Row(id=tm_id, kind="threat_model", metric="robust_accuracy", unit="rate",
              direction="higher",
              has_threshold=any(x is not None and x.threshold is not None for x in (wo, wn)),
              old=None if wo is None else wo.robust_accuracy,
              old_interval=list(wo.interval) if wo is not None and wo.interval else [None, None],
              new=None if wn is None else wn.robust_accuracy,
              new_interval=list(wn.interval) if wn is not None and wn.interval else [None, None],
              attacks=ids, norm=w.norm, epsilon=float(w.epsilon))
    for i in ids:
        why = why_not_comparable(checks_o.get(i), checks_n.get(i))
        if why is not None:
            row.outcome, row.reason = NOT_COMPARABLE, f"its attack {i}: {why}"
            return row
    skipped: list[str] = []
    for x, which, checks in ((wo, "OLD", checks_o), (wn, "NEW", checks_n)):
        left = [i for i in ids if x is None or i not in x.attacks]
        failed = [i for i in left if checks[i].status != "SKIPPED"]
        if failed:  # an attack that errored in that run: its worst case left it out
            row.reason = (f"{which}'s worst case leaves out {', '.join(failed)} ("
                          + ", ".join(f"{i}: {checks[i].status}" for i in failed)
                          + "): the two worst cases are over different attacks")
            return row
        skipped += [f"{i} (SKIPPED in {which})" for i in left]
    common = [i for i in ids if wo is not None and wn is not None
              and i in wo.attacks and i in wn.attacks]
    row.left_out = [i for i in ids if i not in common]
    if not common:
        # every attack SKIPPED in NEW that OLD evaluated: the release dropped the evidence
        row.blocks = wo is not None and any(wn is None or i not in wn.attacks
                                            for i in wo.attacks)
        row.reason = "no attack of it was evaluated in both runs: " + ", ".join(skipped)
        if row.blocks:
            row.reason += " (OLD evaluated it), so the gate stays open"
        return row
    assert wo is not None and wn is not None
    co, cn = [checks_o[i] for i in common], [checks_n[i] for i in common]
    inherited = sorted({f"{c.id} ({which})" for c, which in [*((c, "OLD") for c in co),
                                                             *((c, "NEW") for c in cn)]
                        if set(_inherited_from(c)) & set(row.left_out)})
    if inherited:
        # a later attack took over the breaks of the one left out (samples broken earlier
        # are not attacked again), so over the common attacks the two runs would measure
        # different things: not compared, and the gate stays open
        row.reason = (f"{', '.join(skipped)}: the attacks both runs evaluated carry breaks "
                      f"of the one left out ({', '.join(inherited)}), so they cannot be "
                      "compared without it")
        return row
    row.converged_old, row.converged_new = converged_all(co), converged_all(cn)
    mo, mn = old.measurement, new.measurement
    same_seeds = (mo.seeds.suite == mn.seeds.suite and same_samples(mo.data, mn.data)
                  and all(mo.seeds.checks.get(i) == mn.seeds.checks.get(i) for i in common))
    so, sn = _threat_outcomes(co), _threat_outcomes(cn)
    # over all its attacks, the bitmaps must give the rows' own worst case (they do, from the
    # same records); over the common attacks they give that subset's worst case
    usable = so is not None and sn is not None and (row.left_out or (
        (int(so[0].sum()), int(so[1].sum())) == (wo.n, wo.n_robust)
        and (int(sn[0].sum()), int(sn[1].sum())) == (wn.n, wn.n_robust)))
    if so is None or sn is None or not usable:
        if row.left_out:
            row.reason = ("the runs kept no per-sample outcomes to compare it on the attacks "
                          f"both evaluated ({', '.join(common)}; left out: "
                          f"{', '.join(skipped)})")
            return row
        _normal_approx(row)
    else:
        # paired when every attack evaluated the very same samples in both runs
        paired = same_seeds and all(
            (a.outcomes and b.outcomes and a.outcomes.n == b.outcomes.n
             and a.outcomes.selected == b.outcomes.selected)
            for a, b in zip(co, cn, strict=True))
        row.compared = "share of all samples robust to every attack of the threat model"
        if row.left_out:
            row.compared += (f" that both runs evaluated ({', '.join(common)}; left out: "
                             f"{', '.join(skipped)})")
        _binary_outcomes(row, so[0], sn[0], so[1], sn[1], paired)
    if row.change is not None:
        row.tolerance = tolerance / 100
    return row


# --- the comparison -----------------------------------------------------------------------

@dataclass
class Comparison:
    """The outcome of ``certify compare``: a row per threat model and a row per check."""

    old: dict[str, Any]
    new: dict[str, Any]
    tolerance: float
    rows: list[Row]
    threat_models: list[Row] = field(default_factory=list)
    #: Where the tolerance came from, in words: ``--tolerance``, or which run's stated (or
    #: defaulted) release_tolerance :data:`~certify.tolerance.TOLERANCE_RULE` took.
    tolerance_source: str = "--tolerance"

    @property
    def gating(self) -> list[Row]:
        """The rows that decide: the threat models', then the checks' that are not evidence
        for one (the rows that decide the card)."""
        return [r for r in (*self.threat_models, *self.rows) if r.role == GATE]

    @property
    def regressions(self) -> list[Row]:
        """Resolved regressions of gating rows (with a threshold or not)."""
        return [r for r in self.gating if r.outcome == REGRESSION]

    @property
    def inconclusive(self) -> list[Row]:
        """Gating rows with a threshold for which neither a regression nor non-inferiority
        (nor no change) was shown, or that could not be compared."""
        return [r for r in self.gating
                if r.has_threshold and r.blocks and r.outcome in GATE_OPEN]

    @property
    def not_evaluated(self) -> list[Row]:
        """Rows one run did not evaluate (SKIPPED): listed as not compared, neither gating
        nor blocking."""
        return [r for r in (*self.threat_models, *self.rows)
                if not r.blocks and r.outcome == NOT_COMPARED]

    @property
    def exit_code(self) -> int:
        """1 for a regression of a gating row with a threshold; else 6 for an inconclusive
        one (:attr:`inconclusive`); else 0."""
        if any(r.has_threshold for r in self.regressions):
            return EXIT_FAIL
        return EXIT_INCONCLUSIVE if self.inconclusive else EXIT_OK

    @property
    def decision(self) -> str:
        """The comparison's decision in a few words, as its exit code has it: REGRESSION
        (exit 1), INCONCLUSIVE (exit 6); with exit 0, NO CHANGE when every gating row with a
        threshold is unchanged, IMPROVEMENT when the others improved, NON-INFERIOR otherwise
        (NO THRESHOLD GATED when no gating row has a threshold)."""
        code = self.exit_code
        if code == EXIT_FAIL:
            return "REGRESSION"
        if code == EXIT_INCONCLUSIVE:
            return "INCONCLUSIVE"
        seen = {r.outcome for r in self.gating
                if r.has_threshold and r.blocks and r.outcome not in (NOT_COMPARABLE,
                                                                      NOT_COMPARED)}
        if not seen:
            return "NO THRESHOLD GATED"
        if seen == {NO_CHANGE}:
            return "NO CHANGE"
        if seen <= {NO_CHANGE, IMPROVEMENT}:
            return "IMPROVEMENT"
        return "NON-INFERIOR"

    def to_json(self) -> dict[str, Any]:
        """The comparison as plain JSON values (``--json``)."""
        return {"schema": COMPARE_SCHEMA, "alpha": ALPHA, "correction": "holm",
                "decides_on": "the threat-model rows and the checks that are not an attack "
                              "row of a threat model (the rows that decide the card); attack "
                              "rows are evidence (role: evidence), not gating",
                "tolerance": {"rates_pp": self.tolerance, "scores_relative_percent":
                              self.tolerance, "source": self.tolerance_source,
                              "rule": TOLERANCE_RULE},
                "old": self.old, "new": self.new,
                "threat_models": [r.to_json() for r in self.threat_models],
                "checks": [r.to_json() for r in self.rows],
                "regressions": [r.id for r in self.regressions],
                "inconclusive": [r.id for r in self.inconclusive],
                "not_evaluated": [r.id for r in self.not_evaluated],
                "decision": self.decision,
                "exit_code": self.exit_code}


def _side(result: RunResult, path: Path) -> dict[str, Any]:
    m = result.measurement
    return {"path": str(path), "model": m.model.name, "identity": m.model.identity,
            "verdict": m.verdict, "suite": m.suite.name, "suite_digest": m.suite.digest,
            "data_digest": m.data.digest, "seed": m.seeds.suite,
            "results_schema": result.schema_version}


def release_tolerance(old: RunResult, new: RunResult, given: float | None
                      ) -> tuple[float, str]:
    """The tolerance a comparison uses and where it came from, by
    :func:`certify.tolerance.gate_tolerance`: ``given`` (``--tolerance``) when given, else
    :data:`~certify.tolerance.TOLERANCE_RULE` over what each run's results state."""
    try:
        return gate_tolerance(old.measurement.suite.release_tolerance,
                              new.measurement.suite.release_tolerance, given)
    except ValueError as exc:
        raise UsageError(str(exc), hint="percentage points for rates, percent for scores"
                         ) from None


def compare(old: RunResult, new: RunResult, tolerance: float | None = None,
            old_path: Path = Path("OLD"), new_path: Path = Path("NEW")) -> Comparison:
    """Compare two comparable runs on their threat models and checks (raises
    :class:`NotComparable`). ``tolerance``: percentage points for rates, percent of OLD for
    scores; ``None`` takes it by :data:`~certify.tolerance.TOLERANCE_RULE`
    (:func:`release_tolerance`)."""
    tolerance, source = release_tolerance(old, new, tolerance)
    check_comparable(old, new)
    seeds_o, seeds_n = old.measurement.seeds, new.measurement.seeds
    threats = [_threat_row(tm_id, wo, wn, old, new, tolerance)
               for tm_id, wo, wn in _threat_models(old, new)]
    evidence_for = {a: t.id for t in threats for a in t.attacks}
    named = {(t.norm, t.epsilon): t.id for t in threats}
    rows = []
    for co, cn in paired_checks(old, new):
        why = why_not_comparable(co, cn)
        if why is not None:
            c = co if co is not None else cn
            row = Row(id=c.id, kind=c.kind, metric="", unit="", direction="none",
                      has_threshold=c.threshold is not None, old=None, old_interval=[],
                      new=None, new_interval=[], outcome=NOT_COMPARABLE, reason=why)
        else:
            # paired only on the very same samples (the per-sample outcomes are by position
            # in the evaluated data) with the same seeds
            same_seed = (seeds_o.checks.get(co.id) == seeds_n.checks.get(co.id)
                         and seeds_o.suite == seeds_n.suite
                         and same_samples(old.measurement.data, new.measurement.data))
            row = _row(co, cn, same_seed, tolerance)
            row.converged_old, row.converged_new = converged(co), converged(cn)
        errored = any(c is not None and c.status == "ERROR" for c in (co, cn))
        if row.id in evidence_for or (row.kind == "attack" and not errored):
            # an attack row: evidence for its threat model's row, never a gate (also when
            # its threat model has no row, e.g. every attack of it was SKIPPED)
            row.role = EVIDENCE
            row.evidence_for = evidence_for.get(row.id) or _threat_of(co, cn, named)
        rows.append(row)
    result = Comparison(_side(old, old_path), _side(new, new_path), tolerance, rows, threats,
                        tolerance_source=source)
    tested = [r for r in result.gating if r.p is not None and r._interval is not None]
    adjusted, reject, levels = holm([r.p or 1.0 for r in tested], ALPHA)
    level_of: dict[str, float] = {}
    for r, p_adj, rej, level in zip(tested, adjusted, reject, levels, strict=True):
        r.p_holm = p_adj
        level_of[r.id] = level
        _decide(r, rej, level)
    for r in rows:  # evidence: at its threat model's level, outside the family
        if r.role == EVIDENCE and r.p is not None and r._interval is not None:
            level = level_of.get(r.evidence_for or "", ALPHA)
            _decide(r, r.p <= level, level)
    for r in (*threats, *rows):  # compared without a test: identical outcomes are no change
        if r.p is None and r.change == 0 and r.discordant == {"worse": 0, "better": 0}:
            r.outcome = NO_CHANGE
        if r.outcome == INCONCLUSIVE and not (r.converged_old is False
                                              or r.converged_new is False):
            r.samples_needed = samples_to_decide(r)
            if r.samples_needed is not None:
                r.reason = (f"neither a regression nor non-inferiority within the tolerance "
                            f"is shown: about {r.samples_needed:,} "
                            f"{'paired samples' if r.paired else 'samples per run'} (now "
                            f"{min(r.n_old, r.n_new):,}) would decide it at the observed "
                            f"change ({POWER:.0%} power)")
    return result


def _inherited_from(c: Any) -> list[str]:
    """The attacks of its threat model whose breaks an attack row took over (samples an
    earlier attack broke are not attacked again), from its details."""
    d = c.details if isinstance(c.details, dict) else {}
    by = (d.get("inherited") or {}).get("by") or {}
    return [str(k) for k in by] if isinstance(by, dict) else []


def _threat_of(co: Any, cn: Any, named: dict[Any, str]) -> str:
    """The threat-model row an attack row is evidence for, from its details (``norm``,
    ``epsilon``) in either run; a SKIPPED row records none, so it is named by its check."""
    for c in (co, cn):
        d = c.details if c is not None and isinstance(c.details, dict) else {}
        if "norm" in d and "epsilon" in d:
            key = (d["norm"], float(d["epsilon"]))
            return named.get(key, threat_row_id(*key))
    return "its threat model"


#: The power :func:`samples_to_decide` plans for.
POWER = 0.8


def samples_to_decide(r: Row) -> int | None:
    """About how many samples (paired rows: pairs; unpaired: per run) would decide an
    inconclusive rate or score row at its observed change with :data:`POWER`: showing
    non-inferiority when the change is better than the tolerance's edge, a regression when it
    is worse (at the level Holm used for the row). Paired rates use the power of McNemar's
    test at the observed discordant rates (normal approximation: per-pair variance
    ``p_worse + p_better - (p_better - p_worse)^2``, Connor 1987); unpaired rates the two
    binomial variances; scores scale the interval's standard error. A single variance serves
    both terms (the Wald form of Connor's estimate). ``None`` when the change sits on the
    tolerance's edge (no sample size decides it), nothing is known to scale, or the estimate
    does not exceed the samples already used."""
    if r.change is None or r.change_interval is None:
        return None
    gain = r.change if r.direction != "lower" else -r.change  # better is positive
    margin = gain + r.tolerance
    if abs(margin) < 1e-9:  # on the tolerance's edge: no sample size decides it
        return None
    level = ALPHA if margin > 0 else 1 - (r.confidence or 1 - ALPHA)
    # the two-sided quantile at the row's level, plus the one-sided quantile at POWER
    z = two_sided_z(1 - level) + two_sided_z(2 * POWER - 1)
    n = min(r.n_old, r.n_new)
    if r.unit == "rate" and r.paired and r.discordant is not None and n:
        pw, pb = r.discordant["worse"] / n, r.discordant["better"] / n
        var = pw + pb - (pb - pw) ** 2
    elif r.unit == "rate" and not r.paired and r.old_value is not None and \
            r.new_value is not None:
        var = (r.old_value * (1 - r.old_value) + r.new_value * (1 - r.new_value))
    else:
        var = 0.0
    if var <= 0:  # scale the interval's standard error
        lo, hi = r._interval(1 - ALPHA) if r._interval is not None else (None, None)
        if lo is None or hi is None or not n or hi <= lo:
            return None
        var = n * ((hi - lo) / (2 * two_sided_z(1 - ALPHA))) ** 2
    need = math.ceil(var * (z / margin) ** 2)
    # an estimate at or below the samples already used would contradict the interval that
    # left the row undecided (it is an approximation): say nothing rather than that
    return need if n < need < 1e9 else None


def _decide(r: Row, resolved: bool, level: float) -> None:
    """A tested row's outcome at ``level`` (its interval's confidence is ``1 - level``)."""
    r.confidence = 1 - level
    lo, hi = r._interval(1 - level)
    r.change_interval = [lo, hi]
    r.outcome = _gate(r, resolved, (lo, hi), r._interval(1 - ALPHA))


#: A row's outcomes (``Row.outcome``).
NO_CHANGE = "no change"
REGRESSION = "regression"
IMPROVEMENT = "improvement"
NON_INFERIOR = "non-inferior"
INCONCLUSIVE = "inconclusive"
NOT_COMPARABLE = "not comparable"
NOT_COMPARED = "not compared"
#: Outcomes that keep the gate open (exit 6) on a gating row with a threshold.
GATE_OPEN = frozenset({INCONCLUSIVE, NOT_COMPARED})


def _gate(r: Row, resolved: bool, corrected: tuple[float, float],
          plain: tuple[float, float]) -> str:
    """A tested row's outcome (see the module's docstring), with why in ``r.reason``."""
    tol = r.tolerance
    higher = r.direction == "higher"
    lo, hi = corrected
    if r.paired and r.change == 0 and (r.discordant == {"worse": 0, "better": 0}
                                       or lo == hi == 0):
        return NO_CHANGE  # the same samples, the same per-sample outcomes
    worse = hi < -tol if higher else lo > tol
    better = lo > tol if higher else hi < -tol
    plo, phi = plain
    within = plo >= -tol if higher else phi <= tol
    unconverged = [w for w, ok in (("OLD", r.converged_old), ("NEW", r.converged_new))
                   if ok is False]
    if unconverged:
        r.reason = (f"{' and '.join(unconverged)}'s attacks did not all converge: its worst "
                    "case is an overestimate" if r.kind == "threat_model" else
                    f"{' and '.join(unconverged)}'s attack did not converge: its robust "
                    "accuracy is an overestimate")
    if resolved and worse:
        return REGRESSION
    if within and r.converged_new is not False:
        if resolved and better and not unconverged:
            return IMPROVEMENT
        return NON_INFERIOR
    if not r.reason:
        r.reason = ("neither a regression nor non-inferiority within the tolerance is shown: "
                    "more samples or a stated --tolerance would decide it")
    return INCONCLUSIVE


def compare_paths(old: Path, new: Path, tolerance: float | None = None,
                  pubkey: Path | None = None) -> Comparison:
    """Load (verifying first when ``pubkey`` is given) and compare two runs or cards."""
    _, ro = load_run(old, pubkey)
    _, rn = load_run(new, pubkey)
    return compare(ro, rn, tolerance, old, new)
