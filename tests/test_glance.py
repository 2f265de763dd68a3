"""The card at a glance and its accessibility basics (issue 18, points 4 and 6).

The figure's rules on hand-made results (fast), then the demo card in real headless Chromium at a
phone's and a laptop's width (no sideways scrolling, nothing cut) and its PDF's first page.
"""

from __future__ import annotations

import html as html_lib
import json
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image
from pypdf import PdfReader

from certify import figures
from certify.report import glance
from certify.results import parse_result

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PROBE = Path(__file__).with_name("layout_probe.js")
STATUS_WORDS = ("PASS", "FAIL", "WARN", "INCONCLUSIVE", "SKIPPED", "ERROR", "INFO")


def _check(id: str, kind: str, status: str, metrics: dict | None = None,
           intervals: dict | None = None, threshold: tuple | None = None):
    """A stand-in for a typed check result: what the figure reads of it."""
    thr = None if threshold is None else SimpleNamespace(
        metric=threshold[0], min=threshold[1], max=threshold[2])
    return SimpleNamespace(id=id, kind=kind, status=status, metrics=metrics or {},
                           intervals=intervals or {}, threshold=thr)


def _suite():
    return [
        _check("gaussian_noise", "corruption", "PASS", {"robustness_score": 0.91},
               {"robustness_score": [0.879, 0.934]}, ("robustness_score", 0.8, None)),
        _check("sticker", "corruption", "FAIL", {"robustness_score": 0.243},
               {"robustness_score": [0.205, 0.287]}, ("robustness_score", 0.6, None)),
        _check("square_l2", "attack", "WARN", {"robust_accuracy": 0.67},
               {"robust_accuracy": [0.573, 0.754]}, ("robust_accuracy", 0.5, None)),
        _check("hsj", "attack", "INCONCLUSIVE", {"robust_accuracy": 0.575},
               {"robust_accuracy": [0.422, 0.715]}, ("robust_accuracy", 0.5, None)),
        _check("hue_scores", "corruption", "SKIPPED", {}, {}, ("robustness_score", 0.8, None)),
        _check("clean", "clean_accuracy", "ERROR", {}, {}, ("accuracy", 0.9, None)),
        _check("coverage", "coverage", "PASS",
               {"accuracy_at_coverage": 1.0, "confident_mistake_rate": 0.002},
               {"confident_mistake_rate": [0.0004, 0.013]},
               ("confident_mistake_rate", None, 0.05)),
        _check("brittleness", "brittleness", "INFO",
               {"brittle_score": 0.00884, "reference_brittle_score": 0.00561},
               {"brittle_score": [0.00597, 0.0118],
                "reference_brittle_score": [0.00385, 0.00761]}),
    ]


def _rows(svg: str) -> dict[str, str]:
    """Each row's SVG group, by its id (the group's ``data-row``)."""
    return {html_lib.unescape(m.group(1)): m.group(0) for m in
            re.finditer(r'<g class="glance-row" data-row="([^"]*)".*?</g>', svg, flags=re.S)}


def test_every_status_is_a_word_and_a_shape_not_only_a_colour():
    svg = glance.glance_svg(_suite())
    rows = _rows(svg)
    assert set(rows) == {c.id for c in _suite()}
    expected = {c.id: c.status for c in _suite()}
    tags = {"circle": "<circle", "ring": "<circle", "cross": "<path", "triangle": "<path",
            "diamond": "<path", "dash": "<path", "square": "<rect"}
    for cid, g in rows.items():
        status = expected[cid]
        # the word, and beside it a marker of the status's own shape
        assert f">{status}</text>" in g, (cid, status)
        before_word = g.split(f">{status}</text>")[0]
        assert before_word.rstrip().rsplit("<text", 1)[0].rstrip().endswith("/>")
        assert tags[glance.SHAPES[status]] in before_word.rsplit("<text", 1)[0][-260:], cid
    assert len(set(glance.SHAPES.values())) == len(glance.SHAPES), "two statuses share a shape"
    # the phone's variant has a legend naming every status present, beside its shape (the
    # wide figure's caption says what the marks are)
    legend = glance.glance_svg(_suite(), narrow=True).split("<g>", 1)[0]
    for status in set(expected.values()):
        assert f">{status}</text>" in legend, status
    narrow_rows = _rows(glance.glance_svg(_suite(), narrow=True))
    assert all(f">{expected[cid]}</text>" in g for cid, g in narrow_rows.items())


