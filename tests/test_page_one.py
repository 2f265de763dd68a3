"""Issue 51, point 5: page 1 of the card agrees with itself.

The at-a-glance figure draws exactly the rows the header counts (threat-model rows in place of
the attack rows they summarise, those drawn only as grey evidence rings), and "Most important
findings" names failures first, so a clean accuracy that failed is among them. Synthetic
results rendered by the card's own renderer; no model is run.
"""

from __future__ import annotations

import copy
import functools
import html as html_lib
import json
import re
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from certify.kinds import KINDS
from certify.report import card as card_mod
from certify.report import glance
from certify.results import RunResult, parse_result, verdict_statuses
from certify.stats import wilson_interval

pytestmark = pytest.mark.unit

N = 100
SVG = "{http://www.w3.org/2000/svg}"
_RULE = {"PASS": "interval_within", "FAIL": "interval_outside",
         "INCONCLUSIVE": "interval_straddles", "WARN": "interval_within",
         "INFO": "no_threshold", "ERROR": "error", "SKIPPED": "skipped"}


#: A real run's results: its rows lend their details to the synthetic rows, so that each kind's
#: section of the card renders as it does for a real run.
PREVIOUS = Path(__file__).parent / "data" / "previous_release" / "results.json"


@functools.cache
def _previous() -> RunResult:
    return parse_result(json.loads(PREVIOUS.read_text()), older=True)


@functools.cache
def _templates() -> dict[str, dict[str, Any]]:
    """A real row of each kind the previous release's results have (the first of its kind)."""
    found: dict[str, dict[str, Any]] = {}
    for c in _previous().checks:
        found.setdefault(c.kind, c.model_dump(mode="json", by_alias=True))
    return found


def _row(id: str, kind: str, status: str, value: float | None = None,
         minimum: float | None = None, params: dict | None = None) -> dict[str, Any]:
    """A check row of ``kind`` whose headline metric is ``value``, judged against
    ``minimum`` (none: no threshold): a real row of its kind with these figures."""
    cls = KINDS[kind]
    metric = cls.export.metric if cls.export is not None else cls.metrics[0].name
    row = copy.deepcopy(_templates().get(kind)) or {
        "params": {}, "budget": None, "details": {}, "settled": {},
        "metrics": {m.name: 0 for m in cls.metrics if not m.optional}}
    metrics: dict[str, Any] | None = None
    intervals: dict[str, list[float]] = {}
    if status not in ("ERROR", "SKIPPED"):
        assert value is not None
        metrics = {**row["metrics"], metric: value}
        if cls.metrics[0].unit == "rate":
            intervals = {metric: list(wilson_interval(round(value * N), N))}
        else:
            intervals = {metric: [value * 0.8, value * 1.2]}
    threshold = None if minimum is None else {
        "metric": metric, "min": minimum, "max": None, "text": f"{metric} ≥ {minimum}",
        "rule": "interval"}
    row.update({
        "id": id, "kind": kind, "threshold": threshold, "status": status,
        "decision": f"{id} decided {status}", "metrics": metrics,
        "intervals": intervals if metrics is not None else {},
        "details": row["details"] if metrics is not None else {},
        "warnings": ["the search stopped early"] if status == "WARN" else [],
        "error": "the model raised" if status == "ERROR" else None, "sample_errors": 0,
        "queries": {"total": N, "mean_per_sample": 1.0, "reference": 0}, "outcomes": None,
        "decided_by": {"rule": _RULE[status], "reason": "more samples would decide"
                       if status == "INCONCLUSIVE" else ""}})
    if params:
        row["params"] = {**row["params"], **params}
        if row["details"]:
            row["details"] = {**row["details"], **params}
    return row


def _attack(id: str, status: str, value: float | None = None, eps: float = 8 / 255,
            norm: str = "linf") -> dict[str, Any]:
    return _row(id, "attack", status, value, 0.5, {"attack": id, "epsilon": eps, "norm": norm})


def _threat(norm: str, eps: float, attacks: list[str], value: float, status: str
            ) -> dict[str, Any]:
    """A threat model's row over ``attacks`` (threshold 50%)."""
    k = round(value * N)
    return {"norm": norm, "epsilon": eps, "attacks": attacks, "n": N,
            "robust_accuracy": value, "n_robust": k, "interval": list(wilson_interval(k, N)),
            "threshold": 0.5, "status": status, "decision": f"threat model {status}",
            "support": [], "white_box": [], "transfer": [],
            "broken_by": {a: N - k for a in attacks}, "warnings": [],
            "decided_by": {"rule": _RULE[status]}}


