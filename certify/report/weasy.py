"""WeasyPrint where it can load, and one line that says how to get the PDF where it cannot.

WeasyPrint installs from pip, but it draws text through Pango, HarfBuzz and fontconfig, which
pip cannot install. Without them ``import weasyprint`` prints a banner to stdout and raises
``OSError`` (cffi's ``dlopen`` of ``libgobject-2.0-0`` / ``libpango-1.0-0`` in
``weasyprint/text/ffi.py``); a missing or blocked package raises ``ImportError``. Both mean the
same here: no PDF on this machine. The HTML card, results.json and the signature do not need
WeasyPrint, so ``certify run``, ``certify demo`` and ``certify sign`` write them and print
:func:`pdf_hint`; where a PDF is the point (``certify compare --pdf``, verifying a card.pdf)
:class:`~certify.errors.PdfUnavailableError` is the error.

The outcome is not cached: a failed import leaves nothing half-loaded behind (Python drops the
modules that failed), and the next call sees libraries installed since.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import re
from types import ModuleType

from certify.errors import PdfUnavailableError

#: The Debian/Ubuntu packages WeasyPrint's import needs on a minimal system (Pango pulls in
#: GLib/GObject, HarfBuzz and fontconfig; the fonts give it a face to draw with).
PDF_PACKAGES = ("libpango-1.0-0", "libpangoft2-1.0-0", "libharfbuzz-subset0",
                "fonts-dejavu-core")


def _reason(exc: BaseException) -> str:
    """The failed import in a few words (cffi's message runs to several sentences)."""
    text = (str(exc).splitlines() or [""])[0]
    library = re.match(r"cannot load library '[^']+'", text)
    if library:
        text = library.group(0)
    elif len(text) > 100:
        text = text[:99] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def load_weasyprint() -> ModuleType:
    """The ``weasyprint`` module, or :class:`~certify.errors.PdfUnavailableError` saying why
    it cannot load (its banner on stdout is swallowed: certify's output stays its own)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return importlib.import_module("weasyprint")
    except (ImportError, OSError) as exc:
        raise PdfUnavailableError(
            f"cannot render a PDF: WeasyPrint cannot load its system libraries "
            f"({_reason(exc)})",
            hint=f"install them (Debian/Ubuntu: apt-get install {' '.join(PDF_PACKAGES)}), "
                 "or use card.html") from exc


def unavailable_reason() -> str | None:
    """Why WeasyPrint cannot load here (a few words), or ``None`` when it loads."""
    try:
        load_weasyprint()
    except PdfUnavailableError as exc:
        return _reason(exc.__cause__ if exc.__cause__ is not None else exc)
    return None


def renderer_version(load: bool = True) -> str:
    """WeasyPrint's version as the card's provenance records it; where it cannot load, that
    it was unavailable (and which version pip installed, if any); with ``load=False`` (no PDF
    is rendered) that it was not used, without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("weasyprint")
    except PackageNotFoundError:
        installed = ""
    if not load:
        return f"not used (no PDF{'; ' + installed + ' installed' if installed else ''})"
    try:
        return str(load_weasyprint().__version__)
    except PdfUnavailableError as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        return f"unavailable ({installed + ' installed, ' if installed else ''}{_reason(cause)})"


def pdf_hint(again: str) -> str:
    """The one line a command prints when it wrote the HTML card but no PDF: why, and how to
    get it (``again``: the command that adds card.pdf once the libraries are there)."""
    why = unavailable_reason() or "it did not load"
    return (f"card.pdf not written: WeasyPrint cannot load its system libraries ({why}); "
            f"for the PDF install them (Debian/Ubuntu: apt-get install "
            f"{' '.join(PDF_PACKAGES)}) and {again}")