def test_value_interval_and_threshold_are_drawn_where_they_are():
    svg = glance.glance_svg(_suite())
    g = _rows(svg)["gaussian_noise"]
    x0, x1 = glance._PLOT_X0, glance._PLOT_X1
    at = lambda v: x0 + (x1 - x0) * v  # noqa: E731
    assert f'cx="{at(0.91):.1f}"' in g  # the value's marker
    assert f"M{at(0.879):.1f}," in g and f"L{at(0.934):.1f}," in g  # its 95% interval
    assert f"M{at(0.8):.1f}," in g  # the threshold's tick
    assert ">91.0%</text>" in g
    # an upper threshold (coverage: confident mistakes at most 5%) is drawn at 5%
    assert f"M{at(0.05):.1f}," in _rows(svg)["coverage"]
    # a skipped check has no marker on the axis and says it was not evaluated
    skipped = _rows(svg)["hue_scores"]
    assert "not evaluated" in skipped and "cx=" not in skipped.split("not evaluated")[0]


def test_a_score_that_is_not_a_rate_is_never_put_on_the_percent_axis():
    svg = glance.glance_svg(_suite())
    g = _rows(svg)["brittleness"]
    assert "brittle score 0.00884 (95% CI 0.00597–0.0118)" in g
    assert "reference 0.00561" in g
    shown = re.sub(r"<title>.*?</title>", "", g)
    assert re.findall(r"[\d.]+%", shown) == ["95%"]  # the interval's level, no value as a %
    # nothing of the row is drawn on the axis: its only marker is the status's, beside the word
    drawn = [float(x) for x in re.findall(r'<(?:circle cx|path d)="M?([\d.]+)', g)]
    assert drawn and min(drawn) >= glance._STATUS_X, drawn


def test_the_figure_states_its_numbers_in_words():
    svg = glance.glance_svg(_suite())
    assert svg.startswith("<svg") and 'role="img"' in svg
    assert 'aria-labelledby="glance-title glance-desc"' in svg
    desc = html_lib.unescape(re.search(r'<desc id="glance-desc">(.*?)</desc>', svg).group(1))
    assert ("gaussian_noise: robustness score 91.0% (95% CI 87.9%–93.4%), threshold ≥ 80.0%, "
            "PASS.") in desc
    assert "coverage: confident mistake rate 0.2% (95% CI 0.0%–1.3%), threshold ≤ 5.0%" in desc
    assert "hue_scores: not evaluated, SKIPPED." in desc
    assert "clean: error: no value, ERROR." in desc
    # a metric that came out undefined (non-finite outputs) is not drawn as a number
    nan = _check("nan_score", "corruption", "INCONCLUSIVE", {"robustness_score": None}, {},
                 ("robustness_score", 0.8, None))
    assert glance.alt_text([nan]) == "nan_score: no value, INCONCLUSIVE."
    assert "cx=" not in _rows(glance.glance_svg([nan]))["nan_score"].split("INCONCLUSIVE")[0]
    assert "brittleness: brittle score 0.00884 (95% CI 0.00597–0.0118), reference 0.00561, " \
           "no threshold, INFO." in desc
    assert glance.alt_text(_suite()) == desc


def test_worst_case_line_per_threat_model():
    w = [SimpleNamespace(norm="l2", epsilon=0.5, n=40, robust_accuracy=0.575, status="WARN"),
         SimpleNamespace(norm="linf", epsilon=0.0314, n=100, robust_accuracy=0.1,
                         status="FAIL"),
         SimpleNamespace(norm="spatial", epsilon=0.0, n=100, robust_accuracy=0.08,
                         status="FAIL"),
         SimpleNamespace(norm="l0", epsilon=8.0, n=100, robust_accuracy=0.07, status="FAIL")]
    assert glance.worst_case_line(w) == ("L∞ 8/255: 10% (n 100) FAIL · L2 0.5: 57.5% (n 40) "
                                         "WARN · L0 8 px: 7% (n 100) FAIL · spatial: 8% "
                                         "(n 100) FAIL")
    # an ε that is not a whole number of grey levels is written as it is
    assert glance.threat_name("linf", 0.01) == "L∞ 0.01"


