"""Small inline-SVG figures for the card, written as SVG directly (deterministic output).

Leaf utilities that check presentations call: no file I/O, no timestamps, no ids that change,
so the same results always draw the same bytes. The plots (:func:`per_class_svg`,
:func:`curve_svg`, :func:`failure_bound_svg`, :func:`queries_curve_svg`) keep the layout they
had when matplotlib drew them (the same sizes, margins, tick rules and styles: DejaVu Sans at
7 pt, 0.8 pt spines and ticks, "nice" ticks at steps of 1, 2, 2.5 and 5, 5% data margins), but
are written by :class:`_Axes` in a few dozen SVG elements each instead of matplotlib's
hundreds: a figure costs milliseconds to write and little to draw into the PDF (issue 53).
Each carries ``role="img"`` and a ``<title>`` that states its numbers.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any
from xml.sax.saxutils import escape

#: matplotlib's layout constants the figures keep (points): the pad around a figure, a tick's
#: length and its label's pad, an axis label's pad, the ascent and descent of a line of text as
#: fractions of its size.
_PAD = 7.56
_TICK, _TICK_PAD, _LABEL_PAD = 3.5, 3.5, 4.0
_ASCENT, _DESCENT = 0.76, 0.24
_FONT = 7.0
_FAMILY = "DejaVu Sans, Bitstream Vera Sans, Arial, Helvetica, sans-serif"
#: Advance widths of DejaVu Sans (em) for the characters of tick labels; others count 0.6.
_ADVANCE = {**dict.fromkeys("0123456789", 0.636), ".": 0.318, "\u2212": 0.838, "k": 0.579,
            "M": 0.863}


def _num(v: float) -> str:
    """A coordinate with at most 2 decimals and no trailing zeros."""
    text = f"{v:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def _text_width(text: str, size: float) -> float:
    return size * sum(_ADVANCE.get(ch, 0.6) for ch in text)


def _nice_ticks(lo: float, hi: float, bins: int) -> list[float]:
    """matplotlib's ``MaxNLocator`` (steps 1, 2, 2.5, 5, 10): the widest-spaced ticks on a
    multiple of the step no coarser than needed for at most ``bins`` intervals, at least two
    of them within [lo, hi]."""
    bins = max(1, min(bins, 9))
    raw = (hi - lo) / bins
    scale = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    steps = [s * scale for s in (1, 2, 2.5, 5, 10)]
    first = next(k for k, s in enumerate(steps) if s >= raw * (1 - 1e-9))
    for step in reversed(steps[: first + 1]):
        start = math.floor(lo / step + 1e-9)
        ticks = [round(k * step, 12) for k in range(start, math.ceil(hi / step - 1e-9) + 1)]
        inside = [t for t in ticks if lo - 1e-9 * step <= t <= hi + 1e-9 * step]
        if len(inside) >= 2:
            return inside
    return [lo, hi]


def _tick_format(ticks: Sequence[float]) -> list[str]:
    """Labels as matplotlib's ``ScalarFormatter`` writes them: one number of decimals for the
    whole axis (as many as the step needs), a real minus sign."""
    step = min((abs(b - a) for a, b in zip(ticks, ticks[1:], strict=False)), default=1.0)
    decimals = 0
    while decimals < 8 and abs(round(step, decimals) - step) > 1e-9 * max(step, 1e-12):
        decimals += 1
    return [f"{t:.{decimals}f}".replace("-", "\u2212") if round(t, decimals) != 0
            else f"{0:.{decimals}f}" for t in ticks]


def count_label(value: float) -> str:
    """A query count for a tick: ``3``, ``200``, ``5k``, ``20k``, ``1.5M``."""
    for div, unit in ((1e6, "M"), (1e3, "k")):
        if value >= div:
            return f"{value / div:g}{unit}"
    return f"{value:g}"


def _count_ticks(lo: float, hi: float, data: Sequence[float]) -> tuple[list[tuple[float, str]],
                                                                       list[tuple[float, str]]]:
    """Major (decades) and minor ticks of a log axis of counts within [lo, hi], each with its
    plain label (never ``10^3``). Over less than a decade of data every minor tick is labelled
    too, over less than a decade and a half the 2x and 5x ones, so that the axis never shows a
    single number."""
    dlo, dhi = (min(data), max(data)) if data else (1.0, 1.0)
    span = dhi / max(dlo, 1e-12)
    major: list[tuple[float, str]] = []
    minor: list[tuple[float, str]] = []
    for decade in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        base = 10.0 ** decade
        if lo <= base <= hi:
            major.append((base, count_label(base)))
        for m in range(2, 10):
            v = m * base
            if lo <= v <= hi:
                labelled = span < 10 or (span < 30 and m in (2, 5))
                minor.append((v, count_label(v) if labelled else ""))
    return major, minor


class _Axes:
    """One plot: a figure of ``size`` inches (SVG user units are points, as matplotlib's), its
    axes placed by matplotlib's tight-layout rules for the labels it carries, and the data
    drawn into it, kept as SVG elements in order."""

    def __init__(self, size: tuple[float, float], xlim: tuple[float, float],
                 ylim: tuple[float, float], *, xlog: bool = False,
                 ytick_labels_width: float = 0.0, top: float = _PAD,
                 xtick_size: float = _FONT) -> None:
        self.w, self.h = size[0] * 72, size[1] * 72
        self.xlim, self.ylim, self.xlog = xlim, ylim, xlog
        self.xtick_size = xtick_size
        # matplotlib's tight layout as measured: 36.36 pt at least, and each point of tick
        # labels wider than "0.00" moving the axes about two points right
        self.left = max(36.36, 21.22 + ytick_labels_width
                        + 0.94 * max(0.0, ytick_labels_width - 15.58))
        self.bottom = 2 * _TICK + xtick_size + _LABEL_PAD + _ASCENT * _FONT + 9.68
        self.right = self.w - _PAD
        self.top = top
        self.base = self.h - self.bottom
        self.body: list[str] = []

    def fit_right(self, labels: Sequence[tuple[float, str]]) -> None:
        """Narrow the axes (as matplotlib's tight layout does) so that no x tick label in
        ``labels`` (value, text; centred on its tick) sticks out past the figure's pad."""
        limit = self.w - _PAD
        for v, text in labels:
            half = _text_width(text, self.xtick_size) / 2
            f = (self.x(v) - self.left) / (self.right - self.left)
            if text and f > 0 and self.x(v) + half > limit:
                self.right = min(self.right, self.left + (limit - half - self.left) / f)

    def x(self, v: float) -> float:
        lo, hi = self.xlim
        if self.xlog:
            v, lo, hi = math.log10(max(v, 1e-300)), math.log10(lo), math.log10(hi)
        return self.left + (v - lo) / (hi - lo) * (self.right - self.left)

    def y(self, v: float) -> float:
        lo, hi = self.ylim
        return self.base - (v - lo) / (hi - lo) * (self.base - self.top)

    def line(self, xs: Sequence[float], ys: Sequence[float], color: str, width: float, *,
             marker: float = 0.0, dashed: bool = False, steps: bool = False) -> None:
        """A polyline (``steps``: matplotlib's ``steps-post``), dashed as matplotlib scales
        its dashes by the line's width, with filled circle markers of diameter ``marker``."""
        pts = [(self.x(a), self.y(b)) for a, b in zip(xs, ys, strict=True)]
        if steps:
            stepped = []
            for k, (px, py) in enumerate(pts):
                if k:
                    stepped.append((px, pts[k - 1][1]))
                stepped.append((px, py))
            pts = stepped
        if pts:
            dash = (f' stroke-dasharray="{_num(3.7 * width)} {_num(1.6 * width)}"'
                    if dashed else "")
            self.body.append(
                '<path clip-path="url(#axes)" fill="none" stroke-linecap="square" '
                f'stroke="{color}" stroke-width="{_num(width)}"{dash} d="M'
                + " L".join(f"{_num(px)} {_num(py)}" for px, py in pts) + '"/>')
        if marker and xs:
            r = marker / 2
            self.body.append(
                f'<path clip-path="url(#axes)" fill="{color}" stroke="{color}" '
                'stroke-width="1" d="' + "".join(
                    f"M{_num(self.x(a) - r)} {_num(self.y(b))}a{_num(r)} {_num(r)} 0 1 0 "
                    f"{_num(2 * r)} 0a{_num(r)} {_num(r)} 0 1 0 {_num(-2 * r)} 0z"
                    for a, b in zip(xs, ys, strict=True)) + '"/>')

    def vline(self, v: float, color: str, width: float) -> None:
        """A dashed vertical line across the axes at ``v``."""
        x = _num(self.x(v))
        self.body.append(
            f'<path fill="none" stroke="{color}" stroke-width="{_num(width)}" '
            f'stroke-dasharray="{_num(3.7 * width)} {_num(1.6 * width)}" '
            f'd="M{x} {_num(self.base)} L{x} {_num(self.top)}"/>')

    def bars(self, heights: Sequence[float], colors: Sequence[str], width: float) -> None:
        """Bars at 0, 1, ... from the x axis, one path per colour."""
        by_color: dict[str, list[str]] = {}
        for k, (v, c) in enumerate(zip(heights, colors, strict=True)):
            x0, x1 = self.x(k - width / 2), self.x(k + width / 2)
            y0, y1 = self.y(0.0), self.y(v)
            by_color.setdefault(c, []).append(
                f"M{_num(x0)} {_num(y0)}H{_num(x1)}V{_num(y1)}H{_num(x0)}z")
        for c, rects in by_color.items():
            self.body.append(f'<path fill="{c}" d="{"".join(rects)}"/>')

    def legend(self, entries: Sequence[tuple[str, str, float, bool, float]],
               size: float, points: Sequence[tuple[float, float]]) -> None:
        """matplotlib's frameless legend at its "best" corner (of upper right, upper left,
        lower left and lower right, the first whose box covers the fewest of ``points``):
        each entry (label, colour, line width, dashed, marker diameter)."""
        text_w = max(_text_width(t, size) for t, *_ in entries)
        box_w = 0.4 * size * 2 + 2 * size + 0.8 * size + text_w
        box_h = 0.4 * size * 2 + size * len(entries) + 0.5 * size * (len(entries) - 1)
        pad = 0.5 * size
        corners = {"upper right": (self.right - pad - box_w, self.top + pad),
                   "upper left": (self.left + pad, self.top + pad),
                   "lower left": (self.left + pad, self.base - pad - box_h),
                   "lower right": (self.right - pad - box_w, self.base - pad - box_h)}

        def covered(corner: tuple[float, float]) -> int:
            bx, by = corner
            return sum(bx <= self.x(a) <= bx + box_w and by <= self.y(b) <= by + box_h
                       for a, b in points)

        bx, by = min(corners.values(), key=covered)
        for k, (label, color, width, dashed, marker) in enumerate(entries):
            top = by + 0.4 * size + k * 1.5 * size
            mid = top + size * 0.5
            x0 = bx + 0.4 * size
            dash = (f' stroke-dasharray="{_num(3.7 * width)} {_num(1.6 * width)}"'
                    if dashed else "")
            self.body.append(f'<path fill="none" stroke="{color}" stroke-width="{_num(width)}"'
                             f'{dash} d="M{_num(x0)} {_num(mid)} H{_num(x0 + 2 * size)}"/>')
            r = marker / 2
            self.body.append(f'<circle cx="{_num(x0 + size)}" cy="{_num(mid)}" r="{_num(r)}" '
                             f'fill="{color}" stroke="{color}" stroke-width="1"/>')
            self.body.append(f'<text x="{_num(x0 + 2.8 * size)}" '
                             f'y="{_num(top + _ASCENT * size)}" font-size="{_num(size)}">'
                             f"{escape(label)}</text>")

    def svg(self, title: str, xlabel: str, ylabel: str,
            xticks: Sequence[tuple[float, str]], yticks: Sequence[tuple[float, str]],
            minor: Sequence[tuple[float, str]] = ()) -> str:
        """The finished figure: the white page, the data, the left and bottom spines, ticks
        with their labels, the axis labels, and ``title`` (its numbers in words) as its text
        alternative."""
        marks = [f"M{_num(self.x(v))} {_num(self.base)}v{_TICK}" for v, _ in xticks]
        marks += [f"M{_num(self.left)} {_num(self.y(v))}h-{_TICK}" for v, _ in yticks]
        thin = [f"M{_num(self.x(v))} {_num(self.base)}v2" for v, _ in minor]
        label_y = self.base + 2 * _TICK + _ASCENT * self.xtick_size
        texts = [f'<text x="{_num(self.x(v))}" y="{_num(label_y)}" text-anchor="middle">'
                 f"{escape(t)}</text>" for v, t in [*xticks, *minor] if t]
        if self.xtick_size != _FONT:
            texts = [f'<g font-size="{_num(self.xtick_size)}">', *texts, "</g>"]
        texts += [f'<text x="{_num(self.left - 2 * _TICK)}" '
                  f'y="{_num(self.y(v) + 0.1775 * _FONT)}" text-anchor="end">{escape(t)}</text>'
                  for v, t in yticks]
        ytick_w = max((_text_width(t, _FONT) for _, t in yticks), default=0.0)
        yl_x = self.left - 2 * _TICK - ytick_w - _LABEL_PAD - _DESCENT * _FONT
        yl_y = (self.top + self.base) / 2
        xl_y = self.base + 2 * _TICK + self.xtick_size + _LABEL_PAD + _ASCENT * _FONT
        texts += [f'<text x="{_num((self.left + self.right) / 2)}" y="{_num(xl_y)}" '
                  f'text-anchor="middle">{escape(xlabel)}</text>',
                  f'<text x="{_num(yl_x)}" y="{_num(yl_y)}" text-anchor="middle" '
                  f'transform="rotate(-90 {_num(yl_x)} {_num(yl_y)})">{escape(ylabel)}</text>']
        w, h = _num(self.w), _num(self.h)
        # the card holds many figures in one document: the clip's id is the figure's own
        clip = "c" + hashlib.sha256("".join([title, *self.body]).encode()).hexdigest()[:12]
        return "\n".join([
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}pt" height="{h}pt" '
            f'viewBox="0 0 {w} {h}" role="img" font-family="{_FAMILY}" font-size="7">'
            f"<title>{escape(title)}</title>",
            f'<defs><clipPath id="{clip}"><rect x="{_num(self.left)}" y="{_num(self.top)}" '
            f'width="{_num(self.right - self.left)}" height="{_num(self.base - self.top)}"/>'
            "</clipPath></defs>",
            f'<rect width="{w}" height="{h}" fill="#ffffff"/>',
            *(b.replace("url(#axes)", f"url(#{clip})") for b in self.body),
            f'<path fill="none" stroke="#000000" stroke-width="0.8" stroke-linecap="square" '
            f'd="M{_num(self.left)} {_num(self.top)}V{_num(self.base)}H{_num(self.right)}"/>',
            f'<path fill="none" stroke="#000000" stroke-width="0.8" d="{"".join(marks)}"/>',
            *([f'<path fill="none" stroke="#000000" stroke-width="0.6" d="{"".join(thin)}"/>']
              if thin else []),
            *texts, "</svg>"])


def _limits(values: Sequence[float], *, log: bool = False) -> tuple[float, float]:
    """matplotlib's automatic limits: the data's range with 5% margins (in log space on a log
    axis), widened around a single value."""
    vals = [math.log10(v) for v in values] if log else list(values)
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    if hi - lo < 1e-12:
        spread = 0.05 * abs(lo) if lo else 0.05
        lo, hi = lo - spread, hi + spread
    else:
        m = 0.05 * (hi - lo)
        lo, hi = lo - m, hi + m
    return (10 ** lo, 10 ** hi) if log else (lo, hi)


def _top(ylim: tuple[float, float], ticks: Sequence[float], height: float) -> float:
    """The axes' top margin: matplotlib's pad, more where the top tick's label (half a line
    above its tick) would stick out of the figure."""
    hi_tick = max(ticks)
    inner = height - 33.0 - _PAD
    gap = (ylim[1] - hi_tick) / (ylim[1] - ylim[0]) * inner
    return max(_PAD, _PAD + 0.34 * _FONT - gap)


def _plot(size: tuple[float, float], xlim: tuple[float, float], ylim: tuple[float, float], *,
          xlog: bool = False, xtick_size: float = _FONT
          ) -> tuple[_Axes, list[tuple[float, str]]]:
    """Axes for ``size`` with y ticks chosen for its height; returns them and the y ticks."""
    inner = size[1] * 72 - 33.0 - _PAD
    yt = _nice_ticks(ylim[0], ylim[1], int(inner // (2 * _FONT)))
    ylabels = _tick_format(yt)
    width = max(_text_width(t, _FONT) for t in ylabels)
    ax = _Axes(size, xlim, ylim, xlog=xlog, ytick_labels_width=width,
               top=_top(ylim, yt, size[1] * 72), xtick_size=xtick_size)
    return ax, list(zip(yt, ylabels, strict=True))


def _linear_xticks(ax: _Axes) -> list[tuple[float, str]]:
    """x ticks for the axes' width (matplotlib: at most one per three label heights), the
    axes narrowed where the last label would stick out (and the ticks chosen again)."""
    def ticks() -> list[tuple[float, str]]:
        xt = _nice_ticks(ax.xlim[0], ax.xlim[1], int((ax.right - ax.left) // (3 * _FONT)))
        return list(zip(xt, _tick_format(xt), strict=True))

    ax.fit_right(ticks())
    out = ticks()
    ax.fit_right(out)
    return out


def per_class_svg(per_class: list[dict[str, Any]]) -> str:
    """A bar chart of per-class accuracy."""
    classes = [r["class"] for r in per_class]
    acc = [r["accuracy"] for r in per_class]
    colors = ["#2e7d32" if a >= 0.9 else "#f9a825" if a >= 0.7 else "#c62828" for a in acc]
    n = len(classes)
    ax, yticks = _plot((7.2, 2.0), _limits([-0.4, n - 0.6]), (0.0, 1.02), xtick_size=5.0)
    xticks = [(float(k), str(c)) for k, c in enumerate(classes)]
    ax.fit_right(xticks)
    ax.bars(acc, colors, 0.8)
    title = "Accuracy per class (bars coloured green at 90% or more, amber at 70% or " \
            "more, red below): " + "; ".join(f"class {c}: {100 * a:.1f}%"
                                             for c, a in zip(classes, acc, strict=True))
    return ax.svg(title, "class id", "accuracy", xticks, yticks)


def curve_svg(curve: list[dict[str, Any]], unit: str) -> str:
    """Robustness score as a function of the intensity bound."""
    pts = [(p["intensity"], p["score"]) for p in curve if p["score"] is not None]
    ax, yticks = _plot((2.6, 1.6), _limits([p[0] for p in pts]), (-0.02, 1.02))
    xticks = _linear_xticks(ax)
    ax.line([p[0] for p in pts], [p[1] for p in pts], "#1565c0", 1.2, marker=2.5, steps=True)
    title = (f"Robustness score against the bound ({unit}): "
             + ("; ".join(f"{x:g} {unit}: {100 * y:.1f}%" for x, y in pts) or "no points"))
    return ax.svg(title, unit, "robustness", xticks, yticks)


def failure_bound_svg(curve: list[dict[str, Any]], unit: str, confidence: float) -> str:
    """A random corruption's failure probability per intensity: its estimate and its upper
    bound at ``confidence`` (one draw per sample at each intensity)."""
    pts = [(p["intensity"], p["failure_share"], p["failure_upper"]) for p in curve
           if p.get("failure_share") is not None]
    xs = [p[0] for p in pts]
    ylim = (-0.02, max([0.1, *(p[2] for p in pts)]) * 1.05)
    ax, yticks = _plot((2.6, 1.6), _limits(xs), ylim)
    xticks = _linear_xticks(ax)
    upper = f"upper bound ({100 * confidence:g}%)"
    if pts:
        ax.line(xs, [p[2] for p in pts], "#c62828", 1.2, marker=2.5)
        ax.line(xs, [p[1] for p in pts], "#1565c0", 0.9, marker=2.0, dashed=True)
        ax.legend([(upper, "#c62828", 1.2, False, 2.5), ("observed", "#1565c0", 0.9, True, 2.0)],
                  5.0, [(x, v) for x, f, u in pts for v in (f, u)])
    title = (f"Failure probability under the noise against its intensity ({unit}), "
             f"observed and its {100 * confidence:g}% upper bound: "
             + ("; ".join(f"{x:g} {unit}: {100 * f:.1f}% (at most {100 * u:.1f}%)"
                          for x, f, u in pts) or "no points"))
    return ax.svg(title, unit, "failure probability", xticks, yticks)


def queries_curve_svg(curve: list[dict[str, Any]], totals: list[int]) -> str:
    """Robust accuracy against queries per sample (log scale), the rounds' totals dashed."""
    pts = [(max(p["queries"], 1), p["robust_accuracy"]) for p in curve]
    xs = [float(p[0]) for p in pts] + [float(t) for t in totals]
    ax, yticks = _plot((2.6, 1.6), _limits(xs, log=True), (-0.02, 1.02), xlog=True)
    major, minor = _count_ticks(ax.xlim[0], ax.xlim[1], xs)
    ax.fit_right([*major, *minor])
    ax.line([p[0] for p in pts], [p[1] for p in pts], "#1565c0", 1.2, marker=2.0, steps=True)
    for t in totals:
        ax.vline(t, "#9e9e9e", 0.6)
    title = ("Robust accuracy had the attack stopped after a number of queries per sample: "
             + "; ".join(f"{x:g} queries: {100 * y:.1f}%" for x, y in pts)
             + (f" (round totals: {', '.join(str(t) for t in totals)})" if totals else ""))
    return ax.svg(title, "queries per sample", "robust accuracy", major, yticks, minor)


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
