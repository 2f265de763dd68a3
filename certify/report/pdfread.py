"""A small, strict PDF reader for one job: the embedded files of a card.pdf whose PDF signature
has already been checked.

``certify verify`` reads card.pdf's ``results.json`` and ``results.json.sig`` attachments. pypdf
does that too, but importing it (with the PIL and fontTools it pulls in) costs more CPU than the
rest of the verification. This reader handles what WeasyPrint and pyHanko write: cross-reference
tables and streams (with PNG predictors) chained by ``/Prev``, object streams, and the
``/EmbeddedFiles`` name tree. It is used only on a file whose whole bytes a valid PDF signature
by the verifying key covers (:func:`certify.report.pades.verify_pdf_signature`), so no stranger
chose a byte it parses; a file it cannot parse raises :class:`PdfParseError` and the caller
falls back to pypdf, which reads every other PDF.
"""

from __future__ import annotations

import re
import zlib
from typing import Union


class PdfParseError(ValueError):
    """What this reader does not read (the caller falls back to pypdf)."""


class Ref:
    """An indirect reference ``N G R``."""

    __slots__ = ("num",)

    def __init__(self, num: int) -> None:
        self.num = num


class Name(str):
    """A PDF name (without its slash)."""


#: A PDF object as this reader returns it: null, a boolean, a number, a string (bytes), a name,
#: an indirect reference, an array or a dictionary (keyed by name).
PdfValue = Union[  # noqa: UP007 - a recursive alias needs the Union form on Python 3.10
    None, bool, int, float, bytes, Name, Ref, list["PdfValue"], dict[str, "PdfValue"]]
#: A stream: its dictionary and its raw (still encoded) bytes.
Stream = tuple[dict[str, PdfValue], bytes]


_WS = b" \t\r\n\f\x00"
_DELIM = b"()<>[]{}/%"
_NUMBER = re.compile(rb"[+-]?(?:\d+\.?\d*|\.\d+)")
_REF = re.compile(rb"\s*(\d+)\s+(\d+)\s+R")
_OBJ = re.compile(rb"(\d+)\s+(\d+)\s+obj")
_MAX_DEPTH = 64
_MAX_STREAM = 512 * 2**20


