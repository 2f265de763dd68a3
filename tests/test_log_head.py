"""The transparency log's tree head and proofs without reading the whole log per request
(issue 38 point 5: ``GET /api/v1/log`` read every leaf, 483 ms at 100,000 entries).

Behaviour, not timing: the leaves a head reads are counted, and every head and proof is held
against the list functions of :mod:`certify.service.merkle` (the RFC 6962 oracle) and checked
with the verifiers an auditor runs. The speed is measured in ``benchmarks/log_head.py``.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from certify.service import merkle
from certify.service.db import LogEntry, make_engine, migrate, sessions, sqlite_url
from certify.service.tlog import TransparencyLog

pytestmark = pytest.mark.unit


@pytest.fixture()
def factory(tmp_path: Path) -> Iterator[Any]:
    engine = make_engine(sqlite_url(tmp_path))
    migrate(engine)
    yield sessions(engine)
    engine.dispose()


def _key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _append(log: TransparencyLog, start: int, n: int) -> None:
    for i in range(start, start + n):
        log.append({"schema": "test", "i": i}, f"{i:032x}")


def _leaves(factory: Any) -> list[bytes]:
    with factory() as s:
        return [bytes(h) for h in s.scalars(select(LogEntry.leaf_hash).order_by(LogEntry.idx))]


def _root(head: dict[str, Any]) -> bytes:
    return base64.b64decode(head["root_hash"])


def test_a_head_reads_only_the_entries_appended_since_the_last(factory):
    log = TransparencyLog(factory, _key())
    _append(log, 0, 40)
    first = log.tree_head()
    assert first["tree_size"] == 40 and log.leaves_read == 40  # once, when first asked
    assert log.tree_head()["tree_size"] == 40 and log.leaves_read == 40  # nothing new: none
    _append(log, 40, 3)
    second = log.tree_head()
    assert second["tree_size"] == 43 and log.leaves_read == 43  # the 3 new leaves only
    leaves = _leaves(factory)
    assert _root(first) == merkle.root(leaves[:40]) and _root(second) == merkle.root(leaves)
    # the heads are consistent with the log's own proofs, checked as an auditor checks them
    cons = [base64.b64decode(p) for p in log.consistency(40, 43)["proof"]]
    assert cons == merkle.consistency_proof(leaves, 40, 43)
    merkle.verify_consistency(40, 43, _root(first), _root(second), cons)
    for i in (0, 17, 39, 42):
        inc = log.inclusion(i, 43)
        path = [base64.b64decode(p) for p in inc["audit_path"]]
        assert path == merkle.inclusion_proof(leaves, i, 43)
        merkle.verify_inclusion(base64.b64decode(inc["leaf_hash"]), i, 43, path, _root(second))
    assert log.leaves_read == 43  # proofs read no leaf again


def test_another_process_s_appends_are_seen_and_a_new_process_reads_the_log_once(factory):
    key = _key()
    server, worker = TransparencyLog(factory, key), TransparencyLog(factory, key)
    _append(worker, 0, 5)
    assert server.tree_head()["tree_size"] == 5
    _append(worker, 5, 2)  # appended through another object (another process's)
    head = server.tree_head()
    assert head["tree_size"] == 7 and server.leaves_read == 7
    assert _root(head) == merkle.root(_leaves(factory))
    with pytest.raises(merkle.LogError):  # a tree larger than the log has no proof
        server.inclusion(0, 8)
    with pytest.raises(merkle.LogError):
        server.consistency(3, 8)


def test_the_incremental_tree_gives_the_list_functions_bytes_for_every_size():
    leaves = [merkle.leaf_hash(i.to_bytes(2, "big")) for i in range(40)]
    tree = merkle.MerkleTree()
    assert tree.root() == hashlib.sha256(b"").digest()
    for n, leaf in enumerate(leaves, start=1):
        tree.append(leaf)
        assert tree.root() == merkle.root(leaves[:n])
    for n in range(1, 41):
        assert tree.root(n) == merkle.root(leaves[:n])
        for i in range(n):
            assert tree.inclusion_proof(i, n) == merkle.inclusion_proof(leaves, i, n)
        for m in range(n + 1):
            assert tree.consistency_proof(m, n) == merkle.consistency_proof(leaves, m, n)
    with pytest.raises(merkle.LogError):
        tree.root(41)
