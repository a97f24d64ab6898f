"""The RFC 9162 receipt log: roots, proofs, and verifiers that fail exactly when they should."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence

import pytest
from e31.protocol.errors import BadProof, LocalProtocolError, ProtocolError
from e31.protocol.merkle import (
    EMPTY_ROOT,
    MerkleLog,
    leaf_hash,
    node_hash,
    verify_consistency,
    verify_entry_inclusion,
    verify_inclusion,
)
from hypothesis import given, settings
from hypothesis import strategies as st

# --- a straightforward recursive reference: RFC 9162 §2.1.1, §2.1.3.1, §2.1.4.1 read literally ---


def ref_split(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def ref_mth(leaves: Sequence[bytes]) -> bytes:
    n = len(leaves)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return leaves[0]
    k = ref_split(n)
    return node_hash(ref_mth(leaves[:k]), ref_mth(leaves[k:]))


def ref_path(m: int, leaves: Sequence[bytes]) -> list[bytes]:
    n = len(leaves)
    if n == 1:
        return []
    k = ref_split(n)
    if m < k:
        return [*ref_path(m, leaves[:k]), ref_mth(leaves[k:])]
    return [*ref_path(m - k, leaves[k:]), ref_mth(leaves[:k])]


def ref_subproof(m: int, leaves: Sequence[bytes], whole: bool) -> list[bytes]:
    n = len(leaves)
    if m == n:
        return [] if whole else [ref_mth(leaves)]
    k = ref_split(n)
    if m <= k:
        return [*ref_subproof(m, leaves[:k], whole), ref_mth(leaves[k:])]
    return [*ref_subproof(m - k, leaves[k:], False), ref_mth(leaves[:k])]


def ref_consistency(m: int, leaves: Sequence[bytes]) -> list[bytes]:
    return [] if m == 0 else ref_subproof(m, leaves, True)


def entries(n: int) -> list[bytes]:
    return [b"receipt %d" % i for i in range(n)]


def log_of(n: int) -> MerkleLog:
    log = MerkleLog()
    for e in entries(n):
        log.append(e)
    return log


# --- hand-computed trees, sizes 0..8 ---

L = [leaf_hash(e) for e in entries(8)]
N = node_hash
HAND = [
    hashlib.sha256(b"").digest(),
    L[0],
    N(L[0], L[1]),
    N(N(L[0], L[1]), L[2]),
    N(N(L[0], L[1]), N(L[2], L[3])),
    N(N(N(L[0], L[1]), N(L[2], L[3])), L[4]),
    N(N(N(L[0], L[1]), N(L[2], L[3])), N(L[4], L[5])),
    N(N(N(L[0], L[1]), N(L[2], L[3])), N(N(L[4], L[5]), L[6])),
    N(N(N(L[0], L[1]), N(L[2], L[3])), N(N(L[4], L[5]), N(L[6], L[7]))),
]


def test_hashing_rule() -> None:
    assert leaf_hash(b"x") == hashlib.sha256(b"\x00x").digest()
    assert node_hash(b"a" * 32, b"b" * 32) == hashlib.sha256(b"\x01" + b"a" * 32 + b"b" * 32).digest()
    assert hashlib.sha256(b"").digest() == EMPTY_ROOT


@pytest.mark.parametrize("size", range(9))
def test_hand_computed_roots(size: int) -> None:
    assert log_of(size).root() == HAND[size]
    assert log_of(8).root(size) == HAND[size]


def test_hand_computed_proofs() -> None:
    log = log_of(7)
    # Leaf 2 of 7: sibling L3, then the pair (L0,L1), then the right subtree of leaves 4..6.
    assert log.inclusion_proof(2, 7) == (L[3], N(L[0], L[1]), N(N(L[4], L[5]), L[6]))
    # Leaf 6 of 7: the lone right leaf climbs past (L4,L5) and the left half.
    assert log.inclusion_proof(6, 7) == (N(L[4], L[5]), N(N(L[0], L[1]), N(L[2], L[3])))
    # Consistency 3 -> 7 (RFC 9162 §2.1.5 example shape): c, d, g in the RFC's figure.
    assert log.consistency_proof(3, 7) == (L[2], L[3], N(L[0], L[1]), N(N(L[4], L[5]), L[6]))
    # Consistency 4 -> 7: the old tree is a complete subtree, so the proof omits it.
    assert log.consistency_proof(4, 7) == (N(N(L[4], L[5]), L[6]),)


# RFC 6962's published test data (the Certificate Transparency reference leaves and roots).
CT_LEAVES = [
    bytes.fromhex(h)
    for h in [
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    ]
]
CT_ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
CT_INCLUSION = [
    (
        0,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        5,
        8,
        [
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
]
CT_CONSISTENCY = [
    (
        1,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        6,
        8,
        [
            "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (
        2,
        5,
        [
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
]


def test_certificate_transparency_vectors() -> None:
    log = MerkleLog()
    for e in CT_LEAVES:
        log.append(e)
    assert [log.root(n).hex() for n in range(1, 9)] == CT_ROOTS
    for index, size, proof in CT_INCLUSION:
        assert [p.hex() for p in log.inclusion_proof(index, size)] == proof
        verify_entry_inclusion(
            CT_LEAVES[index],
            index,
            size,
            [bytes.fromhex(p) for p in proof],
            bytes.fromhex(CT_ROOTS[size - 1]),
        )
    for old, new, proof in CT_CONSISTENCY:
        assert [p.hex() for p in log.consistency_proof(old, new)] == proof
        verify_consistency(
            old,
            new,
            bytes.fromhex(CT_ROOTS[old - 1]),
            bytes.fromhex(CT_ROOTS[new - 1]),
            [bytes.fromhex(p) for p in proof],
        )


def test_every_proof_of_small_trees_matches_the_reference_and_verifies() -> None:
    log = log_of(33)
    leaves = [leaf_hash(e) for e in entries(33)]
    for size in range(34):
        root = log.root(size)
        assert root == ref_mth(leaves[:size])
        for index in range(size):
            proof = log.inclusion_proof(index, size)
            assert list(proof) == ref_path(index, leaves[:size])
            verify_inclusion(leaves[index], index, size, proof, root)
        for old in range(size + 1):
            proof = log.consistency_proof(old, size)
            assert list(proof) == ref_consistency(old, leaves[:size])
            verify_consistency(old, size, log.root(old), root, proof)


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 1500), data=st.data())
def test_random_sizes_against_the_reference(size: int, data: st.DataObject) -> None:
    leaves = [leaf_hash(b"%d" % i) for i in range(size)]
    log = MerkleLog()
    for h in leaves:
        log.append_leaf_hash(h)
    assert log.root() == ref_mth(leaves)
    index = data.draw(st.integers(0, size - 1), label="index")
    sub = data.draw(st.integers(index + 1, size), label="subtree size")
    proof = log.inclusion_proof(index, sub)
    assert list(proof) == ref_path(index, leaves[:sub])
    verify_inclusion(leaves[index], index, sub, proof, ref_mth(leaves[:sub]))
    old = data.draw(st.integers(0, size), label="old size")
    cproof = log.consistency_proof(old, size)
    assert list(cproof) == ref_consistency(old, leaves)
    verify_consistency(old, size, ref_mth(leaves[:old]), log.root(), cproof)


# --- proofs that must fail ---


def flip(b: bytes, bit: int = 0) -> bytes:
    return bytes([b[0] ^ (1 << bit)]) + b[1:]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 8, 13, 16, 31])
def test_inclusion_failures(size: int) -> None:
    log = log_of(size + 3)
    root = log.root(size)
    for index in range(size):
        leaf = log.leaf_hash_at(index)
        proof = list(log.inclusion_proof(index, size))
        verify_inclusion(leaf, index, size, proof, root)
        bad_cases: list[tuple[bytes, int, int, list[bytes], bytes]] = [
            (flip(leaf), index, size, proof, root),
            (leaf, index, size, proof, flip(root, 7)),
            (leaf, index, size, [*proof, proof[-1] if proof else root], root),
            # A proof only speaks for the (size, root) pair a signed tree head binds together.
            (leaf, index, size + 1, proof, log.root(size + 1)),
            (leaf, index, size + 3, proof, log.root(size + 3)),
            (leaf, size, size, proof, root),
            (leaf, index, index, proof, root),
        ]
        if size > 1:
            bad_cases.append((leaf, index, size - 1, proof, log.root(size - 1)))
            bad_cases.append((leaf, (index + 1) % size, size, proof, root))
            bad_cases.append((log.leaf_hash_at((index + 1) % size), index, size, proof, root))
        if proof:
            bad_cases.append((leaf, index, size, proof[:-1], root))
            bad_cases.append((leaf, index, size, proof[1:], root))
            for i in range(len(proof)):
                flipped = [*proof[:i], flip(proof[i], i % 8), *proof[i + 1 :]]
                bad_cases.append((leaf, index, size, flipped, root))
        for case in bad_cases:
            with pytest.raises(BadProof):
                verify_inclusion(*case)


@pytest.mark.parametrize("new", [2, 3, 4, 5, 7, 8, 9, 12, 17])
def test_consistency_failures(new: int) -> None:
    log = log_of(new + 2)
    new_root = log.root(new)
    for old in range(1, new):
        old_root = log.root(old)
        proof = list(log.consistency_proof(old, new))
        verify_consistency(old, new, old_root, new_root, proof)
        bad_cases: list[tuple[int, int, bytes, bytes, list[bytes]]] = [
            (old, new, flip(old_root), new_root, proof),
            (old, new, old_root, flip(new_root, 3), proof),
            (old, new, old_root, new_root, proof[:-1]),
            (old, new, old_root, new_root, proof[1:]),
            (old, new, old_root, new_root, [*proof, new_root]),
            (old, new, old_root, new_root, []),
            (old, new + 1, old_root, log.root(new + 1), proof),
            (old, new, old_root, log.root(new + 1), proof),
            (new, old, new_root, old_root, proof),
        ]
        if old > 1:
            bad_cases.append((old - 1, new, log.root(old - 1), new_root, proof))
        if old + 1 < new:
            bad_cases.append((old + 1, new, log.root(old + 1), new_root, proof))
        for i in range(len(proof)):
            bad_cases.append((old, new, old_root, new_root, [*proof[:i], flip(proof[i], 5), *proof[i + 1 :]]))
        for case in bad_cases:
            with pytest.raises(BadProof):
                verify_consistency(*case)


def test_consistency_edge_cases() -> None:
    log = log_of(5)
    verify_consistency(5, 5, log.root(), log.root(), [])
    verify_consistency(0, 5, EMPTY_ROOT, log.root(), [])
    verify_consistency(0, 0, EMPTY_ROOT, EMPTY_ROOT, [])
    with pytest.raises(BadProof):
        verify_consistency(5, 5, log.root(), log.root(4), [])
    with pytest.raises(BadProof):
        verify_consistency(5, 5, log.root(), log.root(), [log.root()])
    with pytest.raises(BadProof):
        verify_consistency(0, 5, log.root(1), log.root(), [])
    with pytest.raises(BadProof):
        verify_consistency(0, 5, EMPTY_ROOT, log.root(), [log.root()])


def test_a_rewritten_history_is_not_consistent() -> None:
    honest, forked = log_of(6), log_of(3)
    for e in [b"forged", b"receipt 4", b"receipt 5"]:
        forked.append(e)
    proof = forked.consistency_proof(4, 6)
    with pytest.raises(BadProof):
        verify_consistency(4, 6, honest.root(4), forked.root(6), proof)


@pytest.mark.parametrize(
    "args",
    [
        (b"short", 0, 1, [], b"r" * 32),
        (b"l" * 32, 0, 1, [], b"short"),
        (b"l" * 32, 0, 1, "not a list", b"r" * 32),
        (b"l" * 32, 0, 1, [b"x" * 31], b"r" * 32),
        (b"l" * 32, 0, 1, [None], b"r" * 32),
        (b"l" * 32, -1, 1, [], b"r" * 32),
        (b"l" * 32, True, 2, [b"p" * 32], b"r" * 32),
        (b"l" * 32, 0, 1 << 64, [], b"r" * 32),
        (b"l" * 32, 0, 2, [b"p" * 32] * 65, b"r" * 32),
        ("text", 0, 1, [], b"r" * 32),
    ],
)
def test_malformed_inclusion_arguments_are_bad_proofs(args: tuple[object, ...]) -> None:
    with pytest.raises(BadProof):
        verify_inclusion(*args)  # type: ignore[arg-type]


@given(
    old=st.integers(-2, 40),
    new=st.integers(-2, 40),
    old_root=st.binary(max_size=40),
    new_root=st.binary(max_size=40),
    proof=st.lists(st.one_of(st.binary(min_size=30, max_size=33), st.integers()), max_size=8),
)
def test_verifiers_raise_only_bad_proof(
    old: int, new: int, old_root: bytes, new_root: bytes, proof: list[bytes]
) -> None:
    with contextlib.suppress(BadProof):
        verify_consistency(old, new, old_root, new_root, proof)
    with contextlib.suppress(BadProof):
        verify_inclusion(old_root, old, new, proof, new_root)


def test_log_api_misuse_is_a_local_error() -> None:
    log = log_of(4)
    for call in (
        lambda: log.root(5),
        lambda: log.root(-1),
        lambda: log.inclusion_proof(4, 4),
        lambda: log.inclusion_proof(0, 0),
        lambda: log.inclusion_proof(0, 9),
        lambda: log.consistency_proof(5, 4),
        lambda: log.consistency_proof(2, 5),
        lambda: log.append_leaf_hash(b"short"),
        lambda: log.leaf_hash_at(4),
    ):
        with pytest.raises(LocalProtocolError) as e:
            call()
        assert isinstance(e.value, ProtocolError) and not e.value.remote


def test_appends_return_indexes_and_old_roots_stay_put() -> None:
    log = MerkleLog()
    roots = []
    for i, e in enumerate(entries(20)):
        assert log.append(e) == i
        roots.append(log.root())
    assert len(log) == log.size == 20
    rebuilt = MerkleLog(log.leaf_hash_at(i) for i in range(20))
    assert rebuilt.root() == log.root() and rebuilt.consistency_proof(7) == log.consistency_proof(7)
    assert [log.root(n + 1) for n in range(20)] == roots
    assert log.root(0) == EMPTY_ROOT
