"""Small inline-SVG figures for the card, drawn with matplotlib (deterministic output).

Leaf utilities that check presentations call: no file I/O, no timestamps, fixed SVG ids, so the
same results always draw the same bytes.
"""

from __future__ import annotations

import io
import math
from typing import Any
from xml.sax.saxutils import escape

_RC: dict[Any, Any] = {"svg.hashsalt": "certify", "svg.fonttype": "none", "font.size": 7}


def _figure(size: tuple[float, float]) -> tuple[Any, Any]:
    # A bare Figure, not pyplot: no global backend or figure registry is touched.
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    return fig, fig.subplots()


def _svg(fig: Any, ax: Any, title: str) -> str:
    """Finish a figure and return it as inline SVG (no XML header, no timestamp), with
    ``title`` (its numbers in words) as its text alternative: ``role="img"`` and ``<title>``."""
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    end = svg.index(">") + 1
    return (svg[: end - 1] + ' role="img">' + f"<title>{escape(title)}</title>" + svg[end:])


def per_class_svg(per_class: list[dict[str, Any]]) -> str:
    """A bar chart of per-class accuracy."""
    import matplotlib

    with matplotlib.rc_context(_RC):
        fig, ax = _figure((7.2, 2.0))
        classes = [r["class"] for r in per_class]
        acc = [r["accuracy"] for r in per_class]
        colors = ["#2e7d32" if a >= 0.9 else "#f9a825" if a >= 0.7 else "#c62828" for a in acc]
        ax.bar([str(c) for c in classes], acc, color=colors, width=0.8)
        ax.set_ylim(0, 1.02)
        ax.set_ylabel("accuracy")
        ax.set_xlabel("class id")
        ax.tick_params(axis="x", labelsize=5)
        title = "Accuracy per class (bars coloured green at 90% or more, amber at 70% or " \
                "more, red below): " + "; ".join(f"class {c}: {100 * a:.1f}%"
                                                 for c, a in zip(classes, acc, strict=True))
        return _svg(fig, ax, title)


def curve_svg(curve: list[dict[str, Any]], unit: str) -> str:
    """Robustness score as a function of the intensity bound."""
    import matplotlib

    pts = [(p["intensity"], p["score"]) for p in curve if p["score"] is not None]
    with matplotlib.rc_context(_RC):
        fig, ax = _figure((2.6, 1.6))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=2.5,
                    color="#1565c0", linewidth=1.2, drawstyle="steps-post")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel(unit)
        ax.set_ylabel("robustness")
        title = (f"Robustness score against the bound ({unit}): "
                 + ("; ".join(f"{x:g} {unit}: {100 * y:.1f}%" for x, y in pts) or "no points"))
        return _svg(fig, ax, title)


def failure_bound_svg(curve: list[dict[str, Any]], unit: str, confidence: float) -> str:
    """A random corruption's failure probability per intensity: its estimate and its upper
    bound at ``confidence`` (one draw per sample at each intensity)."""
    import matplotlib

    pts = [(p["intensity"], p["failure_share"], p["failure_upper"]) for p in curve
           if p.get("failure_share") is not None]
    with matplotlib.rc_context(_RC):
        fig, ax = _figure((2.6, 1.6))
        if pts:
            xs = [p[0] for p in pts]
            ax.plot(xs, [p[2] for p in pts], marker="o", markersize=2.5, color="#c62828",
                    linewidth=1.2, label=f"upper bound ({100 * confidence:g}%)")
            ax.plot(xs, [p[1] for p in pts], marker="o", markersize=2, color="#1565c0",
                    linewidth=0.9, linestyle="--", label="observed")
            ax.legend(frameon=False, fontsize=5)
        ax.set_ylim(-0.02, max([0.1, *(p[2] for p in pts)]) * 1.05)
        ax.set_xlabel(unit)
        ax.set_ylabel("failure probability")
        title = (f"Failure probability under the noise against its intensity ({unit}), "
                 f"observed and its {100 * confidence:g}% upper bound: "
                 + ("; ".join(f"{x:g} {unit}: {100 * f:.1f}% (at most {100 * u:.1f}%)"
                              for x, f, u in pts) or "no points"))
        return _svg(fig, ax, title)


def _count_label(value: float) -> str:
    """A query count for a tick: ``3``, ``200``, ``5k``, ``20k``, ``1.5M``."""
    for div, unit in ((1e6, "M"), (1e3, "k")):
        if value >= div:
            return f"{value / div:g}{unit}"
    return f"{value:g}"


