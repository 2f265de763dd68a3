"""The card's "at a glance" figure: the headline value, 95% interval and threshold of every
row that decides the run's verdict.

The rows are those the card's header counts (:func:`deciding_rows`): every check, except that
a threat model's row stands in place of the attack rows it summarises; those attack rows are
drawn only as its evidence (small grey rings at their own robust accuracies, no status of
their own). One hand-written inline SVG (no JavaScript, no matplotlib: its text stays text in
the PDF and it scales with its ``viewBox``), grouped by the checks' ``glance_group``. Rates
share a 0-100% axis per group; a headline metric that is not a rate (a brittle score) is never
put on that axis: it is written as its value and interval in its own panel. Every status is
drawn as a colour *and* a shape *and* a word, so no verdict is told by colour alone. Each
row's group carries ``class="glance-row"`` with ``data-row`` (its id) and ``data-status``, and
each evidence ring ``class="glance-evidence"`` with ``data-check`` and ``data-for``, so what
the figure shows can be read back without reading its drawing. Leaf module: no I/O,
deterministic output for the same results.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

from certify.kinds import KINDS
from certify.norms import order_key, threat_name
from certify.results import CheckResult, WorstCase

#: Group order on the figure (a check class names its group in ``glance_group``).
GROUPS = ("Corruptions", "Attacks", "Clean, coverage and confidence", "Brittleness and other")

#: Fill colours, the card's CSS palette (templates/card.css).
COLOURS = {"PASS": "#2e7d32", "FAIL": "#c62828", "WARN": "#ef6c00", "INCONCLUSIVE": "#6a1b9a",
           "INFO": "#1565c0", "SKIPPED": "#78909c", "ERROR": "#4a148c"}

#: What each status looks like apart from its colour (the legend says the same).
SHAPES = {"PASS": "circle", "FAIL": "cross", "WARN": "triangle", "INCONCLUSIVE": "diamond",
          "INFO": "ring", "SKIPPED": "dash", "ERROR": "square"}

_W = 480  # viewBox width; the page scales it to its full width
_LABEL_X, _PLOT_X0, _PLOT_X1, _VALUE_X, _STATUS_X = 4, 138, 330, 336, 380
_ROW, _ROW2 = 9.4, 17.0  # row height; with a second (metric name) line
#: The smallest text size on the figure, in viewBox units. At the PDF's full text width (186 mm
#: of A4) a unit is 186/480 mm, so 8.5 units are 9.3 pt; in a desktop browser (896 px of text
#: width) 15.9 px. The narrow variant (:data:`NARROW_W`) keeps 12 px on a 390 px phone.
MIN_FONT = 8.5
#: The phone variant's viewBox width: each row takes two lines (name, value and verdict; then
#: the bar), so that its text stays at 12 px or more when the figure is 366 px wide.
NARROW_W = 258
_FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
#: The evidence rings' colour: grey, apart from every status colour.
EVIDENCE_COLOUR = "#90a4ae"


@dataclass(frozen=True)
class Evidence:
    """An attack row drawn as evidence for its threat model's row: its own robust accuracy."""

    id: str
    value: float | None


@dataclass
class Row:
    """One row of the figure: a check, or a threat model's row (with its attack rows as
    ``evidence``); ``label`` is the name written on the figure where it differs from ``id``."""

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
    label: str | None = None
    evidence: tuple[Evidence, ...] = ()

    @property
    def name(self) -> str:
        """What the figure writes at the row's left."""
        return self.label or self.id

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
        text += f", {self.status}"
        if self.evidence:
            text += "; its attacks alone (evidence): " + ", ".join(
                f"{e.id} {'no value' if e.value is None else _fmt(e.value, self.rate)}"
                for e in self.evidence)
        return text + "."


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


