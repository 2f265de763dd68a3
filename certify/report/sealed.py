"""card.html signed over its exact bytes: the PAdES idea applied to HTML.

A signed card.html holds one unsigned gap: the inside of its last ``certify-signature`` script
element, a slot of :data:`SLOT_BYTES` bytes. Everything else, from the first byte to the last,
is signed: the *HTML statement* (``certify.signed-html/1``) names the byte range (``[0, a, b,
n]``: the bytes before the slot and after it, to the end of the file), the sha256 of those
bytes, and the digest of the results statement the card's results signature covers
(:func:`certify.report.sign.statement`). The slot holds the results signature (as
``results.json.sig``) with the HTML statement and its ECDSA signature under ``html``, as compact
JSON padded with spaces.

``certify verify`` then checks the bytes a reader's browser gets, with any later certify and
without rendering anything. The verifier is strict: the gap is exactly the inside of the last
``certify-signature`` script element, holds only printable ASCII (the JSON and its padding: no
``<``, so no ``</script>`` and no markup), the signed range runs to the end of the file, and
raw bytes are hashed (UTF-8 without a byte-order mark, as the card declares), never decoded
text. Where ordinary handling changed the bytes (line endings converted to CRLF, a byte-order
mark, bytes appended), the refusal says what would verify.

Cards made before this (their signature script holds no ``html`` member) are verified the old
way: by re-rendering the signed payload (:mod:`certify.report.visible`).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from certify.canonical import canonical_json
from certify.errors import VerificationError
from certify.report.signature import Signature

#: The signed statement's type.
HTML_STATEMENT_TYPE = "certify.signed-html/1"
#: The signature slot's size in bytes (the sealed JSON is about 1.3 KB).
SLOT_BYTES = 4096
OPEN = b'<script type="application/json" id="certify-signature">'
CLOSE = b"</script>"
RESULTS_OPEN = b'<script type="application/json" id="certify-results">'
BOM = b"\xef\xbb\xbf"
#: The card declares its encoding within its first bytes (HTML's own rule: 1024).
CHARSET = b'<meta charset="utf-8">'


def blank_slot() -> str:
    """What a signed card's signature script holds before it is sealed."""
    return " " * SLOT_BYTES


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def statement_digest(signed: Mapping[str, object]) -> str:
    """``sha256:<hex>`` of a statement's canonical JSON (what the HTML statement names of the
    results statement, and what the transparency log records)."""
    return _sha256(canonical_json(signed))


def _gap(data: bytes) -> tuple[int, int] | None:
    """The start and end of the last ``certify-signature`` script element's inside (``None``
    when the file has none, or it is not closed)."""
    start = data.rfind(OPEN)
    if start < 0:
        return None
    a = start + len(OPEN)
    b = data.find(CLOSE, a)
    return None if b < 0 else (a, b)


def blank_slot_of(data: bytes) -> bytes:
    """``data`` with its signature slot blank again (as rendered, before sealing)."""
    found = _gap(data)
    if found is None:
        return data
    return data[:found[0]] + blank_slot().encode("ascii") + data[found[1]:]


def _signed_bytes(data: bytes, a: int, b: int) -> bytes:
    return data[:a] + data[b:]


def seal(html: bytes, results_signature: Signature, key: ec.EllipticCurvePrivateKey) -> bytes:
    """``html`` (rendered with a :func:`blank_slot` in its signature script) with the slot
    filled: the results signature and the signed HTML statement over every other byte."""
    found = _gap(html)
    if found is None or html[found[0]:found[1]] != blank_slot().encode("ascii"):
        raise RuntimeError("the card has no blank signature slot to seal")
    a, b = found
    signed = {"type": HTML_STATEMENT_TYPE, "range": [0, a, b, len(html)],
              "sha256": _sha256(_signed_bytes(html, a, b)),
              "results": statement_digest(results_signature.signed)}
    der = key.sign(canonical_json(signed), ec.ECDSA(hashes.SHA256()))
    doc = {**json.loads(results_signature.to_json()),
           "html": {"signed": signed, "signature": base64.b64encode(der).decode("ascii")}}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    if len(text) > SLOT_BYTES or b"<" in text:
        raise RuntimeError(f"the sealed signature ({len(text)} bytes) does not fit its slot")
    return html[:a] + text + b" " * (SLOT_BYTES - len(text)) + html[b:]


class SealBroken(VerificationError):
    """A sealed card whose signatures check out but whose bytes are not the signed ones;
    ``ordinary``: the hint already names the ordinary handling that would explain it."""

    ordinary = False


def payload_of(data: bytes, before: int | None = None) -> bytes | None:
    """The inside of the card's last ``certify-results`` script (before byte ``before``), or
    ``None`` when it has none."""
    start = data.rfind(RESULTS_OPEN, 0, len(data) if before is None else before)
    end = data.find(CLOSE, start) if start >= 0 else -1
    return None if start < 0 or end < 0 else data[start + len(RESULTS_OPEN):end]


@dataclass(frozen=True)
class SealedCard:
    """A sealed card.html whose bytes check out: its results signature document (still to be
    checked by the caller, with the statement it covers) and its embedded payload bytes."""

    signature_text: str
    payload: bytes
    #: What was checked of the visible layer, for ``certify verify``'s output.
    how: str


def signature_text(data: bytes) -> str | None:
    """The text of the last signature slot, when the card is sealed (its JSON names ``html``);
    ``None`` for an unsealed card (one made before cards were sealed, or unsigned)."""
    found = _gap(data)
    if found is None:
        return None
    gap = data[found[0]:found[1]]
    if b'"html":' not in gap:
        return None
    return gap.decode("ascii", errors="replace")


