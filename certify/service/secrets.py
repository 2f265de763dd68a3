"""Endpoint secrets at rest: AES-256-GCM under a key the operator provides.

The key is 32 bytes, from a file (mode 0600, owned by the service's user, and not inside the
service's home folder: a copy of the database and store alone must not decrypt anything) or
from ``CERTIFY_SECRETS_KEY`` (base64). Each secret is bound to its run by the associated data,
so a ciphertext copied to another run does not decrypt.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from certify.errors import UsageError

ENV = "CERTIFY_SECRETS_KEY"
VERSION = b"\x01"


class SecretBox:
    """Encrypts and decrypts short secrets, each bound to a context (the run id)."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise UsageError(f"the secrets key must be 32 bytes, not {len(key)}",
                             hint="make one with: head -c 32 /dev/urandom > secrets.key")
        self._aead = AESGCM(key)

    def encrypt(self, plaintext: str, context: str) -> bytes:
        """``version || nonce || ciphertext+tag``."""
        nonce = os.urandom(12)
        return VERSION + nonce + self._aead.encrypt(nonce, plaintext.encode(), context.encode())

    def decrypt(self, blob: bytes, context: str) -> str:
        """The plaintext; ValueError if the key, the context or the bytes are wrong."""
        if blob[:1] != VERSION or len(blob) < 1 + 12 + 16:
            raise ValueError("not a secret this service encrypted")
        try:
            return self._aead.decrypt(blob[1:13], blob[13:], context.encode()).decode()
        except InvalidTag:
            raise ValueError("the secret does not decrypt with this key for this run") \
                from None


def load_secret_box(path: Path | None, home: Path) -> SecretBox:
    """The box for ``path`` (checked: 0600, ours, outside ``home``) or ``$CERTIFY_SECRETS_KEY``."""
    from certify.service.keys import check_private

    if path is None:
        text = os.environ.get(ENV, "")
        try:
            return SecretBox(base64.b64decode(text, validate=True))
        except ValueError:
            raise UsageError(f"{ENV} is not base64", hint="base64 of 32 random bytes") from None
    resolved, home_r = path.resolve(), home.resolve()
    if home_r == resolved.parent or home_r in resolved.parents:
        raise UsageError(f"the secrets key {path} is inside the service's home {home}",
                         hint="keep it apart from the database it protects")
    check_private(path, "secrets key")
    return SecretBox(path.read_bytes())
