"""Small inline-SVG figures for the card, drawn with matplotlib (deterministic output).

Leaf utilities that check presentations call: no file I/O, no timestamps, fixed SVG ids, so the
same results always draw the same bytes.
"""

from __future__ import annotations

import io
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
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("queries per sample")
        ax.set_ylabel("robust accuracy")
        title = ("Robust accuracy had the attack stopped after a number of queries per sample: "
                 + "; ".join(f"{x:g} queries: {100 * y:.1f}%" for x, y in pts)
                 + (f" (round totals: {', '.join(str(t) for t in totals)})" if totals else ""))
        return _svg(fig, ax, title)
