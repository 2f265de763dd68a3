"""The card's "at a glance" figure: every check's headline value, 95% interval and threshold.

One hand-written inline SVG (no JavaScript, no matplotlib: its text stays text in the PDF and
it scales with its ``viewBox``), grouped by the checks' ``glance_group``. Rates share a 0-100%
axis per group; a headline metric that is not a rate (a brittle score) is never put on that
axis: it is written as its value and interval in its own panel. Every status is drawn as a
colour *and* a shape *and* a word, so no verdict is told by colour alone. Leaf module: no I/O,
deterministic output for the same results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

from certify.checks import CHECKS

#: Group order on the figure (a check class names its group in ``glance_group``).
GROUPS = ("Corruptions", "Attacks", "Clean, coverage and confidence", "Brittleness and other")

#: Fill colours, the card's CSS palette (templates/card.css).
COLOURS = {"PASS": "#2e7d32", "FAIL": "#c62828", "WARN": "#ef6c00", "INCONCLUSIVE": "#6a1b9a",
           "INFO": "#1565c0", "SKIPPED": "#78909c", "ERROR": "#4a148c"}

#: What each status looks like apart from its colour (the legend says the same).
SHAPES = {"PASS": "circle", "FAIL": "cross", "WARN": "triangle", "INCONCLUSIVE": "diamond",
          "INFO": "ring", "SKIPPED": "dash", "ERROR": "square"}

_W = 480  # viewBox width; the page scales it (width: 100%)
_LABEL_X, _PLOT_X0, _PLOT_X1, _VALUE_X, _STATUS_X = 4, 138, 330, 336, 380
_ROW, _ROW2 = 13.5, 21  # row height; with a second (metric name) line
_FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"


@dataclass
class Row:
    """One check on the figure."""

    id: str
    status: str
    group: str
    metric: str
    words: str
    rate: bool
    value: float | None
    interval: tuple[float, float] | None
    threshold: tuple[float | None, float | None] | None
    reference: tuple[float, tuple[float, float] | None] | None = None

    def sentence(self) -> str:
        """The row in words (the figure's text alternative)."""
        if self.value is None:
            why = _no_value(self.status)
            return f"{self.id}: {why}, {self.status}."
        text = f"{self.id}: {self.words} {_fmt(self.value, self.rate)}"
        if self.interval is not None:
            lo, hi = self.interval
            text += f" (95% CI {_fmt(lo, self.rate)}–{_fmt(hi, self.rate)})"
        if self.reference is not None:
            text += f", reference {_fmt(self.reference[0], self.rate)}"
        text += f", threshold {_threshold_text(self)}" if self.threshold else ", no threshold"
        return text + f", {self.status}."


def _no_value(status: str) -> str:
    return {"SKIPPED": "not evaluated", "ERROR": "error: no value"}.get(status, "no value")


def _fmt(v: float, rate: bool) -> str:
    return f"{100 * v:.1f}%" if rate else f"{v:.3g}"


def _threshold_text(r: Row) -> str:
    assert r.threshold is not None
    lo, hi = r.threshold
    parts = []
    if lo is not None:
        parts.append(f"≥ {_fmt(lo, r.rate)}")
    if hi is not None:
        parts.append(f"≤ {_fmt(hi, r.rate)}")
    return " and ".join(parts)


def headline_metric(c: Any) -> str | None:
    """The metric a check is judged on: its threshold's, else its export metric, else its
    first thresholdable metric that it reported (None when it has none)."""
    cls = CHECKS[c.kind]
    if c.threshold is not None:
        return str(c.threshold.metric)
    if cls.export is not None:
        return cls.export.metric
    values = dict(c.metrics) if c.metrics is not None else {}
    return next((m for m in cls.metric_names if values.get(m) is not None), None)


def rows(checks: Sequence[Any]) -> list[Row]:
    """The figure's rows, in group order and the suite's order within a group."""
    out: list[Row] = []
    for c in checks:
        cls = CHECKS[c.kind]
        name = headline_metric(c)
        decl = next((m for m in cls.metrics if m.name == name), None)
        values = dict(c.metrics) if c.metrics is not None else {}
        value = values.get(name) if name and c.status not in ("SKIPPED", "ERROR") else None
        iv = c.intervals.get(name) if name and value is not None else None
        ref = values.get(f"reference_{name}") if value is not None else None
        thr = None if c.threshold is None else (c.threshold.min, c.threshold.max)
        out.append(Row(
            id=c.id, status=c.status, group=cls.glance_group,
            metric=name or "", words=(name or "").replace("_", " "),
            rate=decl is None or decl.unit == "rate",
            value=None if value is None else float(value),
            interval=None if iv is None else (float(iv[0]), float(iv[1])),
            threshold=thr,
            reference=None if ref is None else (
                float(ref), c.intervals.get(f"reference_{name}"))))
    order = {g: i for i, g in enumerate(GROUPS)}
    return sorted(out, key=lambda r: order.get(r.group, len(GROUPS)))


def _x(v: float) -> float:
    return _PLOT_X0 + (_PLOT_X1 - _PLOT_X0) * min(max(v, 0.0), 1.0)


def _shape(status: str, x: float, y: float, r: float = 4.2) -> str:
    """The status's marker centred at (x, y)."""
    col = COLOURS.get(status, "#455a64")
    kind = SHAPES.get(status, "square")
    if kind == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="{col}"/>'
    if kind == "ring":
        return (f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r - 0.8:.1f}" fill="#fff" '
                f'stroke="{col}" stroke-width="1.8"/>')
    if kind == "cross":
        d = r * 0.95
        return (f'<path d="M{x - d:.1f},{y - d:.1f}L{x + d:.1f},{y + d:.1f}M{x - d:.1f},'
                f'{y + d:.1f}L{x + d:.1f},{y - d:.1f}" stroke="{col}" stroke-width="2.6"/>')
    if kind == "triangle":
        return (f'<path d="M{x:.1f},{y - r - 0.6:.1f}L{x + r + 0.6:.1f},{y + r * 0.8:.1f}'
                f'L{x - r - 0.6:.1f},{y + r * 0.8:.1f}Z" fill="{col}"/>')
    if kind == "diamond":
        return (f'<path d="M{x:.1f},{y - r - 0.6:.1f}L{x + r + 0.6:.1f},{y:.1f}L{x:.1f},'
                f'{y + r + 0.6:.1f}L{x - r - 0.6:.1f},{y:.1f}Z" fill="{col}"/>')
    if kind == "dash":
        return (f'<path d="M{x - r:.1f},{y:.1f}L{x + r:.1f},{y:.1f}" stroke="{col}" '
                f'stroke-width="2.6"/>')
    return (f'<rect x="{x - r + 0.6:.1f}" y="{y - r + 0.6:.1f}" width="{2 * r - 1.2:.1f}" '
            f'height="{2 * r - 1.2:.1f}" fill="{col}"/>')