def _count_ticks(ax: Any, xs: list[float]) -> None:
    """Plain tick labels on a log axis of counts (matplotlib's default writes each one as
    mathtext, ``$10^{3}$``, which is most of a small figure's drawing time). Over less than a
    decade every minor tick is labelled too, over less than a decade and a half the 2× and 5×
    ones, so that the axis never shows a single number."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _count_label(v)))
    lo, hi = (min(xs), max(xs)) if xs else (1.0, 1.0)
    span = hi / max(lo, 1e-12)
    if span < 30:
        def minor(v: float, _pos: int) -> str:
            mantissa = round(v / 10 ** math.floor(math.log10(v)), 6) if v > 0 else 0
            return _count_label(v) if span < 10 or mantissa in (2, 5) else ""
        ax.xaxis.set_minor_formatter(FuncFormatter(minor))
        # minor ticks are shorter: their labels sit level with the major ones
        ax.tick_params(axis="x", which="minor", pad=5.0)
    else:
        ax.xaxis.set_minor_formatter(NullFormatter())


def queries_curve_svg(curve: list[dict[str, Any]], totals: list[int]) -> str:
    """Robust accuracy against queries per sample (log scale), the rounds' totals dashed."""
    import matplotlib

    pts = [(max(p["queries"], 1), p["robust_accuracy"]) for p in curve]
    with matplotlib.rc_context(_RC):
        fig, ax = _figure((2.6, 1.6))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=2,
                color="#1565c0", linewidth=1.2, drawstyle="steps-post")
        for t in totals:
            ax.axvline(t, color="#9e9e9e", linewidth=0.6, linestyle="--")
        ax.set_xscale("log")
        _count_ticks(ax, [p[0] for p in pts] + list(totals))
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("queries per sample")
        ax.set_ylabel("robust accuracy")
        title = ("Robust accuracy had the attack stopped after a number of queries per sample: "
                 + "; ".join(f"{x:g} queries: {100 * y:.1f}%" for x, y in pts)
                 + (f" (round totals: {', '.join(str(t) for t in totals)})" if totals else ""))
        return _svg(fig, ax, title)


#: Pair-matrix cell fills by robustness score band (lower bound inclusive), lightest first.
PAIR_BANDS = ((0.9, "#c8e6c9", "≥ 90%"), (0.7, "#ffe0b2", "70–90%"), (0.0, "#ffcdd2", "< 70%"))


def _esc(text: str) -> str:
    return escape(text, {'"': "&quot;"})


def pair_matrix_svg(pairs: list[tuple[str, str, float]]) -> str:
    """A matrix of two-property combinations: ``pairs`` are (first property, second property,
    joint robustness score). Properties are ordered by first appearance; each pair fills the
    cell whose row is the property listed earlier and whose column the later one, with its
    score as text and a fill by score band (:data:`PAIR_BANDS`, with a legend); other cells stay
    blank (grey where a property meets itself). Rows and columns that no pair fills are left
    out. The same two properties in several checks show every score in their cell."""
    props = list(dict.fromkeys(p for a, b, _ in pairs for p in (a, b)))
    pos = {p: k for k, p in enumerate(props)}
    cells: dict[tuple[str, str], list[float]] = {}
    for a, b, score in pairs:
        first, second = sorted((a, b), key=pos.__getitem__)
        cells.setdefault((first, second), []).append(score)
    rows = [p for p in props if any(r == p for r, _ in cells)]
    cols = [p for p in props if any(c == p for _, c in cells)]
    label_w = 7 + 6.2 * max((len(p) for p in props), default=1)
    cw = 64.0
    ch = 15.0 + 12.0 * max((len(v) for v in cells.values()), default=1)
    top = 5 + 5.4 * max((len(p) for p in cols), default=1)  # column labels at -60°
    width = max(label_w + len(cols) * cw + 8 + 3.1 * len(cols[-1]) if cols else 0, 260)
    legend_y = top + len(rows) * ch + 16
    height = legend_y + 14
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="pair-matrix" role="img" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" height="{height:.0f}" '
           f'font-family="DejaVu Sans, Arial, sans-serif" font-size="10">',
           "<title>Joint robustness score of each combination of two properties: "
           + _esc("; ".join(f"{a} with {b} {100 * v:.1f}%" for a, b, v in pairs)) + "</title>"]
    for i, p in enumerate(rows):
        y = top + i * ch + ch / 2 + 3.5
        out.append(f'<text x="{label_w - 5:.1f}" y="{y:.1f}" text-anchor="end">{_esc(p)}</text>')
    for j, p in enumerate(cols):
        x = label_w + j * cw + cw / 2 + 3.5
        out.append(f'<text x="{x:.1f}" y="{top - 5:.1f}" text-anchor="start" '
                   f'transform="rotate(-60 {x:.1f} {top - 5:.1f})">{_esc(p)}</text>')
    for i, rp in enumerate(rows):
        for j, cp in enumerate(cols):
            x, y = label_w + j * cw, top + i * ch
            scores = cells.get((rp, cp), [])
            fill = "#ffffff"
            if scores:
                fill = next(c for lo, c, _ in PAIR_BANDS if min(scores) >= lo)
            elif rp == cp:
                fill = "#eceff1"
            out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{cw:.1f}" height="{ch:.1f}" '
                       f'fill="{fill}" stroke="#d9dee7"/>')
            for k, s in enumerate(scores):
                ty = y + ch / 2 + 3.5 + 12 * (k - (len(scores) - 1) / 2)
                out.append(f'<text x="{x + cw / 2:.1f}" y="{ty:.1f}" text-anchor="middle" '
                           f'font-weight="bold">{100 * s:.1f}%</text>')
    x = 0.0
    for _, color, text in PAIR_BANDS:
        out.append(f'<rect x="{x:.1f}" y="{legend_y - 9:.1f}" width="10" height="10" '
                   f'fill="{color}" stroke="#d9dee7"/>')
        out.append(f'<text x="{x + 14:.1f}" y="{legend_y:.1f}">{_esc(text)}</text>')
        x += 26 + 6.2 * len(text)
    out.append("</svg>")
    return "\n".join(out)