def test_a_long_suite_figure_keeps_its_text_size_and_grows_in_height():
    """The figure is drawn at the page's full width whatever its length: a longer suite makes
    it taller (it may move to page 2), never its text smaller."""
    short = glance.glance_svg(_suite())
    long = glance.glance_svg(_suite() * 12)
    box = lambda svg: [float(v) for v in re.search(r'viewBox="([^"]+)"', svg).group(1).split()]  # noqa: E731
    assert box(short)[2] == box(long)[2] == glance._W
    assert box(long)[3] > 6 * box(short)[3]
    assert glance.smallest_text(long) == glance.smallest_text(short) == glance.MIN_FONT


def test_the_plots_carry_a_title_stating_their_numbers():
    per_class = figures.per_class_svg([{"class": 0, "accuracy": 0.5}, {"class": 7,
                                                                       "accuracy": 1.0}])
    assert re.search(r"<svg[^>]*role=\"img\"", per_class)
    title = re.search(r"<title>(.*?)</title>", per_class).group(1)
    assert "class 0: 50.0%" in title and "class 7: 100.0%" in title
    curve = figures.curve_svg([{"intensity": 0.1, "score": 0.9},
                               {"intensity": 0.2, "score": 0.75}], "sigma")
    title = re.search(r"<title>(.*?)</title>", curve).group(1)
    assert "0.1 sigma: 90.0%" in title and "0.2 sigma: 75.0%" in title
    q = figures.queries_curve_svg([{"queries": 10, "robust_accuracy": 0.8},
                                   {"queries": 100, "robust_accuracy": 0.4}], [100])
    title = re.search(r"<title>(.*?)</title>", q).group(1)
    assert "10 queries: 80.0%" in title and "100 queries: 40.0%" in title


def _tick_texts(svg: str) -> list[str]:
    return [t.strip() for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg) if t.strip()]


def test_the_queries_axis_is_labelled_in_plain_counts_at_every_span():
    wide = figures.queries_curve_svg([{"queries": 1, "robust_accuracy": 1.0},
                                      {"queries": 8000, "robust_accuracy": 0.2}], [1000, 8000])
    ticks = _tick_texts(wide)
    assert {"1", "10", "100", "1k"} <= set(ticks) and not any("$" in t for t in ticks), ticks
    # within one decade the minor ticks carry the numbers, so the axis shows more than one
    narrow = figures.queries_curve_svg([{"queries": 1000, "robust_accuracy": 0.8},
                                        {"queries": 4000, "robust_accuracy": 0.3}], [4000])
    assert {"1k", "2k", "3k", "4k"} <= set(_tick_texts(narrow)), _tick_texts(narrow)


# --- the demo card in Chromium and in its PDF ------------------------------------------------

def layout(card_html: Path, width: int, tmp: Path) -> dict:
    """Load a copy of the card with the layout probe in headless Chromium, in a viewport
    ``width`` px wide.

    Headless Chromium never makes its window narrower than 500 px, so the copy is loaded in an
    iframe of exactly ``width`` x 900 px: the frame is the card's viewport (its media queries,
    ``innerWidth`` and scrolling are the frame's), and the probe posts its findings to the
    outer page, which ``--dump-dom`` prints.
    """
    page = tmp / f"probe-{width}.html"
    text = card_html.read_text(encoding="utf-8")
    page.write_text(text.replace("</body>", f"<script>{PROBE.read_text()}</script></body>"),
                    encoding="utf-8")
    outer = tmp / f"outer-{width}.html"
    outer.write_text(
        "<!DOCTYPE html><html><body style='margin:0'><pre id='layout-result'></pre>"
        f"<iframe src='{page.name}' style='width:{width}px;height:900px;border:0;"
        "display:block'></iframe><script>addEventListener('message', e => {"
        "document.getElementById('layout-result').textContent = e.data; });</script>"
        "</body></html>", encoding="utf-8")
    profile = tempfile.mkdtemp()
    try:
        proc = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--no-first-run", "--hide-scrollbars",
             "--allow-file-access-from-files", f"--user-data-dir={profile}",
             f"--window-size={max(width, 500) + 40},1000", "--virtual-time-budget=10000",
             "--dump-dom", outer.as_uri()],
            capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    found = re.findall(r'<pre id="layout-result">(\{.*?)</pre>', proc.stdout, flags=re.S)
    assert found, proc.stderr[-2000:]
    return json.loads(html_lib.unescape(found[-1]))


