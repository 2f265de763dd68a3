"""How a comparison is shown: in the terminal (a table, or one block per row on a terminal of
80 columns or fewer), and as an HTML/PDF comparison card that has the card's look (the same
CSS). The threat-model rows come first: with the checks that are not attack rows, they decide;
attack rows are shown as evidence for their threat model's row."""

from __future__ import annotations

import importlib.resources
import textwrap
from collections.abc import Sequence
from typing import TypedDict

from rich.console import Console
from rich.table import Table

from certify.report.compare import ALPHA, Comparison, Outcome, Row, RowRole

#: At this many columns or fewer, the terminal shows one block per row instead of a table.
NARROW = 80

_STYLE = {Outcome.REGRESSION: "bold red", Outcome.IMPROVEMENT: "green",
          Outcome.INCONCLUSIVE: "yellow"}


def fmt_value(v: float | None, unit: str) -> str:
    """A metric value: rates as percent, scores with 4 significant digits."""
    if v is None:
        return "–"
    return f"{100 * v:.1f}%" if unit == "rate" else f"{v:.4g}"


def fmt_interval(iv: Sequence[float | None] | None, unit: str) -> str:
    """``[lo, hi]`` of a metric's interval (``–`` when there is none)."""
    if not iv or iv[0] is None or iv[1] is None:
        return "–"
    return f"[{fmt_value(iv[0], unit)}, {fmt_value(iv[1], unit)}]"


def fmt_change(r: Row) -> str:
    """The change with its corrected interval: pp for rates, the score's own units else (on
    the compared quantity, the one the OLD and NEW columns show)."""
    if r.change is None:
        return "–"
    return _change_only(r)


def _differs_from_card(r: Row) -> bool:
    """Whether the compared quantity is not the card's own figure (another denominator: a
    conditional rate compared as the unconditional share "correct and stays correct", the
    samples both runs evaluated, or the attacks both runs evaluated)."""
    return r.change is not None and any(
        a is None or b is None or abs(a - b) > 1e-9
        for a, b in ((r.old_value, r.old), (r.new_value, r.new)))


def _side_text(r: Row, compared: float | None, card: float | None,
               iv: Sequence[float | None]) -> str:
    """One side's value: the compared quantity when the row was compared (so OLD, NEW and the
    change share one denominator), with the card's own figure after it where that differs;
    else the card's figure with its interval."""
    unit = r.unit if r.unit == "rate" else "score"
    if not _differs_from_card(r):
        return f"{fmt_value(card, unit)} {fmt_interval(iv, r.unit)}"
    return f"{fmt_value(compared, unit)} (card: {fmt_value(card, unit)})"


def _change_only(r: Row) -> str:
    assert r.change is not None
    if r.unit == "rate":
        text = f"{100 * r.change:+.1f} pp"
        if r.change_interval:
            text += f" [{100 * r.change_interval[0]:+.1f}, {100 * r.change_interval[1]:+.1f}]"
        return text
    text = f"{r.change:+.4g}"
    if r.change_interval:
        text += f" [{r.change_interval[0]:+.4g}, {r.change_interval[1]:+.4g}]"
    return text


class RowText(TypedDict):
    """What a row shows, as text (the terminal's table and blocks, the comparison card)."""

    id: str
    metric: str
    old: str
    new: str
    compared: str
    pairing: str
    method: str
    change: str
    confidence: str
    p: str
    p_raw: str
    outcome: str
    kind: str
    threshold: bool
    evidence_for: str | None
    attacks: str