def _result(checks: list[dict], worst: list[dict], verdict: str = "FAIL") -> RunResult:
    """The previous release's results with these rows in place of its own."""
    doc = _previous().to_json()
    m = doc["measurement"]
    doc["schema"] = "certify.results/3"  # the older results read as this certify's
    m.update(checks=checks, attack_worst_case=worst, verdict=verdict, summary={},
             seeds={**m["seeds"], "checks": {c["id"]: 0 for c in checks}},
             data={**m["data"], "n": N})
    return parse_result(doc)


def _evidence_suite() -> RunResult:
    """Attack rows that FAIL four times over, summarised by two threat-model rows that FAIL
    twice; a skipped and an errored attack row (each counts itself); a corruption FAIL, an
    INCONCLUSIVE, a PASS and an INFO."""
    checks = [
        _row("clean", "clean_accuracy", "PASS", 0.95, 0.9),
        _row("gaussian_noise", "corruption", "INCONCLUSIVE", 0.79, 0.8),
        _row("sticker", "corruption", "FAIL", 0.1, 0.6),
        _attack("square_linf", "FAIL", 0.04),
        _attack("apgd_linf", "FAIL", 0.03),
        _attack("apgd_t_linf", "FAIL", 0.02),
        _attack("square_l2", "PASS", 0.62, eps=0.5, norm="l2"),
        _attack("apgd_l2", "FAIL", 0.3, eps=0.5, norm="l2"),
        _attack("hopskipjump_l2", "SKIPPED", eps=0.5, norm="l2"),
        _attack("spatial_grid", "ERROR", eps=0.0, norm="spatial"),
        _row("rotation+brightness", "corruption_pair", "INFO", 0.64),
    ]
    worst = [_threat("linf", 8 / 255, ["square_linf", "apgd_linf", "apgd_t_linf"], 0.02,
                     "FAIL"),
             _threat("l2", 0.5, ["square_l2", "apgd_l2"], 0.28, "FAIL")]
    return _result(checks, worst)


_COUNT_RE = re.compile(r'<span class="counts"[^>]*>\((.*?)\)</span>', re.S)
_WORDS = {words: status for status, words in card_mod.COUNT_WORDS}


def _header_counts(html: str) -> Counter[str]:
    """The header's counts beside the overall verdict, by status (upper case)."""
    found = Counter[str]()
    counts = _COUNT_RE.search(html)
    assert counts is not None
    statuses, _, warnings = counts.group(1).partition("; ")
    if warnings:  # the rows' own warnings, beside the statuses (not a status)
        n, words = warnings.split(" ", 1)
        assert words == ("warning on the rows" if n == "1" else "warnings on the rows"), warnings
    for part in statuses.split(", "):
        k, words = part.split(" ", 1)
        found[_WORDS[words].upper()] = int(k)
    return found


def _figures(html: str) -> dict[str, ET.Element]:
    """The wide and the phone's at-a-glance SVGs of a rendered card, parsed as XML."""
    out = {}
    for v in ("wide", "phone"):
        svg = re.search(rf'<div class="glance-{v}">(<svg.*?</svg>)</div>', html, re.S)
        assert svg is not None, v
        out[v] = ET.fromstring(svg.group(1))
    return out


def _markers(svg: ET.Element) -> list[tuple[str, str, ET.Element]]:
    """Each status row of a figure: (id, status, its group)."""
    return [(g.attrib["data-row"], g.attrib["data-status"], g)
            for g in svg.iter(f"{SVG}g") if g.get("class") == "glance-row"]


def _evidence(svg: ET.Element) -> list[ET.Element]:
    """Each evidence ring of a figure."""
    return [e for e in svg.iter() if e.get("class") == "glance-evidence"]


