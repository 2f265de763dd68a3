"""card.pdf's standard signature: PAdES B-B, made with the run's key and its certificate.

Every PDF reader checks a PDF signature (ETSI EN 319 142-1 baseline B-B: a detached CMS
signature over the whole file but the hex string that holds it). :func:`sign_pdf` adds one
with pyHanko after WeasyPrint wrote the card and its attachments, as an incremental update.
No timestamp: a timestamp would need a network service.

:func:`verify_pdf_signature` decides on the raw bytes, not on a PDF reader's verdict: pyHanko
and pdfsig call a signature "intact" when bytes follow it (trailing bytes, an incremental
update) or when a digit of its zero padding changed. Accepted is exactly one signature whose
``/ByteRange`` is ``[0 a b c]`` with ``a`` the offset of the ``/Contents`` ``<``, ``b`` the
offset just after its ``>`` and ``b + c`` the file's length; whose hex string is the CMS DER
followed only by ``0`` digits; whose ``messageDigest`` is the sha256 of those two ranges and
whose ECDSA signature over its signed attributes verifies with the trusted key. Every byte of
the file but the hole is then exactly what the key holder signed, so nothing in the file needs
to be parsed to trust it: the attachments are read afterwards (:func:`attachments`), each
inflated within a bound.

A key gets a self-issued X.509 certificate (its own CA, as PDF readers want a certificate):
``certify keygen`` writes ``NAME.crt`` beside ``NAME.key``; a key made before that is signed
with a certificate made for it on the fly.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import logging
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from certify.errors import UsageError, VerificationError

if TYPE_CHECKING:
    from asn1crypto import cms as asn1_cms
    from asn1crypto import x509 as asn1_x509
    from pypdf.generic import PdfObject, StreamObject

log = logging.getLogger("certify")

#: What ``certify keygen`` writes beside ``NAME.key``: the key's self-issued certificate.
CERT_SUFFIX = ".crt"
#: The signature field certify adds to card.pdf.
FIELD_NAME = "certify"
#: How long a self-issued certificate is valid: a card outlives the run by years.
VALIDITY_DAYS = 100 * 365

_BYTE_RANGE = re.compile(rb"/ByteRange\s*\[\s*(\d{1,12})\s+(\d{1,12})\s+(\d{1,12})\s+(\d{1,12})"
                         rb"\s*\]")
_HEX = re.compile(rb"[0-9A-Fa-f]*")


def fingerprint(public_key: ec.EllipticCurvePublicKey) -> str:
    """sha256 of the DER SubjectPublicKeyInfo (as :func:`certify.report.sign.fingerprint`)."""
    der = public_key.public_bytes(serialization.Encoding.DER,
                                  serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


# --- certificates ---------------------------------------------------------------------------

#: The certificate's common name: this, then the first :data:`NAME_FINGERPRINT_HEX` hex digits of
#: the key's fingerprint (``certify signing key 7f3a9c21``). The name is a label, not a proof:
#: anyone can make a self-signed certificate for their own key with this very name and serial
#: text, and a PDF reader then shows it line for line as it shows the genuine one, "valid"
#: included. A PDF reader proves a card only with the signer's certificate imported as trusted
#: ("Certificate is Trusted" in pdfsig); ``certify verify --pubkey`` (or ``--log``) is the
#: check.
COMMON_NAME = "certify signing key"
NAME_FINGERPRINT_HEX = 8


def common_name_for(key: ec.EllipticCurvePublicKey) -> str:
    """The common name a certificate of ``key`` carries: :data:`COMMON_NAME` and the key's
    fingerprint prefix."""
    return f"{COMMON_NAME} {fingerprint(key).split(':', 1)[1][:NAME_FINGERPRINT_HEX]}"


def self_issued_certificate(key: ec.EllipticCurvePrivateKey,
                            common_name: str | None = None) -> x509.Certificate:
    """A certificate for ``key`` issued by ``key`` itself, usable as its own CA.

    basicConstraints CA:TRUE (a reader's trust store can hold it as a root) and keyUsage
    digitalSignature, nonRepudiation and keyCertSign; valid from a day before now for
    :data:`VALIDITY_DAYS`. The common name carries the key's fingerprint prefix
    (:func:`common_name_for`) and the serial number attribute the whole fingerprint, so that a
    reader showing the signer names the key ``certify verify`` prints.
    """
    fp = fingerprint(key.public_key())
    cn = common_name if common_name is not None else common_name_for(key.public_key())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn),
                      x509.NameAttribute(NameOID.SERIAL_NUMBER, fp)])
    now = datetime.datetime.now(datetime.timezone.utc)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    return (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=VALIDITY_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=True, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski),
                           critical=False)
            .sign(key, hashes.SHA256()))


def certificate_path(key_path: Path) -> Path:
    """Where a key's certificate lives: ``NAME.crt`` beside ``NAME.key``."""
    return key_path.with_suffix(CERT_SUFFIX)


def certificate_pem(cert: x509.Certificate) -> bytes:
    """The certificate as PEM."""
    return cert.public_bytes(serialization.Encoding.PEM)


def write_certificate(key: ec.EllipticCurvePrivateKey, path: Path) -> x509.Certificate:
    """Write ``key``'s self-issued certificate to ``path`` (which must not exist)."""
    cert = self_issued_certificate(key)
    with path.open("xb") as f:
        f.write(certificate_pem(cert))
    return cert


def load_certificate(path: Path, key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    """Read the certificate at ``path``; a UsageError unless it certifies ``key``."""
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except OSError as exc:
        raise UsageError(f"cannot read the certificate {path}: {exc.strerror}",
                         hint="check the file beside the key") from None
    except ValueError:
        raise UsageError(f"{path} is not a PEM certificate",
                         hint="remove it to sign with a certificate made for the key, or "
                              "make new keys with `certify keygen`") from None
    mine = fingerprint(key.public_key())
    public = cert.public_key()
    theirs = fingerprint(public) if isinstance(public, ec.EllipticCurvePublicKey) else "another"
    if theirs != mine:
        raise UsageError(f"the certificate {path} is for key {theirs}, not for the signing key "
                         f"{mine}", hint="put the key's own certificate beside it (certify "
                                         "keygen writes NAME.crt), or remove the file")
    return cert


@dataclass(frozen=True)
class PdfSigningKey:
    """A private key and the certificate card.pdf's signature names."""

    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate

    @classmethod
    def for_key_file(cls, key_path: Path, key: ec.EllipticCurvePrivateKey) -> PdfSigningKey:
        """``key`` (read from ``key_path``) with the certificate beside it; where there is none
        (a key made before certify wrote certificates) one is made for it now, and a log line
        says so. A certificate for another key is a UsageError."""
        path = certificate_path(key_path)
        if path.exists():
            return cls(key, load_certificate(path, key))
        log.warning("no certificate %s beside the signing key: card.pdf is signed with a "
                    "certificate made for this key now (keys made by `certify keygen` come "
                    "with one)", path.name)
        return cls(key, self_issued_certificate(key))


def _cms() -> ModuleType:
    """asn1crypto's ``cms`` module with every CMS attribute type registered.

    ``asn1crypto.tsp`` adds ``signing_certificate_v2`` (which pyHanko signs with) to
    ``cms.CMSAttributeType`` at its import, but ``cms`` builds its name-to-OID map once, at
    its first use: a signature checked before ``tsp`` was imported would leave pyHanko's next
    signing in the same process failing with "invalid literal for int(): signing_certificate_v2".
    So ``tsp`` is imported first, and a map built without its names is built again (asn1crypto
    builds it once per class, so it is rebuilt here rather than dropped)."""
    from asn1crypto import cms, tsp  # noqa: F401 - tsp registers its attribute types

    names = cms.CMSAttributeType
    if names._reverse_map is not None and set(names._map.values()) - set(names._reverse_map):
        names._reverse_map = {name: oid for oid, name in names._map.items()}
    return cms


def sign_pdf(pdf: bytes, signer: PdfSigningKey) -> bytes:
    """``pdf`` with a PAdES B-B signature by ``signer`` over the whole file (no timestamp)."""
    _cms()
    from asn1crypto import keys as asn1_keys
    from asn1crypto import x509 as asn1_x509
    from pyhanko.pdf_utils.incremental_writer import IncrementalPdfFileWriter
    from pyhanko.sign import fields, signers
    from pyhanko_certvalidator.registry import SimpleCertificateStore

    cert = asn1_x509.Certificate.load(
        signer.certificate.public_bytes(serialization.Encoding.DER))
    key = asn1_keys.PrivateKeyInfo.load(signer.key.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    cms_signer = signers.SimpleSigner(signing_cert=cert, signing_key=key,
                                      cert_registry=SimpleCertificateStore.from_certs([cert]))
    meta = signers.PdfSignatureMetadata(field_name=FIELD_NAME, md_algorithm="sha256",
                                        subfilter=fields.SigSeedSubFilter.PADES)
    out = signers.PdfSigner(meta, cms_signer).sign_pdf(
        IncrementalPdfFileWriter(io.BytesIO(pdf)))
    return bytes(out.getvalue())


# --- verification on the raw bytes ----------------------------------------------------------

@dataclass(frozen=True)
class PdfSignature:
    """What a verified PDF signature established."""

    #: fingerprint of the signer certificate's key (the trusted key)
    key_fingerprint: str
    #: the signer certificate's subject, as a reader shows it
    subject: str
    #: ``[0, a, b, c]``: what the signature covers (all of the file but its own hex string)
    byte_range: tuple[int, int, int, int]


def has_signature(data: bytes) -> bool:
    """Whether ``data`` holds a PDF signature dictionary (a ``/ByteRange``)."""
    return b"/ByteRange" in data


def _der_length(der: bytes) -> int:
    """The length of the DER element at the start of ``der`` (header included)."""
    if len(der) < 2 or der[0] != 0x30:
        raise ValueError("not a DER SEQUENCE")
    first = der[1]
    if first < 0x80:
        return 2 + first
    n = first & 0x7F
    if n == 0 or n > 4 or len(der) < 2 + n:
        raise ValueError("bad DER length")
    return 2 + n + int.from_bytes(der[2:2 + n], "big")


def verify_pdf_signature(data: bytes, key: ec.EllipticCurvePublicKey, where: str
                         ) -> PdfSignature:
    """Raise VerificationError unless ``data`` carries exactly one PDF signature that covers
    the whole file and was made with ``key`` (see the module's docstring for every check)."""

    def refuse(what: str, hint: str = "do not trust this card") -> VerificationError:
        return VerificationError(f"{where}: {what}", hint=hint)

    count = data.count(b"/ByteRange")
    if count != 1:
        raise refuse(f"the PDF holds {count} signatures, not one: something was signed onto "
                     "it after certify's signature (an incremental update)")
    found = _BYTE_RANGE.search(data)
    if found is None:
        raise refuse("the PDF signature's /ByteRange is malformed")
    start, a, b, c = (int(v) for v in found.groups())
    if start != 0 or not 0 < a < b or b + c != len(data):
        extra = b + c - len(data)
        why = (f"{-extra} byte(s) follow what it covers (trailing bytes or an incremental "
               "update)" if start == 0 and 0 < a < b and extra < 0 else
               "its byte range is not the whole file")
        raise refuse(f"the PDF signature does not cover the whole file: {why}")
    if data[a:a + 1] != b"<" or data[b - 1:b] != b">":
        raise refuse("the PDF signature's byte range does not end at its /Contents string")
    hex_text = data[a + 1:b - 1]
    if len(hex_text) % 2 or _HEX.fullmatch(hex_text) is None:
        raise refuse("the PDF signature's /Contents is not a hex string")
    raw = bytes.fromhex(hex_text.decode("ascii"))
    try:
        length = _der_length(raw)
    except ValueError as exc:
        raise refuse(f"the PDF signature is not a CMS signature ({exc})") from None
    if length > len(raw):
        raise refuse("the PDF signature's CMS is cut short")
    if hex_text[2 * length:].strip(b"0"):
        raise refuse("the PDF signature's padding was changed (it must be all zeros)")
    covered = hashlib.sha256()
    covered.update(data[:a])
    covered.update(data[b:b + c])
    signer = _check_cms(raw[:length], covered.digest(), key, refuse)
    return PdfSignature(*signer, byte_range=(start, a, b, c))


class _Refuse(Protocol):
    """How a check says no: the refusal naming the file, with a hint."""

    def __call__(self, what: str, hint: str = ...) -> VerificationError: ...


def _check_cms(der: bytes, digest: bytes, key: ec.EllipticCurvePublicKey, refuse: _Refuse
               ) -> tuple[str, str]:
    """Check a detached CMS SignedData over ``digest``; returns (key fingerprint, subject)."""
    cms = _cms()

    try:
        info = cms.ContentInfo.load(der, strict=True)
        if info["content_type"].native != "signed_data":
            raise ValueError("not SignedData")
        sd = info["content"]
        if sd["encap_content_info"]["content"].native is not None:
            raise ValueError("not detached")
        signer_infos = list(sd["signer_infos"])
        if len(signer_infos) != 1:
            raise ValueError(f"{len(signer_infos)} signers")
        si = signer_infos[0]
        if si["digest_algorithm"]["algorithm"].native != "sha256":
            raise ValueError(f"digest {si['digest_algorithm']['algorithm'].native}")
        attrs = {a["type"].native: a["values"] for a in si["signed_attrs"]}
        content_type = attrs["content_type"][0].native
        message_digest = attrs["message_digest"][0].native
        cert = _signer_certificate(sd, si["sid"])
        signed_attrs = bytearray(si["signed_attrs"].dump())
        signed_attrs[0] = 0x31  # signed over as a SET OF, not its [0] IMPLICIT tag
        value = si["signature"].native
        algorithm = si["signature_algorithm"].signature_algo
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise refuse(f"the PDF signature is not a CMS signature certify reads ({exc})") \
            from None
    if content_type != "data" or message_digest != digest:
        raise refuse("the PDF's bytes are not the signed ones (the signature's digest does "
                     "not match the file)")
    try:
        signer_key = serialization.load_der_public_key(cert.public_key.dump())
    except ValueError:
        raise refuse("the PDF signer's certificate holds no readable key") from None
    subject = cert.subject.native.get("common_name") or cert.subject.human_friendly
    theirs = (fingerprint(signer_key) if isinstance(signer_key, ec.EllipticCurvePublicKey)
              else "a key that is not ECDSA")
    if theirs != fingerprint(key):
        raise refuse(f"the PDF is signed by key {theirs} ({subject}), not by the given key "
                     f"{fingerprint(key)}", hint="check that --pubkey is the signer's public "
                                                 "key; otherwise do not trust this card")
    if algorithm != "ecdsa":
        raise refuse(f"the PDF signature's algorithm {algorithm} is not ECDSA")
    try:
        key.verify(value, bytes(signed_attrs), ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise refuse("the PDF signature itself is invalid (its signed attributes were "
                     "altered or it is not the key's)") from None
    return theirs, subject


def _signer_certificate(sd: asn1_cms.SignedData, sid: asn1_cms.SignerIdentifier
                        ) -> asn1_x509.Certificate:
    """The certificate of the signer ``sid`` names, among those the SignedData carries."""
    for choice in sd["certificates"] or []:
        if choice.name != "certificate":
            continue
        cert = choice.chosen
        if sid.name == "issuer_and_serial_number":
            if (cert.issuer == sid.chosen["issuer"]
                    and cert.serial_number == sid.chosen["serial_number"].native):
                return cert
        elif cert.key_identifier == sid.chosen.native:
            return cert
    raise ValueError("the signer's certificate is not in the signature")


# --- attachments, inflated within bounds ----------------------------------------------------

def attachments(data: bytes, limits: dict[str, int], where: str, signed: bool = False
                ) -> dict[str, bytes]:
    """The embedded files named in ``limits``, each inflated to at most its limit in bytes.

    An attachment larger than its limit is refused before it is inflated in full (a zlib
    stream inflates in steps of at most the limit); an encoding other than Flate is refused.
    ``signed``: the whole file is covered by a PDF signature already checked with the
    verifying key; it is then read by :mod:`certify.report.pdfread` (a small reader, no
    pypdf import), falling back to pypdf where that reader cannot parse it.
    """
    if signed:
        from certify.report.pdfread import PdfParseError, embedded_files

        try:
            streams = embedded_files(data, set(limits))
        except (PdfParseError, ValueError, KeyError, TypeError, IndexError, RecursionError):
            streams = None
        if streams is not None:
            return {name: _inflate_raw(head.get("Filter"), head.get("DecodeParms"), raw,
                                       limits[name], f"{where}: attachment {name}")
                    for name, (head, raw) in streams.items()}
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        names = _pdf_dict(reader.trailer["/Root"]).get("/Names")
        tree = _pdf_dict(names).get("/EmbeddedFiles") if names is not None else None
        found = _name_tree(tree, set(limits)) if tree is not None else {}
    except (PdfReadError, OSError, ValueError, KeyError, TypeError, AttributeError,
            RecursionError) as exc:
        raise VerificationError(f"{where} is not a readable PDF ({exc})",
                                hint="is the file complete?") from None
    out = {}
    for name, stream in found.items():
        out[name] = _inflate(stream, limits[name], f"{where}: attachment {name}")
    return out


def _pdf_resolved(obj: object) -> object:
    """``obj``, or the object it refers to (a pypdf indirect reference)."""
    from pypdf.generic import PdfObject

    return obj.get_object() if isinstance(obj, PdfObject) else obj


def _pdf_dict(obj: object) -> dict[str, PdfObject]:
    """A pypdf dictionary (a reference resolved); ValueError for anything else."""
    from pypdf.generic import DictionaryObject

    got = _pdf_resolved(obj)
    if not isinstance(got, DictionaryObject):
        raise ValueError(f"a {type(got).__name__} where a dictionary belongs")
    return got


def _pdf_list(obj: object) -> list[PdfObject]:
    """A pypdf array (a reference resolved; none: empty); ValueError for anything else."""
    from pypdf.generic import ArrayObject

    got = _pdf_resolved(obj)
    if got is None:
        return []
    if not isinstance(got, ArrayObject):
        raise ValueError(f"a {type(got).__name__} where an array belongs")
    return got


def _name_tree(node: object, wanted: set[str], depth: int = 0) -> dict[str, StreamObject]:
    """The file streams of the ``wanted`` names in an /EmbeddedFiles name tree (the last of
    each, as pypdf reads them); bounded in depth."""
    from pypdf.generic import StreamObject

    if depth > 16:
        raise ValueError("the attachment tree is too deep")
    tree = _pdf_dict(node)
    found: dict[str, StreamObject] = {}
    for kid in _pdf_list(tree.get("/Kids")):
        found.update(_name_tree(kid, wanted, depth + 1))
    pairs = _pdf_list(tree.get("/Names"))
    for i in range(0, len(pairs) - 1, 2):
        name = str(pairs[i])
        if name in wanted:
            ef = _pdf_dict(_pdf_dict(pairs[i + 1])["/EF"])
            stream = _pdf_resolved(ef.get("/F") or ef["/UF"])
            if not isinstance(stream, StreamObject):
                raise ValueError(f"the attachment {name} is not a stream")
            found[name] = stream
    return found


def _inflate(stream: StreamObject, limit: int, where: str) -> bytes:
    return _inflate_raw(stream.get("/Filter"), stream.get("/DecodeParms"),
                        bytes(getattr(stream, "_data", b"")), limit, where)


def _inflate_raw(filters: object, params: object, raw: bytes, limit: int, where: str
                 ) -> bytes:
    """A stream's bytes decoded (none, or Flate without parameters), at most ``limit``."""
    named: list[object] = ([] if filters is None else list(filters)
                           if isinstance(filters, list) else [filters])
    if not named:
        body = raw
    elif [str(f).lstrip("/") for f in named] == ["FlateDecode"] and params is None:
        d = zlib.decompressobj()
        try:
            body = d.decompress(raw, limit + 1)
        except zlib.error:
            raise VerificationError(f"{where} is not a readable Flate stream",
                                    hint="the file was altered") from None
        if d.unconsumed_tail:
            body += b"?"  # more to come: over the limit
    else:
        raise VerificationError(f"{where} is encoded with {named}, not Flate",
                                hint="not a card certify wrote")
    if len(body) > limit:
        raise VerificationError(f"{where} inflates to more than {limit:,} bytes",
                                hint="not a card certify wrote; do not trust it")
    return body