class _Parser:
    def __init__(self, data: bytes, at: int = 0) -> None:
        self.data, self.at = data, at

    def _skip(self) -> None:
        d, n = self.data, len(self.data)
        while self.at < n:
            c = d[self.at]
            if c in _WS:
                self.at += 1
            elif c == 0x25:  # % comment
                end = d.find(b"\n", self.at)
                self.at = n if end < 0 else end + 1
            else:
                return

    def value(self, depth: int = 0) -> PdfValue:
        if depth > _MAX_DEPTH:
            raise PdfParseError("nested too deep")
        self._skip()
        d = self.data
        if self.at >= len(d):
            raise PdfParseError("unexpected end")
        c = d[self.at:self.at + 1]
        if d.startswith(b"<<", self.at):
            self.at += 2
            out: dict[str, PdfValue] = {}
            while True:
                self._skip()
                if d.startswith(b">>", self.at):
                    self.at += 2
                    return out
                key = self.value(depth + 1)
                if not isinstance(key, Name):
                    raise PdfParseError("a dictionary key is not a name")
                out[str(key)] = self.value(depth + 1)
        if c == b"[":
            self.at += 1
            items: list[PdfValue] = []
            while True:
                self._skip()
                if d.startswith(b"]", self.at):
                    self.at += 1
                    return items
                items.append(self.value(depth + 1))
        if c == b"/":
            end = self.at + 1
            while end < len(d) and d[end] not in _WS and d[end] not in _DELIM:
                end += 1
            raw = d[self.at + 1:end]
            self.at = end
            return Name(re.sub(rb"#([0-9A-Fa-f]{2})", lambda m: bytes([int(m.group(1), 16)]),
                               raw).decode("latin-1"))
        if c == b"(":
            return self._literal()
        if c == b"<":
            end = d.find(b">", self.at)
            if end < 0:
                raise PdfParseError("unterminated hex string")
            hexed = re.sub(rb"\s", b"", d[self.at + 1:end])
            self.at = end + 1
            return bytes.fromhex((hexed + b"0" * (len(hexed) % 2)).decode("ascii"))
        for word, v in ((b"true", True), (b"false", False), (b"null", None)):
            if d.startswith(word, self.at):
                self.at += len(word)
                return v
        m = _NUMBER.match(d, self.at)
        if m is None:
            raise PdfParseError(f"unexpected byte at {self.at}")
        ref = _REF.match(d, m.start()) if b"." not in m.group() else None
        if ref is not None:
            self.at = ref.end()
            return Ref(int(ref.group(1)))
        self.at = m.end()
        text = m.group()
        return float(text) if b"." in text else int(text)

    def _literal(self) -> bytes:
        d, out, depth = self.data, bytearray(), 0
        i = self.at + 1
        escapes = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("b"): 8, ord("f"): 12}
        while i < len(d):
            c = d[i]
            if c == 0x5C:  # backslash
                nxt = d[i + 1] if i + 1 < len(d) else 0
                if nxt in escapes:
                    out.append(escapes[nxt])
                    i += 2
                elif 0x30 <= nxt <= 0x37:
                    m = re.match(rb"[0-7]{1,3}", d[i + 1:i + 4])
                    assert m is not None
                    out.append(int(m.group(), 8) & 0xFF)
                    i += 1 + len(m.group())
                elif nxt in (0x0D, 0x0A):
                    i += 3 if d[i + 1:i + 3] == b"\r\n" else 2
                else:
                    out.append(nxt)
                    i += 2
                continue
            if c == 0x28:
                depth += 1
            elif c == 0x29:
                if depth == 0:
                    self.at = i + 1
                    return bytes(out)
                depth -= 1
            out.append(c)
            i += 1
        raise PdfParseError("unterminated string")


def _int(v: PdfValue, what: str) -> int:
    """``v``, an integer; PdfParseError naming ``what`` for anything else."""
    if not isinstance(v, int):
        raise PdfParseError(f"bad {what}")
    return v


def _ints(v: PdfValue, what: str) -> list[int]:
    """``v``, an array of integers; PdfParseError naming ``what`` for anything else."""
    if not isinstance(v, list):
        raise PdfParseError(f"bad {what}")
    return [_int(x, what) for x in v]


def _inflate(data: bytes, params: PdfValue) -> bytes:
    try:
        raw = zlib.decompress(data)
    except zlib.error as exc:
        raise PdfParseError(f"bad Flate stream ({exc})") from None
    if not isinstance(params, dict):
        return raw
    predictor = _int(params.get("Predictor", 1), "/Predictor")
    if predictor == 1:
        return raw
    if predictor < 10:
        raise PdfParseError("TIFF predictors are not read here")
    cols = _int(params.get("Columns", 1), "/Columns")
    out, prev = bytearray(), bytearray(cols)
    for i in range(0, len(raw), cols + 1):
        kind, row = raw[i], bytearray(raw[i + 1:i + 1 + cols])
        if kind == 2:
            row = bytearray((a + b) & 0xFF for a, b in zip(row, prev, strict=False))
        elif kind != 0:
            raise PdfParseError(f"PNG predictor {kind} is not read here")
        out += row
        prev = row
    return bytes(out)


