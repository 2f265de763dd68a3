"""Writing a run's report: results.json (canonical), images/, card.html and card.pdf, each written
atomically."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from certify.canonical import canonical_json, script_safe_json
from certify.errors import PdfUnavailableError
from certify.images import data_uri, decode_png, image_digest, png_bytes
from certify.report.card import render_html, render_pdf
from certify.report.pades import PdfSigningKey, sign_pdf
from certify.report.sealed import seal
from certify.report.signature import Signature
from certify.results import RunResult, parse_result
from certify.rundir import atomic_write

__all__ = ["load_images", "write_report"]

if TYPE_CHECKING:
    import numpy as np
    from cryptography.hazmat.primitives.asymmetric import ec

log = logging.getLogger("certify")

IMAGES_DIR = "images"


def write_report(result: RunResult, out: Path,
                 images: Mapping[str, np.ndarray | bytes] | None = None,
                 pdf: bool = True, signature: Signature | None = None,
                 key: ec.EllipticCurvePrivateKey | None = None,
                 pdf_signer: PdfSigningKey | None = None) -> dict[str, Path]:
    """Write results.json, images/, card.html and (unless ``pdf=False``) card.pdf into ``out``.

    Where WeasyPrint cannot load its system libraries, everything but card.pdf is written and
    the returned paths have no ``"pdf"``: the caller says how to get it
    (:func:`certify.report.weasy.pdf_hint`); a card.pdf of earlier results is removed.

    ``images`` maps digests to ``[H, W, 3]`` uint8 pixels (a fresh run) or to PNG bytes (read
    back by :func:`load_images`). results.json is validated against the schema before anything
    is written. With a ``signature`` (made by ``key``) it also writes results.json.sig,
    seals card.html over its exact bytes with ``key`` (:mod:`certify.report.sealed`), embeds
    the signature in the PDF, and card.pdf gets a PAdES signature by ``pdf_signer`` (required
    with a signature: a verifier refuses a card.pdf whose signed payload says certify signed
    it but which carries no PDF signature).
    """
    if signature is not None and key is None:
        raise ValueError("a signed card.html is sealed with the signing key (key)")
    if signature is not None and pdf and pdf_signer is None:
        raise ValueError("a signed card.pdf needs the PDF signing key (pdf_signer)")
    # render everything that can fail before the first file is replaced
    payload = canonical_json(result.to_json())
    # What is written must read back under the schema; and the card shows what a verifier
    # reads back (e.g. 1.0 is written as 1), so it is rendered from the read-back result.
    result = parse_result(json.loads(payload))
    if signature is not None:
        _check_signed_bytes(signature, payload, script_safe_json(result.to_json()))
    pngs = {d: v if isinstance(v, bytes) else png_bytes(v) for d, v in (images or {}).items()}
    html = render_html(result, signature, {d: data_uri(b) for d, b in pngs.items()})
    html_bytes = html.encode("utf-8")
    if signature is not None and key is not None:
        html_bytes = seal(html_bytes, signature, key)
    pdf_bytes = None
    if pdf:
        try:
            pdf_bytes = render_pdf(html, payload, signature)
        except PdfUnavailableError as exc:
            log.debug("card.pdf not rendered: %s", exc.message)
        if pdf_bytes is not None and signature is not None and pdf_signer is not None:
            pdf_bytes = sign_pdf(pdf_bytes, pdf_signer)
    paths = {"results": out / "results.json", "html": out / "card.html"}
    atomic_write(paths["results"], payload)
    if pngs:
        (out / IMAGES_DIR).mkdir(exist_ok=True)
        for digest, data in pngs.items():
            target = out / IMAGES_DIR / f"{digest.removeprefix('sha256:')}.png"
            if not target.exists():
                atomic_write(target, data)
    sig_path = out / "results.json.sig"
    if signature is not None:
        atomic_write(sig_path, signature.to_json().encode())
        paths["signature"] = sig_path
    elif sig_path.exists():
        sig_path.unlink()  # a stale signature of other results must not sit beside them
    atomic_write(paths["html"], html_bytes)
    if pdf_bytes is not None:
        paths["pdf"] = out / "card.pdf"
        atomic_write(paths["pdf"], pdf_bytes)
    elif (out / "card.pdf").exists():
        (out / "card.pdf").unlink()  # a PDF of other results (or unsigned) must not stay
    return paths


def _check_signed_bytes(signature: Signature, payload: bytes, script: str) -> None:
    """Refuse to write a card that would not verify: the signed statement's payload digests
    must be those of the bytes about to be written (results.json and the PDF's attachment;
    the HTML card's embedded script). A statement of the older type names none."""
    import hashlib

    for key, data in (("payload", payload), ("html_payload", script.encode("utf-8"))):
        want = signature.signed.get(key)
        if want is not None and want != "sha256:" + hashlib.sha256(data).hexdigest():
            raise RuntimeError(f"the signature's {key} digest is not that of the card's "
                               "bytes: sign the results as they are written")


def load_images(out: Path) -> dict[str, bytes]:
    """The card images of a run directory (digest -> PNG bytes), each checked against the
    digest in its name; a damaged image is left out (the card then shows it missing)."""
    found: dict[str, bytes] = {}
    folder = out / IMAGES_DIR
    if not folder.is_dir():
        return found
    for f in sorted(folder.glob("*.png")):
        data = f.read_bytes()
        try:
            digest = image_digest(decode_png(data))
        except ValueError:
            digest = ""
        if digest != f"sha256:{f.stem}":
            log.warning("image %s does not match its digest; left out of the card", f.name)
            continue
        found[digest] = data
    return found
