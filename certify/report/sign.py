"""Signing and verifying results: ECDSA P-256 over a statement of the payload's digests.

``results.json`` (:func:`certify.canonical.canonical_json`) has two parts, ``measurement`` and
``provenance``. The signature covers a small *statement* (``certify.signed-results/2``): the
schema version, the sha256 of each part's canonical JSON, and the sha256 of the exact payload
bytes a verifier reads: ``payload`` (the canonical results.json bytes, also card.pdf's
attachment) and ``html_payload`` (the text of card.html's embedded results script). A verifier
reads the small signature first (at most :data:`MAX_SIGNATURE_BYTES`), checks the signature
over the statement (a bad signature is reported as such, never as a changed payload), then the
digest of the raw payload bytes, and only then parses the payload. Statements of the older
type ``certify.signed-results/1`` (part digests only) still verify the old way: each part's
digest recomputed from the parsed payload.

card.pdf also carries a standard PDF signature (:mod:`certify.report.pades`) over the whole
file; card.html is sealed over its exact bytes (:mod:`certify.report.sealed`): both are checked
without rendering anything, by any later certify. An older card.html (made before cards were
sealed) is compared with a fresh rendering of the signed payload
(:mod:`certify.report.visible`). Where the visible layer cannot be compared (such a card from
another renderer, a card.pdf from before PDF signatures), :class:`Verified` says so
(``visible_compared`` False) and ``certify verify`` exits 8.

The key pair is ECDSA P-256 (PEM, PKCS#8 / SubjectPublicKeyInfo), which cosign-style tooling
reads too; ``certify keygen`` also writes the key's self-issued certificate (``NAME.crt``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from certify.canonical import canonical_json, script_safe_json
from certify.errors import UsageError, VerificationError
from certify.report import sealed
from certify.report.signature import Signature  # the document (re-exported here)

if TYPE_CHECKING:
    from certify.report.pades import PdfSignature
    from certify.results import RunResult

ALGORITHM = "ecdsa-p256-sha256"


STATEMENT_TYPE = "certify.signed-results/2"
#: Statement types this certify still verifies (the old way: part digests after parsing).
OLD_STATEMENT_TYPES = ("certify.signed-results/1",)
PARTS = ("measurement", "provenance")
#: The largest signature document read (it is a few hundred bytes): checked before parsing.
MAX_SIGNATURE_BYTES = 64 * 1024
#: The largest payload read or inflated when the caller sets no limit (``certify verify``);
#: the service passes its own (``--max-verify-mb``).
DEFAULT_MAX_INFLATED_BYTES = 256 * 2**20
#: Results formats whose signed cards this certify verifies (see the README's "Results
#: formats"): the current one is read in full, an older one has its signature and payload
#: checked but its figures are not re-read.
RESULTS_FORMATS = ("certify.results/2", "certify.results/3")


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def part_digest(doc: Mapping[str, object], part: str) -> str:
    """sha256 of one part's canonical JSON."""
    return _sha256(canonical_json(doc.get(part)))


def statement(doc: Mapping[str, object]) -> dict[str, str]:
    """What a signature covers: the schema version, the digest of each part, and the digests
    of the exact payload bytes a verifier reads (results.json and card.pdf's attachment:
    ``payload``; card.html's embedded script: ``html_payload``), and that card.html is sealed
    over its bytes (``html_seal``: a card.html without a seal is then refused)."""
    return {"type": STATEMENT_TYPE, "schema": str(doc.get("schema")),
            **{p: part_digest(doc, p) for p in PARTS},
            "payload": _sha256(canonical_json(doc)),
            "html_payload": _sha256(script_safe_json(doc).encode("utf-8")),
            # card.html of these results is sealed over its bytes: an unsealed one is refused
            "html_seal": sealed.HTML_STATEMENT_TYPE}


