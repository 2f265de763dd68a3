"""RFC 6962 Merkle trees: tree hashes, inclusion and consistency proofs, and their checks.

Leaves are hashed as SHA-256(0x00 || data) and nodes as SHA-256(0x01 || left || right), so a
leaf can never pass for a node. Proofs are built as RFC 6962 §2.1.1–2.1.2 define them and
verified with the algorithms of RFC 9162 §2.1.3.2 and §2.1.4.2. All hashes are raw bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from certify.errors import CertifyError


class LogError(CertifyError):
    """A transparency-log proof or tree head does not check out (exit 1)."""

    exit_code = 1


def leaf_hash(data: bytes) -> bytes:
    """The hash of a leaf holding ``data``."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """The hash of an interior node."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (n >= 2)."""
    k = 1
    while k << 1 < n:
        k <<= 1
    return k


def root(leaves: Sequence[bytes]) -> bytes:
    """MTH of a list of leaf hashes (the empty tree's is SHA-256 of nothing)."""
    n = len(leaves)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return leaves[0]
    k = _split(n)
    return node_hash(root(leaves[:k]), root(leaves[k:]))


def inclusion_proof(leaves: Sequence[bytes], index: int, tree_size: int) -> list[bytes]:
    """PATH(index, D[tree_size]): the audit path of leaf ``index`` in the first
    ``tree_size`` leaves."""
    if not 0 <= index < tree_size <= len(leaves):
        raise LogError(f"no leaf {index} in a tree of size {tree_size}")
    return _path(index, leaves[:tree_size])


def _path(m: int, d: Sequence[bytes]) -> list[bytes]:
    if len(d) == 1:
        return []
    k = _split(len(d))
    if m < k:
        return _path(m, d[:k]) + [root(d[k:])]
    return _path(m - k, d[k:]) + [root(d[:k])]


def consistency_proof(leaves: Sequence[bytes], first: int, second: int) -> list[bytes]:
    """PROOF(first, D[second]): shows the tree of size ``first`` is a prefix of ``second``."""
    if not 0 <= first <= second <= len(leaves):
        raise LogError(f"no consistency proof from size {first} to size {second}")
    if first == 0 or first == second:
        return []
    return _subproof(first, leaves[:second], True)


def _subproof(m: int, d: Sequence[bytes], whole: bool) -> list[bytes]:
    n = len(d)
    if m == n:
        return [] if whole else [root(d)]
    k = _split(n)
    if m <= k:
        return _subproof(m, d[:k], whole) + [root(d[k:])]
    return _subproof(m - k, d[k:], False) + [root(d[:k])]