def assert_fits(result: dict, width: int) -> None:
    """No sideways scrolling of the page and nothing cut, without hiding the overflow."""
    assert result["innerWidth"] == width, result["innerWidth"]
    assert result["htmlOverflowX"] in ("visible", "auto"), result["htmlOverflowX"]
    assert result["bodyOverflowX"] in ("visible", "auto"), result["bodyOverflowX"]
    assert result["checked"] > 500  # the probe saw the card, not an empty page
    assert result["scrollWidth"] <= result["clientWidth"], (
        f"the page scrolls sideways at {width}px: {result['scrollWidth']} > "
        f"{result['clientWidth']}; cut: {result['cut'][:5]}")
    assert not result["cut"], result["cut"][:10]


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is installed by setup.sh")
@pytest.mark.parametrize("width", [390, 1280])
def test_card_fits_a_phone_and_a_laptop_in_chromium(demo_run, tmp_path, width):
    result = layout(demo_run / "card.html", width, tmp_path)
    assert_fits(result, width)
    # every summary row shows its check's name and its verdict together: both inside the
    # viewport, the verdict on the name's line (rows stack on a phone, never scroll sideways)
    results = json.loads((demo_run / "results.json").read_text())
    rows = result["summary"]
    assert len(rows) == (len(results["measurement"]["checks"])
                         + len(results["measurement"]["attack_worst_case"]))
    for row in rows:
        (nl, nt, nr, nb), (vl, vt, vr, vb) = row["n"], row["v"]
        assert 0 <= nl and nr <= width and 0 <= vl and vr <= width, row
        assert vl >= nl and vt < nb and vb > nt, row  # beside it, on the same line
        assert vt - nt < 40, row


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is installed by setup.sh")
def test_the_probe_catches_a_page_that_scrolls_or_clips(tmp_path):
    wide = tmp_path / "wide.html"
    wide.write_text("<html><body>" + "<p>x</p>" * 600 +
                    "<table><tr>" + "<td>wide_cell_content</td>" * 40 +
                    "</tr></table></body></html>")
    assert layout(wide, 390, tmp_path)["scrollWidth"] > 400
    hidden = tmp_path / "hidden.html"
    hidden.write_text("<html><body style='overflow-x:hidden'>" + "<p>x</p>" * 600 +
                      "<div style='overflow:hidden;width:100px'><span style='white-space:nowrap'>"
                      "a long line that the box cuts off</span></div></body></html>")
    r = layout(hidden, 390, tmp_path)
    assert r["bodyOverflowX"] == "hidden"
    assert any(c.get("clipped_by") for c in r["cut"]), r["cut"]


def _page1(pdf: Path, tmp: Path, stem: str) -> tuple[np.ndarray, float, float]:
    """Page 1 at 72 dpi (one pixel per point) in colour, and the y (points) of the "At a
    glance" heading and of the figure's caption ("Each check's ...") below the figure."""
    subprocess.run(["pdftoppm", "-r", "72", "-png", "-f", "1", "-l", "1", str(pdf),
                    str(tmp / stem)], check=True)
    (png,) = tmp.glob(f"{stem}*.png")
    with Image.open(png) as im:
        pixels = np.asarray(im.convert("RGB"), dtype=np.int32)
    words = subprocess.run(["pdftotext", "-bbox", "-f", "1", "-l", "1", str(pdf), "-"],
                           check=True, capture_output=True, text=True).stdout
    found = re.findall(r'<word xMin="[\d.]+" yMin="([\d.]+)"[^>]*>([^<]*)</word>', words)
    ys = [(float(y), w) for y, w in found]
    heading = next(y for y, w in ys if w == "glance")
    caption = next(y for (y, w), (_, nxt) in zip(ys, ys[1:], strict=False)
                   if w == "Each" and nxt.startswith("check"))
    return pixels, heading, caption


def _hex(colour: str) -> np.ndarray:
    return np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])


