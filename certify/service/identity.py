"""What every node of one service shares: its signing key and certificate, its session secret
and its secrets key, from configuration rather than from each node's home.

Each comes from a file (``--sign-key``, ``--session-secret``, ``--secrets-key``: a path, such
as a mounted secret), or an environment variable (``CERTIFY_SIGN_KEY`` and
``CERTIFY_SIGN_CERT`` hold PEM text, ``CERTIFY_SESSION_SECRET`` hex, ``CERTIFY_SECRETS_KEY``
base64), or, on a single machine, the home folder (made at first start, as before). The
transparency log's tree heads are signed with the signing key, so the log's key is the same.

Their fingerprints are recorded in the database (table ``identity``) by the first node that
starts; a node that starts with another key is refused with a message that names both
fingerprints, unless its operator passes ``--new-identity`` (a deliberate key rotation; runs
signed with the old key then answer 500, as the README says). The signing key's certificate
is recorded whole, so that every node's card.pdf names the same certificate.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from certify.errors import UsageError
from certify.service.db import Identity

log = logging.getLogger("certify.service")

SIGN_KEY_ENV, SIGN_CERT_ENV, SESSION_ENV = ("CERTIFY_SIGN_KEY", "CERTIFY_SIGN_CERT",
                                            "CERTIFY_SESSION_SECRET")


@dataclass(frozen=True)
class NodeIdentity:
    """The keys this node runs with, checked against the service's record."""

    #: A key file the run processes read, with its certificate (``NAME.crt``) beside it.
    sign_key: Path
    private: ec.EllipticCurvePrivateKey
    certificate_pem: bytes
    session_secret: bytes


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _signing_key_file(home: Path, given: Path | None) -> Path:
    """``--sign-key``, else ``CERTIFY_SIGN_KEY`` written to this node's home (mode 0600: the
    run processes read a file), else the home's own key (made at first start)."""
    from certify.service import keys

    pem = os.environ.get(SIGN_KEY_ENV)
    if given is None and pem:
        path = home / "keys" / "configured.key"
        _write_private(path, pem.encode())
        cert = os.environ.get(SIGN_CERT_ENV)
        crt = path.with_suffix(".crt")
        if cert:
            crt.write_bytes(cert.encode())
        else:
            crt.unlink(missing_ok=True)  # the recorded one, or a new one, is written below
        return path
    return keys.signing_key_path(home, given)