def read_statement_link(slot: str) -> str | None:
    """The results statement digest a sealed slot's HTML statement names (checked by
    :func:`read_sealed` to be signed)."""
    try:
        link = json.loads(slot)["html"]["signed"]["results"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    return link if isinstance(link, str) else None


def read_sealed(data: bytes, key: ec.EllipticCurvePublicKey, key_fingerprint: str,
                where: str, max_signature_bytes: int) -> SealedCard:
    """Check a sealed card's bytes: the slot's shape, the HTML statement's signature by
    ``key``, its byte range (the whole file but the slot) and the digest of those bytes; a
    VerificationError otherwise, saying what would verify where ordinary handling changed the
    bytes."""
    found = _gap(data)
    if found is None:
        raise VerificationError(f"{where} has no signature slot", hint="not a card certify wrote")
    a, b = found
    gap = data[a:b]
    if len(gap) > max_signature_bytes:
        raise VerificationError(f"{where}: the signature slot is larger than "
                                f"{max_signature_bytes:,} bytes", hint="not a card certify wrote")
    if any(c < 0x20 or c > 0x7E for c in gap) or b"<" in gap:
        raise VerificationError(f"{where}: the signature slot holds more than the signature "
                                "(markup or other bytes)", hint="do not trust this card")
    body = gap.rstrip(b" ")
    try:
        doc = json.loads(body)
        html = doc["html"]
        signed, value = html["signed"], html["signature"]
        if not isinstance(signed, dict) or not isinstance(value, str):
            raise TypeError("html")
        doc.pop("html")
    except (ValueError, KeyError, TypeError, RecursionError, AttributeError):
        raise VerificationError(f"{where}: the signature slot is malformed",
                                hint="do not trust this card") from None
    if signed.get("type") != HTML_STATEMENT_TYPE:
        raise VerificationError(f"{where}: unknown signed HTML statement type "
                                f"{signed.get('type')!r}",
                                hint="verify with the certify version that signed it")
    if str(doc.get("key_fingerprint")) != key_fingerprint:
        raise VerificationError(f"{where}: signed by key {doc.get('key_fingerprint')}, not by "
                                f"the given key {key_fingerprint}",
                                hint="check that --pubkey is the signer's public key")
    try:
        key.verify(base64.b64decode(value, validate=True), canonical_json(signed),
                   ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        raise VerificationError(f"{where}: the card's signature itself is invalid: it was "
                                "altered, or it does not belong to the statement it carries",
                                hint="do not trust this card") from None
    why = _bytes_problem(data, signed)
    if why is not None:
        hint, ordinary = _diagnosis(data, signed)
        broken = SealBroken(f"{where}: {why}", hint=hint)
        broken.ordinary = ordinary
        raise broken
    if CHARSET not in data[:1024]:
        raise VerificationError(f"{where}: the card declares no UTF-8 charset in its first "
                                "1024 bytes", hint="not a card certify wrote")
    payload = payload_of(data, a)
    if payload is None:
        raise VerificationError(f"{where} carries no certify results", hint="not a card?")
    return SealedCard(json.dumps(doc), payload,
                      f"the signature covers the card's exact bytes ({len(data):,} bytes, all "
                      f"but its {b - a:,}-byte signature slot): nothing was rendered to check it")


def _bytes_problem(data: bytes, signed: Mapping[str, object]) -> str | None:
    """Why ``data`` is not the bytes ``signed`` covers (``None``: it is)."""
    found = _gap(data)
    rng = signed.get("range")
    if found is None:
        return "the card's signature slot is gone"
    a, b = found
    if rng != [0, a, b, len(data)]:
        if isinstance(rng, list) and len(rng) == 4 and rng[3] != len(data):
            return (f"the card is {len(data):,} bytes, not the {rng[3]:,} that were signed: it "
                    "changed after signing")
        return "the card's signed byte range is not the whole file but its signature slot"
    if _sha256(_signed_bytes(data, a, b)) != signed.get("sha256"):
        return "the card's bytes changed after signing (the signature is valid for other bytes)"
    return None


def _diagnosis(data: bytes, signed: Mapping[str, object]) -> tuple[str, bool]:
    """What ordinary handling would explain a change, checked by undoing it, and ``True``; or
    a plain warning and ``False`` when none does."""
    tries: list[tuple[str, bytes]] = []
    if data.startswith(BOM):
        tries.append(("would verify without the byte-order mark at its start: an editor added "
                      "one after signing", data[len(BOM):]))
    if b"\r\n" in data:
        lf = data.replace(b"\r\n", b"\n")
        tries.append(("would verify with LF line endings: converted to CRLF after signing "
                      "(git's core.autocrlf, or an editor)", lf))
        if lf.startswith(BOM):
            tries.append(("would verify with LF line endings and without the byte-order mark: "
                          "both added after signing", lf[len(BOM):]))
    rng = signed.get("range")
    if isinstance(rng, list) and len(rng) == 4 and isinstance(rng[3], int) \
            and 0 < rng[3] < len(data):
        extra = len(data) - rng[3]
        tries.append((f"would verify without the {extra:,} byte{'s' if extra > 1 else ''} added "
                      "after its signed end", data[:rng[3]]))
    for why, candidate in tries:
        if _bytes_problem(candidate, signed) is None:
            return (why + "; use the file as certify wrote it (e.g. mark *.html binary in "
                    ".gitattributes)", True)
    return ("what the card shows was edited after signing, or the page was re-saved (a "
            "browser's \"Save page as\", a minifier): do not trust it", False)
