"""Forged cards, each refused by ``certify verify`` and by a real service's ``POST /api/v1/verify``
(issue 38): what an attacker does to a signed card.pdf (vector strokes or a white box over a
figure, an incremental update, trailing bytes, a changed padding digit, a header byte, another
card's pages, a re-signature with another key, a swapped payload) and to card.html (a swapped
payload, a CSS-only change). poppler's ``pdfsig`` (which always exits 0: its text is read)
reports every PDF forgery as invalid, not covering the whole document, or untrusted given an
NSS database that trusts the genuine certificate; the genuine cards pass both tools.

The genuine card is a copy of the session's small demo run signed with ``certify sign`` (one
PDF rendering); the other card is a tiny ``certify run`` signed with the same key.
"""

from __future__ import annotations

import io
import logging
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pdf_tools import CERTUTIL, PDFSIG, accepted_by_pdfsig, pdfsig, trusting_nss
from pypdf import PdfReader, PdfWriter
from pypdf.generic import ArrayObject, DecodedStreamObject, NameObject
from service_fixture import Service

from certify.errors import CARD_WRITTEN_CODES

import builders

pytestmark = pytest.mark.e2e

needs_nss = pytest.mark.skipif(PDFSIG is None or CERTUTIL is None,
                               reason="poppler-utils and libnss3-tools (scripts/setup.sh --test)")


# --- the genuine cards ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The genuine key pair (with its certificate) and an attacker's."""
    genuine, other = tmp_path_factory.mktemp("keys"), tmp_path_factory.mktemp("attacker")
    for d in (genuine, other):
        assert builders.run_cli("keygen", "--out", d).returncode == 0
    return {"key": genuine / "certify.key", "pub": genuine / "certify.pub",
            "crt": genuine / "certify.crt", "other_key": other / "certify.key"}


