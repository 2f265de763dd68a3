"""Issue 30: a card a release reader understands.

Page one tells the story (model, version, date, verdict, findings, the figure at full width);
the PDF's main body is at most four pages before the appendix, with figure text of at least
9 pt and no table row taller than half a page (measured in WeasyPrint's own layout of the demo
card); the model-card fields come from the flags, intended use is never the suite's
description, and the signed card carries no absolute path or host name unless asked.
"""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from pypdf import PdfReader

from certify.report import card as card_mod
from certify.report import glance

import builders

pytestmark = pytest.mark.e2e

#: 9 pt in CSS px (WeasyPrint lays out in CSS px: 96 per inch, 72 pt per inch)
NINE_PT_PX = 9 * 96 / 72


def _boxes(box):
    yield box
    for child in (box.all_children() if hasattr(box, "all_children") else ()):
        yield from _boxes(child)


def test_demo_pdf_main_body_is_four_pages_with_legible_figure_and_short_rows(demo_run):
    """The demo card as WeasyPrint lays it out for card.pdf: the appendix starts by page 5,
    the at-a-glance figure is on page 1 at the text's full width with text of 9 pt or more,
    and no table row (split across pages or not) is taller than half a page."""
    import weasyprint

    html = (demo_run / "card.html").read_text(encoding="utf-8")
    doc = weasyprint.HTML(string=html).render()
    appendix_page, figure = None, None
    heights: dict[int, list] = {}
    root = doc.pages[0]._page_box.children[0].element
    in_thead = {tr for thead in root.iter("thead") for tr in thead.iter("tr")}
    for number, page in enumerate(doc.pages, 1):
        pb = page._page_box
        half = (pb.height - pb.margin_top - pb.margin_bottom) / 2
        for b in _boxes(pb):
            el = getattr(b, "element", None)
            if el is None:
                continue
            if el.get("id") == "appendix" and appendix_page is None:
                appendix_page = number
            cls = el.get("class") or ""
            if "glance-svg" in cls and "glance-narrow" not in cls and figure is None:
                figure = (number, b, el)
            if b.element_tag == "tr" and el not in in_thead:
                heights.setdefault(id(el), [el, 0.0])[1] += b.height
    assert appendix_page is not None and appendix_page <= 5, appendix_page  # body ≤ 4 pages
    assert len(doc.pages) > appendix_page  # the evidence is there, in the appendix
    number, box, el = figure
    assert number == 1, "the at-a-glance figure must be on page 1"
    body = next(b for b in _boxes(doc.pages[0]._page_box) if b.element_tag == "main")
    assert box.width >= 0.98 * body.width, (box.width, body.width)  # full width
    view_w = float(el.get("viewBox").split()[2])
    sizes = [float(t.get("font-size")) for t in el.iter() if t.get("font-size")]
    assert sizes and min(sizes) * box.width / view_w >= NINE_PT_PX, min(sizes)
    tall = [("".join(e.itertext())[:60], round(h)) for e, h in heights.values() if h > half]
    assert not tall, tall
    # page 1 in the PDF itself: the story's parts, as text a reader can select
    text = PdfReader(demo_run / "card.pdf").pages[0].extract_text()
    results = json.loads((demo_run / "results.json").read_text())
    m = results["measurement"]
    for part in ("Most important findings", "At a glance", "Worst case per threat model",
                 f"Overall verdict: {m['verdict']}", m["model_card"]["name"],
                 m["model_card"]["version"], results["provenance"]["evaluated_at"][:10]):
        assert part in text, part
    assert "Summary of verdicts" in "".join(p.extract_text() for p in
                                            PdfReader(demo_run / "card.pdf").pages[:3])