def test_the_glance_figure_and_the_verdicts_are_on_pdf_page_one(demo_run, tmp_path):
    from certify.report.card import render_pdf

    pdf = demo_run / "card.pdf"
    results = json.loads((demo_run / "results.json").read_text())
    parsed = parse_result(results)
    # the figure's rows are the rows that decide: threat models in place of their attack rows
    shown = glance.deciding_rows(parsed.checks, parsed.measurement.attack_worst_case)
    text = PdfReader(pdf).pages[0].extract_text()
    # selectable text on page 1: the verdict words, the rows' names (the figure's text is text)
    assert "At a glance" in text and "Worst case per threat model" in text
    assert f"Overall verdict: {results['measurement']['verdict']}" in text
    assert "Corruptions · robustness score" in text and "Attacks · robust accuracy" in text
    for r in shown:
        assert r.name in text, r.name
    for status in {r.status for r in shown}:
        assert status in text
    # the drawing: against the same card rendered without the figure's SVG, page 1 has a tall
    # band between the heading and the caption, drawn in every verdict colour present
    card = (demo_run / "card.html").read_text(encoding="utf-8")
    without = re.sub(r'<svg xmlns="http://www.w3.org/2000/svg" viewBox[^>]*class="glance-svg".*?'
                     r"</svg>", "", card, count=1, flags=re.S)
    assert without != card
    bare = tmp_path / "bare.pdf"
    bare.write_bytes(render_pdf(without, (demo_run / "results.json").read_bytes()))
    full, top, bottom = _page1(pdf, tmp_path, "full")
    _, bare_top, bare_bottom = _page1(bare, tmp_path, "bare")
    assert bare_bottom - bare_top < 60, (bare_top, bare_bottom)
    assert bottom - top > 250, (top, bottom)  # the figure: over 88 mm tall, on page 1
    band = full[int(top) + 20:int(bottom) - 2]
    for status in {r.status for r in shown}:
        near = (np.abs(band - _hex(glance.COLOURS[status])).max(axis=-1) < 30).sum()
        assert near >= 8, (status, near)


class _Figures(HTMLParser):
    """Collects the card's images, top-level SVGs (with their <title>) and verdict badges."""

    def __init__(self) -> None:
        super().__init__()
        self.imgs: list[dict] = []
        self.svgs: list[dict] = []
        self.badges: list[str] = []
        self._depth = 0
        self._in_title = False
        self._badge: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a)
        elif tag == "svg":
            if self._depth == 0:
                self.svgs.append({"attrs": a, "title": ""})
            self._depth += 1
        elif tag == "title" and self._depth:
            self._in_title = True
        elif tag == "span" and "verdict" in (a.get("class") or "").split():
            self._badge = []

    def handle_endtag(self, tag):
        if tag == "svg":
            self._depth -= 1
        elif tag == "title":
            self._in_title = False
        elif tag == "span" and self._badge is not None:
            self.badges.append("".join(self._badge).strip())
            self._badge = None

    def handle_data(self, data):
        if self._in_title and self.svgs and not self.svgs[-1]["title"]:
            self.svgs[-1]["title"] = data
        if self._badge is not None:
            self._badge.append(data)


def test_every_figure_has_a_text_alternative_and_every_verdict_a_word(demo_run):
    parser = _Figures()
    parser.feed((demo_run / "card.html").read_text(encoding="utf-8"))
    assert parser.svgs and parser.imgs and parser.badges
    for svg in parser.svgs:
        assert svg["attrs"].get("role") == "img", svg["attrs"]
        # a title that states numbers, not only a name
        assert re.search(r"\d", svg["title"]), svg["title"][:80]
    for img in parser.imgs:
        alt = img.get("alt") or ""
        assert re.search(r"sample .+\S", alt), alt
    perturbed = [i["alt"] for i in parser.imgs if "predicted" in i["alt"]]
    assert perturbed and all("true " in a for a in perturbed)
    words = set(STATUS_WORDS) | {"passed", "too weak"}
    assert all(b in words for b in parser.badges), set(parser.badges) - words


# --- the plots, written as SVG directly (issue 53) --------------------------------------------