def _text(x: float, y: float, s: str, size: float = 9.5, anchor: str = "start",
          fill: str = "#1d2330", weight: str = "normal") -> str:
    w = f' font-weight="{weight}"' if weight != "normal" else ""
    a = f' text-anchor="{anchor}"' if anchor != "start" else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" fill="{fill}"{a}{w}>'
            f"{escape(s)}</text>")


def _clip(s: str, n: int = 21) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def _legend(y: float, statuses: list[str]) -> tuple[list[str], float]:
    """Legend of the statuses present, the interval and the threshold mark."""
    parts: list[str] = []
    x: float = _LABEL_X + 4
    items: list[tuple[str, str]] = [(s, s) for s in statuses]
    items += [("interval", "95% interval"), ("threshold", "threshold")]
    for key, label in items:
        width = 12 + 5.6 * len(label) + 10
        if x + width > _W:
            x, y = _LABEL_X + 4, y + 13
        if key == "interval":
            parts.append(f'<path d="M{x - 5:.1f},{y - 3:.1f}L{x + 5:.1f},{y - 3:.1f}" '
                         'stroke="#455a64" stroke-width="2.2"/>')
        elif key == "threshold":
            parts.append(f'<path d="M{x:.1f},{y - 8:.1f}L{x:.1f},{y + 2:.1f}" stroke="#1d2330" '
                         'stroke-width="1.4"/>')
        else:
            parts.append(_shape(key, x, y - 3, 3.8))
        parts.append(_text(x + 9, y, label, 8.5))
        x += width
    return parts, y + 8