def headline_metric(c: CheckResult) -> str | None:
    """The metric a check is judged on: its threshold's, else its export metric, else its
    first thresholdable metric that it reported (None when it has none)."""
    cls = KINDS[c.kind]
    if c.threshold is not None:
        return str(c.threshold.metric)
    if cls.export is not None:
        return cls.export.metric
    values = dict(c.metrics) if c.metrics is not None else {}
    return next((m for m in cls.metric_names if values.get(m) is not None), None)


def rows(checks: Sequence[CheckResult]) -> list[Row]:
    """The figure's rows, in group order and the suite's order within a group."""
    out: list[Row] = []
    for c in checks:
        cls = KINDS[c.kind]
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
            interval=_interval(iv),
            threshold=thr,
            reference=None if ref is None else (
                float(ref), _interval(c.intervals.get(f"reference_{name}")))))
    order = {g: i for i, g in enumerate(GROUPS)}
    return sorted(out, key=lambda r: order.get(r.group, len(GROUPS)))


def _interval(iv: Sequence[float | None] | None) -> tuple[float, float] | None:
    """A 95% interval as two floats (``None`` without one, or with an open end)."""
    if iv is None or len(iv) != 2 or iv[0] is None or iv[1] is None:
        return None
    return float(iv[0]), float(iv[1])


def threat_row(w: WorstCase, group: str, evidence: Sequence[Row] = ()) -> Row:
    """A threat model's row (its robust accuracy against all its attacks at once, decided
    against its threshold), with its attack rows' own robust accuracies as evidence."""
    name = threat_name(w.norm, w.epsilon)
    n = len(w.attacks)
    iv = list(w.interval or [])
    return Row(id=f"threat model {name}", status=w.status, group=group,
               metric="robust_accuracy", words="robust accuracy", rate=True,
               value=None if w.status == "ERROR" else float(w.robust_accuracy),
               interval=(float(iv[0]), float(iv[1])) if len(iv) == 2 else None,
               threshold=None if w.threshold is None else (float(w.threshold), None),
               label=f"{name} ({n} attack{'s' if n != 1 else ''})",
               evidence=tuple(Evidence(e.id, e.value) for e in evidence))


def deciding_rows(checks: Sequence[CheckResult], worst: Sequence[WorstCase] = ()
                  ) -> list[Row]:
    """The rows that decide the run's verdict, as the figure draws them and the card's header
    counts them (:func:`certify.results.verdict_statuses`): every check's row, except
    that each threat model's row stands, at its first attack's place, in place of the attack
    rows it summarises (drawn as its evidence); an errored attack row is its own row. In group
    order, the suite's order within a group."""
    own = {r.id: r for r in rows(checks)}
    by_attack = {a: k for k, w in enumerate(worst) for a in w.attacks}
    evidence: dict[int, list[Row]] = {}
    for c in checks:
        k = by_attack.get(c.id)
        if k is not None and c.status != "ERROR":
            evidence.setdefault(k, []).append(own[c.id])
    out: list[Row] = []
    placed: set[int] = set()
    for c in checks:
        k = by_attack.get(c.id)
        if k is None or c.status == "ERROR":
            out.append(own[c.id])
        elif k not in placed:
            placed.add(k)
            out.append(threat_row(worst[k], own[c.id].group, evidence[k]))
    out += [threat_row(w, KINDS["attack"].glance_group) for k, w in enumerate(worst)
            if k not in placed]
    order = {g: i for i, g in enumerate(GROUPS)}
    return sorted(out, key=lambda r: order.get(r.group, len(GROUPS)))


@dataclass(frozen=True)
class _Geometry:
    """Where a row's parts go: the wide figure (one line per row) or the phone's (two)."""

    width: float
    label_x: float
    plot_x0: float
    plot_x1: float
    value_x: float
    status_x: float
    two_line: bool

    def x(self, v: float) -> float:
        return self.plot_x0 + (self.plot_x1 - self.plot_x0) * min(max(v, 0.0), 1.0)


WIDE = _Geometry(_W, _LABEL_X, _PLOT_X0, _PLOT_X1, _VALUE_X, _STATUS_X, False)
NARROW = _Geometry(NARROW_W, 4, 10, NARROW_W - 10, NARROW_W - 122, NARROW_W - 84, True)


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