class PdfFile:
    """The objects of a PDF, read through its cross-reference sections."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.offsets: dict[int, int] = {}  # object -> byte offset
        self.packed: dict[int, tuple[int, int]] = {}  # object -> (object stream, index)
        self.trailer: dict[str, PdfValue] = {}
        self._streams: dict[int, Stream] = {}
        at = data.rfind(b"startxref", max(0, len(data) - 2048))
        if at < 0:
            raise PdfParseError("no startxref")
        m = re.match(rb"startxref\s+(\d+)", data[at:at + 40])
        if m is None:
            raise PdfParseError("bad startxref")
        seen: set[int] = set()
        offset: int | None = int(m.group(1))
        while offset is not None:
            if offset in seen or len(seen) > 64 or not 0 <= offset < len(data):
                raise PdfParseError("bad cross-reference chain")
            seen.add(offset)
            trailer = self._section(offset)
            for k, v in trailer.items():
                self.trailer.setdefault(k, v)
            prev = trailer.get("Prev")
            offset = prev if isinstance(prev, int) else None

    def _known(self, num: int) -> bool:
        return num in self.offsets or num in self.packed

    def _section(self, at: int) -> dict[str, PdfValue]:
        d = self.data
        if d.startswith(b"xref", at):
            p = _Parser(d, at + 4)
            while True:
                p._skip()
                m = re.match(rb"(\d+)\s+(\d+)[ \t]*\r?\n?", d[p.at:p.at + 40])
                if m is None:
                    break
                first, count = int(m.group(1)), int(m.group(2))
                p.at += m.end()
                for i in range(count):
                    p._skip()
                    entry = d[p.at:p.at + 18].split()
                    if len(entry) != 3:
                        raise PdfParseError("bad xref entry")
                    p.at += 18
                    num = first + i
                    if entry[2] == b"n" and not self._known(num):
                        self.offsets[num] = int(entry[0])
            p._skip()
            if not d.startswith(b"trailer", p.at):
                raise PdfParseError("no trailer")
            p.at += 7
            trailer = p.value()
            if not isinstance(trailer, dict):
                raise PdfParseError("bad trailer")
            return trailer
        num, head, raw = self._object_at(at)
        if not isinstance(head, dict) or head.get("Type") != "XRef" or raw is None:
            raise PdfParseError("the cross-reference is neither a table nor a stream")
        body = self._decode(head, raw)
        widths = _ints(head.get("W"), "/W")
        if not (len(widths) == 3 and all(0 <= w <= 8 for w in widths)):
            raise PdfParseError("bad /W")
        index = _ints(head.get("Index") or [0, head.get("Size", 0)], "/Index")
        step, pos = sum(widths), 0
        for first, count in zip(index[0::2], index[1::2], strict=True):
            for i in range(count):
                row = body[pos:pos + step]
                pos += step
                if len(row) < step:
                    raise PdfParseError("short xref stream")
                fields, k = [], 0
                for w in widths:
                    fields.append(int.from_bytes(row[k:k + w], "big") if w else None)
                    k += w
                kind = 1 if fields[0] is None else fields[0]
                n = first + i
                if self._known(n):
                    continue
                if kind == 1:
                    self.offsets[n] = int(fields[1] or 0)
                elif kind == 2:
                    self.packed[n] = (int(fields[1] or 0), int(fields[2] or 0))
        self.offsets.setdefault(num, at)
        return head

    def _object_at(self, at: int) -> tuple[int, PdfValue, bytes | None]:
        m = _OBJ.match(self.data, at)
        if m is None:
            raise PdfParseError(f"no object at {at}")
        p = _Parser(self.data, m.end())
        value = p.value()
        p._skip()
        if not self.data.startswith(b"stream", p.at):
            return int(m.group(1)), value, None
        start = p.at + 6
        if self.data.startswith(b"\r\n", start):
            start += 2
        elif self.data.startswith(b"\n", start):
            start += 1
        length: PdfValue | Stream = value.get("Length") if isinstance(value, dict) else None
        if isinstance(length, Ref):
            length = self.get(length.num)
        if not isinstance(length, int) or not 0 <= length <= _MAX_STREAM:
            raise PdfParseError("bad stream length")
        raw = self.data[start:start + length]
        if not self.data[start + length:start + length + 12].lstrip().startswith(b"endstream"):
            raise PdfParseError("stream not closed where its length says")
        return int(m.group(1)), value, raw

    def _decode(self, head: dict[str, PdfValue], raw: bytes) -> bytes:
        filt = head.get("Filter")
        if filt is None or filt == []:
            return raw
        if filt in ("FlateDecode", ["FlateDecode"]):
            params = head.get("DecodeParms")
            return _inflate(raw, params[0] if isinstance(params, list) else params)
        raise PdfParseError(f"filter {filt!r} is not read here")

    def get(self, num: int, depth: int = 0) -> PdfValue | Stream:
        """Object ``num`` (a stream as ``(dict, raw bytes)``)."""
        if depth > 8:
            raise PdfParseError("references nested too deep")
        if num in self.offsets:
            got, value, raw = self._object_at(self.offsets[num])
            if got != num:
                raise PdfParseError(f"object {num} is not where the cross-reference says")
            if raw is None:
                return value
            if not isinstance(value, dict):
                raise PdfParseError(f"stream {num} has no dictionary")
            return value, raw
        if num in self.packed:
            stm, index = self.packed[num]
            head, body = self._objstm(stm)
            count, first = head.get("N"), head.get("First")
            if not isinstance(count, int) or not isinstance(first, int) or index >= count:
                raise PdfParseError("bad object stream")
            p = _Parser(body)
            pairs = [p.value() for _ in range(2 * count)]
            if pairs[2 * index] != num:
                raise PdfParseError(f"object {num} is not where its object stream says")
            return _Parser(body, first + _int(pairs[2 * index + 1], "object stream")).value()
        raise PdfParseError(f"object {num} is not in the cross-reference")

    def _objstm(self, num: int) -> Stream:
        if num not in self._streams:
            got = self.get(num)
            if not isinstance(got, tuple):
                raise PdfParseError("an object stream is not a stream")
            head, raw = got
            self._streams[num] = (head, self._decode(head, raw))
        return self._streams[num]

    def resolve(self, v: PdfValue | Stream) -> PdfValue | Stream:
        """``v``, or the object it refers to."""
        return self.get(v.num) if isinstance(v, Ref) else v


def embedded_files(data: bytes, wanted: set[str]) -> dict[str, Stream]:
    """The streams (dictionary and raw bytes) of the ``wanted`` names in the document's
    ``/EmbeddedFiles`` name tree, the last of each name."""
    pdf = PdfFile(data)
    root = pdf.resolve(pdf.trailer.get("Root"))
    if not isinstance(root, dict):
        raise PdfParseError("no catalog")
    names = pdf.resolve(root.get("Names"))
    tree = pdf.resolve(names.get("EmbeddedFiles")) if isinstance(names, dict) else None
    found: dict[str, Stream] = {}

    def walk(node: PdfValue | Stream, depth: int) -> None:
        if depth > 16 or not isinstance(node, dict):
            raise PdfParseError("bad name tree")
        kids, pairs = node.get("Kids") or [], node.get("Names") or []
        if not isinstance(kids, list) or not isinstance(pairs, list):
            raise PdfParseError("bad name tree")
        for kid in kids:
            walk(pdf.resolve(kid), depth + 1)
        for i in range(0, len(pairs) - 1, 2):
            key = pairs[i]
            name = key.decode("latin-1") if isinstance(key, bytes) else str(key)
            if name in wanted:
                spec = pdf.resolve(pairs[i + 1])
                ef = pdf.resolve(spec.get("EF")) if isinstance(spec, dict) else None
                ref = (ef.get("F") or ef.get("UF")) if isinstance(ef, dict) else None
                stream = pdf.resolve(ref)
                if not isinstance(stream, tuple):
                    raise PdfParseError(f"attachment {name} is not a stream")
                found[name] = stream

    if tree is not None:
        walk(tree, 0)
    return found