def test_the_figure_shows_exactly_the_rows_the_header_counts():
    result = _evidence_suite()
    m = result.measurement
    # the situation of issue 51: attack rows fail more often than the rows that decide
    attack_fails = sum(c.kind == "attack" and c.status == "FAIL" for c in result.checks)
    assert attack_fails == 4 and sum(w.status == "FAIL" for w in m.attack_worst_case) == 2
    html = card_mod.render_html(result)
    header = _header_counts(html)
    assert header == Counter({"PASS": 1, "FAIL": 3, "INCONCLUSIVE": 1, "WARN": 0, "ERROR": 1,
                              "INFO": 1, "SKIPPED": 1})
    # the header counts the verdict's rows (the engine's own list)
    assert +header == Counter(verdict_statuses(result.checks, m.attack_worst_case))
    expected = {"clean": "PASS", "gaussian_noise": "INCONCLUSIVE", "sticker": "FAIL",
                "threat model L∞ 8/255": "FAIL", "threat model L2 0.5": "FAIL",
                "hopskipjump_l2": "SKIPPED", "spatial_grid": "ERROR",
                "rotation+brightness": "INFO"}
    for variant, svg in _figures(html).items():
        marks = _markers(svg)
        # one status row per deciding row, no attack row of a threat model among them
        assert {i: s for i, s, _ in marks} == expected, variant
        assert len(marks) == len(expected), variant
        assert Counter(s for _, s, _ in marks) == +header, variant
        for cid, status, group in marks:
            # the status drawn is the row's: its word, in its colour, and no other status's
            words = {t.text for t in group.iter(f"{SVG}text")} & set(glance.COLOURS)
            assert words == {status}, (variant, cid, words)
            colours = {e.get("fill") or e.get("stroke") for e in group.iter()} - {None}
            assert glance.COLOURS[status] in colours, (variant, cid)
            assert not colours & (set(glance.COLOURS.values()) - {glance.COLOURS[status]})
        # the attack rows are drawn only as evidence of their threat model: grey rings with
        # no status of their own, inside their threat model's row
        rings = _evidence(svg)
        assert sorted((e.get("data-check"), e.get("data-for")) for e in rings) == sorted([
            ("square_linf", "threat model L∞ 8/255"), ("apgd_linf", "threat model L∞ 8/255"),
            ("apgd_t_linf", "threat model L∞ 8/255"), ("square_l2", "threat model L2 0.5"),
            ("apgd_l2", "threat model L2 0.5")]), variant
        for e in rings:
            assert e.get("data-status") is None and e.get("stroke") == glance.EVIDENCE_COLOUR
            assert e in list(dict((i, g) for i, _, g in marks)[e.get("data-for")].iter())
        assert glance.EVIDENCE_COLOUR not in glance.COLOURS.values()
    # the figure's rows are the data it is drawn from
    rows = glance.deciding_rows(result.checks, m.attack_worst_case)
    assert {r.id: r.status for r in rows} == expected
    tm = next(r for r in rows if r.id == "threat model L2 0.5")
    assert tm.name == "L2 0.5 (2 attacks)" and tm.value == 0.28
    assert [(e.id, e.value) for e in tm.evidence] == [("square_l2", 0.62), ("apgd_l2", 0.3)]
    # the text alternative says it too, attack rows as evidence
    assert ("threat model L2 0.5: robust accuracy 28.0% (95% CI 20.1%–37.5%), threshold "
            "≥ 50.0%, FAIL; its attacks alone (evidence): square_l2 62.0%, apgd_l2 30.0%."
            ) in html_lib.unescape(html)
    # the phone's legend names the evidence ring
    legend = [t.text for t in _figures(html)["phone"].findall(f"{SVG}text")]
    assert "one attack alone" in legend


def test_a_run_without_threat_models_draws_every_check():
    """No threat-model row: every check is a row that decides, and the figure draws each."""
    checks = [_row("clean", "clean_accuracy", "PASS", 0.95, 0.9),
              _attack("square_linf", "SKIPPED"),
              _row("blur", "corruption", "WARN", 0.85, 0.8)]
    result = _result(checks, [], verdict="WARN")
    html = card_mod.render_html(result)
    for svg in _figures(html).values():
        assert [(i, s) for i, s, _ in _markers(svg)] == [("blur", "WARN"),
                                                         ("square_linf", "SKIPPED"),
                                                         ("clean", "PASS")]
        assert Counter(s for _, s, _ in _markers(svg)) == +_header_counts(html)
        assert not _evidence(svg)
    n = len(card_mod.row_warnings(result.checks, []))
    assert n and f"; {n} warning{'s' if n != 1 else ''} on the rows)" in html