def _name(r: Row, narrow: bool = False) -> str:
    """A row's name as written at its left, cut to its column: a check id at 21 characters
    (19 on a phone); a threat model's label, whose characters are ours and narrower, at 24
    (22)."""
    if r.label:
        return _clip(r.label, 22 if narrow else 24)
    return _clip(r.id, 19 if narrow else 21)


def _legend(y: float, statuses: list[str], width: float, evidence: bool = False
            ) -> tuple[list[str], float]:
    """Legend of the statuses present, the interval and the threshold mark (and the evidence
    ring, where a threat model's row shows its attacks)."""
    parts: list[str] = []
    x: float = _LABEL_X + 4
    items: list[tuple[str, str]] = [(s, s) for s in statuses]
    items += [("interval", "95% interval"), ("threshold", "threshold")]
    if evidence:
        items.append(("evidence", "one attack alone"))
    for key, label in items:
        w = 12 + 5.6 * len(label) + 10
        if x + w > width:
            x, y = _LABEL_X + 4, y + 12
        if key == "interval":
            parts.append(f'<path d="M{x - 5:.1f},{y - 3:.1f}L{x + 5:.1f},{y - 3:.1f}" '
                         'stroke="#455a64" stroke-width="2.2"/>')
        elif key == "threshold":
            parts.append(f'<path d="M{x:.1f},{y - 8:.1f}L{x:.1f},{y + 2:.1f}" stroke="#1d2330" '
                         'stroke-width="1.4"/>')
        elif key == "evidence":
            parts.append(f'<circle cx="{x:.1f}" cy="{y - 3:.1f}" r="2.2" fill="#fff" '
                         f'stroke="{EVIDENCE_COLOUR}" stroke-width="1"/>')
        else:
            parts.append(_shape(key, x, y - 3, 3.8))
        parts.append(_text(x + 9, y, label, MIN_FONT))
        x += w
    return parts, y + 4


def _status_mark(g: _Geometry, r: Row, cy: float) -> list[str]:
    col = COLOURS.get(r.status, "#455a64")
    return [_shape(r.status, g.status_x + 4, cy, 3.4),
            _text(g.status_x + 11, cy + 3.2, r.status, MIN_FONT, fill=col, weight="bold")]


def _attr(s: str) -> str:
    return escape(s, {'"': "&quot;"})


def _open_row(r: Row) -> str:
    """A row's group, carrying its id and status (what a reader of the SVG counts)."""
    return (f'<g class="glance-row" data-row="{_attr(r.id)}" data-status="{_attr(r.status)}">'
            f"<title>{escape(r.sentence())}</title>")


def _evidence_marks(g: _Geometry, r: Row, cy: float) -> list[str]:
    """Small grey rings at each attack row's own robust accuracy: evidence for the threat
    model's row, drawn under its marker, with no status of their own."""
    return [f'<circle class="glance-evidence" data-check="{_attr(e.id)}" '
            f'data-for="{_attr(r.id)}" cx="{g.x(e.value):.1f}" cy="{cy:.1f}" r="2.2" '
            f'fill="#fff" stroke="{EVIDENCE_COLOUR}" stroke-width="1"/>'
            for e in r.evidence if e.value is not None]