def _c(id, kind, status, value, threshold, warnings=(), decision="", metric=None,
       rule="interval_within", reason=""):
    from certify.results import DecidedBy

    metric = metric or {"attack": "robust_accuracy"}.get(kind, "robustness_score")
    thr = None if threshold is None else SimpleNamespace(
        metric=metric, min=threshold, max=None, text=f"{metric} ≥ {threshold}", rule="interval")
    return SimpleNamespace(id=id, kind=kind, status=status, metrics={metric: value},
                           intervals={metric: [value - 0.02, value + 0.02]}, threshold=thr,
                           warnings=list(warnings), decision=decision, error=None,
                           sample_errors=0, details={},
                           decided_by=DecidedBy(rule=rule, reason=reason))


def test_findings_put_the_most_severe_first_then_the_farthest_from_its_threshold():
    checks = [
        _c("rotation", "corruption", "WARN", 0.85, 0.8, ["the search stopped early; more"]),
        _c("blur", "corruption", "FAIL", 0.75, 0.8, decision="x lies wholly outside y",
           rule="interval_outside"),
        _c("grayscale", "corruption", "INCONCLUSIVE", 0.79, 0.8,
           decision="robustness_score = 0.79 (95% interval …) straddles it (interval rule): "
                    "about 464 samples would decide", rule="interval_straddles",
           reason="about 464 samples would decide"),
        _c("sticker", "corruption", "FAIL", 0.02, 0.6, decision="lies wholly outside",
           rule="interval_outside"),
        _c("hue", "corruption", "PASS", 0.99, 0.8),
        _c("square_linf", "attack", "FAIL", 0.13, 0.5, decision="lies wholly outside",
           rule="interval_outside"),
    ]
    from certify.results import DecidedBy

    worst = [SimpleNamespace(norm="linf", epsilon=8 / 255, attacks=["square_linf"], n=100,
                             robust_accuracy=0.13, interval=[0.08, 0.21], threshold=0.5,
                             status="FAIL", warnings=[], decision="lies wholly below",
                             decided_by=DecidedBy(rule="interval_outside"))]
    found = card_mod.findings(checks, worst)
    # FAILs first, farthest from the threshold first (sticker 58 points, L∞ 37, blur 5);
    # the attack row is evidence for its threat model's row, which stands for it
    assert [f["check"] for f in found] == ["sticker", "threat model L∞ 8/255", "blur"]
    assert "threshold ≥ 60.0%" in found[0]["what"] and "95% CI" in found[0]["what"]
    assert found[0]["why"] == "its whole 95% interval misses the threshold (interval rule)"
    rest = card_mod.findings(checks[:3], [], n=3)
    assert [f["status"] for f in rest] == ["FAIL", "INCONCLUSIVE", "WARN"]
    assert rest[1]["why"] == "about 464 samples would decide"
    assert rest[2]["why"] == "the search stopped early"


def test_glance_text_stays_legible_on_paper_and_on_a_phone():
    """At full width on A4 (186 mm of text) every figure text is at least 9 pt; the phone's
    variant keeps 12 px at 366 px (390 px less the page's padding)."""
    checks = [_c(f"c{i}", "corruption", "PASS", 0.9, 0.8) for i in range(5)]
    wide, narrow = glance.glance_svg(checks), glance.glance_svg(checks, narrow=True)
    mm_per_unit = 186 / float(re.search(r'viewBox="0 0 ([\d.]+)', wide).group(1))
    assert glance.smallest_text(wide) * mm_per_unit / 25.4 * 72 >= 9
    px_per_unit = 366 / float(re.search(r'viewBox="0 0 ([\d.]+)', narrow).group(1))
    assert glance.smallest_text(narrow) * px_per_unit >= 12


@pytest.fixture(scope="module")
def stated_run(model_path, npz_path, clean_suite, tmp_path_factory):
    out = tmp_path_factory.mktemp("stated") / "card"
    proc = builders.run_cli(
        "run", model_path, "--suite", clean_suite, "--data", npz_path, "--out", out,
        "--no-pdf", "--model-name", "Sign reader", "--model-version", "2.3.1",
        "--owner", "Perception team", "--license", "apache-2.0",
        "--intended-use", "Reads German traffic signs from dash-camera crops.")
    assert proc.returncode in (0, 1, 6, 7), proc.stderr
    return out