@pytest.fixture(scope="module")
def genuine(demo_small_run: Path, keys: dict[str, Path],
            tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small demo run, signed afterwards (card.pdf rendered and PDF-signed once)."""
    out = tmp_path_factory.mktemp("genuine") / "card"
    shutil.copytree(demo_small_run, out)
    proc = builders.run_cli("sign", out, "--key", keys["key"])
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def other_card(keys: dict[str, Path], model_path: Path, npz_path: Path, clean_suite: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another genuine card, signed with the same key (a tiny run's)."""
    out = tmp_path_factory.mktemp("other") / "card"
    proc = builders.run_cli("run", model_path, "--suite", clean_suite, "--data", npz_path,
                            "--samples", "40", "--out", out, "--sign-key", keys["key"])
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    return out


@pytest.fixture(scope="module")
def service(keys: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """One ``certify serve`` that signs (and verifies) with the genuine key; no workers."""
    svc = Service(tmp_path_factory.mktemp("svc") / "home", "--workers", "0", "--sign-key",
                  str(keys["key"])).start()
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def nss(keys: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An NSS database that trusts the genuine certificate."""
    return trusting_nss(tmp_path_factory.mktemp("nss"), keys["crt"])


# --- forging ---------------------------------------------------------------------------------

def _sig_hole(data: bytes) -> tuple[int, int]:
    """Offsets of the signature's /Contents hex string (``<`` and just after ``>``)."""
    m = re.search(rb"/ByteRange\s*\[\s*0\s+(\d+)\s+(\d+)\s+\d+\s*\]", data)
    assert m is not None
    return int(m.group(1)), int(m.group(2))


def _add_stream(writer: PdfWriter, ops: bytes) -> None:
    """Append a content stream to page 1 (drawn over what is there)."""
    page = writer.pages[0]
    stream = DecodedStreamObject()
    stream.set_data(ops)
    ref = writer._add_object(stream)
    contents: Any = page["/Contents"]
    drawn = list(contents) if isinstance(contents.get_object(), list) else [contents]
    page[NameObject("/Contents")] = ArrayObject([*drawn, ref])


WHITE_BOX = b"q 1 1 1 rg 60 560 200 60 re f Q\n"


def _vector_digits() -> bytes:
    """A white box and "45.0%" drawn as stroked paths (no text object: nothing to extract)."""
    strokes = [  # one path per glyph, in a 20 x 30 cell
        b"0 30 m 0 15 l 20 15 l 20 30 m 20 0 l",  # 4
        b"20 30 m 0 30 l 0 15 l 20 15 l 20 0 l 0 0 l",  # 5
        b"10 0 m 12 0 l 12 2 l 10 2 l h",  # .
        b"0 0 m 20 0 l 20 30 l 0 30 l h",  # 0
        b"0 0 m 20 30 l 2 28 m 5 28 l 15 2 m 18 2 l",  # %
    ]
    ops = [WHITE_BOX, b"q 0 0 0 RG 2.5 w"]
    for i, glyph in enumerate(strokes):
        ops.append(b"q 1 0 0 1 %d 575 cm %s S Q" % (70 + 32 * i, glyph))
    ops.append(b"Q\n")
    return b"\n".join(ops)


def vector_strokes(card: Path, other: Path) -> bytes:
    """Vector strokes over a figure: an extra content stream on page 1, file rewritten."""
    w = PdfWriter(clone_from=PdfReader(str(card / "card.pdf")))
    _add_stream(w, _vector_digits())
    buf = io.BytesIO()
    w.write(buf)
    return buf.getvalue()


def white_box(card: Path, other: Path) -> bytes:
    """A white box over a figure, appended as an incremental update (the signed bytes stay)."""
    w = PdfWriter(str(card / "card.pdf"), incremental=True)
    _add_stream(w, WHITE_BOX)
    buf = io.BytesIO()
    w.write(buf)
    return buf.getvalue()


def incremental_update(card: Path, other: Path, attacker_key: Path | None = None) -> bytes:
    """An incremental update that draws over page 1 and is signed by another key on top."""
    from certify.report.pades import PdfSigningKey, sign_pdf
    from certify.report.sign import load_private_key

    w = PdfWriter(str(card / "card.pdf"), incremental=True)
    _add_stream(w, _vector_digits())
    buf = io.BytesIO()
    w.write(buf)
    assert attacker_key is not None
    key = load_private_key(attacker_key)
    data = buf.getvalue()
    # pyHanko names its field "certify": the attacker's is another field
    import certify.report.pades as pades

    field, pades.FIELD_NAME = pades.FIELD_NAME, "certify-2"
    try:
        return sign_pdf(data, PdfSigningKey.for_key_file(attacker_key, key))
    finally:
        pades.FIELD_NAME = field


def trailing_bytes(card: Path, other: Path) -> bytes:
    """Bytes after the signed file (a PDF reader ignores them)."""
    return (card / "card.pdf").read_bytes() + b"\n% 45.0%\n"


def padding_digit(card: Path, other: Path) -> bytes:
    """One digit of the signature's zero padding changed (pyHanko calls it intact)."""
    data = bytearray((card / "card.pdf").read_bytes())
    _, end = _sig_hole(bytes(data))
    assert data[end - 2:end - 1] == b"0"
    data[end - 2:end - 1] = b"1"
    return bytes(data)


def header_byte(card: Path, other: Path) -> bytes:
    """The %PDF- header's version changed (one byte, inside the signed range)."""
    data = (card / "card.pdf").read_bytes()
    assert data.startswith(b"%PDF-1.")
    return data[:7] + (b"6" if data[7:8] != b"6" else b"5") + data[8:]


def _attachments(path: Path) -> dict[str, bytes]:
    return {k: v[0] for k, v in PdfReader(str(path)).attachments.items()}


def _with_attachments(pages_of: Path, files: dict[str, bytes]) -> bytes:
    w = PdfWriter(clone_from=PdfReader(str(pages_of)))
    names: Any = w._root_object["/Names"]
    names.pop("/EmbeddedFiles", None)
    for name in ("results.json", "results.json.sig"):
        w.add_attachment(name, files[name])
    buf = io.BytesIO()
    w.write(buf)
    return buf.getvalue()


def pages_from_another_card(card: Path, other: Path) -> bytes:
    """Another card's pages carrying this card's signed attachments."""
    return _with_attachments(other / "card.pdf", _attachments(card / "card.pdf"))


def _unsigned_pages(pdf: Path) -> PdfWriter:
    """A new PDF of ``pdf``'s pages without its signature field (what a re-signer makes
    first): only the pages are copied, their signature widgets left out."""
    reader = PdfReader(str(pdf))
    w = PdfWriter()
    for page in reader.pages:
        annots = page.get("/Annots")
        if annots is not None:
            keep = [a for a in annots if a.get_object().get("/FT") != "/Sig"]
            page[NameObject("/Annots")] = ArrayObject(keep)
        w.add_page(page)
    return w


def pages_from_another_card_unsigned(card: Path, other: Path) -> bytes:
    """Another card's pages, its PDF signature removed, with this card's attachments."""
    w = _unsigned_pages(other / "card.pdf")
    files = _attachments(card / "card.pdf")
    for name in ("results.json", "results.json.sig"):
        w.add_attachment(name, files[name])
    buf = io.BytesIO()
    w.write(buf)
    assert b"/ByteRange" not in buf.getvalue()
    return buf.getvalue()


def resigned(card: Path, other: Path, attacker_key: Path | None = None) -> bytes:
    """The card's pages edited (a white box and new digits), re-signed with another key."""
    from certify.report.pades import PdfSigningKey, sign_pdf
    from certify.report.sign import load_private_key

    w = _unsigned_pages(card / "card.pdf")
    files = _attachments(card / "card.pdf")
    for name in ("results.json", "results.json.sig"):
        w.add_attachment(name, files[name])
    _add_stream(w, _vector_digits())
    buf = io.BytesIO()
    w.write(buf)
    assert b"/ByteRange" not in buf.getvalue()
    assert attacker_key is not None
    return sign_pdf(buf.getvalue(), PdfSigningKey.for_key_file(
        attacker_key, load_private_key(attacker_key)))


def payload_swap_pdf(card: Path, other: Path) -> bytes:
    """This card's pages with another genuine card's payload and signature (same key)."""
    return _with_attachments(card / "card.pdf", _attachments(other / "card.pdf"))


def _script(html: str, part: str) -> str:
    m = re.search(rf'<script type="application/json" id="certify-{part}">(.*?)</script>', html,
                  flags=re.S)
    assert m is not None
    return m.group(1)


def payload_swap_html(card: Path, other: Path) -> bytes:
    """This card's HTML with another genuine card's embedded payload and signature."""
    html = (card / "card.html").read_text(encoding="utf-8")
    theirs = (other / "card.html").read_text(encoding="utf-8")
    for part in ("results", "signature"):
        html = html.replace(_script(html, part), _script(theirs, part))
    return html.encode("utf-8")


def css_only(card: Path, other: Path) -> bytes:
    """A style changed (FAIL badges drawn in the PASS colour, say): no text, no image."""
    html = (card / "card.html").read_text(encoding="utf-8")
    style = re.search(r"<style>(.*?)</style>", html, flags=re.S)
    assert style is not None
    css = style.group(1)
    edited = css.replace("}", "} .forged{}", 1)
    assert edited != css
    return html.replace(css, edited).encode("utf-8")


def seal_removed(card: Path, other: Path) -> bytes:
    """The card's seal taken out of its signature slot (the results signature left inline, as
    cards were before they were sealed), so that it would be checked the older way."""
    import json

    html = (card / "card.html").read_bytes()
    slot_open = b'<script type="application/json" id="certify-signature">'
    at = html.rfind(slot_open) + len(slot_open)
    end = html.find(b"</script>", at)
    doc = json.loads(html[at:end])
    doc.pop("html")
    return html[:at] + json.dumps(doc, indent=2).encode() + html[end:]


#: name: (forge, file suffix, what certify says, whether pdfsig reads it)
FORGERIES: dict[str, tuple[Callable[..., bytes], str, str]] = {
    "vector_strokes": (vector_strokes, ".pdf", "does not cover the whole file"),
    "white_box": (white_box, ".pdf", "follow what it covers"),
    "incremental_update": (incremental_update, ".pdf", "holds 2 signatures"),
    "trailing_bytes": (trailing_bytes, ".pdf", "follow what it covers"),
    "padding_digit": (padding_digit, ".pdf", "padding was changed"),
    "header_byte": (header_byte, ".pdf", "not the signed ones"),
    "pages_from_another_card": (pages_from_another_card, ".pdf",
                                "does not cover the whole file"),
    "pages_from_another_card_unsigned": (pages_from_another_card_unsigned, ".pdf",
                                         "carries no PDF signature"),
    "resigned_with_another_key": (resigned, ".pdf", "not by the given key"),
    "payload_swap_pdf": (payload_swap_pdf, ".pdf", "does not cover the whole file"),
    "payload_swap_html": (payload_swap_html, ".html", "changed after signing"),
    "css_only": (css_only, ".html", "changed after signing"),
    "seal_removed": (seal_removed, ".html", "its seal was removed"),
}


def forge(name: str, card: Path, other: Path, keys: dict[str, Path], folder: Path) -> Path:
    fn, suffix, _ = FORGERIES[name]
    extra = {"attacker_key": keys["other_key"]} if name in (
        "incremental_update", "resigned_with_another_key") else {}
    path = folder / f"card{suffix}"
    path.write_bytes(fn(card, other, **extra))
    return path


# --- the tests -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(FORGERIES))
def test_forgery_is_refused_by_verify_and_by_the_service(
        name: str, genuine: Path, other_card: Path, keys: dict[str, Path], service: Service,
        tmp_path: Path) -> None:
    path = forge(name, genuine, other_card, keys, tmp_path)
    proc = builders.run_cli("verify", path, "--pubkey", keys["pub"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert FORGERIES[name][2] in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    with path.open("rb") as f:
        r = service.post("/verify", files={"file": (path.name, f)})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["valid"] is False, doc
    assert FORGERIES[name][2] in doc["reason"], doc


def test_genuine_cards_verify_in_certify_and_in_the_service(
        genuine: Path, other_card: Path, keys: dict[str, Path], service: Service) -> None:
    """The control: what the forgeries were made from passes both."""
    for card in (genuine, other_card):
        for name in ("card.pdf", "card.html", "results.json"):
            proc = builders.run_cli("verify", card / name, "--pubkey", keys["pub"])
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert proc.stdout.startswith(f"OK: {card / name} is intact")
        for name in ("card.pdf", "card.html"):
            with (card / name).open("rb") as f:
                doc = service.post("/verify", files={"file": (name, f)}).json()
            assert doc["valid"] is True, doc
    pdf = builders.run_cli("verify", genuine / "card.pdf", "--pubkey", keys["pub"]).stdout
    assert "visible content: the PDF signature covers the whole file" in pdf


@needs_nss
def test_pdfsig_refuses_each_pdf_forgery_and_trusts_the_genuine_cards(
        genuine: Path, other_card: Path, keys: dict[str, Path], nss: Path,
        tmp_path: Path) -> None:
    prefix = _fingerprint(keys["pub"]).split(":", 1)[1][:8]
    for card in (genuine, other_card):
        sigs = pdfsig(card / "card.pdf", nss)
        assert len(sigs) == 1 and accepted_by_pdfsig(sigs), sigs
        # the signer's name tells keys apart: it carries the fingerprint's prefix (issue 50)
        assert sigs[0]["Signer Certificate Common Name"] == f"certify signing key {prefix}", sigs
    seen = {}
    for name, (_, suffix, _) in FORGERIES.items():
        if suffix != ".pdf":
            continue
        folder = tmp_path / name
        folder.mkdir()
        sigs = pdfsig(forge(name, genuine, other_card, keys, folder), nss)
        seen[name] = sigs
        assert not accepted_by_pdfsig(sigs), (name, sigs)
    # what pdfsig says, forgery by forgery
    assert seen["resigned_with_another_key"][0]["Signature Validation"] == "Signature is Valid."
    assert seen["resigned_with_another_key"][0]["Certificate Validation"] \
        == "Certificate issuer isn't Trusted."
    attacker = _fingerprint(keys["other_key"].with_suffix(".pub")).split(":", 1)[1][:8]
    assert seen["resigned_with_another_key"][0]["Signer Certificate Common Name"] \
        == f"certify signing key {attacker}" != f"certify signing key {prefix}"
    for name in ("white_box", "trailing_bytes", "incremental_update"):
        assert seen[name][0]["total"] == "no", (name, seen[name])
    assert seen["header_byte"][0]["Signature Validation"] != "Signature is Valid."


# --- cards the verifier cannot compare, and the results formats -------------------------------

def _old_signature(doc: dict, key_path: Path) -> str:
    """A ``certify.signed-results/1`` signature of ``doc``, as certify wrote before issue 38
    (part digests only)."""
    import base64

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    from certify.canonical import canonical_json
    from certify.report.sign import (
        ALGORITHM,
        PARTS,
        Signature,
        fingerprint,
        load_private_key,
        part_digest,
    )

    key = load_private_key(key_path)
    signed = {"type": "certify.signed-results/1", "schema": str(doc["schema"]),
              **{p: part_digest(doc, p) for p in PARTS}}
    der = key.sign(canonical_json(signed), ec.ECDSA(hashes.SHA256()))
    return Signature(ALGORITHM, base64.b64encode(der).decode(), fingerprint(key.public_key()),
                     signed).to_json()


def test_cards_whose_visible_layer_cannot_be_compared_exit_8(
        genuine: Path, keys: dict[str, Path], service: Service, tmp_path: Path) -> None:
    """A card.pdf from before PDF signatures (statement /1, no PDF signature) and a card.html
    from another renderer: the signature and the payload check out, the visible layer is not
    compared, and verify says so with exit 8. The service never calls such a card valid
    (issue 50): its API answers ``valid: false`` in the state ``visible_not_checked`` with the
    reason, and its page shows "signature valid, visible content not checked" in amber, never
    the green VALID. The same payload's results.json verifies (exit 0): it has no visible
    layer."""
    import json

    import requests

    from certify.errors import EXIT_VISIBLE_NOT_COMPARED
    from certify.results import parse_result

    payload = (genuine / "results.json").read_bytes()
    old_sig = _old_signature(json.loads(payload), keys["key"])
    old = tmp_path / "old"
    old.mkdir()
    (old / "results.json").write_bytes(payload)
    (old / "results.json.sig").write_text(old_sig)
    w = _unsigned_pages(genuine / "card.pdf")
    w.add_attachment("results.json", payload)
    w.add_attachment("results.json.sig", old_sig.encode())
    with (old / "card.pdf").open("wb") as f:
        w.write(f)
    # another renderer: the provenance names another certify (signed with the payload)
    result = parse_result(json.loads(payload))
    renderer = {**result.provenance.renderer, "certify": "0.0.9", "code": "sha256:" + "0" * 64}
    result = result.model_copy(update={"provenance": result.provenance.model_copy(
        update={"renderer": renderer})})
    other = tmp_path / "other-renderer"
    other.mkdir()
    # as cards were before they were sealed over their bytes (issue 50): the signature inline
    (other / "card.html").write_bytes(_unsealed_card(result, genuine, keys["key"]))
    for path, why in ((old / "card.pdf", "carries no PDF signature (made before certify "
                                         "signed PDFs)"),
                      (other / "card.html", "not compared: the card was rendered by certify "
                                            "0.0.9")):
        proc = builders.run_cli("verify", path, "--pubkey", keys["pub"])
        assert proc.returncode == EXIT_VISIBLE_NOT_COMPARED, proc.stdout + proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[0] == (f"{path}: the signature and the signed payload are intact (signed "
                            f"by {_fingerprint(keys['pub'])})")
        assert why in proc.stdout and "verdict:" in proc.stdout
        assert lines[-1].startswith("exit 8: the visible layer was not compared")
        with path.open("rb") as f:
            doc = service.post("/verify", files={"file": (path.name, f)}).json()
        assert doc["valid"] is False and doc["state"] == "visible_not_checked", doc
        assert doc["signature_valid"] is True and doc["visible_compared"] is False, doc
        assert "visible content was not compared" in doc["reason"] and why in doc["reason"]
        with path.open("rb") as f:
            page = requests.post(f"{service.url}/verify", files={"file": (path.name, f)},
                                 timeout=60)
        assert page.status_code == 200
        assert "SIGNATURE VALID, VISIBLE CONTENT NOT CHECKED" in page.text
        assert 'class="verdict PASS">VALID<' not in page.text and "verdict WARN" in page.text
    proc = builders.run_cli("verify", old / "results.json", "--pubkey", keys["pub"])
    assert proc.returncode == 0 and "payload:" not in proc.stdout, proc.stdout + proc.stderr


def _unsealed_card(result: Any, images_of: Path, key_path: Path) -> bytes:
    """A card.html of ``result`` signed as certify signed cards before issue 50: the signature
    document inline in its script, no byte-range signature (what 47b4ef2 wrote)."""
    import base64

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    from certify.canonical import canonical_json
    from certify.images import data_uri
    from certify.report.card import render_html, unsealed_form
    from certify.report.sign import ALGORITHM, Signature, fingerprint, load_private_key, statement
    from certify.report.write import load_images

    key = load_private_key(key_path)
    # the statement as it was before sealing: no html_seal
    signed = {k: v for k, v in statement(result.to_json()).items() if k != "html_seal"}
    der = key.sign(canonical_json(signed), ec.ECDSA(hashes.SHA256()))
    signature = Signature(ALGORITHM, base64.b64encode(der).decode(),
                          fingerprint(key.public_key()), signed)
    images = {d: data_uri(b) for d, b in load_images(images_of).items()}
    return unsealed_form(render_html(result, signature, images), signature).encode("utf-8")


def _fingerprint(pub: Path) -> str:
    from certify.report.sign import fingerprint, load_public_key

    return fingerprint(load_public_key(pub))


def test_sign_refuses_an_older_or_unreadable_results_format(keys: dict[str, Path],
                                                            tmp_path: Path) -> None:
    """A results.json from an older release is refused with a clear error and a hint, never
    an internal error (a certify.results/2 file from before issue 29 crashed `certify sign`,
    whose hint named a --debug flag that `sign` does not have); nothing is written."""
    import json

    from certify.errors import EXIT_USAGE

    previous = Path(__file__).parent / "data" / "previous_release" / "results.json"
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(previous, run / "results.json")
    proc = builders.run_cli("sign", run, "--key", keys["key"])
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert "older results format 'certify.results/2'" in proc.stderr
    assert "rerun the suite with this certify" in proc.stderr
    assert "internal error" not in proc.stderr and "--debug" not in proc.stderr
    assert sorted(p.name for p in run.iterdir()) == ["results.json"]
    # labelled with this certify's format but not readable by it: refused the same way
    from certify.canonical import canonical_json
    from certify.results import SCHEMA

    doc = json.loads(previous.read_text())
    doc["schema"] = SCHEMA
    (run / "results.json").write_bytes(canonical_json(doc))
    proc = builders.run_cli("sign", run, "--key", keys["key"])
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert "cannot be" in proc.stderr and "rerun the suite with this certify" in proc.stderr
    assert sorted(p.name for p in run.iterdir()) == ["results.json"]


def test_an_internal_error_s_hint_names_a_way_the_command_has(
        monkeypatch: pytest.MonkeyPatch, keys: dict[str, Path], tmp_path: Path) -> None:
    """`sign` has no --debug: its hint names CERTIFY_DEBUG=1, which shows the traceback."""
    import certify.api

    def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("a planted bug")

    monkeypatch.setattr(certify.api, "sign_run", broken)
    proc = builders.run_cli("sign", tmp_path, "--key", keys["key"])
    assert proc.returncode == 70 and "a planted bug" in proc.stderr
    assert "CERTIFY_DEBUG=1" in proc.stderr and "--debug" not in proc.stderr
    proc = builders.run_cli("sign", tmp_path, "--key", keys["key"],
                            env={"CERTIFY_DEBUG": "1"})
    assert proc.returncode == 70 and "Traceback" in proc.stderr


def test_keygen_writes_a_self_issued_ca_certificate_for_the_key(keys: dict[str, Path],
                                                               tmp_path: Path) -> None:
    """NAME.crt certifies NAME.key's public key, as its own CA; a key without one signs with
    a certificate made on the fly (a log line says so); one for another key is refused."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from certify.errors import EXIT_USAGE

    cert = x509.load_pem_x509_certificate(keys["crt"].read_bytes())
    spki = (serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert cert.public_key().public_bytes(*spki) == keys["pub"].read_bytes()
    assert cert.issuer == cert.subject
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature and usage.content_commitment and usage.key_cert_sign
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days > 3650
    # a key from before certificates (no .crt), and a .crt of another key
    from certify.report.pades import PdfSigningKey
    from certify.report.sign import load_private_key

    bare = tmp_path / "bare.key"
    shutil.copy(keys["key"], bare)
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("certify").addHandler(handler)
    try:
        made = PdfSigningKey.for_key_file(bare, load_private_key(bare)).certificate
    finally:
        logging.getLogger("certify").removeHandler(handler)
    assert made.public_key().public_bytes(*spki) == keys["pub"].read_bytes()
    assert any("no certificate bare.crt beside the signing key" in m for m in said), said
    # the service makes the certificate beside a key that has none (a home from before)
    from certify.errors import UsageError
    from certify.service.keys import ensure_certificate

    pem = ensure_certificate(bare, load_private_key(bare))
    assert bare.with_suffix(".crt").read_bytes() == pem == ensure_certificate(
        bare, load_private_key(bare))
    assert x509.load_pem_x509_certificate(pem).public_key().public_bytes(*spki) \
        == keys["pub"].read_bytes()
    shutil.copy(keys["other_key"].with_suffix(".crt"), bare.with_suffix(".crt"))
    proc = builders.run_cli("sign", tmp_path / "no-run", "--key", bare)
    assert proc.returncode == EXIT_USAGE and "is for key" in proc.stderr, proc.stderr
    with pytest.raises(UsageError, match="is for key"):
        ensure_certificate(bare, load_private_key(bare))


# --- card.html sealed over its exact bytes (issue 50) -----------------------------------------

def _tamper_text(html: bytes) -> bytes:
    """The card's visible verdict word changed (outside the embedded JSON)."""
    for a, b in ((b">PASS<", b">FAIL<"), (b">FAIL<", b">PASS<"), (b">WARN<", b">PASS<")):
        at = html.find(a)
        if at >= 0:
            return html[:at] + b + html[at + len(a):]
    raise AssertionError("no verdict word in the card")


def test_a_sealed_card_verifies_after_an_upgrade_and_tampering_is_refused_before_and_after(
        genuine: Path, keys: dict[str, Path], service: Service, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """card.html is signed over its exact bytes: nothing is rendered to check it, so a later
    certify (another code digest) verifies the untouched card and refuses a tampered one
    exactly as the certify that signed it does. The service is a different build from the
    card's renderer too: a card whose signed provenance names another renderer."""
    import json

    from certify.report import card as card_module
    from certify.report.sign import load_private_key, sign
    from certify.report.write import load_images, write_report
    from certify.results import parse_result

    html = (genuine / "card.html").read_bytes()
    tampered = tmp_path / "tampered" / "card.html"
    tampered.parent.mkdir()
    tampered.write_bytes(_tamper_text(html))
    result = parse_result(json.loads((genuine / "results.json").read_bytes()))
    renderer = {**result.provenance.renderer, "certify": "0.0.9", "code": "sha256:" + "0" * 64}
    assert not card_module.same_renderer(renderer)
    old = result.model_copy(update={"provenance": result.provenance.model_copy(
        update={"renderer": renderer})})
    other = tmp_path / "other-renderer"
    other.mkdir()
    key = load_private_key(keys["key"])
    write_report(old, other, load_images(genuine), pdf=False, signature=sign(old.to_json(), key),
                 key=key)
    other_tampered = tmp_path / "other-tampered" / "card.html"
    other_tampered.parent.mkdir()
    other_tampered.write_bytes(_tamper_text((other / "card.html").read_bytes()))

    def check(upgraded: bool) -> None:
        for path in (genuine / "card.html", other / "card.html"):
            proc = builders.run_cli("verify", path, "--pubkey", keys["pub"])
            assert proc.returncode == 0, (upgraded, proc.stdout + proc.stderr)
            assert "visible content: the signature covers the card's exact bytes" in proc.stdout
        for path in (tampered, other_tampered):
            proc = builders.run_cli("verify", path, "--pubkey", keys["pub"])
            assert proc.returncode == 1, (upgraded, proc.stdout + proc.stderr)
            assert "changed after signing" in proc.stderr and "edited" in proc.stderr

    check(upgraded=False)
    # an upgrade of certify: another code digest (a comment added to one .py file is enough)
    monkeypatch.setattr(card_module, "code_digest", lambda: "sha256:" + "1" * 64)
    assert not card_module.same_renderer(dict(result.provenance.renderer))
    check(upgraded=True)
    for path, valid in ((other / "card.html", True), (other_tampered, False),
                        (tampered, False)):
        with path.open("rb") as f:
            doc = service.post("/verify", files={"file": (path.name, f)}).json()
        assert doc["valid"] is valid, doc
        if valid:
            assert doc["visible_compared"] is True and doc["state"] == "valid", doc
        else:
            assert "changed after signing" in doc["reason"], doc


def test_ordinary_handling_of_a_sealed_card_is_diagnosed(genuine: Path, keys: dict[str, Path],
                                                        tmp_path: Path) -> None:
    """CRLF line endings, a byte-order mark and appended bytes are refused, each with what
    would verify; markup in the signature slot, a second slot appended and a slot moved are
    refused."""
    html = (genuine / "card.html").read_bytes()
    slot_open = b'<script type="application/json" id="certify-signature">'
    at = html.rfind(slot_open) + len(slot_open)
    end = html.find(b"</script>", at)
    cases = {
        "crlf": (html.replace(b"\n", b"\r\n"), "would verify with LF line endings"),
        "bom": (b"\xef\xbb\xbf" + html, "would verify without the byte-order mark"),
        "bom_crlf": (b"\xef\xbb\xbf" + html.replace(b"\n", b"\r\n"),
                     "would verify with LF line endings and without the byte-order mark"),
        "appended": (html + b"\n", "would verify without the 1 byte added after its signed end"),
        "markup_in_slot": (html[:end - 7] + b"<b>x</b" + html[end - 6:],
                           "the signature slot holds more than the signature"),
        "second_slot": (html + slot_open + html[at:end] + b"</script>",
                        "bytes added after its signed end"),
        "slot_moved_up": (html[:at - len(slot_open)] + html[end + 9:] .replace(
            b"</body>", slot_open + html[at:end] + b"</script></body>", 1),
            "its bytes changed after signing"),
    }
    for name, (data, says) in cases.items():
        path = tmp_path / f"{name}.html"
        path.write_bytes(data)
        proc = builders.run_cli("verify", path, "--pubkey", keys["pub"])
        assert proc.returncode == 1, (name, proc.stdout + proc.stderr)
        assert says in proc.stderr, (name, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_verifying_imports_no_engine_and_renders_nothing(genuine: Path, keys: dict[str, Path]
                                                        ) -> None:
    """``certify verify`` of card.pdf and of card.html in a fresh interpreter imports no
    torch, onnxruntime, kornia, scikit-image or WeasyPrint, nothing that renders a card
    (jinja2, matplotlib, certify's card and check modules), and no pypdf (a signed card.pdf's
    attachments are read by certify's small reader)."""
    import subprocess
    import sys

    heavy = ("torch", "onnxruntime", "kornia", "skimage", "weasyprint", "jinja2", "matplotlib",
             "certify.report.card", "certify.report.visible", "certify.checks", "certify.engine",
             "certify.models", "pypdf")
    code = ("import sys\nfrom certify.cli import main\nfolder, pub = sys.argv[1:3]\n"
            "for name in ('card.pdf', 'card.html'):\n"
            "    sys.argv = ['certify', 'verify', folder + '/' + name, '--pubkey', pub]\n"
            "    try:\n        main()\n    except SystemExit as e:\n"
            "        assert e.code == 0, (name, e.code)\n"
            f"print('LOADED', sorted(m for m in {heavy!r} if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(genuine), str(keys["pub"])],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK: ") == 2, proc.stdout
    assert "LOADED []" in proc.stdout, proc.stdout


def test_a_card_html_from_47b4ef2_still_verifies_with_the_visible_layer_caveat(
        tmp_path: Path) -> None:
    """An unsealed card.html written by certify at 47b4ef2 (tests/data/card_47b4ef2): its
    signature and payload check out, its visible layer is not compared (another renderer), so
    ``verify`` exits 8, never 0; a changed payload in it is still refused (exit 1)."""
    from certify.errors import EXIT_VISIBLE_NOT_COMPARED

    here = Path(__file__).parent / "data" / "card_47b4ef2"
    proc = builders.run_cli("verify", here / "card.html", "--pubkey", here / "certify.pub")
    assert proc.returncode == EXIT_VISIBLE_NOT_COMPARED, proc.stdout + proc.stderr
    assert "not compared: the card was rendered by certify 0.1.0, templates 289257ca8ae5" \
        in proc.stdout
    assert "verdict: PASS" in proc.stdout
    html = (here / "card.html").read_bytes()
    changed = tmp_path / "card.html"
    changed.write_bytes(html.replace(b'"accuracy": 1', b'"accuracy": 0.9', 1))
    assert changed.read_bytes() != html
    proc = builders.run_cli("verify", changed, "--pubkey", here / "certify.pub")
    assert proc.returncode == 1 and "changed after signing" in proc.stderr, proc.stderr


def test_the_small_pdf_reader_reads_what_pypdf_reads(genuine: Path, other_card: Path,
                                                     tmp_path: Path) -> None:
    """``certify verify`` reads a PDF-signed card.pdf's attachments with a small reader (no
    pypdf import); on certify's cards, signed and unsigned, and on a PDF pypdf wrote (a
    classic cross-reference table) it reads exactly what pypdf reads."""
    from certify.report import pades
    from certify.report.pdfread import embedded_files

    limits = {"results.json": 2**28, "results.json.sig": 2**16}
    w = _unsealed_pages_with(genuine)
    rewritten = tmp_path / "pypdf.pdf"
    with rewritten.open("wb") as f:
        w.write(f)
    for path in (genuine / "card.pdf", other_card / "card.pdf", rewritten):
        data = path.read_bytes()
        fast = embedded_files(data, set(limits))  # parses, no fallback
        assert set(fast) == set(limits), path
        got = pades.attachments(data, limits, str(path), signed=True)
        assert got == pades.attachments(data, limits, str(path)), path
        assert got["results.json"].startswith(b"{")


def _unsealed_pages_with(card: Path) -> PdfWriter:
    w = _unsigned_pages(card / "card.pdf")
    w.add_attachment("results.json", (card / "results.json").read_bytes())
    w.add_attachment("results.json.sig", (card / "results.json.sig").read_bytes())
    return w