def _row_context(r: Row) -> RowText:
    return {
        "id": r.id, "metric": r.metric or "–",
        "old": _side_text(r, r.old_value, r.old, r.old_interval),
        "new": _side_text(r, r.new_value, r.new, r.new_interval),
        "compared": r.compared or "–",
        "pairing": ("paired" if r.paired else "unpaired") if r.method else "–",
        "method": r.method,
        "change": fmt_change(r),
        "confidence": "–" if r.confidence is None else f"{100 * r.confidence:.2f}%",
        "p": "–" if r.p_holm is None else f"{r.p_holm:.3g}",
        "p_raw": "–" if r.p is None else f"{r.p:.3g}",
        "outcome": r.outcome.value + (f" ({r.reason})" if r.reason else ""),
        "kind": r.outcome.value.replace(" ", "-"),
        "threshold": r.has_threshold,
        "evidence_for": r.evidence_for if r.role == RowRole.EVIDENCE else None,
        "attacks": ", ".join(r.attacks),
    }


def rows_context(c: Comparison) -> list[RowText]:
    """What each check's row shows, as text (attack rows say which threat model they are
    evidence for)."""
    return [_row_context(r) for r in c.rows]


def threat_rows_context(c: Comparison) -> list[RowText]:
    """What each threat model's row shows, as text."""
    return [_row_context(r) for r in c.threat_models]


def summary_line(c: Comparison) -> str:
    """One sentence: the decision and why."""
    regs = c.regressions
    gated = [r.id for r in regs if r.has_threshold]
    skipped = [r.id for r in c.gating if r.outcome == Outcome.NOT_COMPARED and r.blocks]
    unevaluated = [r.id for r in c.not_evaluated]
    apart = [r.id for r in (*c.threat_models, *c.rows) if r.outcome == Outcome.NOT_COMPARABLE]
    note = (f"; not compared: {', '.join(skipped)} (see why in the table)" if skipped else "")
    if unevaluated:
        note += (f"; not evaluated in one run (SKIPPED, neither gating nor blocking): "
                 f"{', '.join(unevaluated)}")
    if apart:
        note += f"; not comparable (only in one run, or changed): {', '.join(apart)}"
    if gated:
        return (f"RESOLVED REGRESSION on {', '.join(gated)} (a row with a threshold): "
                f"exit 1{note}")
    open_ = [r.id + (f" (about {r.samples_needed:,} samples would decide it)"
                     if r.samples_needed else "") for r in c.inconclusive]
    if open_:
        return (f"INCONCLUSIVE on {', '.join(open_)}: neither a regression nor "
                f"non-inferiority within the tolerance ({c.tolerance:g}) is shown: exit 6"
                f"{note}")
    extra = (f" (resolved regression only on rows without a threshold: "
             f"{', '.join(r.id for r in regs)})" if regs else "")
    return (f"no resolved regression; every threat model and check with a threshold is "
            f"unchanged or non-inferior within the tolerance ({c.tolerance:g}){extra}: exit 0"
            f"{note}")


def _method_note(c: Comparison) -> str:
    gating = sum(r.p is not None for r in c.gating)
    return (f"Decided on the threat-model rows and the checks that are not attack rows (attack "
            f"rows are evidence, shown at their threat model's level). Holm correction over "
            f"{gating} compared rows at family-wise {ALPHA:g}; tolerance {c.tolerance:g} (pp "
            f"for rates, % of OLD for scores; from {c.tolerance_source}). Rates compare the "
            "share of all evaluated samples with the row's outcome (robustness: correct and "
            "stays correct; a threat model: robust to every attack of it); OLD, NEW and the "
            "change are on that share, with the card's own figure beside it where it differs.")