def glance_svg(checks: Sequence[Any]) -> str:
    """The at-a-glance figure as inline SVG (with ``<title>`` and ``<desc>``); its
    ``viewBox`` is ``_W`` wide (see :func:`print_width_mm`)."""
    rs = rows(checks)
    statuses = [s for s in COLOURS if any(r.status == s for r in rs)]
    body, y = _legend(14, statuses)
    for group in [g for g in GROUPS if any(r.group == g for r in rs)] + sorted(
            {r.group for r in rs} - set(GROUPS)):
        members = [r for r in rs if r.group == group]
        rates = [r for r in members if r.rate]
        others = [r for r in members if not r.rate]
        metrics = {r.metric for r in rates if r.value is not None}
        head = group
        if rates and len(metrics) == 1:
            head += f" · {next(iter(metrics)).replace('_', ' ')}"
        y += 18
        body.append(_text(_LABEL_X, y, head, 10, weight="bold"))
        if rates:
            y += 12
            for t in (0.0, 0.25, 0.5, 0.75, 1.0):
                body.append(_text(_x(t), y, f"{100 * t:.0f}%", 7.5, "middle", "#5b6475"))
            top = y + 3
            grid_at = len(body)
            for r in rates:
                two = len(metrics) > 1 and r.value is not None
                h = _ROW2 if two else _ROW
                cy = y + 3 + 8
                body.append(f"<g><title>{escape(r.sentence())}</title>")
                body.append(_text(_LABEL_X, cy + 3.5, _clip(r.id)))
                if two:
                    body.append(_text(_LABEL_X, cy + 13, _clip(r.words, 28), 7.5,
                                      fill="#5b6475"))
                col = COLOURS.get(r.status, "#455a64")
                if r.value is None:
                    why = _no_value(r.status)
                    body.append(_text(_PLOT_X0 + 4, cy + 3.5, why, 8.5, fill="#5b6475"))
                else:
                    if r.interval is not None:
                        lo, hi = _x(r.interval[0]), _x(r.interval[1])
                        body.append(f'<path d="M{lo:.1f},{cy:.1f}L{hi:.1f},{cy:.1f}M{lo:.1f},'
                                    f'{cy - 3:.1f}L{lo:.1f},{cy + 3:.1f}M{hi:.1f},{cy - 3:.1f}'
                                    f'L{hi:.1f},{cy + 3:.1f}" stroke="{col}" '
                                    'stroke-width="1.6" opacity="0.8"/>')
                    if r.threshold is not None:
                        for tv in r.threshold:
                            if tv is not None:
                                body.append(f'<path d="M{_x(tv):.1f},{cy - 6:.1f}L{_x(tv):.1f},'
                                            f'{cy + 6:.1f}" stroke="#1d2330" stroke-width="1.4"/>')
                    body.append(_shape(r.status, _x(r.value), cy))
                    body.append(_text(_VALUE_X, cy + 3.5, _fmt(r.value, True), 8.5))
                body.append(_shape(r.status, _STATUS_X + 4, cy, 3.8))
                body.append(_text(_STATUS_X + 11, cy + 3.2, r.status, 8.5, fill=col,
                                  weight="bold"))
                body.append("</g>")
                y += h
            grid = "".join(f'<path d="M{_x(t):.1f},{top:.1f}L{_x(t):.1f},{y + 3:.1f}" '
                           'stroke="#d9dee7" stroke-width="0.6"/>'
                           for t in (0.0, 0.25, 0.5, 0.75, 1.0))
            body.insert(grid_at, grid)
        if others:
            y += 2
            for r in others:
                cy = y + 3 + 8
                body.append(f"<g><title>{escape(r.sentence())}</title>")
                body.append(_text(_LABEL_X, cy + 3.5, _clip(r.id)))
                if r.value is None:
                    line = _no_value(r.status)
                else:
                    line = f"{r.words} {_fmt(r.value, False)}"
                    if r.interval is not None:
                        line += f" (95% CI {_fmt(r.interval[0], False)}–" \
                                f"{_fmt(r.interval[1], False)})"
                body.append(_text(_PLOT_X0, cy + 3.5, line, 8.5))
                h = _ROW
                if r.reference is not None:
                    ref = f"reference {_fmt(r.reference[0], False)}"
                    if r.reference[1] is not None:
                        ref += f" ({_fmt(r.reference[1][0], False)}–" \
                               f"{_fmt(r.reference[1][1], False)})"
                    body.append(_text(_PLOT_X0, cy + 14, ref + "; own scale, not a rate", 7.5,
                                      fill="#5b6475"))
                    h = _ROW2
                body.append(_shape(r.status, _STATUS_X + 4, cy, 3.8))
                body.append(_text(_STATUS_X + 11, cy + 3.2, r.status, 8.5,
                                  fill=COLOURS.get(r.status, "#455a64"), weight="bold"))
                body.append("</g>")
                y += h
    height = y + 10
    title = "At a glance: every check's headline value, 95% interval and threshold"
    desc = " ".join(r.sentence() for r in rs)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {height:.0f}" '
            f'role="img" aria-labelledby="glance-title glance-desc" '
            f'font-family="{_FONT}" class="glance-svg">'
            f'<title id="glance-title">{escape(title)}</title>'
            f'<desc id="glance-desc">{escape(desc)}</desc>' + "".join(body) + "</svg>")


