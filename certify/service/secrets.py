"""Endpoint secrets at rest: AES-256-GCM under a key the operator provides.

The key is 32 bytes, from a file (mode 0600, owned by the service's user, and not inside the
service's home folder: a copy of the database and store alone must not decrypt anything) or
from ``CERTIFY_SECRETS_KEY`` (base64). Each secret is bound to its run by the associated data,
so a ciphertext copied to another run does not decrypt.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import Any

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
        #: Names the key without revealing it (every node of a service must hold the same).
        self.fingerprint = "sha256:" + hashlib.sha256(b"certify secrets key\0" + key).hexdigest()

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


def pack(header: str | None, url: str | None) -> str:
    """What a run keeps encrypted: the endpoint's header secret and, when the endpoint URL
    itself holds a credential (``?api_key=…``, ``user:pass@``), the whole URL (the database
    and ``job.json`` then keep only its redacted form)."""
    import json

    return json.dumps({"v": 2, "header": header, "url": url})


def unpack(plaintext: str) -> tuple[str | None, str | None]:
    """(header secret, URL with its credentials) as :func:`pack` made them; a secret stored
    before version 2 is the header secret alone."""
    import json

    try:
        doc = json.loads(plaintext)
    except ValueError:
        return plaintext, None
    if isinstance(doc, dict) and doc.get("v") == 2:
        return doc.get("header"), doc.get("url")
    return plaintext, None


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


def migrate_url_credentials(factory: Any, box: SecretBox | None, store: Any) -> int:
    """Runs stored before credentials in endpoint URLs were kept encrypted: each run whose
    stored URL holds one gets it encrypted with its header secret (:func:`pack`) and keeps the
    URL redacted; its ``job.json`` is redacted too. Without a secrets key a finished run's URL
    is redacted (it is not needed again) and a live one is left for the operator, with a
    warning. Returns how many runs changed."""
    import json
    import logging

    from sqlalchemy import select

    from certify.redact import has_credentials, redact
    from certify.service.db import FINAL_STATES, Run

    log = logging.getLogger("certify.service")
    changed = 0
    with factory() as s:
        for run in s.scalars(select(Run).where(Run.model_kind == "http")):
            url = run.model_ref
            if not has_credentials(url):
                continue
            if box is not None:
                header = None
                if run.secret_enc is not None:
                    header, _ = unpack(box.decrypt(run.secret_enc, run.id))
                run.secret_enc = box.encrypt(pack(header, url), run.id)
            elif run.state not in FINAL_STATES:
                log.warning("run %s: its endpoint URL holds a credential in clear and this "
                            "service has no secrets key (--secrets-key) to keep it", run.id)
                continue
            run.model_ref = redact(url)
            changed += 1
            # a run folder from before issue 39 kept its job.json in the store
            from certify.service.store import NotInStore, put_bytes, read_bytes, run_prefix

            key = f"{run_prefix(run.id)}/job.json"
            try:
                spec = json.loads(read_bytes(store, key, 1 << 20))
            except (NotInStore, ValueError):
                continue
            if isinstance(spec, dict) and has_credentials(str(spec.get("model", ""))):
                spec["model"] = redact(str(spec["model"]))
                put_bytes(store, key, json.dumps(spec, indent=1).encode())
        s.commit()
    if changed:
        log.info("kept the credentials of %d endpoint URL(s) encrypted", changed)
    return changed
