"""Does a card *show* what was signed? Compare its visible content with the signed payload's.

The signature covers the payload embedded in a card, not the text and pictures around it. So
``certify verify`` also re-renders the card from the verified payload and compares what a reader
sees: the visible text (whitespace normalised, so renderer differences in line breaking do not
matter) and every image, by the digest of its pixels (which the signed measurement records).
When the card was made by the same renderer (same certify, jinja2, WeasyPrint), an HTML card
must match the re-rendered one byte for byte; cards from another renderer are checked on their
text and images.
"""

from __future__ import annotations

import difflib
import io
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

from certify.errors import VerificationError
from certify.images import decode_png, image_digest, pixels_of_data_uri
from certify.report.card import render_html, render_pdf, renderer_info
from certify.results import RunResult

_WS = re.compile(r"\s+")
#: A 1x1 white PNG: stands in for images when only the layout of a re-render matters (the
#: card's CSS gives every image a fixed size).
_PLACEHOLDER = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4"
                "nGP4//8/AAX+Av4N70a4AAAAAElFTkSuQmCC")


@dataclass
class CardView:
    """What a reader sees in an HTML card: its text, and its images in order."""

    text: str = ""
    #: Digest of each ``<img>``'s pixels (``missing``/``unreadable`` when it shows none).
    images: list[str] = field(default_factory=list)
    #: The ``data-digest`` each ``<img>`` declares (what the signed measurement names).
    declared: list[str] = field(default_factory=list)
    #: ``src`` of each image whose pixels are readable, by pixel digest.
    sources: dict[str, str] = field(default_factory=dict)


class _Visible(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.view = CardView()
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style"):
            self._skip += 1
        elif tag == "img":
            a = dict(attrs)
            src = a.get("src") or ""
            try:
                digest = image_digest(pixels_of_data_uri(src)) if src else "missing"
                if src:
                    self.view.sources[digest] = src
            except ValueError:
                digest = "unreadable"
            self.view.images.append(digest)
            self.view.declared.append(a.get("data-digest") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._skip:
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def html_view(html: str) -> CardView:
    """Parse a card's HTML into what a reader sees."""
    p = _Visible()
    p.feed(html)
    p.close()
    p.view.text = _WS.sub(" ", "".join(p.parts)).strip()
    return p.view


def _first_difference(a: str, b: str, width: int = 60) -> str:
    """A short description of where two texts first differ."""
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op != "equal":
            return (f"the card shows {a[max(0, i1 - 20):i2 + 20][:width]!r} where the signed "
                    f"payload renders {b[max(0, j1 - 20):j2 + 20][:width]!r}")
    return "the texts differ"


def _check_images(actual: list[str], expected: list[str], where: str) -> None:
    if actual == expected:
        return
    if len(actual) != len(expected):
        raise VerificationError(f"{where} shows {len(actual)} images but the signed payload "
                                f"names {len(expected)}", hint="do not trust this card")
    k = next(i for i, (a, e) in enumerate(zip(actual, expected, strict=True)) if a != e)
    raise VerificationError(f"{where}: image {k + 1} does not show the signed pixels "
                            f"({actual[k]} instead of {expected[k]})",
                            hint="do not trust this card")


def check_html(html: str, result: RunResult, signature: Any, where: str) -> str:
    """Raise VerificationError unless the card's visible content is the signed payload's.

    Returns a sentence saying how it was checked.
    """
    card = html_view(html)
    rerendered = render_html(result, signature, card.sources)
    if rerendered == html:
        return "the card is exactly what the signed payload renders to"
    expected = html_view(rerendered)
    if card.text != expected.text:
        raise VerificationError(f"{where}: the visible text is not what the signed payload "
                                f"says: {_first_difference(card.text, expected.text)}",
                                hint="the card was edited after signing; do not trust it")
    _check_images(card.images, expected.declared, where)
    if dict(result.provenance.renderer) == renderer_info():
        raise VerificationError(f"{where}: the card's markup differs from what the signed "
                                "payload renders to with the same renderer",
                                hint="the card was edited after signing; do not trust it")
    return ("the visible text and images match the signed payload (card rendered by "
            f"{_renderer_text(result.provenance.renderer)}, checked with "
            f"{_renderer_text(renderer_info())})")


def _renderer_text(r: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(r.items())) or "an unrecorded renderer"


def pdf_text(data: bytes) -> str:
    """The PDF's text with all whitespace removed (line breaking is the renderer's business)."""
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data))
    return _WS.sub("", "".join(page.extract_text() or "" for page in reader.pages))


def pdf_image_digests(data: bytes) -> set[str]:
    """Pixel digests of the images drawn in a PDF."""
    from pypdf import PdfReader

    out = set()
    for page in PdfReader(io.BytesIO(data)).pages:
        for im in page.images:
            try:
                out.add(image_digest(decode_png(im.data)))
            except ValueError:
                out.add("unreadable")
    return out


def check_pdf(data: bytes, payload: bytes, result: RunResult, signature: Any, where: str
              ) -> str:
    """Raise VerificationError unless the PDF's pages show what the signed payload renders to.

    Compares the page text with a fresh rendering of the payload and the images' pixels with
    the digests the payload names. Returns a sentence saying how it was checked.
    """
    declared = html_view(render_html(result, signature, {})).declared
    placeholders = dict.fromkeys(declared, _PLACEHOLDER)
    expected_pdf = render_pdf(render_html(result, signature, placeholders), payload, signature)
    actual_text, expected_text = pdf_text(data), pdf_text(expected_pdf)
    if actual_text != expected_text:
        raise VerificationError(f"{where}: the pages' text is not what the signed payload says: "
                                f"{_first_difference(actual_text, expected_text)}",
                                hint="pages were edited or taken from another card; do not "
                                     "trust it")
    shown = pdf_image_digests(data)
    unexpected = sorted(shown - set(declared))
    if unexpected:
        raise VerificationError(f"{where}: {len(unexpected)} image(s) on the pages are not the "
                                f"signed ones (e.g. {unexpected[0]})", hint="do not trust it")
    missing = sorted(set(declared) - shown)
    if missing:
        raise VerificationError(f"{where}: {len(missing)} signed image(s) are not on the pages "
                                f"(e.g. {missing[0]})", hint="do not trust it")
    return "the pages' text and images match the signed payload"