def _session_secret(home: Path, given: Path | None) -> bytes:
    from certify.service import keys

    if given is not None:  # hex text (as in the environment), or raw bytes
        keys.check_private(given, "session secret")
        raw = given.read_bytes()
        try:  # hex text may end in a newline; raw bytes are taken whole (a random secret
            # can begin or end with a byte that looks like white space)
            data = bytes.fromhex(raw.decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            data = raw
    elif os.environ.get(SESSION_ENV):
        try:
            data = bytes.fromhex(os.environ[SESSION_ENV].strip())
        except ValueError:
            raise UsageError(f"{SESSION_ENV} is not hex",
                             hint="make one with: python -c 'import secrets; "
                                  "print(secrets.token_hex(32))'") from None
    else:
        return keys.session_secret(home)
    if len(data) < 32:
        raise UsageError("the session secret is shorter than 32 bytes",
                         hint="use 32 random bytes or more")
    return data


def _fingerprint(label: bytes, secret: bytes) -> str:
    return "sha256:" + hashlib.sha256(label + b"\0" + secret).hexdigest()


def _recorded(factory: sessionmaker[Session], name: str, value: str) -> str:
    """The service's recorded ``name``: ``value`` if this node is the first to record it."""
    from certify.service.db import utcnow

    with factory() as s:
        row = s.get(Identity, name)
        if row is not None:
            return str(row.value)
        s.add(Identity(name=name, value=value, created=utcnow()))
        try:
            s.commit()
            return value
        except IntegrityError:  # another node recorded it at the same moment
            s.rollback()
            row = s.get(Identity, name)
            assert row is not None
            return str(row.value)


def _replace(factory: sessionmaker[Session], name: str, value: str) -> None:
    from certify.service.db import utcnow

    with factory() as s:
        row = s.get(Identity, name)
        if row is None:
            s.add(Identity(name=name, value=value, created=utcnow()))
        else:
            row.value, row.created = value, utcnow()
        s.commit()


_WHAT = {"sign_key": ("signing key", "--sign-key (or CERTIFY_SIGN_KEY)"),
         "session_secret": ("session secret", "--session-secret (or CERTIFY_SESSION_SECRET)"),
         "secrets_key": ("secrets key", "--secrets-key (or CERTIFY_SECRETS_KEY)")}


def _agree(factory: sessionmaker[Session], name: str, mine: str, rotate: bool) -> None:
    theirs = _recorded(factory, name, mine)
    if theirs == mine:
        return
    what, option = _WHAT[name]
    if rotate:
        log.warning("--new-identity: the service's %s changes from %s to %s", what, theirs,
                    mine)
        _replace(factory, name, mine)
        return
    raise UsageError(f"this node's {what} ({mine[:23]}…) is not the service's "
                     f"({theirs[:23]}…, recorded in its database by the node that started "
                     "first)",
                     hint=f"give every node the same {option}; to change the service's "
                          f"{what} on purpose, start one node with --new-identity")


def load_identity(factory: sessionmaker[Session], home: Path, sign_key: Path | None,
                  passphrase: bytes | None,
                  session_secret: Path | None, secrets_fingerprint: str | None,
                  rotate: bool = False) -> NodeIdentity:
    """This node's keys, checked against (or, first, recorded as) the service's."""
    from certify.report.pades import certificate_path, certificate_pem, load_certificate
    from certify.report.sign import fingerprint, load_private_key
    from certify.service import keys

    key_path = _signing_key_file(home, sign_key)
    private = load_private_key(key_path, passphrase)
    _agree(factory, "sign_key", fingerprint(private.public_key()), rotate)
    secret = _session_secret(home, session_secret)
    _agree(factory, "session_secret", _fingerprint(b"certify session secret", secret), rotate)
    if secrets_fingerprint is not None:
        _agree(factory, "secrets_key", secrets_fingerprint, rotate)
    else:
        with factory() as s:
            row = s.get(Identity, "secrets_key")
            recorded_box = None if row is None else str(row.value)
        if recorded_box is not None and not rotate:
            raise UsageError(f"the service keeps endpoint secrets encrypted with a secrets key "
                             f"({recorded_box[:23]}…) that this node was not given",
                             hint="give every node the same --secrets-key (or "
                                  "CERTIFY_SECRETS_KEY); to drop it on purpose, start one "
                                  "node with --new-identity")
        if recorded_box is not None:
            log.warning("--new-identity: the service no longer has a secrets key")
            with factory() as s:
                s.execute(delete(Identity).where(Identity.name == "secrets_key"))
                s.commit()
    # the certificate: beside the key if there is one, else the service's recorded one (made
    # by the first node), so that every node's card.pdf names the same certificate
    crt = certificate_path(key_path)
    if not crt.exists():
        with factory() as s:
            row = s.get(Identity, "certificate")
            recorded = None if row is None else row.value.encode()
        if recorded is not None:
            try:
                from cryptography import x509

                cert = x509.load_pem_x509_certificate(recorded)
                if cert.public_key() == private.public_key():
                    crt.write_bytes(recorded)
            except (ValueError, OSError):
                log.warning("the recorded certificate could not be used; making one")
    pem = keys.ensure_certificate(key_path, private)
    load_certificate(crt, private)
    recorded_pem = _recorded(factory, "certificate", pem.decode())
    if recorded_pem.encode() != pem:
        from cryptography import x509

        other = x509.load_pem_x509_certificate(recorded_pem.encode())
        if other.public_key() != private.public_key():
            _replace(factory, "certificate", pem.decode())  # the key rotated (checked above)
        else:  # two nodes made one at once, or this one was given another: the service's wins
            log.warning("this node's certificate %s differs from the service's recorded one "
                        "for the same key; using the recorded one", crt.name)
            try:
                crt.write_bytes(recorded_pem.encode())
            except OSError as exc:
                raise UsageError(f"cannot write the service's certificate to {crt}: "
                                 f"{exc.strerror}",
                                 hint="give this node the service's certificate "
                                      "(GET /api/v1/certificate) beside its key") from None
    return NodeIdentity(key_path, private, certificate_pem(load_certificate(crt, private)),
                        secret)
