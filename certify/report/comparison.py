"""How a comparison is shown: a rich terminal table, and an HTML/PDF comparison card that has
the card's look (the same CSS)."""

from __future__ import annotations

import importlib.resources
from typing import Any

from rich.console import Console
from rich.table import Table

from certify.report.compare import ALPHA, Comparison, Row

_STYLE = {"regression": "bold red", "improvement": "green", "inconclusive": "yellow"}


def fmt_value(v: float | None, unit: str) -> str:
    """A metric value: rates as percent, scores with 4 significant digits."""
    if v is None:
        return "–"
    return f"{100 * v:.1f}%" if unit == "rate" else f"{v:.4g}"


def fmt_interval(iv: Any, unit: str) -> str:
    """``[lo, hi]`` of a metric's interval (``–`` when there is none)."""
    if not iv or iv[0] is None or iv[1] is None:
        return "–"
    return f"[{fmt_value(iv[0], unit)}, {fmt_value(iv[1], unit)}]"


def fmt_change(r: Row) -> str:
    """The change with its corrected interval: pp for rates, the score's own units else.

    When the compared quantity is not the metric itself (a conditional robustness score is
    compared on the unconditional share "correct and stays correct"), the compared values
    come first: ``88.3% → 0.0%: -88.3 pp [...]``.
    """
    if r.change is None:
        return "–"
    prefix = ""
    if any(a is None or b is None or abs(a - b) > 1e-9
           for a, b in ((r.old_value, r.old), (r.new_value, r.new))):
        prefix = f"{fmt_value(r.old_value, r.unit)} → {fmt_value(r.new_value, r.unit)}: "
    return prefix + _change_only(r)


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


def rows_context(c: Comparison) -> list[dict[str, Any]]:
    """What each table row shows, as text."""
    out = []
    for r in c.rows:
        out.append({
            "id": r.id, "metric": r.metric or "–",
            "old": f"{fmt_value(r.old, r.unit if r.unit == 'rate' else 'score')} "
                   f"{fmt_interval(r.old_interval, r.unit)}",
            "new": f"{fmt_value(r.new, r.unit if r.unit == 'rate' else 'score')} "
                   f"{fmt_interval(r.new_interval, r.unit)}",
            "compared": r.compared or "–",
            "pairing": ("paired" if r.paired else "unpaired") if r.method else "–",
            "method": r.method,
            "change": fmt_change(r),
            "confidence": "–" if r.confidence is None else f"{100 * r.confidence:.2f}%",
            "p": "–" if r.p_holm is None else f"{r.p_holm:.3g}",
            "outcome": r.outcome + (f" ({r.reason})" if r.reason else ""),
            "kind": r.outcome.split(",")[0].replace(" ", "-"),
            "threshold": r.has_threshold,
        })
    return out


def summary_line(c: Comparison) -> str:
    """One sentence: the decision and why."""
    regs = c.regressions
    gated = [r.id for r in regs if r.has_threshold]
    skipped = [r.id for r in c.rows if r.outcome == "not compared"]
    apart = [r.id for r in c.rows if r.outcome == "not comparable"]
    note = (f"; not compared: {', '.join(skipped)} (see why in the table)" if skipped else "")
    if apart:
        note += f"; not comparable (only in one run, or changed): {', '.join(apart)}"
    if gated:
        return (f"RESOLVED REGRESSION on {', '.join(gated)} (a check with a threshold): "
                f"exit 1{note}")
    open_ = [r.id for r in c.inconclusive]
    if open_:
        return (f"INCONCLUSIVE on {', '.join(open_)}: neither a regression nor "
                f"non-inferiority within the tolerance ({c.tolerance:g}) is shown: exit 6"
                f"{note}")
    extra = (f" (resolved regression only on checks without a threshold: "
             f"{', '.join(r.id for r in regs)})" if regs else "")
    return (f"no resolved regression; every check with a threshold is unchanged or "
            f"non-inferior within the tolerance ({c.tolerance:g}){extra}: exit 0{note}")


def print_table(c: Comparison, console: Console) -> None:
    """The comparison as a rich table, then its decision."""
    t = Table(title=f"certify compare: {c.old['model']} (OLD) -> {c.new['model']} (NEW)",
              show_lines=False)
    for col in ("check", "metric", "OLD [95%]", "NEW [95%]", "pairing",
                "change [Holm-corrected]", "p (Holm)", "result"):
        t.add_column(col, overflow="fold")
    for r, row in zip(c.rows, rows_context(c), strict=True):
        t.add_row(row["id"], row["metric"], row["old"], row["new"], row["pairing"],
                  row["change"], row["p"], row["outcome"], style=_STYLE.get(r.outcome))
    console.print(t)
    console.print(f"Holm correction over {sum(r.p is not None for r in c.rows)} compared "
                  f"checks at family-wise {ALPHA:g}; tolerance {c.tolerance:g} (pp for rates, "
                  "% of OLD for scores). Rates compare the share of all evaluated samples with "
                  "the check's outcome (robustness: correct and stays correct); where that share "
                  "is not the metric itself, it is shown before the change.",
                  highlight=False)
    console.print(summary_line(c), highlight=False)


def render_html(c: Comparison) -> str:
    """The self-contained comparison card (HTML, the card's CSS)."""
    from certify.report.card import _environment

    css = (importlib.resources.files("certify._templates") / "card.css").read_text("utf-8")
    return _environment().get_template("compare.html.j2").render(
        css=css, c=c, rows=rows_context(c), summary=summary_line(c), alpha=ALPHA)


def render_pdf(html: str) -> bytes:
    """The comparison card as PDF (WeasyPrint, as the card); raises
    :class:`~certify.errors.PdfUnavailableError` where WeasyPrint cannot load."""
    import logging

    from certify.report.weasy import load_weasyprint

    weasyprint = load_weasyprint()
    logging.getLogger("weasyprint").setLevel(logging.ERROR)
    logging.getLogger("fontTools").setLevel(logging.ERROR)
    pdf = weasyprint.HTML(string=html).write_pdf()
    if pdf is None:
        raise RuntimeError("WeasyPrint produced no PDF")
    return pdf
