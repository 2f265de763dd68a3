"""The robustness model card: jinja2 HTML (autoescaped, StrictUndefined) and WeasyPrint PDF.

The card is a view of a typed :class:`~certify.results.RunResult`. Each check kind presents
itself (headline, figures, its section template ``templates/checks/<kind>.html.j2``); this
module only iterates over the kinds a run has, in registry order. Images are looked up by the
pixel digest the signed measurement records (see :mod:`certify.images`).
"""

from __future__ import annotations

import base64
import functools
import importlib.resources
import logging
import re
import typing
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TypedDict

import jinja2
import markupsafe

from certify.canonical import script_safe_json
from certify.kinds import CERTIFIED_METHODS, KINDS
from certify.norms import card_text
from certify.report import glance
from certify.report.sealed import blank_slot
from certify.results import (
    DECISION_RULE_TEXT,
    CheckResult,
    DecidedBy,
    ModelCardDoc,
    RunMeasurement,
    RunResult,
    Status,
    WorstCase,
    verdict_statuses,
)

if TYPE_CHECKING:
    from importlib.abc import Traversable

    from certify.report.signature import Signature


def _environment() -> jinja2.Environment:
    root = importlib.resources.files("certify._templates")
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(
            lambda name: root.joinpath(*name.split("/")).read_text(encoding="utf-8")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["pct"] = lambda v: "–" if v is None else f"{100 * float(v):.1f}%"
    env.filters["num"] = num = lambda v, d=3: "–" if v is None else f"{float(v):.{d}f}"
    # a threat model in the attack section's words, as its norm writes it
    env.globals["threat_text"] = lambda n, e, grid=True: card_text(n, e, num, grid)
    return env


def headline(c: CheckResult) -> str:
    """One line that says what a check measured (the card's summary and the CLI's)."""
    if c.status == "ERROR":
        return f"error: {c.error}"
    if c.status == "SKIPPED":
        return f"skipped: {c.decision}"
    text = KINDS[c.kind].headline(c)
    if c.sample_errors:
        text += f"; {c.sample_errors} sample(s) errored"
    return text


#: The counts' words, in the order the card and the console give them.
COUNT_WORDS = (("pass", "passed"), ("fail", "failed"), ("inconclusive", "inconclusive"),
               ("warn", "passed with a warning (WARN)"), ("error", "errored"),
               ("info", "informational"), ("skipped", "skipped"))


def row_warnings(checks: Sequence[CheckResult], worst: Sequence[WorstCase]
                 ) -> list[tuple[str, str]]:
    """Every warning the rows carry, whatever their status, as (row, text): the console
    prints one line each and the card counts them (a FAIL or INFO row may warn too, so the
    count of WARN rows is not the count of warnings)."""
    from certify.report.glance import threat_name

    out = [(c.id, str(t)) for c in checks for t in c.warnings]
    out += [(f"threat model {threat_name(w.norm, w.epsilon)}", str(t))
            for w in worst for t in w.warnings]
    return out


def deciding_counts(checks: Sequence[CheckResult], worst: Sequence[WorstCase]
                    ) -> tuple[dict[str, int], int]:
    """The rows that decide the run's verdict, counted by status (lower case, every status),
    and how many attack rows the threat-model rows stand in for.

    Each check row counts, except that a threat model's row counts in place of the attack rows
    it summarises (their evidence; an errored attack row still counts itself), as in the
    verdict (:func:`~certify.results.verdict_statuses`). The signed
    ``measurement.summary`` counts every check row instead, attack rows included.
    """
    statuses = verdict_statuses(checks, worst)
    grouped = {i for w in worst for i in w.attacks}
    evidence = sum(c.id in grouped and c.status != "ERROR" for c in checks)
    return {s.lower(): statuses.count(s) for s in typing.get_args(Status)}, evidence


def _tree_digest(root: Traversable, suffixes: tuple[str, ...]) -> str:
    """sha256 over the relative name and the bytes of every file under ``root`` (a
    :mod:`importlib.resources` traversable) whose name ends with one of ``suffixes``, in
    name order."""
    import hashlib

    files: list[tuple[str, Traversable]] = []

    def walk(node: Traversable, prefix: str) -> None:
        for child in node.iterdir():
            if child.is_dir():
                if child.name != "__pycache__":
                    walk(child, f"{prefix}{child.name}/")
            elif child.name.endswith(suffixes):
                files.append((prefix + child.name, child))

    walk(root, "")
    h = hashlib.sha256()
    for name, f in sorted(files, key=lambda t: t[0]):
        data = f.read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return "sha256:" + h.hexdigest()


def templates_digest() -> str:
    """sha256 over every packaged template file's name and bytes (``certify._templates``)."""
    return _tree_digest(importlib.resources.files("certify._templates"), (".j2", ".css"))


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 over every Python file of the certify package, by name and bytes: the card's
    text comes from code (headlines, findings, the glance) as much as from templates, and
    certify's version string stays the same between commits. Read once per process: the code
    that renders is the code loaded (templates, read at each rendering, are not cached)."""
    return _tree_digest(importlib.resources.files("certify"), (".py",))


#: The renderer entries that decide whether this certify renders a card byte for byte as the
#: recorded renderer did (WeasyPrint only draws the PDF, which its own signature covers).
SAME_RENDERER_KEYS = ("certify", "templates", "code", "jinja2")


def renderer_info(pdf: bool = True) -> dict[str, str]:
    """What renders the card, recorded in provenance: certify's version, digests of its
    templates and code, jinja2's and WeasyPrint's versions. ``certify verify`` compares card.html
    with a fresh rendering only where these name its own renderer (:func:`same_renderer`).
    Where WeasyPrint cannot load its system libraries, its entry says it was unavailable (no
    PDF was rendered) instead of failing the run. Without a PDF (``pdf=False``) WeasyPrint is
    not imported at all (seconds of start-up for nothing): its entry says it was not used."""
    from certify.report.weasy import renderer_version

    return {**html_renderer(), "weasyprint": renderer_version(load=pdf)}


def html_renderer() -> dict[str, str]:
    """The entries of :func:`renderer_info` that decide card.html's bytes."""
    import jinja2 as j

    from certify.version import __version__

    return {"certify": __version__, "templates": templates_digest(),
            "code": code_digest(), "jinja2": j.__version__}


def same_renderer(recorded: Mapping[str, object]) -> bool:
    """Whether a card's recorded renderer is this certify's own (same version, templates,
    code and jinja2): then it re-renders byte for byte."""
    mine = html_renderer()
    return all(recorded.get(k) == mine[k] for k in SAME_RENDERER_KEYS)


def renderer_text(r: Mapping[str, object]) -> str:
    """A renderer in words (digests cut to 12 hex digits)."""
    if not r:
        return "an unrecorded renderer"
    parts = []
    for k in ("certify", "templates", "code", "jinja2"):
        v = str(r.get(k, "not recorded"))
        parts.append(f"{k} {v.split(':')[-1][:12] if v.startswith('sha256:') else v}")
    return ", ".join(parts)


def _glance(checks: Sequence[CheckResult], worst: Sequence[WorstCase]) -> dict[str, str]:
    """The at-a-glance figure (wide and phone variants) of the rows the header counts."""
    return {"svg": glance.glance_svg(checks, worst),
            "narrow": glance.glance_svg(checks, worst, narrow=True),
            "alt": glance.alt_text(checks, worst), "worst": glance.worst_case_line(worst)}


#: How severe a verdict is, for the card's findings: failures first, then what established
#: nothing (an error) or could not decide, then warnings.
SEVERITY = {"FAIL": 0, "ERROR": 1, "INCONCLUSIVE": 2, "WARN": 3}


def _shortfall(value: float | None, threshold: tuple[float | None, float | None] | None,
               rate: bool) -> float:
    """How far a figure lies on the wrong side of its threshold (negative: on the right side
    by that much): percentage points for a rate, a share of the bound otherwise; 0 without a
    value or a threshold."""
    if value is None or threshold is None:
        return 0.0
    lo, hi = threshold
    gaps = ([] if lo is None else [(lo - value, lo)]) + ([] if hi is None else
                                                        [(value - hi, hi)])
    if not gaps:
        return 0.0
    gap, bound = max(gaps)
    return gap if rate else gap / max(abs(bound), 1e-12)


def _first_clause(text: str, limit: int = 220) -> str:
    """The first sentence of a warning or decision, cut at a clause boundary."""
    text = text.strip()
    for sep in (". ", "; a stronger", "; "):
        if sep in text[:limit]:
            return text[: text.index(sep)].rstrip(".")
    return text if len(text) <= limit else text[: limit - 1].rsplit(" ", 1)[0] + "…"


def _value_words(r: glance.Row) -> str:
    if r.value is None:
        return ""
    text = f"{r.words} {glance._fmt(r.value, r.rate)}"
    if r.interval is not None:
        lo, hi = glance._fmt(r.interval[0], r.rate), glance._fmt(r.interval[1], r.rate)
        text += f" (95% CI {lo.removesuffix('%') if r.rate else lo}–{hi})"
    return text


def _why(status: str, error: str, warnings: list[str], decision: str, by: DecidedBy) -> str:
    """Why a verdict is what it is, in a clause: the error, the warning that stopped a pass,
    what keeps an interval from deciding, the rule a failure met, or what stopped a pass.
    ``by`` is the row's typed rule (:class:`~certify.results.DecidedBy`); the ``decision``
    sentence is only quoted, never searched."""
    if status == "ERROR":
        return _first_clause(error or decision)
    if status == "WARN" and warnings:
        return _first_clause(warnings[0])
    if by.rule == "interval_straddles":
        return _first_clause(by.reason)
    if by.rule == "interval_outside":
        return "its whole 95% interval misses the threshold (interval rule)"
    if status == "WARN" and by.stopped and by.reason:
        return _first_clause(by.reason)
    return _first_clause(decision)


def findings(checks: Sequence[CheckResult], worst: Sequence[WorstCase], n: int = 3
             ) -> list[dict[str, str]]:
    """The card's most important findings, in words.

    Failures first, then errors and inconclusive verdicts, then warnings (:data:`SEVERITY`);
    within each, the figure farthest on the wrong side of its threshold first. Among the
    failures, each group of the at-a-glance figure (corruptions, attacks, clean accuracy …)
    names its worst failure before any group names a second one, and every group that failed
    is named even where that takes more than ``n`` findings: a clean accuracy far below its
    threshold is not crowded out by attacks that fail farther below theirs. A failed clean
    accuracy always leads: a release reader asks first whether the model works at all.

    Candidates are the rows that decide (:func:`~certify.report.glance.deciding_rows`: the
    checks and the threat-model rows); an attack row summarised by its threat model's row is
    evidence for that row and does not compete with it, unless its verdict differs (an attack
    too weak, or not converged, says so itself)."""
    rows = {r.id: r for r in glance.rows(checks)}
    grouped = {a: w for w in worst for a in w.attacks}
    found: list[tuple[int, float, str, dict[str, str]]] = []
    for c in checks:
        if c.status not in SEVERITY:
            continue
        w = grouped.get(c.id)
        if w is not None and c.status == w.status:
            continue
        r = rows[c.id]
        what = _value_words(r) or headline(c)
        if c.threshold is not None:
            what += f", threshold {_short_threshold(c, r)}"
        why = _why(c.status, c.error or "", c.warnings, c.decision, c.decided_by)
        found.append((SEVERITY[c.status], _shortfall(r.value, r.threshold, r.rate), r.group,
                      {"status": c.status, "check": c.id, "what": what, "why": why}))
    for w in worst:
        if w.status not in SEVERITY:
            continue
        name = glance.threat_name(w.norm, w.epsilon)
        what = (f"robust accuracy {100 * w.robust_accuracy:.1f}% against all {len(w.attacks)} "
                f"attack(s) of the threat model")
        if w.interval:
            what += f" (95% CI {100 * w.interval[0]:.1f}%–{100 * w.interval[1]:.1f}%)"
        if w.threshold is not None:
            what += f", threshold ≥ {100 * w.threshold:.0f}%"
        group = next((rows[a].group for a in w.attacks if a in rows),
                     KINDS["attack"].glance_group)
        thr = None if w.threshold is None else (float(w.threshold), None)
        found.append((SEVERITY[w.status], _shortfall(w.robust_accuracy, thr, True), group,
                      {"status": w.status, "check": f"threat model {name}", "what": what,
                       "why": _why(w.status, "", w.warnings, w.decision, w.decided_by)}))
    found.sort(key=lambda f: (f[0], -f[1]))
    failed = [f for f in found if f[0] == SEVERITY["FAIL"]]
    leaders = [f for i, f in enumerate(failed) if all(g[2] != f[2] for g in failed[:i])]
    # whether the model works at all comes first: a failed clean accuracy leads the findings,
    # whatever else of its group failed farther below its threshold
    kinds = {c.id: c.kind for c in checks}
    clean = [f for f in failed if kinds.get(f[3]["check"]) == "clean_accuracy"]
    leaders = clean + [f for f in leaders if not any(f is x for x in clean)]
    ordered = leaders + [f for f in found if not any(f is x for x in leaders)]
    return [f[3] for f in ordered[:max(n, len(leaders))]]


def _unsettled(c: CheckResult) -> dict[str, bool]:
    """What keeps a check's figure from being final, from its typed ``settled`` field: a random
    draw (not searched), a search or an attack that had not converged, an attack that failed
    the binarization test, a black-box attack below its query floor (evidence only)."""
    s = c.settled
    return {"random": s.random_draw,
            "search": s.search_converged is False,
            "attack": s.attack_converged is False,
            "weak": s.binarization_failed,
            "evidence": s.short_of_floor,
            "statistical": s.statistical}


def summary_result(c: CheckResult, r: glance.Row) -> str:
    """A check's result in one short line for the summary table (its full headline is in its
    detail block): the headline value and interval, and what keeps it from being final."""
    if c.status == "ERROR":
        return _first_clause(f"error: {c.error}", 120)
    if c.status == "SKIPPED":
        return f"skipped: {c.decision}"
    full = headline(c)
    if r.value is None or (c.status == "INFO" and len(full) <= 150):
        return full if len(full) <= 160 else _first_clause(full, 160)
    text = _value_words(r)
    state = _unsettled(c)
    flags = [words for key, words in (("random", "random draw, not a worst case"),
                                      ("statistical", "random corruption, decided per sample "
                                                      "at a stated confidence"),
                                      ("search", "search not converged"),
                                      ("attack", "not converged"),
                                      ("weak", "binarization test failed")) if state[key]]
    if state["random"] and state["statistical"]:  # random_linf, random_l0: one flag
        flags.remove("random corruption, decided per sample at a stated confidence")
    if c.sample_errors:
        flags.append(f"{c.sample_errors} sample(s) errored")
    return text + ("; " + ", ".join(flags) if flags else "")


def limitations(result: RunResult) -> list[str]:
    """What this run could not establish, in sentences (the card's Limitations): the model's
    identity and how it was run, time budgets, rows not established, figures that are not
    final, searches without their gradient search, then the data and the scope."""
    m, checks = result.measurement, result.checks
    return [*_model_limitations(m), *_budget_limitations(checks), *_not_established(checks),
            *_unsettled_limitations(checks), *_gradient_search_limitations(checks),
            *_scope_limitations(m)]


def _model_limitations(m: RunMeasurement) -> list[str]:
    """An unidentified model; how white-box attacks and batching ran on it."""
    out: list[str] = []
    if m.model.identity.startswith("unidentified"):
        out.append(f"The model is unidentified ({m.model.identity.split(': ', 1)[-1]}): this "
                   "card cannot be tied to a model file, and a later run cannot show it "
                   "evaluated the same model.")
    if m.model.metadata.get("white_box"):
        out.append(f"White-box attacks: {m.model.metadata['white_box']}.")
    if m.model.metadata.get("batching"):  # a batch fixed in the model: how it was run
        out.append(f"Batching: the model was {m.model.metadata['batching']}.")
    return out


def _budget_limitations(checks: Sequence[CheckResult]) -> list[str]:
    """Samples chosen by a time budget (the first budget's seconds and rates stand for all)."""
    budgeted = {c.id: d for c in checks
                if isinstance(d := c.details.get("time_budget"), dict)}
    if not budgeted:
        return []
    first = next(iter(budgeted.values()))
    return [f"Samples chosen by a time budget of {first.get('seconds', 0):,.0f} s "
            f"({first.get('rates', '')}): "
            + ", ".join(f"{i} on {d.get('samples')}" for i, d in budgeted.items())
            + " samples; a larger budget gives narrower intervals."]


def _not_established(checks: Sequence[CheckResult]) -> list[str]:
    """Checks skipped on this model and checks that errored."""
    out: list[str] = []
    skipped = [c.id for c in checks if c.status == "SKIPPED"]
    if skipped:
        out.append(f"Not evaluated on this model: {', '.join(skipped)} (skipped checks are "
                   "not passed).")
    errored = [c.id for c in checks if c.status == "ERROR"]
    if errored:
        out.append(f"Errored, so not established: {', '.join(errored)}.")
    return out


def _unsettled_limitations(checks: Sequence[CheckResult]) -> list[str]:
    """Figures that are not final (:func:`_unsettled`): searches and attacks that had not
    converged, attacks too weak to trust, black-box evidence, random draws and random
    corruptions."""
    out: list[str] = []
    state = {c.id: _unsettled(c) for c in checks}
    unconverged = [i for i, s in state.items() if s["search"] or s["attack"]]
    weak = [i for i, s in state.items() if s["weak"]]
    evidence = [i for i, s in state.items() if s["evidence"]]
    if unconverged:
        out.append(f"Searches and attacks that had not converged when their budget ran out: "
                   f"{', '.join(unconverged)}. A stronger search can only lower these figures.")
    if weak:
        out.append(f"Attacks that failed the binarization test (too weak to trust their "
                   f"robust accuracy): {', '.join(weak)}.")
    if evidence:
        out.append(f"Black-box attacks below their query floor, evidence rather than a pass "
                   f"on their own: {', '.join(evidence)}.")
    random = [i for i, s in state.items() if s["random"]]
    if random:
        out.append(f"Random draws, not worst cases: {', '.join(random)} (the attack rows at "
                   "the same bound say what an adversary finds).")
    statistical = [c for c in checks if state[c.id]["statistical"]
                   and not state[c.id]["random"] and c.status not in ("ERROR", "SKIPPED")]
    if statistical:
        undecided = []
        for c in statistical:
            st = c.details.get("statistical")
            left = st.get("undecided", 0) if isinstance(st, dict) else 0
            if isinstance(left, int) and left:
                undecided.append(f"{c.id} ({left})")
        out.append(f"Random corruptions, statements about a noise distribution at the stated "
                   f"confidence per sample, not worst cases: {', '.join(c.id for c in statistical)}"
                   + (f"; samples undecided within their draws, counted on both sides of the "
                      f"interval: {', '.join(undecided)}" if undecided else "") + ".")
    return out


def _gradient_search_limitations(checks: Sequence[CheckResult]) -> list[str]:
    """Checks searched only by their design, without the gradient search over their
    parameters."""
    no_gradient = []
    for c in checks:
        gs = c.details.get("gradient_search") if c.status not in ("ERROR", "SKIPPED") else None
        if isinstance(gs, dict) and gs.get("samples_not_run"):
            no_gradient.append(f"{c.id} ({gs.get('samples_not_run')} sample(s))")
    if not no_gradient:
        return []
    return ["Searched only by their design, without the gradient search over their "
            f"parameters (no graph of the model, or its copy disagreed): "
            f"{', '.join(no_gradient)}. A gradient search may find fields the design "
            "does not visit."]


def _scope_limitations(m: RunMeasurement) -> list[str]:
    """The data's notes (resizing, a sample cap, skipped files), the assumed preprocessing and
    what the figures hold for."""
    pre = m.model.preprocessing
    return [*(m.data.notes or []),
            f"Preprocessing is assumed, not read from the model: inputs scaled "
            f"×{pre.get('input_scale')}, mean {_listed(pre.get('mean'))}, std "
            f"{_listed(pre.get('std'))}, {pre.get('channel_order')} channel "
            f"order, {m.model.layout} layout, images resized to "
            f"{m.model.input_shape[1]}×{m.model.input_shape[2]}. A different input pipeline in "
            "deployment can change every figure on this card.",
            f"Results hold for the {m.data.n} evaluation samples of {m.data.name} and the "
            "threat models and budgets stated here. Every robust accuracy is an empirical "
            "upper bound: a stronger attack may break what these attacks could not."]


def _listed(v: object) -> str:
    return ", ".join(f"{x:g}" for x in v) if isinstance(v, list) else str(v)


def _short_threshold(c: CheckResult, r: glance.Row) -> str:
    """A threshold in the summary: its bound on the headline metric the result states."""
    if c.threshold is None:
        return "none"
    if r.metric == c.threshold.metric and r.threshold is not None:
        return glance._threshold_text(r)
    return str(c.threshold.text)


class ModelDetails(TypedDict):
    """The model's details on the card, as its team stated them (``None``: not stated)."""

    name: str
    #: whether ``name`` is the stated one (else the file or endpoint name certify saw)
    name_stated: bool
    version: str | None
    owner: str | None
    license: str | None
    intended_use: str | None
    #: when the run was made (ISO 8601, from provenance), and its date alone
    evaluated_at: str | None
    evaluated_on: str | None


def model_details(result: RunResult) -> ModelDetails:
    """Name, version, owner, license, intended use and the evaluation date, as stated (or
    "not stated"); the name falls back to the file or endpoint name certify saw."""
    m, p = result.measurement, result.provenance
    stated = m.model_card or ModelCardDoc()
    when = (p.model_extra or {}).get("evaluated_at")  # provenance keeps extra keys
    return {
        "name": stated.name or m.model.name,
        "name_stated": bool(stated.name),
        "version": stated.version,
        "owner": stated.owner,
        "license": stated.license,
        "intended_use": stated.intended_use,
        "evaluated_at": None if when is None else str(when),
        "evaluated_on": str(when)[:10] if when else None,
    }


def card_context(result: RunResult, signature: Signature | None = None,
                 images: Mapping[str, str] | None = None) -> dict[str, object]:
    """Everything the template shows, computed from the result (and the images it names)."""
    images = images or {}
    m, p = result.measurement, result.provenance
    checks = result.checks
    kinds = {c.kind for c in checks}
    families = list(dict.fromkeys(cls.family for cls in KINDS.values()))
    present = {KINDS[k].family for k in kinds}
    not_tested = [{"family": f, "why": "not in this suite"} for f in families
                  if f not in present]
    figures: dict[str, dict[str, str]] = {}
    for c in checks:
        figures[c.id] = {} if c.status in ("ERROR", "SKIPPED") else KINDS[c.kind].figures(c)
    sections = [{"kind": kind, "partial": cls.partial(),
                 "checks": [c for c in checks if c.kind == kind],
                 "figures": cls.section_figures([c for c in checks if c.kind == kind])}
                for kind, cls in KINDS.items() if kind in kinds]
    warnings = [{"check": c.id, "text": w} for c in checks for w in c.warnings]
    rule = {"name": m.suite.decision, "text": DECISION_RULE_TEXT[m.suite.decision],
            "others": [{"check": c.id, "name": c.threshold.rule, "text":
                        DECISION_RULE_TEXT[c.threshold.rule]} for c in checks
                       if c.threshold is not None and c.threshold.rule != m.suite.decision],
            "release_tolerance": m.suite.release_tolerance}

    def img(digest: str, alt: str) -> markupsafe.Markup:
        """An <img> of a signed image; ``data-digest`` says which pixels it must show."""
        src = images.get(digest, "")
        return markupsafe.Markup('<img src="{}" alt="{}" data-digest="{}">').format(
            src, alt, digest)

    skipped = [c for c in checks if c.status == "SKIPPED"]
    glance_rows = {r.id: r for r in glance.rows(checks)}
    grouped = {a: glance.threat_name(w.norm, w.epsilon) for w in m.attack_worst_case
               for a in w.attacks}
    summary = [{"id": c.id, "kind": c.kind, "status": c.status, "decision": c.decision,
                "result": summary_result(c, glance_rows[c.id]),
                "threshold": _short_threshold(c, glance_rows[c.id]),
                "evidence_for": grouped.get(c.id), "group": glance_rows[c.id].group}
               for c in checks]
    order = {g: i for i, g in enumerate(glance.GROUPS)}
    summary.sort(key=lambda s: order.get(str(s["group"]), len(order)))
    counts, evidence_rows = deciding_counts(checks, m.attack_worst_case)
    return {
        "counts": counts,
        "n_warnings": len(row_warnings(checks, m.attack_worst_case)),
        "evidence_rows": evidence_rows,
        "details": model_details(result),
        "findings": findings(checks, list(m.attack_worst_case)),
        "summary": summary,
        "limitations": limitations(result),
        "threat_name": glance.threat_name,
        "r": result,
        "skipped": skipped,
        "skipped_why": ("model returns labels only" if skipped and m.model.output == "labels"
                        else "each row says why"),
        "m": m,
        "p": p,
        "not_tested": not_tested,
        "figures": figures,
        "method_names": CERTIFIED_METHODS,
        "certified_rows": any(w.certified is not None for w in m.attack_worst_case),
        "timings": dict((getattr(p, "timings", None) or {}).get("checks") or {}),
        "headlines": {c.id: headline(c) for c in checks},
        "glance": _glance(checks, m.attack_worst_case),
        "sections": sections,
        "warnings": warnings,
        "decision_rule": rule,
        "img": img,
        "payload": script_safe_json(result.to_json()),
        "signature": signature,
        # a signed card's slot is sealed over the card's bytes once rendered (report.sealed)
        "signature_json": "null" if signature is None else blank_slot(),
    }


def unsealed_form(html: str, signature: Signature) -> str:
    """``html`` rendered for ``signature`` in the form cards had before they were sealed (the
    signature document inline in its script, no byte-range signature): what an older card's
    re-rendering is compared with (:func:`certify.report.visible.check_html`)."""
    return html.replace(blank_slot(), signature.to_json().strip().replace("<", "\\u003c"), 1)


def render_html(result: RunResult, signature: Signature | None = None,
                images: Mapping[str, str] | None = None) -> str:
    """The self-contained card HTML; ``images`` maps digests to data URIs."""
    env = _environment()
    css = (importlib.resources.files("certify._templates") / "card.css").read_text("utf-8")
    ctx = card_context(result, signature, images)
    return env.get_template("card.html.j2").render(css=css, **ctx)


_INLINE_SVG = re.compile(r"<svg\b([^>]*)>.*?</svg>", re.S)
_SVG_CLASS = re.compile(r'\bclass="([^"]*)"')


def figures_as_images(html: str) -> str:
    """``html`` with each inline SVG figure as an ``<img>`` of the same SVG (a ``data:`` URI),
    for WeasyPrint: it draws the same picture with the same SVG renderer, but its HTML parser
    and style cascade no longer walk every element of every figure (about 1.4 s of the demo
    card's PDF, issue 53). The image keeps the figure's classes (plus ``svg``, which the
    stylesheet sizes as it sizes ``svg``) and its ``<title>`` as its ``alt`` text."""

    def image(m: re.Match[str]) -> str:
        svg = m.group(0)
        if "xmlns=" not in m.group(1):
            svg = svg.replace("<svg", '<svg xmlns="http://www.w3.org/2000/svg"', 1)
        title = re.search(r"<title>(.*?)</title>", svg, re.S)
        cls = _SVG_CLASS.search(m.group(1))
        classes = ("svg " + cls.group(1)) if cls else "svg"
        uri = "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode()
        alt = title.group(1).replace('"', "&quot;") if title else ""
        return f'<img class="{classes}" src="{uri}" alt="{alt}">'

    return _INLINE_SVG.sub(image, html)


def render_pdf(html: str, payload: bytes, signature: Signature | None = None) -> bytes:
    """Render the card HTML to PDF with WeasyPrint, attaching the payload and signature.

    Raises :class:`~certify.errors.PdfUnavailableError` where WeasyPrint cannot load its
    system libraries (:func:`certify.report.weasy.load_weasyprint`).
    """
    from certify.report.weasy import load_weasyprint

    weasyprint = load_weasyprint()
    # WeasyPrint logs font-subsetting chatter at INFO/WARNING; keep it out of the user's way.
    logging.getLogger("weasyprint").setLevel(logging.ERROR)
    logging.getLogger("fontTools").setLevel(logging.ERROR)
    doc = weasyprint.HTML(string=figures_as_images(html))
    attachment = weasyprint.Attachment(
        string=payload.decode("utf-8"), name="results.json",
        description="certify results (canonical JSON)",
    )
    attachments = [attachment]
    if signature is not None:
        attachments.append(weasyprint.Attachment(
            string=signature.to_json(), name="results.json.sig",
            description="certify signature of results.json"))
    pdf = doc.write_pdf(attachments=attachments)
    if pdf is None:
        raise RuntimeError("WeasyPrint produced no PDF")
    return pdf