def _findings_suite(clean: float) -> RunResult:
    """A clean accuracy that FAILs at ``clean`` (threshold 90%), three threat models and a
    corruption that FAIL farther from their thresholds, an inconclusive corruption, an errored
    check and a warning."""
    checks = [
        _row("clean", "clean_accuracy", "FAIL", clean, 0.9),
        _row("gaussian_noise", "corruption", "INCONCLUSIVE", 0.79, 0.8),
        _row("rotation", "corruption", "WARN", 0.85, 0.8),
        _row("sticker", "corruption", "FAIL", 0.02, 0.6),
        _row("hue", "corruption", "ERROR"),
        _attack("apgd_linf", "FAIL", 0.02),
        _attack("sparse_rs_l0", "FAIL", 0.07, eps=8.0, norm="l0"),
        _attack("spatial_grid", "FAIL", 0.08, eps=0.0, norm="spatial"),
    ]
    worst = [_threat("linf", 8 / 255, ["apgd_linf"], 0.02, "FAIL"),
             _threat("l0", 8.0, ["sparse_rs_l0"], 0.07, "FAIL"),
             _threat("spatial", 0.0, ["spatial_grid"], 0.08, "FAIL")]
    return _result(checks, worst)


def _findings_of(result: RunResult) -> list[dict[str, str]]:
    return card_mod.findings(list(result.checks), list(result.measurement.attack_worst_case))


def test_a_failed_clean_accuracy_is_among_the_findings():
    """Issue 51: a clean accuracy of 69.8% against 90% was left out, crowded out by failures
    farther from their thresholds (sticker 58 points, L∞ 48, L0 43, spatial 42)."""
    result = _findings_suite(0.698)
    found = _findings_of(result)
    assert "clean" in [f["check"] for f in found]
    assert {f["status"] for f in found} == {"FAIL"}
    # a failed clean accuracy leads (issue 62), then each group of the figure names its worst
    # failure, farthest from its threshold first
    assert [f["check"] for f in found] == ["clean", "sticker", "threat model L∞ 8/255"]
    clean = next(f for f in found if f["check"] == "clean")
    assert "accuracy 69.8%" in clean["what"] and "threshold ≥ 90.0%" in clean["what"]
    # and on the rendered card, in its findings list on page 1
    html = card_mod.render_html(result)
    listed = html.split('<section id="findings">', 1)[1].split("</section>", 1)[0]
    assert "<strong>clean</strong>: accuracy 69.8%" in listed


def test_a_failed_clean_accuracy_leads_even_where_its_group_failed_farther():
    """Issue 62: clean accuracy 54.7% against 80% FAILs, and the coverage row of the same
    group of the figure fails farther below its threshold: page 1 named the coverage row (the
    group's worst) and not the clean accuracy. Whether the model works at all comes first."""
    base = _findings_suite(0.547)
    coverage = _row("coverage", "coverage", "FAIL", 0.01, 0.9)
    result = _result([c.model_dump(mode="json", by_alias=True) for c in base.checks]
                     + [coverage],
                     [w.model_dump(mode="json") for w in base.measurement.attack_worst_case])
    found = _findings_of(result)
    assert found[0]["check"] == "clean" and "accuracy 54.7%" in found[0]["what"]
    assert {"sticker", "threat model L∞ 8/255"} <= {f["check"] for f in found}


def test_findings_put_failures_first_each_by_its_margin():
    """A clean accuracy far below its threshold leads; every FAIL comes before the error,
    the inconclusive row and the warning, whatever their figures."""
    result = _findings_suite(0.2)  # 70 points below its threshold: the farthest failure
    found = card_mod.findings(list(result.checks), list(result.measurement.attack_worst_case),
                              n=9)
    assert [f["check"] for f in found] == [
        "clean", "sticker", "threat model L∞ 8/255",  # each group's worst, farthest first
        "threat model L0 8 px", "threat model spatial",  # ... then the other failures
        "hue", "gaussian_noise", "rotation"]  # then ERROR, INCONCLUSIVE, WARN
    assert [f["status"] for f in found] == ["FAIL"] * 5 + ["ERROR", "INCONCLUSIVE", "WARN"]
    # three findings by default: the failures
    assert [f["status"] for f in _findings_of(result)] == ["FAIL"] * 3


def test_every_group_that_failed_is_named_even_beyond_three_findings():
    """Four groups of the figure fail: each is named, so the list grows to four."""
    base = _findings_suite(0.698)
    brittle = _row("brittleness", "brittleness", "FAIL", 0.02)
    brittle["threshold"] = {"metric": "brittle_score", "min": None, "max": 0.01,
                            "text": "brittle_score ≤ 0.01", "rule": "interval"}
    result = _result([c.model_dump(mode="json", by_alias=True) for c in base.checks] + [brittle],
                     [w.model_dump(mode="json") for w in base.measurement.attack_worst_case])
    found = _findings_of(result)
    assert len(found) == 4 and {f["status"] for f in found} == {"FAIL"}
    assert {"clean", "brittleness", "sticker", "threat model L∞ 8/255"} == {
        f["check"] for f in found}