def print_width_mm(svg: str, height_mm: float = 160.0, widest_mm: float = 180.0,
                   narrowest_mm: float = 110.0) -> float:
    """The figure's width that keeps it at most ``height_mm`` tall, so that it fits on the
    PDF's first page under the title (A4), but never narrower than ``narrowest_mm`` (a long
    suite's figure then moves to the next page rather than shrinking past legibility)."""
    box = svg.split('viewBox="', 1)[1].split('"', 1)[0].split()
    w, h = float(box[2]), float(box[3])
    return round(max(narrowest_mm, min(widest_mm, height_mm * w / h)), 1)


def alt_text(checks: Sequence[Any]) -> str:
    """The figure's numbers in words (its text alternative)."""
    return " ".join(r.sentence() for r in rows(checks))


def _eps(norm: str, eps: float) -> str:
    if norm == "linf":
        k = round(eps * 255)
        if k and abs(eps * 255 - k) < 0.05:
            return f"{k}/255"
    return f"{eps:g}"


def threat_name(norm: str, eps: float) -> str:
    """A threat model in a few characters: ``L∞ 8/255``, ``L2 0.5``, ``L0 8 px``, ``spatial``."""
    if norm == "spatial":
        return "spatial"
    if norm == "l0":
        return f"L0 {eps:g} px"
    sym = {"linf": "L∞", "l2": "L2", "l1": "L1"}.get(norm, norm)
    return f"{sym} {_eps(norm, eps)}"


_NORM_ORDER = {"linf": 0, "l2": 1, "l1": 2, "l0": 3, "spatial": 4}


def worst_case_line(worst: Sequence[Any]) -> str:
    """The worst case per threat model in one line (robust to every attack of the suite), each
    with its row's verdict."""
    worst = sorted(worst, key=lambda w: (_NORM_ORDER.get(w.norm, 9), w.norm, w.epsilon))
    return " · ".join(f"{threat_name(w.norm, w.epsilon)}: {100 * w.robust_accuracy:.3g}% "
                      f"(n {w.n}){_status(w)}" for w in worst)


def _status(row: Any) -> str:
    """`` PASS`` etc. after a threat model's figure (none for rows made before they had one)."""
    status = getattr(row, "status", None)
    return f" {status}" if status else ""
