"""The service's own keys: the card-signing key and the session-cookie key, both 0600.

The signing key lives only on the server. Without ``--sign-key`` the service makes one in its
home folder at first start (``keys/service.key``) and uses it from then on; a key file that
other users can read is refused. Its self-issued certificate (``keys/service.crt``, named by
every card.pdf's PDF signature) is made beside it where missing.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import Any

from certify.errors import UsageError


def check_private(path: Path, what: str) -> None:
    """Refuse a key file that group or others can read, or that another user owns."""
    try:
        st = path.stat()
    except OSError as exc:
        raise UsageError(f"cannot read the {what} {path}: {exc.strerror}",
                         hint="check the path") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UsageError(f"the {what} {path} is readable by other users "
                         f"(mode {stat.S_IMODE(st.st_mode):04o})", hint=f"chmod 600 {path}")
    if st.st_uid != os.getuid():
        raise UsageError(f"the {what} {path} belongs to another user",
                         hint="the service's keys must belong to the user running it")


def signing_key_path(home: Path, given: Path | None) -> Path:
    """The signing key to use: ``given``, or the home folder's own (made on first start)."""
    if given is not None:
        check_private(given, "signing key")
        return given
    from certify.report.sign import keygen

    folder = home / "keys"
    path = folder / "service.key"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        keygen(folder, "service")
    check_private(path, "signing key")
    return path


def ensure_certificate(key_path: Path, key: Any) -> bytes:
    """The signing key's certificate (PEM), ``NAME.crt`` beside ``NAME.key``: read, or made
    where missing (a home from before certify wrote certificates, or a ``--sign-key`` without
    one), so that every run's card.pdf names the same certificate and
    ``GET /api/v1/certificate`` publishes it. A certificate for another key is refused."""
    from certify.report.pades import (
        certificate_path,
        certificate_pem,
        load_certificate,
        write_certificate,
    )

    path = certificate_path(key_path)
    if path.exists():
        return certificate_pem(load_certificate(path, key))
    try:
        cert = write_certificate(key, path)
    except OSError as exc:
        raise UsageError(f"cannot write the signing key's certificate {path}: {exc.strerror}",
                         hint="put the key's certificate there (`certify keygen` writes "
                              "NAME.crt beside NAME.key), or let the service write it") \
            from None
    return certificate_pem(cert)


def session_secret(home: Path) -> bytes:
    """The key that signs session cookies (``keys/session.key``, made on first start)."""
    folder = home / "keys"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "session.key"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
    check_private(path, "session key")
    return path.read_bytes()
