"""Uploads built to exhaust a card verifier (issue 38 point 2), for the tests and
``benchmarks/verify_load.py``.

Each is small on the wire and expensive to read: PDF inflation bombs (an attachment that
inflates to hundreds of MB, or a PDF object stream the reader must inflate and parse before any
signature is checked), deep JSON (in results.json and in an HTML card's embedded script), a
PDF with a huge page tree, arrays in the PDF's own structure that take pypdf minutes to parse,
wide JSON behind a genuine signature of the older statement type (whose payload is parsed
before its digests are compared), a genuine card.html with a PNG decompression bomb added to
its visible part, and the page of unclosed script tags from issue 28.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from certify.canonical import canonical_json

#: The statement type certify signed before issue 38: the digests of the *parsed* payload's
#: parts, so a verifier parses the payload before it can compare them.
LEGACY_STATEMENT = "certify.signed-results/1"


def legacy_signature(key: ec.EllipticCurvePrivateKey, fingerprint: str) -> bytes:
    """A genuine signature document of the older statement type, made with ``key`` (what any
    card a service signed before issue 38 carries, and anyone who holds such a card has)."""
    signed = {"type": LEGACY_STATEMENT, "schema": "certify.results/1",
              "measurement": "sha256:" + "0" * 64, "provenance": "sha256:" + "0" * 64}
    der = key.sign(canonical_json(signed), ec.ECDSA(hashes.SHA256()))
    return json.dumps({"algorithm": "ecdsa-p256-sha256",
                       "signature": base64.b64encode(der).decode("ascii"),
                       "key_fingerprint": fingerprint, "signed": signed}).encode()


def pdf(objects: dict[int, bytes], root: int) -> bytes:
    """A PDF of ``objects`` (number -> body, e.g. ``b"<< /Type /Catalog ... >>"`` or a
    dictionary followed by ``stream ... endstream``) with a classic cross-reference table."""
    out = bytearray(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = {}
    for num in sorted(objects):
        offsets[num] = len(out)
        out += b"%d 0 obj\n" % num + objects[num] + b"\nendobj\n"
    size = max(objects) + 1
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % size
    for num in range(1, size):
        out += (b"%010d 00000 n \n" % offsets[num]) if num in offsets else \
            b"0000000000 65535 f \n"
    out += b"trailer\n<< /Size %d /Root %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (size, root, xref)
    return bytes(out)


def _stream(data: bytes, extra: bytes = b"", filters: int = 0, encoded: int = 0) -> bytes:
    """A stream object of ``data`` deflated ``filters`` more times; ``encoded`` deflates were
    applied already (its /Filter names them all)."""
    for _ in range(filters):
        data = zlib.compress(data, 9)
    n = filters + encoded
    filt = b"" if not n else b" /Filter [" + b" /FlateDecode" * n + b" ]"
    return b"<< /Length %d%s %s >>\nstream\n" % (len(data), filt, extra) + data + \
        b"\nendstream"


def _deflate_repeated(head: bytes, chunk: bytes, times: int, tail: bytes) -> bytes:
    """zlib data of ``head + chunk * times + tail``, made without holding (or compressing)
    the whole: one fully flushed deflate block of ``chunk``, repeated (a GB in a second)."""
    def raw(data: bytes, final: bool) -> bytes:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        return c.compress(data) + c.flush(zlib.Z_FINISH if final else zlib.Z_FULL_FLUSH)

    adler = zlib.adler32(head)
    for _ in range(times):
        adler = zlib.adler32(chunk, adler)
    adler = zlib.adler32(tail, adler)
    return (b"\x78\xda" + raw(head, False) + raw(chunk, False) * times + raw(tail, True) +
            struct.pack(">I", adler))


def _card_pdf(payload: bytes, signature: bytes, layers: int, encoded: int = 0) -> bytes:
    """A one-page PDF with results.json (``payload``, deflated ``layers`` more times) and
    results.json.sig attached, as a card carries them."""
    return pdf({
        1: b"<< /Type /Catalog /Pages 2 0 R /Names << /EmbeddedFiles << /Names "
           b"[(results.json) 4 0 R (results.json.sig) 6 0 R] >> >> >>",
        2: b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        3: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>",
        4: b"<< /Type /Filespec /F (results.json) /UF (results.json) /EF << /F 5 0 R >> >>",
        5: _stream(payload, b"/Type /EmbeddedFile", layers, encoded),
        6: b"<< /Type /Filespec /F (results.json.sig) /UF (results.json.sig) "
           b"/EF << /F 7 0 R >> >>",
        7: _stream(signature, b"/Type /EmbeddedFile"),
    }, 1)


def inflation_bomb_pdf(inflated_mb: int, signature: bytes, layers: int = 2) -> bytes:
    """A card.pdf whose results.json attachment inflates to ``inflated_mb`` MB of JSON (an
    array of empty objects: the issue's 72 KB PDF held 75 MB of them) through ``layers``
    deflates (one: about 1 KB a MB; two: a few KB for a GB)."""
    chunk = b"{}," * (2**20 // 3)
    payload = _deflate_repeated(b"[", chunk, inflated_mb, b"{}]")
    return _card_pdf(payload, signature, layers - 1, encoded=1)


def wide_json(mb: float) -> bytes:
    """``mb`` MB of an array of empty objects: about 20 bytes of heap per byte, parsed."""
    n = max(2, int(mb * 2**20) // 3)
    return b"[" + b"{}," * (n - 1) + b"{}]"


def deep_json(depth: int) -> bytes:
    """JSON nested ``depth`` deep (``[[[[...``), unclosed."""
    return b"[" * depth


def html_card(results: bytes, signature: bytes) -> bytes:
    """An HTML page that embeds ``results`` and ``signature`` as a card does."""
    return (b'<!doctype html><html><body><p>card</p>'
            b'<script type="application/json" id="certify-results">' + results +
            b'</script><script type="application/json" id="certify-signature">' + signature +
            b"</script></body></html>")


def png_bomb(width: int, height: int) -> bytes:
    """A black RGB PNG of ``width`` x ``height`` pixels: 3 bytes a pixel decoded, about a
    thousandth of that encoded."""
    row = b"\x00" * (1 + 3 * width)
    c = zlib.compressobj(9)
    idat = b"".join(c.compress(row) for _ in range(height)) + c.flush()

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data +
                struct.pack(">I", zlib.crc32(kind + data)))

    return (b"\x89PNG\r\n\x1a\n" +
            chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def with_png_bomb(card_html: bytes, width: int = 9400, height: int = 9400) -> bytes:
    """A genuine card.html (payload and signature untouched) with one more image in its
    visible part: a PNG that decodes to ``width`` x ``height`` x 3 bytes (265 MB by default,
    under Pillow's decompression-bomb threshold), which the visible-layer check decodes after
    the signature checks out."""
    body = card_html.index(b">", card_html.index(b"<body")) + 1
    img = (b'<img src="data:image/png;base64,' + base64.b64encode(png_bomb(width, height)) +
           b'">')
    return card_html[:body] + img + card_html[body:]


def unclosed_tags_html(n: int = 6000) -> bytes:
    """Issue 28's page: ``n`` unclosed ``certify-results`` script tags."""
    return b'<script type="application/json" id="certify-results">' * n


def page_tree_pdf(pages: int, signature: bytes) -> bytes:
    """A card.pdf whose page tree holds ``pages`` leaves (one page object, referenced over
    and over from a deflated object stream)."""
    return _objstm_pdf(b"<< /Type /Pages /Kids [" + b"3 0 R " * pages + b"] /Count %d >>"
                       % pages, signature)


def array_bomb_pdf(numbers: int, signature: bytes) -> bytes:
    """A card.pdf whose catalog holds an array of ``numbers`` numbers, deflated in an object
    stream: the reader inflates and parses it to find the attachments, before any signature
    is checked."""
    return _objstm_pdf(b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>", signature,
                       junk=b" /Junk [" + b"0 " * numbers + b"]")


def nested_array_pdf(arrays: int, signature: bytes, per_array: int = 99_000) -> bytes:
    """A card.pdf whose catalog holds ``arrays`` arrays of ``per_array`` numbers each (under
    pypdf's per-array limit), deflated in an object stream: a few KB that cost the reader
    about 8 s of CPU per million numbers, before any signature is checked."""
    inner = b"[" + b"0 " * per_array + b"] "
    return _objstm_pdf(b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>", signature,
                       junk=b" /Junk [" + inner * arrays + b"]")


def _objstm_pdf(pages_obj: bytes, signature: bytes, junk: bytes = b"") -> bytes:
    """A PDF 1.5 with a cross-reference stream, whose catalog (object 1, with ``junk``) and
    page tree (object 2) live in a deflated object stream (object 8)."""
    body = bytearray(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets: dict[int, int] = {}

    def add(num: int, data: bytes) -> None:
        offsets[num] = len(body)
        body.extend(b"%d 0 obj\n" % num + data + b"\nendobj\n")

    catalog = (b"<< /Type /Catalog /Pages 2 0 R /Names << /EmbeddedFiles << /Names "
               b"[(results.json) 4 0 R (results.json.sig) 6 0 R] >> >>" + junk + b" >>")
    add(3, b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>")
    add(4, b"<< /Type /Filespec /F (results.json) /UF (results.json) /EF << /F 5 0 R >> >>")
    add(5, _stream(b'{"schema": "certify.results/1"}', b"/Type /EmbeddedFile"))
    add(6, b"<< /Type /Filespec /F (results.json.sig) /UF (results.json.sig) "
           b"/EF << /F 7 0 R >> >>")
    add(7, _stream(signature, b"/Type /EmbeddedFile"))
    header = b"1 0 2 %d " % (len(catalog) + 1)
    add(8, _stream(header + catalog + b" " + pages_obj,
                   b"/Type /ObjStm /N 2 /First %d" % len(header), 1))
    xref_at = len(body)
    size = 10
    rows = [struct.pack(">BIH", 0, 0, 65535)]
    for num in range(1, size - 1):
        rows.append(struct.pack(">BIH", 2, 8, num - 1) if num in (1, 2) else
                    struct.pack(">BIH", 1, offsets[num], 0))
    rows.append(struct.pack(">BIH", 1, xref_at, 0))
    add(9, _stream(b"".join(rows), b"/Type /XRef /Size %d /W [1 4 2] /Root 1 0 R" % size))
    body.extend(b"startxref\n%d\n%%%%EOF\n" % xref_at)
    return bytes(body)