def _rate_row(g: _Geometry, r: Row, y: float, two: bool) -> tuple[list[str], float]:
    """One rate's row: its name, interval, threshold tick, value marker, value and verdict
    (and a threat model's evidence rings)."""
    body = [_open_row(r)]
    col = COLOURS.get(r.status, "#455a64")
    if g.two_line:  # name, value and verdict on one line, the bar under them
        ty = y + 9
        body.append(_text(g.label_x, ty, _name(r, narrow=True)))
        if r.value is not None:
            body.append(_text(g.value_x, ty, _fmt(r.value, True), MIN_FONT))
        body += _status_mark(g, r, ty - 3.2)
        cy = ty + 10
        h = 2 * _ROW + 7
        if two:
            body.append(_text(g.label_x, cy + 13, _clip(r.words, 40), MIN_FONT, fill="#5b6475"))
            h += 10
    else:
        cy = y + 5.5
        body.append(_text(g.label_x, cy + 3.1, _name(r), MIN_FONT))
        if two:
            body.append(_text(g.label_x, cy + 11.2, _clip(r.words, 28), MIN_FONT,
                              fill="#5b6475"))
        h = _ROW2 if two else _ROW
        body += _status_mark(g, r, cy)
    if r.value is None:
        body.append(_text(g.plot_x0 + 4, cy + 3.3, _no_value(r.status), MIN_FONT,
                          fill="#5b6475"))
    else:
        body += _evidence_marks(g, r, cy)
        if r.interval is not None:
            lo, hi = g.x(r.interval[0]), g.x(r.interval[1])
            body.append(f'<path d="M{lo:.1f},{cy:.1f}L{hi:.1f},{cy:.1f}M{lo:.1f},'
                        f'{cy - 3:.1f}L{lo:.1f},{cy + 3:.1f}M{hi:.1f},{cy - 3:.1f}'
                        f'L{hi:.1f},{cy + 3:.1f}" stroke="{col}" '
                        'stroke-width="1.6" opacity="0.8"/>')
        if r.threshold is not None:
            for tv in r.threshold:
                if tv is not None:
                    body.append(f'<path d="M{g.x(tv):.1f},{cy - 4.5:.1f}L{g.x(tv):.1f},'
                                f'{cy + 4.5:.1f}" stroke="#1d2330" stroke-width="1.4"/>')
        body.append(_shape(r.status, g.x(r.value), cy, 3.6))
        if not g.two_line:
            body.append(_text(g.value_x, cy + 3.3, _fmt(r.value, True), MIN_FONT))
    body.append("</g>")
    return body, h


def _other_row(g: _Geometry, r: Row, y: float) -> tuple[list[str], float]:
    """A score that is not a rate: its value and interval in words, never on the % axis."""
    body = [_open_row(r)]
    if r.value is None:
        line = _no_value(r.status)
    else:
        line = f"{r.words} {_fmt(r.value, False)}"
        if r.interval is not None:
            line += f" (95% CI {_fmt(r.interval[0], False)}–{_fmt(r.interval[1], False)})"
    ref = ""
    if r.reference is not None:
        ref = f"reference {_fmt(r.reference[0], False)}"
        if r.reference[1] is not None:
            ref += f" ({_fmt(r.reference[1][0], False)}–{_fmt(r.reference[1][1], False)})"
        ref += "; own scale, not a rate"
    if g.two_line:
        ty = y + 9
        body.append(_text(g.label_x, ty, _name(r, narrow=True)))
        body += _status_mark(g, r, ty - 3.2)
        lines = [line] + ([ref.removesuffix("; own scale, not a rate"), "own scale, not a rate"]
                          if ref else [])
        for k, t in enumerate(lines):
            body.append(_text(g.label_x, ty + 11 * (k + 1), t, MIN_FONT))
        h: float = 11 * (len(lines) + 1) + 2
    else:
        cy = y + 5.5
        body.append(_text(g.label_x, cy + 3.1, _name(r), MIN_FONT))
        body.append(_text(g.plot_x0, cy + 3.1, line, MIN_FONT))
        h = _ROW
        if ref:
            body.append(_text(g.plot_x0, cy + 11.2, ref, MIN_FONT, fill="#5b6475"))
            h = _ROW2
        body += _status_mark(g, r, cy)
    body.append("</g>")
    return body, h