def test_plot_ticks_follow_matplotlibs_rules():
    """matplotlib is the oracle for the tick rules the plots kept: ``MaxNLocator`` (steps 1,
    2, 2.5, 5, 10) for where the ticks go, ``ScalarFormatter`` for how they read."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    rng = np.random.default_rng(53)
    cases = [(-0.02, 1.02, 5), (-0.75, 15.75, 6), (0.08, 0.52, 6), (-0.02, 0.105, 5),
             (0.0, 1.02, 7), (-2.54, 44.54, 9)]
    # ranges of the plots' kind (near zero for their width: matplotlib would write an offset
    # for -39.5177..-39.5148, which no plot of the card has)
    cases += [(float(a * w), float((a + 1) * w), int(b)) for a, w, b in
              zip(rng.uniform(-1, 1, 40), 10 ** rng.uniform(-3, 3, 40),
                  rng.integers(2, 10, 40), strict=True)]
    for lo, hi, bins in cases:
        want = [float(t) for t in MaxNLocator(nbins=bins, steps=[1, 2, 2.5, 5, 10])
                .tick_values(lo, hi) if lo - 1e-9 <= t <= hi + 1e-9]
        got = figures._nice_ticks(lo, hi, bins)
        assert np.allclose(got, want, rtol=0, atol=1e-9 * (hi - lo)), (lo, hi, bins, got, want)
        ax = Figure().subplots()
        ax.set_ylim(lo, hi)
        ax.set_yticks(want)
        fmt = ax.yaxis.get_major_formatter()
        fmt.set_locs(want)
        labels = [fmt(t) for t in want]
        assert figures._tick_format(got) == labels, (lo, hi, labels)


def test_plots_are_small_valid_svg_with_their_own_ids():
    import xml.etree.ElementTree as ET

    curve = [{"intensity": x, "score": 1 - x / 30} for x in range(0, 16, 3)]
    noise = [{"intensity": x / 10, "failure_share": x / 100, "failure_upper": x / 50}
             for x in range(1, 6)]
    svgs = [figures.per_class_svg([{"class": k, "accuracy": k / 43} for k in range(43)]),
            figures.curve_svg(curve, "degrees"), figures.curve_svg(curve[:3], "degrees"),
            figures.failure_bound_svg(noise, "sigma", 0.95),
            figures.queries_curve_svg([{"queries": q, "robust_accuracy": 1 - q / 6000}
                                       for q in (1, 10, 100, 1000, 5000)], [1000, 5000])]
    ns = "{http://www.w3.org/2000/svg}"
    ids = []
    for svg in svgs:
        root = ET.fromstring(svg)
        assert root.get("role") == "img" and root.find(f"{ns}title") is not None
        assert root.get("width") in ("518.4pt", "187.2pt")
        # matplotlib wrote 150 to 720 elements for these; a plot is now a few dozen
        assert sum(1 for _ in root.iter()) < 130
        ids += [c.get("id") for c in root.iter(f"{ns}clipPath")]
        assert all(f"url(#{c.get('id')})" in svg for c in root.iter(f"{ns}clipPath")) \
            or "<title>Accuracy per class" in svg  # bars need no clip
    assert len(ids) == len(set(ids)) == len(svgs), ids
    # the same results draw the same bytes
    assert figures.curve_svg(curve, "degrees") == svgs[1]
    # the per-class chart has a bar for every class, coloured by its band
    bars = re.findall(r'<path fill="(#[0-9a-f]{6})" d="([^"]*)"/>', svgs[0])
    assert sum(d.count("z") for _, d in bars) == 43
    assert {c for c, _ in bars} == {"#c62828", "#f9a825", "#2e7d32"}


def test_the_legend_keeps_off_the_data():
    """The failure-bound legend goes to the first corner of matplotlib's order that covers the
    fewest points: rising curves leave the upper left free, falling ones the lower left."""
    rising = [{"intensity": x / 10, "failure_share": x / 100, "failure_upper": x / 50}
              for x in range(1, 6)]
    falling = [{"intensity": x / 10, "failure_share": (6 - x) / 100,
                "failure_upper": (6 - x) / 50} for x in range(1, 6)]

    def legend_x(svg: str) -> float:
        return float(re.search(r'<text x="([\d.]+)"[^>]*font-size="5">upper bound', svg)
                     .group(1))

    assert legend_x(figures.failure_bound_svg(rising, "sigma", 0.95)) < 80
    assert legend_x(figures.failure_bound_svg(falling, "sigma", 0.95)) > 100
