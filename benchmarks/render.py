"""What rendering a card costs (issue 53): the demo card's HTML and PDF, and each figure.

Reads a finished run folder (default: runs ``certify demo --no-pdf`` into a temporary folder
first), then renders its card as ``certify sign``/``certify run`` do: ``render_html`` (the
Jinja template, the page-1 figure and every check's figures, written as SVG) and ``render_pdf``
(WeasyPrint), each ``--repeats`` times in this process after one untimed warm-up (imports and
font loading are not counted), as CPU seconds of the process (both cores). Every figure of the
card is drawn alone too, with its own CPU time (milliseconds). The reference workload
(``benchmarks/reference_workload.py``) runs before and after, for the ratio.

``.venv/bin/python benchmarks/render.py [--run DIR] [--repeats 5]``: prints JSON and a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def reference_s() -> float:
    """The reference workload's best round, in a fresh process."""
    out = subprocess.run([sys.executable, str(HERE / "reference_workload.py")], check=True,
                         capture_output=True, text=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["best_s"])


def cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
    """``fn()``'s CPU seconds (this process, all threads) and its value."""
    c0 = time.process_time()
    value = fn()
    return time.process_time() - c0, value


def figure_calls(result: Any) -> dict[str, Callable[[], Any]]:
    """Each figure the card draws, as a call that draws it alone: page 1's at-a-glance figure
    and each check's figures as its kind draws them for the card (``Kind.figures``)."""
    from certify.kinds import KINDS
    from certify.report import glance

    checks = list(result.measurement.checks)
    worst = list(result.measurement.attack_worst_case)
    calls: dict[str, Callable[[], Any]] = {
        "page 1: at a glance": lambda: glance.glance_svg(checks, worst)}
    for c in checks:
        kind = KINDS.get(c.kind)
        if kind is not None and c.status not in ("ERROR", "SKIPPED"):
            calls[c.id] = lambda c=c, kind=kind: kind.figures(c)
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, help="a finished run folder (default: a fresh demo)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    ref_before = reference_s()
    with tempfile.TemporaryDirectory() as tmp:
        run = args.run
        if run is None:
            run = Path(tmp) / "demo"
            subprocess.run([sys.executable, "-m", "certify.cli", "demo", "--no-pdf", "-q",
                            "--out", str(run)], check=True)
        from certify.canonical import canonical_json
        from certify.images import data_uri
        from certify.report.card import render_html, render_pdf
        from certify.report.write import load_images
        from certify.results import parse_result

        result = parse_result(json.loads((run / "results.json").read_text()))
        payload = canonical_json(result.to_json())
        images = {d: data_uri(b) for d, b in load_images(run).items()}
        html = render_html(result, None, images)  # warm-up: imports, fonts, caches
        pdf = render_pdf(html, payload)
        html_s, pdf_s = [], []
        for _ in range(args.repeats):
            s, html = cpu(lambda: render_html(result, None, images))
            html_s.append(s)
            s, pdf = cpu(lambda html=html: render_pdf(html, payload))
            pdf_s.append(s)
        figure_s = {name: round(cpu(call)[0] * 1000, 2)
                    for name, call in figure_calls(result).items()}
    ref_after = reference_s()
    ref = min(ref_before, ref_after)
    html_med, pdf_med = statistics.median(html_s), statistics.median(pdf_s)
    total = html_med + pdf_med
    doc = {"html_cpu_s": [round(s, 2) for s in html_s], "pdf_cpu_s": [round(s, 2) for s in pdf_s],
           "html_median_s": round(html_med, 2), "pdf_median_s": round(pdf_med, 2),
           "total_median_s": round(total, 2), "reference_s": [ref_before, ref_after],
           "total_over_reference": round(total / ref, 2), "html_bytes": len(html),
           "pdf_bytes": len(pdf), "figures_cpu_ms": figure_s}
    print(json.dumps(doc))
    print(f"card HTML {html_med:.2f} s + PDF {pdf_med:.2f} s = {total:.2f} CPU s (median of "
          f"{args.repeats}); reference workload {ref:.2f} s: {total / ref:.2f}×")
    for name, s in sorted(figure_s.items(), key=lambda kv: -kv[1]):
        print(f"  {s:7.2f} ms  {name}")


if __name__ == "__main__":
    main()
