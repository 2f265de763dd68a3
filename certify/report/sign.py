"""Signing and verifying results: ECDSA P-256 over a statement of the payload's two parts.

``results.json`` (:func:`certify.canonical.canonical_json`) has two parts, ``measurement`` and
``provenance``. The signature covers a small *statement*: the schema version and the sha256 of
each part's canonical JSON. A verifier checks the signature over the statement first (a bad
signature is reported as such, never as a changed payload), then recomputes each part's digest
from whatever it parsed (HTML, PDF attachment or results.json) and says which part changed.
The key pair is ECDSA P-256 (PEM, PKCS#8 / SubjectPublicKeyInfo), which cosign-style tooling
reads too.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from certify.canonical import canonical_json, script_safe_json
from certify.errors import UsageError, VerificationError

ALGORITHM = "ecdsa-p256-sha256"


STATEMENT_TYPE = "certify.signed-results/1"
PARTS = ("measurement", "provenance")


def part_digest(doc: dict[str, Any], part: str) -> str:
    """sha256 of one part's canonical JSON."""
    return "sha256:" + hashlib.sha256(canonical_json(doc.get(part))).hexdigest()


def statement(doc: dict[str, Any]) -> dict[str, str]:
    """What a signature covers: the schema version and the digest of each part."""
    return {"type": STATEMENT_TYPE, "schema": str(doc.get("schema")),
            **{p: part_digest(doc, p) for p in PARTS}}


@dataclass(frozen=True)
class Signature:
    """A detached signature over a statement, and the fingerprint of the key that made it."""

    algorithm: str
    value: str  # base64 DER
    key_fingerprint: str
    signed: dict[str, str]

    def to_json(self) -> str:
        """The ``results.json.sig`` document."""
        return json.dumps({"algorithm": self.algorithm, "signature": self.value,
                           "key_fingerprint": self.key_fingerprint, "signed": self.signed},
                          indent=2, sort_keys=True) + "\n"

    @staticmethod
    def from_json(text: str, where: str) -> Signature:
        """Parse a signature document, or raise VerificationError naming ``where``."""
        try:
            d = json.loads(text)
            signed = d["signed"]
            if not isinstance(signed, dict) or not all(
                    isinstance(v, str) for v in signed.values()):
                raise TypeError("signed")
            return Signature(str(d["algorithm"]), str(d["signature"]),
                             str(d["key_fingerprint"]), dict(signed))
        except (ValueError, KeyError, TypeError):
            raise VerificationError(f"{where}: the signature is malformed or from an older "
                                    "certify", hint="re-sign with `certify sign`") from None