def fingerprint(public_key: ec.EllipticCurvePublicKey) -> str:
    """sha256 of the DER SubjectPublicKeyInfo, as ``sha256:<hex>``."""
    der = public_key.public_bytes(serialization.Encoding.DER,
                                  serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def keygen(out_dir: Path, name: str = "certify", passphrase: bytes | None = None
           ) -> tuple[Path, Path]:
    """Write ``NAME.key`` (mode 0600, optionally encrypted), ``NAME.pub`` and ``NAME.crt`` (the
    key's self-issued certificate, which card.pdf's PDF signature names) into ``out_dir``."""
    from certify.report.pades import certificate_path, write_certificate

    out_dir.mkdir(parents=True, exist_ok=True)
    key_path, pub_path = out_dir / f"{name}.key", out_dir / f"{name}.pub"
    cert_path = certificate_path(key_path)
    for p in (key_path, pub_path, cert_path):
        if p.exists():
            raise UsageError(f"{p} already exists", hint="choose another --out or --name")
    key = ec.generate_private_key(ec.SECP256R1())
    enc = (serialization.BestAvailableEncryption(passphrase) if passphrase
           else serialization.NoEncryption())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub_path.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    write_certificate(key, cert_path)
    return key_path, pub_path


def load_private_key(path: Path, passphrase: bytes | None = None) -> ec.EllipticCurvePrivateKey:
    """Read a PEM private key; a clear UsageError for every way it can be wrong."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read key {path}: {exc.strerror}", hint="check --key") from None
    try:
        key = serialization.load_pem_private_key(data, password=passphrase)
    except TypeError:
        raise UsageError(f"{path} is encrypted", hint="set the passphrase variable") from None
    except ValueError:
        raise UsageError(f"{path} is not a readable PEM private key (or wrong passphrase)",
                         hint="create one with `certify keygen`") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise UsageError(f"{path} is not an ECDSA P-256 key", hint="use `certify keygen`")
    return key


def load_public_key(path: Path) -> ec.EllipticCurvePublicKey:
    """Read a PEM public key (ECDSA P-256)."""
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}", hint="check --pubkey") from None
    except ValueError:
        raise UsageError(f"{path} is not a PEM public key", hint="use the .pub from keygen") \
            from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise UsageError(f"{path} is not an ECDSA public key", hint="use the .pub from keygen")
    return key


def sign(results: Mapping[str, object], key: ec.EllipticCurvePrivateKey) -> Signature:
    """Sign the statement of ``results`` (a results document as plain JSON)."""
    signed = statement(results)
    der = key.sign(canonical_json(signed), ec.ECDSA(hashes.SHA256()))
    return Signature(ALGORITHM, base64.b64encode(der).decode("ascii"),
                     fingerprint(key.public_key()), signed)


_OPEN = '<script type="application/json" id="certify-'
_CLOSE = "</script>"
_PARTS = ("results", "signature")


def embedded_parts(html: str) -> dict[str, str]:
    """The card's embedded ``results`` and ``signature`` scripts, by part (the last of each).

    Linear in the size of the page, whatever it holds: each opening tag is found once and its
    closing tag searched from there; a page with an unclosed tag ends the search, since no later
    tag could close either (a regular expression that retries from every opening tag took
    quadratic time on a page of unclosed tags).
    """
    parts: dict[str, str] = {}
    at = 0
    while (start := html.find(_OPEN, at)) >= 0:
        head = start + len(_OPEN)
        name_end = html.find('">', head, head + 16)
        name = html[head:name_end] if name_end >= 0 else ""
        if name not in _PARTS:
            at = head
            continue
        body = name_end + 2
        end = html.find(_CLOSE, body)
        if end < 0:
            break
        parts[name] = html[body:end]  # the last of each, as before
        at = end + len(_CLOSE)
    return parts


@dataclass(frozen=True)
class Embedded:
    """What a card or results.json carries, read before anything is parsed: the signature
    (small, bounded) and the exact payload bytes (bounded)."""

    signature: Signature
    #: the exact payload bytes (UTF-8): results.json's, card.pdf's attachment, or the text of
    #: card.html's embedded results script
    payload: bytes
    #: which statement digest covers ``payload``: ``payload`` or ``html_payload``
    digest_key: str
    #: card.pdf's PDF signature, checked (``None``: not a PDF, or a PDF without one)
    pdf_signature: PdfSignature | None = None
    #: a sealed card.html whose bytes checked out: how (``None``: not one)
    sealed_how: str | None = None


def _read_bounded(path: Path, limit: int, what: str) -> bytes:
    """The bytes of ``path``, refused (before reading) when larger than ``limit``."""
    try:
        size = path.stat().st_size
        if size > limit:
            raise VerificationError(f"{path}: the {what} is {size:,} bytes, more than "
                                    f"{limit:,}", hint="not a file certify wrote")
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}", hint="check the path") \
            from None


def _signature(text: bytes | str, where: str) -> Signature:
    if len(text) > MAX_SIGNATURE_BYTES:
        raise VerificationError(f"{where}: the signature is larger than {MAX_SIGNATURE_BYTES:,} "
                                "bytes", hint="not a signature certify wrote")
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return Signature.from_json(text, where)


def read_embedded(path: Path, key: ec.EllipticCurvePublicKey, max_inflated_bytes: int
                  ) -> Embedded:
    """The signature and the raw payload of a card or results.json, without parsing the
    payload. For card.pdf, a PDF signature is checked first (with ``key``), before any
    attachment is inflated."""
    if not path.is_file():
        raise UsageError(f"{path} not found", hint="pass card.html, card.pdf or results.json")
    suffix = path.suffix.lower()
    if suffix == ".json":
        sig_path = path.with_name(path.name + ".sig")
        if not sig_path.is_file():
            raise VerificationError(f"{path} has no detached signature {sig_path.name}",
                                    hint="sign the run with `certify sign`")
        sig = _signature(_read_bounded(sig_path, MAX_SIGNATURE_BYTES, "signature"),
                         str(sig_path))
        return Embedded(sig, _read_bounded(path, max_inflated_bytes, "payload"), "payload")
    if suffix in (".html", ".htm"):
        data = _read_bounded(path, max_inflated_bytes + 2**20, "card")
        slot = sealed.signature_text(data)
        if slot is not None:  # sealed over its exact bytes: nothing is decoded or rendered
            try:
                card = sealed.read_sealed(data, key, fingerprint(key), str(path),
                                          MAX_SIGNATURE_BYTES)
            except sealed.SealBroken as exc:
                raise _explain_broken_seal(data, slot, key, path, exc) from None
            sig = _signature(card.signature_text, str(path))
            verify_statement(sig, key)
            if sealed.statement_digest(sig.signed) != sealed.read_statement_link(slot):
                raise VerificationError(f"{path}: the card's signature seals other results "
                                        "than the results signature beside it",
                                        hint="do not trust this card")
            return Embedded(sig, card.payload, "html_payload", sealed_how=card.how)
        text = data.decode("utf-8", errors="replace")
        parts = embedded_parts(text)
        if "results" not in parts:
            raise VerificationError(f"{path} carries no certify results", hint="not a card?")
        if "signature" not in parts or parts["signature"].strip() in ("", "null"):
            raise VerificationError(f"{path} is not signed", hint="sign with `certify sign`")
        sig = _signature(parts["signature"], str(path))
        if sig.signed.get("html_seal") is not None:
            verify_statement(sig, key)
            raise VerificationError(
                f"{path}: the card carries no seal over its bytes, yet its results were signed "
                "by a certify that seals card.html: its seal was removed (and what it shows may "
                "have been changed)", hint="do not trust this card")
        return Embedded(sig, parts["results"].encode("utf-8"), "html_payload")
    if suffix == ".pdf":
        from certify.report import pades

        data = path.read_bytes()
        pdf_sig = (pades.verify_pdf_signature(data, key, str(path))
                   if pades.has_signature(data) else None)
        files = pades.attachments(data, {"results.json": max_inflated_bytes,
                                         "results.json.sig": MAX_SIGNATURE_BYTES}, str(path),
                                  signed=pdf_sig is not None)
        if "results.json" not in files:
            raise VerificationError(f"{path} carries no results.json", hint="not a card?")
        if "results.json.sig" not in files:
            raise VerificationError(f"{path} is not signed", hint="sign with `certify sign`")
        return Embedded(_signature(files["results.json.sig"], str(path)),
                        files["results.json"], "payload", pdf_sig)
    raise UsageError(f"cannot verify a {suffix or 'suffix-less'} file",
                     hint="pass card.html, card.pdf or results.json")


def _explain_broken_seal(data: bytes, slot: str, key: ec.EllipticCurvePublicKey, path: Path,
                         exc: sealed.SealBroken) -> VerificationError:
    """Why a sealed card's bytes are not the signed ones, where that can be said: its embedded
    payload changed; or (a card this certify rendered) what a reader sees differs from a
    fresh rendering of its signed payload (the text, an image, the markup). The refusal
    itself never depends on this: ``exc`` stands where nothing more can be said."""
    if exc.ordinary:  # ordinary handling, already said
        return exc
    try:
        sig = _signature(slot, str(path))
        verify_statement(sig, key)
    except VerificationError:
        return exc
    payload = sealed.payload_of(data) or b""
    if _sha256(payload) != sig.signed.get("html_payload"):
        return VerificationError(f"{path}: the card's bytes changed after signing: the signed "
                                 "payload changed after signing (its sha256 is not the signed "
                                 "one)", hint="do not trust this card")
    try:
        from certify.report.visible import check_html
        from certify.results import parse_result

        check_html(data, parse_result(_parse(payload, path)), sig, str(path), sealed=True,
                   prefix=" (its bytes changed after signing)")
    except VerificationError as specific:
        return specific
    except Exception:  # noqa: BLE001 - an explanation that fails leaves the refusal as it is
        return exc
    return exc


def _parse(data: bytes, where: Path) -> dict[str, object]:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        raise VerificationError(f"{where}: the embedded results are not valid JSON",
                                hint="the file was altered") from None
    if not isinstance(doc, dict):
        raise VerificationError(f"{where}: the embedded results are not a document",
                                hint="the file was altered")
    return doc


def verify_statement(sig: Signature, key: ec.EllipticCurvePublicKey) -> None:
    """Raise VerificationError unless ``sig`` is ``key``'s valid signature of the statement it
    carries, of a statement type this certify reads."""
    if sig.algorithm != ALGORITHM:
        raise VerificationError(f"unsupported signature algorithm {sig.algorithm!r}",
                                hint=f"certify signs with {ALGORITHM}")
    if sig.key_fingerprint != fingerprint(key):
        raise VerificationError(
            f"signed by key {sig.key_fingerprint}, not by the given key {fingerprint(key)}",
            hint="check that --pubkey is the signer's public key")
    try:
        der = base64.b64decode(sig.value, validate=True)
        key.verify(der, canonical_json(sig.signed), ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        raise VerificationError("the signature itself is invalid: it was altered, or it does "
                                "not belong to the statement it carries",
                                hint="do not trust this card; ask the signer for a new "
                                     "signature") from None
    kind = sig.signed.get("type")
    if kind != STATEMENT_TYPE and kind not in OLD_STATEMENT_TYPES:
        raise VerificationError(f"unknown signed statement type {kind!r}",
                                hint="verify with the certify version that signed it")
    if kind == STATEMENT_TYPE and not {"payload", "html_payload"} <= set(sig.signed):
        raise VerificationError("the signed statement names no payload digest",
                                hint="do not trust this card")


def verify(results: Mapping[str, object], sig: Signature, key: ec.EllipticCurvePublicKey
           ) -> None:
    """Raise VerificationError unless ``sig`` is ``key``'s valid signature of ``results`` (a
    parsed document): the statement's signature first, so a damaged signature is reported as
    such; then the schema and each part's digest, and the message names the part that
    changed."""
    verify_statement(sig, key)
    _check_parts(results, sig)


def _check_parts(results: Mapping[str, object], sig: Signature) -> None:
    if sig.signed.get("schema") != results.get("schema"):
        raise VerificationError(
            f"the payload's schema {results.get('schema')!r} is not the signed "
            f"{sig.signed.get('schema')!r}", hint="do not trust this card")
    changed = [p for p in PARTS if sig.signed.get(p) != part_digest(results, p)]
    if changed:
        raise VerificationError(
            f"the {' and the '.join(changed)} changed after signing (the signature is valid "
            "for other content)", hint="do not trust this card")


def is_older_format(fmt: str) -> bool:
    """Whether ``fmt`` is a results format this certify verifies but no longer writes."""
    from certify.results import SCHEMA

    return (fmt in RESULTS_FORMATS and SCHEMA in RESULTS_FORMATS
            and RESULTS_FORMATS.index(fmt) < RESULTS_FORMATS.index(SCHEMA))


@dataclass(frozen=True)
class Verified:
    """What ``certify verify`` established about a file."""

    #: the typed results (``None`` for an older results format, whose figures this certify
    #: does not re-read)
    result: RunResult | None
    signature: Signature
    #: How the visible content was checked, or why it was not (``None`` for results.json).
    visible: str | None
    #: Whether the visible layer was compared with the signed payload: ``True`` (card.pdf's
    #: PDF signature covers it, or card.html is what the payload renders to), ``False`` (a
    #: card from another renderer, a card.pdf from before PDF signatures, an older results
    #: format: ``certify verify`` exits 8), ``None`` for results.json (nothing visible).
    visible_compared: bool | None = None
    #: the payload's results format (its ``schema``)
    results_format: str = ""
    #: card.pdf's checked PDF signature (:class:`certify.report.pades.PdfSignature`)
    pdf_signature: PdfSignature | None = None

    @property
    def older_format(self) -> bool:
        """Whether the payload is in an older results format than this certify writes."""
        return is_older_format(self.results_format)

    def format_note(self) -> str | None:
        """The line that says an older format's figures were not re-read (``None`` when the
        format is this certify's)."""
        if not self.older_format:
            return None
        note = (f"older results format {self.results_format}: the figures are not re-read "
                "by this certify")
        return note + ("; visible layer not compared" if self.visible_compared is False
                       else "")