def glance_svg(checks: Sequence[CheckResult], worst: Sequence[WorstCase] = (), *,
               narrow: bool = False) -> str:
    """The at-a-glance figure as inline SVG (with ``<title>`` and ``<desc>``): the headline
    value, interval, threshold and verdict of every row that decides (:func:`deciding_rows`
    of ``checks`` and the threat models' rows ``worst``), grouped, on one 0–100% axis drawn
    once at the top. ``narrow``: the phone variant (:data:`NARROW_W` wide, two lines per
    row)."""
    g = NARROW if narrow else WIDE
    rs = deciding_rows(checks, worst)
    statuses = [s for s in COLOURS if any(r.status == s for r in rs)]
    # the phone's variant has room for a legend; the wide one's caption says what the marks
    # are, and every row writes its verdict as a word beside its shape
    body, y = (_legend(14, statuses, g.width, any(r.evidence for r in rs)) if narrow
               else ([], 0.0))
    groups = [gr for gr in GROUPS if any(r.group == gr for r in rs)] + sorted(
        {r.group for r in rs} - set(GROUPS))
    if any(r.rate for r in rs):  # the axis, once: every group's rates share it
        y += 9
        for t in (0.0, 0.25, 0.5, 0.75, 1.0):
            anchor = "start" if t == 0 and narrow else "end" if t == 1 and narrow else "middle"
            body.append(_text(g.x(t), y, f"{100 * t:.0f}%", MIN_FONT, anchor, "#5b6475"))
    top = y + 3
    for group in groups:
        members = [r for r in rs if r.group == group]
        rates = [r for r in members if r.rate]
        others = [r for r in members if not r.rate]
        metrics = {r.metric for r in rates if r.value is not None}
        head = group
        if rates and len(metrics) == 1:
            head += f" · {next(iter(metrics)).replace('_', ' ')}"
        y += 13
        body.append(_text(_LABEL_X, y, head, 9.5, weight="bold"))
        y += 0.5
        for r in rates:
            part, h = _rate_row(g, r, y, len(metrics) > 1 and r.value is not None)
            body += part
            y += h
        for r in others:
            part, h = _other_row(g, r, y)
            body += part
            y += h
    if any(r.rate for r in rs):
        grid = "".join(f'<path d="M{g.x(t):.1f},{top:.1f}L{g.x(t):.1f},{y + 2:.1f}" '
                       'stroke="#d9dee7" stroke-width="0.6"/>'
                       for t in (0.0, 0.25, 0.5, 0.75, 1.0))
        body.insert(0, grid)
    height = y + 6
    title = ("At a glance: the headline value, 95% interval and threshold of every row that "
             "decides the verdict")
    desc = " ".join(r.sentence() for r in rs)
    ident = "glance-n" if narrow else "glance"
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {g.width:g} {height:.0f}" '
            f'role="img" aria-labelledby="{ident}-title {ident}-desc" '
            f'font-family="{_FONT}" class="glance-svg{" glance-narrow" if narrow else ""}">'
            f'<title id="{ident}-title">{escape(title)}</title>'
            f'<desc id="{ident}-desc">{escape(desc)}</desc>' + "".join(body) + "</svg>")


def smallest_text(svg: str) -> float:
    """The smallest ``font-size`` on a figure, in its viewBox units."""
    return min(float(v) for v in re.findall(r'font-size="([\d.]+)"', svg))


def alt_text(checks: Sequence[CheckResult], worst: Sequence[WorstCase] = ()) -> str:
    """The figure's numbers in words (its text alternative)."""
    return " ".join(r.sentence() for r in deciding_rows(checks, worst))


def worst_case_line(worst: Sequence[WorstCase]) -> str:
    """The worst case per threat model in one line (robust to every attack of the suite), each
    with its row's verdict."""
    worst = sorted(worst, key=lambda w: order_key(w.norm, w.epsilon))
    return " · ".join(f"{threat_name(w.norm, w.epsilon)}: {100 * w.robust_accuracy:.3g}% "
                      f"(n {w.n}){_status(w)}" for w in worst)


def _status(row: WorstCase) -> str:
    """`` PASS`` etc. after a threat model's figure (none for rows made before they had one)."""
    status: str | None = getattr(row, "status", None)
    return f" {status}" if status else ""
