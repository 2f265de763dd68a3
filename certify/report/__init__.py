"""Reports: results.json (canonical), card.html and card.pdf, written atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from certify.report.card import render_html, render_pdf
from certify.report.payload import canonical_json
from certify.report.sign import Signature
from certify.rundir import atomic_write

__all__ = ["canonical_json", "render_html", "write_report"]


def write_report(results: dict[str, Any], out: Path, pdf: bool = True,
                 signature: Signature | None = None) -> dict[str, Path]:
    """Write results.json, card.html and (unless ``pdf=False``) card.pdf into ``out``.

    With a ``signature`` (of ``canonical_json(results)``, the bytes of results.json) it also
    writes results.json.sig and embeds the signature in the HTML and the PDF.
    """
    # render everything that can fail before the first file is replaced
    payload = canonical_json(results)
    html = render_html(results, signature)
    pdf_bytes = render_pdf(html, payload, signature) if pdf else None
    paths = {"results": out / "results.json", "html": out / "card.html"}
    atomic_write(paths["results"], payload)
    sig_path = out / "results.json.sig"
    if signature is not None:
        atomic_write(sig_path, signature.to_json().encode())
        paths["signature"] = sig_path
    elif sig_path.exists():
        sig_path.unlink()  # a stale signature of other results must not sit beside them
    atomic_write(paths["html"], html.encode("utf-8"))
    if pdf_bytes is not None:
        paths["pdf"] = out / "card.pdf"
        atomic_write(paths["pdf"], pdf_bytes)
    return paths
