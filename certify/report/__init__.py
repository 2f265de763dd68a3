"""Reports: results.json (canonical), card.html and card.pdf, written atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from certify.report.card import render_html, render_pdf
from certify.report.payload import canonical_json
from certify.rundir import atomic_write

__all__ = ["canonical_json", "render_html", "write_report"]


def write_report(results: dict[str, Any], out: Path, pdf: bool = True) -> dict[str, Path]:
    """Write results.json, card.html and (unless ``pdf=False``) card.pdf into ``out``.

    Signing plugs in here: it signs ``canonical_json(results)``, the bytes of results.json.
    """
    payload = canonical_json(results)
    html = render_html(results)
    paths = {"results": out / "results.json", "html": out / "card.html"}
    atomic_write(paths["results"], payload)
    atomic_write(paths["html"], html.encode("utf-8"))
    if pdf:
        paths["pdf"] = out / "card.pdf"
        render_pdf(html, paths["pdf"], payload)
    return paths