class MerkleTree:
    """An append-only RFC 6962 tree that keeps the hash of every complete aligned subtree
    (level ``h`` holds the nodes over leaves ``[j·2^h, (j+1)·2^h)``; about 64 bytes a leaf).

    Appending a leaf costs O(1) amortised; the root of the first ``size`` leaves, an inclusion
    proof and a consistency proof cost O(log² n) hashes, where the list functions above
    (:func:`root`, :func:`inclusion_proof`, :func:`consistency_proof`) read every leaf. Their
    results are the same bytes: the list functions are this class's test oracle.
    """

    def __init__(self) -> None:
        self._levels: list[bytearray] = [bytearray()]

    @property
    def size(self) -> int:
        """Leaves in the tree."""
        return len(self._levels[0]) // 32

    def append(self, leaf: bytes) -> None:
        """Add a leaf hash (32 bytes) at the right edge."""
        if len(leaf) != 32:
            raise ValueError("a leaf hash is 32 bytes")
        level, h = self._levels, 0
        level[0] += leaf
        while len(level[h]) % 64 == 0:  # level h just completed a pair: its parent exists
            node = node_hash(bytes(level[h][-64:-32]), bytes(level[h][-32:]))
            h += 1
            if h == len(level):
                level.append(bytearray())
            level[h] += node

    def leaf(self, index: int) -> bytes:
        """The hash of leaf ``index``."""
        if not 0 <= index < self.size:
            raise LogError(f"no leaf {index} in a tree of size {self.size}")
        return bytes(self._levels[0][32 * index:32 * index + 32])

    def _mth(self, start: int, n: int) -> bytes:
        """MTH(D[start:start+n]) (n >= 1): a stored node when the range is an aligned
        power of two, else split as RFC 6962 §2.1 splits it."""
        if n & (n - 1) == 0 and start % n == 0:
            h, j = n.bit_length() - 1, start // n
            return bytes(self._levels[h][32 * j:32 * j + 32])
        k = _split(n)
        return node_hash(self._mth(start, k), self._mth(start + k, n - k))

    def root(self, size: int | None = None) -> bytes:
        """MTH of the first ``size`` leaves (all of them by default)."""
        size = self.size if size is None else size
        if not 0 <= size <= self.size:
            raise LogError(f"no tree of size {size} in a log of {self.size}")
        return hashlib.sha256(b"").digest() if size == 0 else self._mth(0, size)

    def inclusion_proof(self, index: int, tree_size: int) -> list[bytes]:
        """PATH(index, D[tree_size]), as :func:`inclusion_proof`."""
        if not 0 <= index < tree_size <= self.size:
            raise LogError(f"no leaf {index} in a tree of size {tree_size}")
        return self._path(index, 0, tree_size)

    def _path(self, m: int, start: int, n: int) -> list[bytes]:
        if n == 1:
            return []
        k = _split(n)
        if m < k:
            return self._path(m, start, k) + [self._mth(start + k, n - k)]
        return self._path(m - k, start + k, n - k) + [self._mth(start, k)]

    def consistency_proof(self, first: int, second: int) -> list[bytes]:
        """PROOF(first, D[second]), as :func:`consistency_proof`."""
        if not 0 <= first <= second <= self.size:
            raise LogError(f"no consistency proof from size {first} to size {second}")
        if first == 0 or first == second:
            return []
        return self._subproof(first, 0, second, True)

    def _subproof(self, m: int, start: int, n: int, whole: bool) -> list[bytes]:
        if m == n:
            return [] if whole else [self._mth(start, n)]
        k = _split(n)
        if m <= k:
            return self._subproof(m, start, k, whole) + [self._mth(start + k, n - k)]
        return self._subproof(m - k, start + k, n - k, False) + [self._mth(start, k)]


def verify_inclusion(leaf: bytes, index: int, tree_size: int, proof: Sequence[bytes],
                     expected_root: bytes) -> None:
    """Raise LogError unless ``proof`` shows leaf hash ``leaf`` at ``index`` under the root."""
    if not 0 <= index < tree_size:
        raise LogError(f"leaf index {index} is outside a tree of size {tree_size}")
    fn, sn, r = index, tree_size - 1, leaf
    for p in proof:
        if sn == 0:
            raise LogError("the inclusion proof is longer than the tree allows")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0 or r != expected_root:
        raise LogError(f"the inclusion proof of entry {index} does not lead to the tree "
                       f"head's root (tree size {tree_size})")


def verify_consistency(first: int, second: int, first_root: bytes, second_root: bytes,
                       proof: Sequence[bytes]) -> None:
    """Raise LogError unless ``proof`` shows the tree of size ``first`` (``first_root``) is a
    prefix of the tree of size ``second`` (``second_root``): the log only appended."""
    if first > second:
        raise LogError(f"the log shrank: tree size {second} after {first}")
    if first == second:
        if proof or first_root != second_root:
            raise LogError(f"two different roots for the same tree size {first}: the log "
                           "rewrote its history")
        return
    if first == 0:
        if proof:
            raise LogError("a consistency proof from the empty tree must be empty")
        return
    path = list(proof)
    if first & (first - 1) == 0:  # a power of two: the old root is a node of the new tree
        path = [first_root, *path]
    if not path:
        raise LogError("an empty consistency proof between different tree sizes")
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise LogError("the consistency proof is longer than the trees allow")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0 or fr != first_root or sr != second_root:
        raise LogError(f"the log's tree of size {second} is not an extension of the tree of "
                       f"size {first} seen before: the log rewrote its history")
