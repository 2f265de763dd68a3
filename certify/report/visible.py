"""Does an *older* card.html show what was signed? Compare it with a fresh rendering.

Cards are sealed over their exact bytes now (:mod:`certify.report.sealed`): this module is
only for cards made before that, whose signature covers the payload embedded in the card but
not the markup around it. For those, ``certify verify`` re-renders the card from the
verified payload and compares the two byte for byte, when the card names this verifier's own
renderer (:func:`certify.report.card.same_renderer`: certify's version, a digest of its
templates and of its code). Any change a reader could see (text, an image, a style) is then a
difference. A card from another renderer cannot be reproduced here: its visible layer is not
compared, and :func:`check_html` says so (``certify verify`` exits 8). card.pdf is not
re-rendered: its PDF signature covers its pages (:mod:`certify.report.pades`).

When the bytes differ, the message says where a reader would see it: the visible text (with
whitespace normalised), an image's pixels (by the digest the signed measurement records), or
else the markup (styles, attributes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

from certify.errors import VerificationError
from certify.images import image_digest, pixels_of_data_uri
from certify.report.card import (
    html_renderer,
    render_html,
    renderer_text,
    same_renderer,
    unsealed_form,
)
from certify.report.sealed import blank_slot_of
from certify.report.signature import Signature
from certify.results import RunResult

_WS = re.compile(r"\s+")


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
    """A short description of where two texts first differ (linear: a common prefix and a
    common suffix, never a diff, which is quadratic on a long text an attacker chose)."""
    n = min(len(a), len(b))
    i = next((k for k in range(n) if a[k] != b[k]), n)
    if i == len(a) == len(b):
        return "the texts differ"
    j = 0
    while j < min(len(a), len(b)) - i and a[len(a) - 1 - j] == b[len(b) - 1 - j]:
        j += 1
    lo = max(0, i - 20)
    return (f"the card shows {a[lo:max(i + 20, len(a) - j + 20)][:width]!r} where the signed "
            f"payload renders {b[lo:max(i + 20, len(b) - j + 20)][:width]!r}")


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


def check_html(data: bytes, result: RunResult, signature: Signature, where: str,
               sealed: bool = False, prefix: str = "") -> tuple[bool, str]:
    """Compare a card's bytes with a fresh rendering of its verified payload.

    Returns ``(True, how)`` when the card is exactly what the payload renders to, ``(False,
    why)`` when the card names another renderer (its visible layer is not compared), and
    raises VerificationError when this renderer made it and the bytes differ.

    ``sealed``: a sealed card whose bytes were already found changed, compared only to say
    where a reader sees the change (its signature slot is blanked on both sides); ``prefix``
    starts the message.
    """
    recorded = dict(result.provenance.renderer)
    if not same_renderer(recorded):
        return False, (f"not compared: the card was rendered by {renderer_text(recorded)}; "
                       f"this verifier renders with {renderer_text(html_renderer())}")
    html = data.decode("utf-8", errors="replace")
    card = html_view(html)
    fresh_html = render_html(result, signature, card.sources)
    rerendered = fresh_html if sealed else unsealed_form(fresh_html, signature)
    if sealed:
        data = blank_slot_of(data)
    if rerendered.encode("utf-8") == data:
        return True, "the card is exactly what the signed payload renders to"
    where = where + prefix
    expected = html_view(rerendered)
    if card.text != expected.text:
        raise VerificationError(f"{where}: the visible text is not what the signed payload "
                                f"says: {_first_difference(card.text, expected.text)}",
                                hint="the card was edited after signing; do not trust it")
    _check_images(card.images, expected.declared, where)
    fresh = rerendered.encode("utf-8")
    at = next((i for i, (x, y) in enumerate(zip(data, fresh, strict=False)) if x != y),
              min(len(data), len(fresh)))
    raise VerificationError(f"{where}: the card's markup differs from what the signed payload "
                            f"renders to with the same renderer (from byte {at:,}: styles, "
                            "attributes or layout)",
                            hint="the card was edited after signing; do not trust it")
