"""RFC 6962 Merkle trees: the published test vectors, and every proof for small trees."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from certify.service.merkle import (
    LogError,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    root,
    verify_consistency,
    verify_inclusion,
)

pytestmark = pytest.mark.unit

# The RFC 6962 test leaves and the roots of their first 1..8 (as used by CT implementations).
LEAVES = [bytes.fromhex(h) for h in (
    "", "00", "10", "2021", "3031", "40414243", "5051525354555657",
    "606162636465666768696a6b6c6d6e6f")]
ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]


def test_roots_match_the_rfc6962_vectors() -> None:
    hashes = [leaf_hash(d) for d in LEAVES]
    assert [root(hashes[:n]).hex() for n in range(1, 9)] == ROOTS
    assert root([]).hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_known_inclusion_and_consistency_proof_lengths() -> None:
    hashes = [leaf_hash(d) for d in LEAVES]
    # RFC 6962 §2.1.3's example tree of 7 leaves: d0's path has 3 hashes, d6's has 2.
    assert len(inclusion_proof(hashes, 0, 7)) == 3
    assert len(inclusion_proof(hashes, 6, 7)) == 2
    # §2.1.3's consistency examples: 3 → 7 is [c, d, g, l] (4), 4 → 7 is [l] (1), 6 → 7 is 3.
    assert len(consistency_proof(hashes, 3, 7)) == 4
    assert len(consistency_proof(hashes, 4, 7)) == 1
    assert len(consistency_proof(hashes, 6, 7)) == 3


def test_every_proof_of_trees_up_to_40_verifies() -> None:
    hashes = [leaf_hash(i.to_bytes(2, "big")) for i in range(40)]
    for n in range(1, 41):
        r = root(hashes[:n])
        for i in range(n):
            verify_inclusion(hashes[i], i, n, inclusion_proof(hashes, i, n), r)
        for m in range(n + 1):
            verify_consistency(m, n, root(hashes[:m]), r, consistency_proof(hashes, m, n))


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 60), st.data())
def test_a_wrong_proof_fails(n: int, data: st.DataObject) -> None:
    hashes = [leaf_hash(i.to_bytes(2, "big")) for i in range(n)]
    r = root(hashes)
    i = data.draw(st.integers(0, n - 1))
    proof = inclusion_proof(hashes, i, n)
    other = data.draw(st.integers(0, n - 1).filter(lambda j: j != i))
    with pytest.raises(LogError):
        verify_inclusion(hashes[i], other, n, proof, r)  # wrong index
    with pytest.raises(LogError):
        verify_inclusion(leaf_hash(b"forged"), i, n, proof, r)  # wrong leaf
    if proof:
        k = data.draw(st.integers(0, len(proof) - 1))
        bad = [*proof]
        bad[k] = bytes([bad[k][0] ^ 1]) + bad[k][1:]
        with pytest.raises(LogError):
            verify_inclusion(hashes[i], i, n, bad, r)  # a flipped byte
    m = data.draw(st.integers(1, n - 1))
    cons = consistency_proof(hashes, m, n)
    rewritten = [*hashes]
    rewritten[data.draw(st.integers(0, m - 1))] = leaf_hash(b"rewritten")
    with pytest.raises(LogError):  # history rewritten below the old size
        verify_consistency(m, n, root(hashes[:m]), root(rewritten), cons)
    with pytest.raises(LogError):  # the log shrank
        verify_consistency(n, m, r, root(hashes[:m]), cons)
