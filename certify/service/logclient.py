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

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from certify.errors import CertifyError
from certify.report.sign import fingerprint
from certify.safetext import printable
from certify.service import merkle
from certify.service.bounded import MAX_JSON_BYTES, Bounds, bounded_request, session
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
    """Reads one log's public routes, each answer within ``bounds`` (a byte cap and a total
    deadline: :mod:`certify.service.bounded`)."""

    def __init__(self, url: str, timeout: float = 30.0, bounds: Bounds | None = None) -> None:
        self.url = url.rstrip("/")
        self.base = self.url + "/api/v1"
        self.bounds = bounds or Bounds(deadline_s=timeout)
        self.http = session()

    def get(self, path: str, **params: Any) -> Any:
        def unreachable(message: str, hint: str | None) -> LogUnreachable:
            return LogUnreachable(message, hint=hint or "check --log")

        a = bounded_request(self.http, "GET", self.base + path, self.bounds, unreachable,
                            what=f"the log at {printable(self.url)} ({path.split('?')[0]})",
                            cap=MAX_JSON_BYTES, params=params or None,
                            where=f"the log at {printable(self.url)}",
                            unreachable_hint="check --log")
        if a.status == 404 and path.startswith("/log/lookup"):
            return None
        if not 200 <= a.status < 300:
            raise LogUnreachable(f"the log at {printable(self.url)} answered {a.status} to "
                                 f"{path}", hint="is this a certify service?")
        try:
            return (a.body or b"").decode("ascii") if path == "/key" else a.json()
        except ValueError:
            raise LogUnreachable(f"the log at {printable(self.url)} sent something that is not "
                                 f"{'a PEM key' if path == '/key' else 'JSON'} for "
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


def pinned_key(client: LogClient, pubkey: Path | None, state_path: Path
               ) -> tuple[ec.EllipticCurvePublicKey, str]:
    """The service's key to check its cards against, and a line saying where it came from:
    ``pubkey`` when given, else the key the service sends, pinned on first use. A key other
    than the one pinned for this URL in ``state_path`` is refused (LogError), whichever way it
    came. The pin itself is written by :func:`check_in_log`, once a card verified."""
    key = log_key(client, pubkey)
    fp = fingerprint(key)
    pinned = _load_state(state_path)["urls"].get(client.url)
    if pinned is not None and pinned != fp:
        raise LogError(f"the service at {printable(client.url)} now signs with key {fp}, not "
                       f"the {pinned} pinned for it in {state_path}",
                       hint="do not trust it until its operator explains the key change; "
                            "remove its entry from that file to accept the new key")
    how = "--pubkey" if pubkey is not None else "sent by the service"
    if pinned is not None:
        return key, f"key: {fp} ({how}), the one pinned for {client.url} in {state_path}"
    return key, (f"key: {fp} ({how}), seen for the first time: pinned for {client.url} in "
                 f"{state_path} (a later key change is refused; compare the fingerprint with "
                 "the one the service's operator publishes, or pass --pubkey)")


def check_in_log(statement: dict[str, Any], client: LogClient,
                 key: ec.EllipticCurvePublicKey, state_path: Path,
                 run_id: str | None = None) -> list[str]:
    """Inclusion of a verified card's statement and consistency with the last head seen;
    returns what was established, one line each (LogError otherwise).

    ``run_id`` is the service run the card's signed provenance names: the log entry must be
    that run's (a card copied into another run's folder still names its own run)."""
    return log_inclusion(statement, client, key, state_path, run_id)[0]


def log_inclusion(statement: dict[str, Any], client: LogClient,
                  key: ec.EllipticCurvePublicKey, state_path: Path,
                  run_id: str | None = None) -> tuple[list[str], int]:
    """:func:`check_in_log`, and the index of the card's entry in the log. Answers of the
    wrong shape are a LogError, like answers that do not prove what they should."""
    try:
        return _log_inclusion(statement, client, key, state_path, run_id)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        raise LogError(f"the log at {printable(client.url)} sent malformed answers",
                       hint="do not trust this log") from None


def _log_inclusion(statement: dict[str, Any], client: LogClient,
                   key: ec.EllipticCurvePublicKey, state_path: Path,
                   run_id: str | None) -> tuple[list[str], int]:
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
    index = found["index"]
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ValueError("index")
    entry = client.get(f"/log/entries/{index}")
    if not isinstance(entry, dict) or entry.get("statement_digest") != digest:
        raise LogError(f"the log's entry {index} does not log this card's statement",
                       hint="do not trust this log")
    if run_id is not None and entry.get("run_id") != run_id:
        raise LogError(f"the card names service run {run_id}, but the log's entry {index} is "
                       f"run {printable(entry.get('run_id'), 80)}'s",
                       hint="the card is not the run it claims")
    head = client.get("/log")
    check_tree_head(head, key)
    size, root = int(head["tree_size"]), _b64(head["root_hash"], "root hash")
    proof = client.get("/log/proof/inclusion", index=index, tree_size=size)
    leaf = merkle.leaf_hash(bytes.fromhex(digest.split(":", 1)[1]))
    merkle.verify_inclusion(leaf, index, size, [_b64(p, "audit path") for p in
                                                proof.get("audit_path", [])], root)
    lines = [f"log: entry {index} of {size} at {client.url}"
             + (f", run {printable(entry.get('run_id'), 80)}" if entry.get("run_id") else ""),
             f"inclusion: proven under the signed tree head of size {size}"]
    if seen is None:
        lines.append(f"consistency: first time this log is seen here; its head and key {fp} "
                     f"are now pinned in {state_path} (a later other key, or a head that does "
                     "not extend this one, is refused)")
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
    return lines, index