def print_table(c: Comparison, console: Console) -> None:
    """The comparison in the terminal, then its decision: a table, or one block per row when
    the terminal is :data:`NARROW` columns or fewer (``COLUMNS`` or the terminal's width)."""
    if console.width <= NARROW:
        _print_blocks(c, console)
        return
    t = Table(title=f"certify compare: {c.old.model} (OLD) -> {c.new.model} (NEW)",
              show_lines=False)
    for col in ("row", "metric", "OLD", "NEW", "pairing",
                "change [Holm-corrected]", "p (Holm)", "result"):
        t.add_column(col, overflow="fold")
    for r, row in [*zip(c.threat_models, threat_rows_context(c), strict=True),
                   *zip(c.rows, rows_context(c), strict=True)]:
        name = row["id"]
        if row["evidence_for"]:
            name += f" (evidence for {row['evidence_for']})"
        t.add_row(name, row["metric"], row["old"], row["new"], row["pairing"],
                  row["change"], row["p"], row["outcome"], style=_STYLE.get(r.outcome))
    console.print(t)
    console.print(_method_note(c), highlight=False)
    console.print(f"decision: {c.decision}", highlight=False, markup=False)
    console.print(summary_line(c), highlight=False)


def _print_blocks(c: Comparison, console: Console) -> None:
    """One block per row, every line within the console's width."""
    width = console.width

    def say(text: str, indent: str = "", style: str | None = None) -> None:
        for line in textwrap.wrap(text, width, initial_indent=indent,
                                  subsequent_indent=indent + "  ",
                                  break_on_hyphens=False) or [""]:
            console.print(line, style=style, highlight=False, markup=False, soft_wrap=True)

    say(f"certify compare: {c.old.model} (OLD) -> {c.new.model} (NEW)",
        style="bold")
    groups = (("Threat models (they decide)", c.threat_models, threat_rows_context(c)),
              ("Checks", c.rows, rows_context(c)))
    for title, rows, texts in groups:
        if not rows:
            continue
        say("")
        say(title, style="bold")
        for r, row in zip(rows, texts, strict=True):
            role = (f"evidence for {row['evidence_for']}" if row["evidence_for"]
                    else "gate" + ("" if row["threshold"] else ", no threshold"))
            say("")
            say(f"{row['id']} ({role})", style=_STYLE.get(r.outcome))
            say(f"metric: {row['metric']}", "  ")
            say(f"OLD: {row['old']}", "  ")
            say(f"NEW: {row['new']}", "  ")
            if row["change"] != "–":
                say(f"change: {row['change']} at {row['confidence']}, {row['pairing']}, "
                    f"p (Holm) {row['p']}", "  ")
            say(f"result: {row['outcome']}", "  ", style=_STYLE.get(r.outcome))
    say("")
    say(_method_note(c))
    say(f"decision: {c.decision}", style="bold")
    say(summary_line(c))


def render_html(c: Comparison) -> str:
    """The self-contained comparison card (HTML, the card's CSS); its badge is the
    comparison's decision (:attr:`~certify.report.compare.Comparison.decision`)."""
    from certify.report.card import _environment

    css = (importlib.resources.files("certify._templates") / "card.css").read_text("utf-8")
    return _environment().get_template("compare.html.j2").render(
        css=css, c=c, rows=rows_context(c), threats=threat_rows_context(c),
        summary=summary_line(c), alpha=ALPHA, badge=BADGE[c.decision], decision=c.decision)


#: The badge's colour class (the card's CSS) for each decision.
BADGE = {"REGRESSION": "FAIL", "INCONCLUSIVE": "INCONCLUSIVE", "NO CHANGE": "PASS",
         "IMPROVEMENT": "PASS", "NON-INFERIOR": "PASS", "NO THRESHOLD GATED": "INFO"}


def render_pdf(html: str) -> bytes:
    """The comparison card as PDF (WeasyPrint, as the card); raises
    :class:`~certify.errors.PdfUnavailableError` where WeasyPrint cannot load."""
    import logging

    from certify.report.weasy import load_weasyprint

    weasyprint = load_weasyprint()
    logging.getLogger("weasyprint").setLevel(logging.ERROR)
    logging.getLogger("fontTools").setLevel(logging.ERROR)
    pdf = weasyprint.HTML(string=html).write_pdf()
    if not isinstance(pdf, bytes):
        raise RuntimeError("WeasyPrint produced no PDF")
    return pdf