def verify_file(path: Path, key: ec.EllipticCurvePublicKey, *,
                max_inflated_bytes: int | None = None) -> Verified:
    """Verify a card or results.json; raise VerificationError (or SchemaError) unless the
    signature, the signed payload, the schema and (for cards) the visible content check out.

    In order, nothing parsed before it is trusted: card.pdf's PDF signature (when it has one:
    the whole file, made with ``key``); the signature document (at most
    :data:`MAX_SIGNATURE_BYTES`) and its ECDSA signature over the statement; the sha256 of the
    raw payload bytes (at most ``max_inflated_bytes``, inflated or not; default
    :data:`DEFAULT_MAX_INFLATED_BYTES`); only then the payload is parsed. A visible layer that
    cannot be compared is no error: ``visible_compared`` is ``False`` and ``visible`` says why.
    """
    limit = DEFAULT_MAX_INFLATED_BYTES if max_inflated_bytes is None else max_inflated_bytes
    got = read_embedded(path, key, limit)
    sig = got.signature
    verify_statement(sig, key)
    suffix = path.suffix.lower()
    is_pdf = suffix == ".pdf"
    if sig.signed.get("type") == STATEMENT_TYPE:
        if _sha256(got.payload) != sig.signed[got.digest_key]:
            raise VerificationError(
                f"{path}: the signed payload changed after signing (its sha256 is not the "
                "signed one; the signature is valid for other content)",
                hint="do not trust this card")
        if is_pdf and got.pdf_signature is None:
            raise VerificationError(
                f"{path}: the PDF carries no PDF signature, yet its payload was signed by a "
                "certify that signs card.pdf itself: its pages were replaced or its signature "
                "removed", hint="do not trust this card")
        doc = _parse(got.payload, path)
        _check_parts(doc, sig)
    else:  # certify.signed-results/1: part digests of the parsed payload, canonical bytes
        doc = _parse(got.payload, path)
        _check_parts(doc, sig)
        form = (script_safe_json(doc).encode("utf-8") if got.digest_key == "html_payload"
                else canonical_json(doc))
        if got.payload != form:
            raise VerificationError(f"{path}: the signed values are intact but the payload's "
                                    "bytes were reformatted after signing",
                                    hint="use the file as certify wrote it")
    return _visible(path, doc, got)