def fingerprint(public_key: ec.EllipticCurvePublicKey) -> str:
    """sha256 of the DER SubjectPublicKeyInfo, as ``sha256:<hex>``."""
    der = public_key.public_bytes(serialization.Encoding.DER,
                                  serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def keygen(out_dir: Path, name: str = "certify", passphrase: bytes | None = None
           ) -> tuple[Path, Path]:
    """Write ``NAME.key`` (mode 0600, optionally encrypted) and ``NAME.pub`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    key_path, pub_path = out_dir / f"{name}.key", out_dir / f"{name}.pub"
    for p in (key_path, pub_path):
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


def sign(results: dict[str, Any], key: ec.EllipticCurvePrivateKey) -> Signature:
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


def extract(path: Path) -> tuple[dict[str, Any], Signature, bool]:
    """The results document, its signature, and whether its bytes are in canonical form.

    A value changed after signing fails the signature; a byte changed without changing any
    value (reformatting) leaves the signature valid but the form non-canonical, and
    :func:`verify_file` refuses that too.
    """
    if not path.is_file():
        raise UsageError(f"{path} not found", hint="pass card.html, card.pdf or results.json")
    suffix = path.suffix.lower()
    if suffix == ".json":
        sig_path = path.with_name(path.name + ".sig")
        if not sig_path.is_file():
            raise VerificationError(f"{path} has no detached signature {sig_path.name}",
                                    hint="sign the run with `certify sign`")
        raw = path.read_bytes()
        doc = _parse(raw.decode("utf-8", errors="replace"), path)
        return (doc, Signature.from_json(sig_path.read_text(encoding="utf-8"), str(sig_path)),
                raw == canonical_json(doc))
    if suffix in (".html", ".htm"):
        parts = embedded_parts(path.read_text(encoding="utf-8", errors="replace"))
        if "results" not in parts:
            raise VerificationError(f"{path} carries no certify results", hint="not a card?")
        if "signature" not in parts or parts["signature"].strip() in ("", "null"):
            raise VerificationError(f"{path} is not signed", hint="sign with `certify sign`")
        doc = _parse(parts["results"], path)
        return (doc, Signature.from_json(parts["signature"], str(path)),
                parts["results"] == script_safe_json(doc))
    if suffix == ".pdf":
        from pypdf import PdfReader
        from pypdf.errors import PdfReadError

        try:
            files = PdfReader(str(path)).attachments
        except (PdfReadError, OSError, ValueError) as exc:
            raise VerificationError(f"{path} is not a readable PDF ({exc})",
                                    hint="is the file complete?") from None
        if "results.json" not in files:
            raise VerificationError(f"{path} carries no results.json", hint="not a card?")
        if "results.json.sig" not in files:
            raise VerificationError(f"{path} is not signed", hint="sign with `certify sign`")
        raw = files["results.json"][0]
        doc = _parse(raw.decode("utf-8", errors="replace"), path)
        return (doc, Signature.from_json(files["results.json.sig"][0].decode("utf-8"), str(path)),
                raw == canonical_json(doc))
    raise UsageError(f"cannot verify a {suffix or 'suffix-less'} file",
                     hint="pass card.html, card.pdf or results.json")


def _parse(text: str, where: Path) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError:
        raise VerificationError(f"{where}: the embedded results are not valid JSON",
                                hint="the file was altered") from None
    if not isinstance(doc, dict):
        raise VerificationError(f"{where}: the embedded results are not a document",
                                hint="the file was altered")
    return doc


def verify(results: dict[str, Any], sig: Signature, key: ec.EllipticCurvePublicKey) -> None:
    """Raise VerificationError unless ``sig`` is ``key``'s valid signature of ``results``.

    The signature is checked over its statement first, so a damaged signature is reported as
    such; then each part's digest is compared, and the message names the part that changed.
    """
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
    if sig.signed.get("type") != STATEMENT_TYPE:
        raise VerificationError(f"unknown signed statement type {sig.signed.get('type')!r}",
                                hint="verify with the certify version that signed it")
    if sig.signed.get("schema") != results.get("schema"):
        raise VerificationError(
            f"the payload's schema {results.get('schema')!r} is not the signed "
            f"{sig.signed.get('schema')!r}", hint="do not trust this card")
    changed = [p for p in PARTS if sig.signed.get(p) != part_digest(results, p)]
    if changed:
        raise VerificationError(
            f"the {' and the '.join(changed)} changed after signing (the signature is valid "
            "for other content)", hint="do not trust this card")


@dataclass(frozen=True)
class Verified:
    """What ``certify verify`` established about a file."""

    result: Any  # certify.results.RunResult
    signature: Signature
    #: How the visible content was checked (``None`` for results.json, which has none).
    visible: str | None


def verify_file(path: Path, key: ec.EllipticCurvePublicKey) -> Verified:
    """Verify a card or results.json; raise VerificationError (or SchemaError) unless the
    signature, each signed part, the schema and (for cards) the visible content check out."""
    from certify.results import parse_result

    doc, sig, canonical = extract(path)
    verify(doc, sig, key)
    if not canonical:
        raise VerificationError(f"{path}: the signed values are intact but the payload's bytes "
                                "were reformatted after signing",
                                hint="use the file as certify wrote it")
    result = parse_result(doc)
    visible = None
    suffix = path.suffix.lower()
    if suffix in (".html", ".htm"):
        from certify.report.visible import check_html

        visible = check_html(path.read_text(encoding="utf-8"), result, sig, str(path))
    elif suffix == ".pdf":
        from certify.report.visible import check_pdf

        visible = check_pdf(path.read_bytes(), canonical_json(doc), result, sig, str(path))
    return Verified(result, sig, visible)
