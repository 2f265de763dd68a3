"""Reports: results.json (canonical), images/, card.html and card.pdf, written atomically.

This package face does no work: :mod:`certify.report.write` writes a run's files,
:mod:`certify.report.sign` signs and verifies them (without the engine: no torch, onnxruntime
or WeasyPrint), :mod:`certify.report.card` renders the card. The names below are looked up on
first use, so that ``import certify.report.sign`` loads nothing else.
"""

from __future__ import annotations

from typing import Any

__all__ = ["canonical_json", "load_images", "render_html", "write_report"]

_WHERE = {"canonical_json": "certify.canonical", "load_images": "certify.report.write",
          "write_report": "certify.report.write", "render_html": "certify.report.card"}


def __getattr__(name: str) -> Any:
    """``write_report``, ``load_images``, ``render_html`` and ``canonical_json``, imported
    when first asked for."""
    if name not in _WHERE:
        raise AttributeError(f"module 'certify.report' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
