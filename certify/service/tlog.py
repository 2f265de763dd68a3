"""The service's transparency log: every issued card, appended to an RFC 6962 Merkle tree.

A leaf's data is the *statement digest*: SHA-256 of the canonical JSON of the statement the
card's signature covers (schema, and the digests of its measurement and provenance). Rows of
``log_entries`` are only ever inserted, with consecutive indices; a tree head is signed with the
service's key over ``{"type": "certify.tree-head/1", "tree_size", "root_hash", "timestamp"}``.
"""

from __future__ import annotations

import base64
import threading
import time
from typing import TypedDict

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from certify.canonical import canonical_json
from certify.report.sealed import statement_digest as statement_digest  # the leaf's data
from certify.report.sign import ALGORITHM, fingerprint
from certify.service import merkle
from certify.service.db import LogEntry, utcnow

TREE_HEAD_TYPE = "certify.tree-head/1"


class TreeHead(TypedDict):
    """A signed tree head (``GET /log``)."""

    tree_size: int
    root_hash: str
    timestamp: int
    key_fingerprint: str
    algorithm: str
    signature: str


class Entry(TypedDict):
    """One entry of the log and the statement it logs (``GET /log/entries/{n}``)."""

    index: int
    leaf_hash: str
    statement_digest: str
    statement: dict[str, object]
    run_id: str
    created: str


class InclusionProof(TypedDict):
    """An entry's audit path in a tree of a given size."""

    index: int
    tree_size: int
    leaf_hash: str
    audit_path: list[str]


class ConsistencyProof(TypedDict):
    """That the tree of size ``first`` is a prefix of the tree of size ``second``."""

    first: int
    second: int
    proof: list[str]


def b64(b: bytes) -> str:
    """Standard base64 text."""
    return base64.b64encode(b).decode("ascii")


def tree_head_payload(size: int, root_b64: str, timestamp: int) -> bytes:
    """The bytes a tree head's signature covers."""
    return canonical_json({"type": TREE_HEAD_TYPE, "tree_size": size, "root_hash": root_b64,
                           "timestamp": timestamp})


class TransparencyLog:
    """The log on the ``log_entries`` table, signed with the service's key."""

    def __init__(self, factory: sessionmaker[Session], key: ec.EllipticCurvePrivateKey
                 ) -> None:
        self.factory, self.key = factory, key
        # The tree of the entries read so far: rows are never updated or deleted, so each
        # leaf is read once per process and a tree head or proof costs O(log² n) hashes and
        # one query for the entries appended since the last (the whole log was read per
        # request before: 483 ms at 100,000 entries).
        self._tree = merkle.MerkleTree()
        self._lock = threading.Lock()
        #: Leaf hashes this process has read from the database (each once).
        self.leaves_read = 0

    def _synced(self) -> merkle.MerkleTree:
        """The tree of every committed entry (call with the lock held): reads only the
        entries from the cached size on."""
        tree = self._tree
        with self.factory() as s:
            rows = s.execute(select(LogEntry.idx, LogEntry.leaf_hash)
                             .where(LogEntry.idx >= tree.size).order_by(LogEntry.idx)).all()
        for idx, leaf in rows:
            if idx != tree.size:  # indices are consecutive; never skip one
                break
            tree.append(bytes(leaf))
            self.leaves_read += 1
        return tree

    def size(self) -> int:
        """Entries in the log."""
        with self.factory() as s:
            return int(s.scalar(select(func.count()).select_from(LogEntry)) or 0)

    def append(self, statement: dict[str, object], run_id: str) -> int:
        """Append a signed statement (once: the same statement again gets its index)."""
        digest = statement_digest(statement)
        leaf = merkle.leaf_hash(bytes.fromhex(digest.split(":", 1)[1]))
        for _ in range(50):
            existing = self.lookup(digest)
            if existing is not None:
                return existing
            with self.factory() as s:
                idx = int(s.scalar(select(func.count()).select_from(LogEntry)) or 0)
                s.add(LogEntry(idx=idx, leaf_hash=leaf, statement_digest=digest,
                               statement=statement, run_id=run_id, created=utcnow()))
                try:
                    s.commit()
                    return idx
                except IntegrityError:  # another writer took idx (or this statement)
                    s.rollback()
            time.sleep(0.01)
        raise RuntimeError("could not append to the transparency log after 50 tries")

    def lookup(self, digest: str) -> int | None:
        """The index of the entry with this statement digest."""
        with self.factory() as s:
            return s.scalar(select(LogEntry.idx).where(LogEntry.statement_digest == digest))

    def tree_head(self) -> TreeHead:
        """The latest signed tree head."""
        with self._lock:
            tree = self._synced()
            size, root_b64 = tree.size, b64(tree.root())
        ts = int(time.time() * 1000)
        sig = self.key.sign(tree_head_payload(size, root_b64, ts), ec.ECDSA(hashes.SHA256()))
        return TreeHead(tree_size=size, root_hash=root_b64, timestamp=ts,
                        key_fingerprint=fingerprint(self.key.public_key()),
                        algorithm=ALGORITHM, signature=b64(sig))

    def entry(self, n: int) -> Entry:
        """Entry ``n`` (LogError if there is none)."""
        with self.factory() as s:
            e = s.get(LogEntry, n)
        if e is None:
            raise merkle.LogError(f"no log entry {n}")
        return Entry(index=e.idx, leaf_hash=b64(bytes(e.leaf_hash)),
                     statement_digest=e.statement_digest, statement=e.statement,
                     run_id=e.run_id, created=e.created.isoformat() + "Z")

    def inclusion(self, index: int, tree_size: int) -> InclusionProof:
        """The audit path of entry ``index`` in the tree of size ``tree_size``."""
        with self._lock:
            tree = self._synced()
            proof = tree.inclusion_proof(index, tree_size)
            leaf = tree.leaf(index)
        return InclusionProof(index=index, tree_size=tree_size, leaf_hash=b64(leaf),
                              audit_path=[b64(p) for p in proof])

    def consistency(self, first: int, second: int) -> ConsistencyProof:
        """The proof that the tree of size ``first`` is a prefix of that of ``second``."""
        with self._lock:
            proof = self._synced().consistency_proof(first, second)
        return ConsistencyProof(first=first, second=second, proof=[b64(p) for p in proof])