def _locals(tmp: Path) -> list[str]:
    """What must not be published: this machine's name and the test's absolute paths."""
    return [platform.node(), str(tmp.parent), str(Path.home()), "/tmp/"]


def test_card_fields_date_and_no_local_paths_by_default(stated_run, clean_suite, model_path,
                                                        npz_path, tmp_path):
    results = json.loads((stated_run / "results.json").read_text())
    m, p = results["measurement"], results["provenance"]
    assert m["model_card"] == {"name": "Sign reader", "version": "2.3.1",
                               "owner": "Perception team", "license": "apache-2.0",
                               "intended_use": "Reads German traffic signs from dash-camera "
                                               "crops."}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", p["evaluated_at"])
    html = (stated_run / "card.html").read_text(encoding="utf-8")
    for shown in ("Sign reader", "2.3.1", "Perception team", "apache-2.0",
                  "Reads German traffic signs from dash-camera crops.", p["evaluated_at"][:10]):
        assert shown in html, shown
    intended = html.split('<section id="intended-use">', 1)[1].split("</section>", 1)[0]
    assert m["suite"]["description"] not in intended
    # no absolute path, no host name: not in the signed JSON, not anywhere on the card
    signed = json.dumps({"measurement": m, "provenance": p})
    visible = re.sub(r'<script type="application/json".*?</script>', "", html, flags=re.S)
    for text in (signed, visible):
        for local in _locals(stated_run):
            assert local not in text, local
    assert "host" not in p["environment"]
    assert p["data_source"] == npz_path.name and p["suite_source"] == clean_suite.name

    # without the flags: the card says what was not stated, never the suite's description
    bare = tmp_path / "bare"
    proc = builders.run_cli("run", model_path, "--suite", clean_suite, "--data", npz_path,
                            "--out", bare, "--no-pdf")
    assert proc.returncode in (0, 1, 6, 7), proc.stderr
    doc = json.loads((bare / "results.json").read_text())
    assert doc["measurement"]["model_card"] is None
    html = (bare / "card.html").read_text(encoding="utf-8")
    intended = html.split('<section id="intended-use">', 1)[1].split("</section>", 1)[0]
    assert "Not stated" in intended and doc["measurement"]["suite"]["description"] not in intended
    details = html.split('<section id="model-details">', 1)[1].split("</section>", 1)[0]
    assert details.count("not stated") == 3  # version, owner, license

    # --provenance full: the paths as given and the host name, by request
    full = tmp_path / "full"
    proc = builders.run_cli("run", model_path, "--suite", clean_suite, "--data", npz_path,
                            "--out", full, "--no-pdf", "--provenance", "full")
    assert proc.returncode in (0, 1, 6, 7), proc.stderr
    doc = json.loads((full / "results.json").read_text())
    assert doc["provenance"]["data_source"] == str(npz_path)
    assert doc["provenance"]["environment"]["host"] == platform.node()


def test_the_hugging_face_export_uses_the_stated_fields(stated_run):
    import yaml

    proc = builders.run_cli("export", stated_run)
    assert proc.returncode == 0, proc.stderr
    text = (stated_run / "model-index.md").read_text()
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["license"] == "apache-2.0"
    assert front["model-index"][0]["name"] == "Sign reader"
    assert front["certify"]["model_version"] == "2.3.1"
    assert front["certify"]["owner"] == "Perception team"


def test_overlong_or_control_character_fields_are_refused(model_path, npz_path, clean_suite,
                                                          tmp_path):
    proc = builders.run_cli("run", model_path, "--suite", clean_suite, "--data", npz_path,
                            "--out", tmp_path / "x", "--owner", "a\x07b")
    assert proc.returncode == 2 and "--owner contains control characters" in proc.stderr
    assert not (tmp_path / "x").exists()