def _visible(path: Path, doc: Mapping[str, object], got: Embedded) -> Verified:
    """The typed result (current format) and how the visible layer was checked."""
    from certify.results import parse_result

    fmt = str(doc.get("schema"))
    # this certify's format is read in full; an unknown one is refused by parse_result
    result = None if is_older_format(fmt) else parse_result(doc)
    suffix = path.suffix.lower()
    sig = got.signature
    if suffix == ".json":
        return Verified(result, sig, None, None, fmt)
    if suffix == ".pdf":
        if got.pdf_signature is not None:
            return Verified(result, sig, "the PDF signature covers the whole file (its pages "
                            "and attachments), made with the signer's key (certificate "
                            f"{got.pdf_signature.subject})", True, fmt, got.pdf_signature)
        return Verified(result, sig, "not compared: this card.pdf carries no PDF signature "
                        "(made before certify signed PDFs), so its pages are not covered by a "
                        "signature", False, fmt)
    if got.sealed_how is not None:
        return Verified(result, sig, got.sealed_how, True, fmt)
    if result is None:
        return Verified(None, sig, f"not compared: the card's results format {fmt} is "
                        "older than this certify's", False, fmt)
    from certify.report.visible import check_html  # an older, unsealed card: re-rendered

    compared, how = check_html(path.read_bytes(), result, sig, str(path))
    return Verified(result, sig, how, compared, fmt)
