"""An auditor's check of a card against a certify service's transparency log.

``certify verify CARD --log URL``: the card's signature (as without ``--log``), the entry that
logs its statement, the signed tree head, the entry's inclusion under that head, and the
head's consistency with the last head this machine saw from the same log (kept in a small state
file), so a log that rewrote or dropped history is caught. Without ``--pubkey`` the log's key is
fetched and pinned on first use: a log that later presents another key is refused.
"""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path
from typing import Any

import requests
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from certify.errors import CertifyError
from certify.report.sign import fingerprint
from certify.service import merkle
from certify.service.merkle import LogError
from certify.service.tlog import statement_digest, tree_head_payload


class LogUnreachable(CertifyError):
    """The log's server could not be reached or answered nonsense (exit 3)."""

    exit_code = 3


def default_state_path() -> Path:
    """``$CERTIFY_LOG_STATE`` or ``~/.config/certify/logs.json``."""
    env = os.environ.get("CERTIFY_LOG_STATE")
    return Path(env) if env else Path.home() / ".config" / "certify" / "logs.json"


class LogClient:
    """Reads one log's public routes."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.base = self.url + "/api/v1"
        self.timeout = timeout

    def get(self, path: str, **params: Any) -> Any:
        try:
            r = requests.get(self.base + path, params=params or None, timeout=self.timeout)
        except requests.RequestException as exc:
            raise LogUnreachable(f"cannot reach the log at {self.url}: {type(exc).__name__}",
                                 hint="check --log") from None
        if r.status_code == 404 and path.startswith("/log/lookup"):
            return None
        if not r.ok:
            raise LogUnreachable(f"the log at {self.url} answered {r.status_code} to {path}",
                                 hint="is this a certify service?")
        try:
            return r.text if path == "/key" else r.json()
        except ValueError:
            raise LogUnreachable(f"the log at {self.url} sent something that is not JSON for "
                                 f"{path}") from None


def _b64(text: Any, what: str) -> bytes:
    try:
        return base64.b64decode(str(text), validate=True)
    except ValueError:
        raise LogError(f"the log's {what} is not base64") from None


def check_tree_head(head: dict[str, Any], key: ec.EllipticCurvePublicKey) -> None:
    """Raise LogError unless ``head`` is signed by ``key``."""
    try:
        payload = tree_head_payload(int(head["tree_size"]), str(head["root_hash"]),
                                    int(head["timestamp"]))
        key.verify(_b64(head["signature"], "tree head signature"), payload,
                   ec.ECDSA(hashes.SHA256()))
    except (KeyError, TypeError, ValueError):
        raise LogError("the log's tree head is malformed") from None
    except InvalidSignature:
        raise LogError("the log's tree head is not signed by the log's key",
                       hint="do not trust this log") from None


#: The state file's layout: heads pinned by the log's key fingerprint (``logs``), and the key
#: each URL was seen with (``urls``). Version 1 pinned heads by URL string, so that the same
#: log under another spelling of its address started afresh.
STATE_VERSION = 2


def _load_state(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        doc = {}
    except (OSError, ValueError):
        raise LogError(f"the log state file {path} is unreadable",
                       hint="fix or remove it (you lose the history it pins)") from None
    return migrate_state(doc if isinstance(doc, dict) else {})


def migrate_state(doc: dict[str, Any]) -> dict[str, Any]:
    """A state document in the current layout; a version 1 document (heads by URL) becomes
    heads by key, keeping for each key the largest head seen under any of its URLs."""
    if doc.get("version") == STATE_VERSION:
        doc.setdefault("logs", {})
        doc.setdefault("urls", {})
        return doc
    logs: dict[str, Any] = {}
    urls: dict[str, str] = {}
    for url, seen in (doc.get("logs") or {}).items():
        if not isinstance(seen, dict) or not seen.get("key_fingerprint"):
            continue
        fp = str(seen["key_fingerprint"])
        urls[str(url)] = fp
        kept = logs.get(fp)
        if kept is None or int(seen.get("tree_size", 0)) > int(kept.get("tree_size", 0)):
            logs[fp] = {k: v for k, v in seen.items() if k != "key_fingerprint"} | {
                "urls": sorted({*(kept or {}).get("urls", []), str(url)})}
        else:
            kept["urls"] = sorted({*kept.get("urls", []), str(url)})
    return {"version": STATE_VERSION, "logs": logs, "urls": urls}


def _save_state(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def log_key(client: LogClient, pubkey: Path | None) -> ec.EllipticCurvePublicKey:
    """The key to check against: ``pubkey``, or the log's own (pinned later)."""
    from certify.report.sign import load_public_key

    if pubkey is not None:
        return load_public_key(pubkey)
    try:
        key = serialization.load_pem_public_key(str(client.get("/key")).encode())
    except ValueError:
        raise LogUnreachable(f"{client.url} did not send a PEM public key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise LogError(f"{client.url}'s key is not an ECDSA key")
    return key


def check_in_log(statement: dict[str, Any], client: LogClient,
                 key: ec.EllipticCurvePublicKey, state_path: Path,
                 run_id: str | None = None) -> list[str]:
    """Inclusion of a verified card's statement and consistency with the last head seen;
    returns what was established, one line each (LogError otherwise).

    ``run_id`` is the service run the card's signed provenance names: the log entry must be
    that run's (a card copied into another run's folder still names its own run)."""
    state = _load_state(state_path)
    logs, urls = state["logs"], state["urls"]
    fp = fingerprint(key)
    if urls.get(client.url, fp) != fp:
        raise LogError(f"the log at {client.url} now signs with key {fp}, not the "
                       f"{urls[client.url]} pinned when it was first seen",
                       hint="do not trust it until its operator explains the key change")
    # pinned by its key: the same log under another spelling of its address is the same log
    seen = logs.get(fp)
    digest = statement_digest(statement)
    found = client.get("/log/lookup", statement_digest=digest)
    if found is None:
        raise LogError(f"the card is not in the log at {client.url} (statement {digest})",
                       hint="a card this service issued is always logged")
    index = int(found["index"])
    entry = client.get(f"/log/entries/{index}")
    if not isinstance(entry, dict) or entry.get("statement_digest") != digest:
        raise LogError(f"the log's entry {index} does not log this card's statement",
                       hint="do not trust this log")
    if run_id is not None and entry.get("run_id") != run_id:
        raise LogError(f"the card names service run {run_id}, but the log's entry {index} is "
                       f"run {entry.get('run_id')}'s", hint="the card is not the run it claims")
    head = client.get("/log")
    check_tree_head(head, key)
    size, root = int(head["tree_size"]), _b64(head["root_hash"], "root hash")
    proof = client.get("/log/proof/inclusion", index=index, tree_size=size)
    leaf = merkle.leaf_hash(bytes.fromhex(digest.split(":", 1)[1]))
    merkle.verify_inclusion(leaf, index, size, [_b64(p, "audit path") for p in
                                                proof.get("audit_path", [])], root)
    lines = [f"log: entry {index} of {size} at {client.url}"
             + (f", run {entry.get('run_id')}" if entry.get("run_id") else ""),
             f"inclusion: proven under the signed tree head of size {size}"]
    if seen is None:
        lines.append("consistency: first time this log is seen here; its head is now pinned")
    else:
        old_size, old_root = int(seen["tree_size"]), _b64(seen["root_hash"], "pinned root")
        if old_size > size:
            raise LogError(f"the log shrank: tree size {size}, but {old_size} was seen at "
                           f"{seen.get('seen_at')}", hint="do not trust this log")
        cons = client.get("/log/proof/consistency", first=old_size, second=size)
        merkle.verify_consistency(old_size, size, old_root, root,
                                  [_b64(p, "consistency proof") for p in cons.get("proof", [])])
        lines.append(f"consistency: the log extends the tree of size {old_size} seen at "
                     f"{seen.get('seen_at')}")
    logs[fp] = {"tree_size": size, "root_hash": head["root_hash"],
                "seen_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "urls": sorted({*(seen or {}).get("urls", []), client.url})}
    urls[client.url] = fp
    _save_state(state_path, state)
    return lines
