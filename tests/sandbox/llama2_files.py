"""llama2.c-format checkpoints and tokenizers written from Python, for the generate workload's tests
and benchmark: random weights of any shape, and hand-made weights whose greedy output is known."""

from __future__ import annotations

import hashlib
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Shape:
    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int
    shared: bool = True

    @property
    def head_size(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.head_size * self.n_kv_heads

    def header(self) -> bytes:
        vocab = self.vocab_size if self.shared else -self.vocab_size
        return struct.pack(
            "<7i",
            self.dim,
            self.hidden_dim,
            self.n_layers,
            self.n_heads,
            self.n_kv_heads,
            vocab,
            self.seq_len,
        )

    def tensors(self) -> list[tuple[str, int]]:
        """The weights in llama2.c's order, as (name, float count)."""
        d, h, n_l, v, kv = self.dim, self.hidden_dim, self.n_layers, self.vocab_size, self.kv_dim
        out = [
            ("token_embedding", v * d),
            ("rms_att", n_l * d),
            ("wq", n_l * d * d),
            ("wk", n_l * d * kv),
            ("wv", n_l * d * kv),
            ("wo", n_l * d * d),
            ("rms_ffn", n_l * d),
            ("w1", n_l * d * h),
            ("w2", n_l * h * d),
            ("w3", n_l * d * h),
            ("rms_final", d),
            ("freq_cis", self.seq_len * self.head_size),
        ]
        if not self.shared:
            out.append(("wcls", v * d))
        return out

    def n_floats(self) -> int:
        return sum(n for _, n in self.tensors())


# The 15M-parameter shape of llama2.c's stories15M.
SHAPE_15M = Shape(dim=288, hidden_dim=768, n_layers=6, n_heads=6, n_kv_heads=6, vocab_size=32000, seq_len=256)


def random_floats(n: int, seed: bytes, scale: float) -> array[float]:
    """n floats uniform in about [-scale, scale), from SHAKE-256 of seed (fast enough for 15M)."""
    raw = hashlib.shake_256(seed).digest(n)
    step = scale / 128.0
    return array("f", (b * step for b in memoryview(raw).cast("b")))


def write_random_model(path: Path, shape: Shape, seed: bytes = b"e31", scale: float = 0.1) -> None:
    with path.open("wb") as f:
        f.write(shape.header())
        for name, n in shape.tensors():
            values = random_floats(n, seed + name.encode(), 1.0 if name.startswith("rms") else scale)
            f.write(values.tobytes())


def write_model(path: Path, shape: Shape, tensors: dict[str, Sequence[float]]) -> None:
    """A checkpoint from explicit tensors; a tensor not given is all zeros."""
    with path.open("wb") as f:
        f.write(shape.header())
        for name, n in shape.tensors():
            values = array("f", tensors.get(name, [0.0] * n))
            assert len(values) == n, (name, len(values), n)
            f.write(values.tobytes())


def byte_tokens() -> list[bytes]:
    """llama2.c's first 259 tokens: <unk>, <s>, </s>, then <0x00>..<0xFF>."""
    return [b"<unk>", b"<s>", b"</s>"] + [b"<0x%02X>" % i for i in range(256)]


def write_tokenizer(path: Path, tokens: Sequence[bytes], scores: Sequence[float]) -> None:
    assert len(tokens) == len(scores)
    with path.open("wb") as f:
        f.write(struct.pack("<i", max((len(t) for t in tokens), default=1)))
        for tok, score in zip(tokens, scores, strict=True):
            f.write(struct.pack("<fi", score, len(tok)) + tok)


def random_vocabulary(vocab_size: int, seed: int = 1) -> tuple[list[bytes], list[float]]:
    """Byte tokens, single letters and a space, then distinct random lowercase words up to vocab_size."""
    import random

    rng = random.Random(seed)
    tokens = byte_tokens() + [bytes([c]) for c in b" abcdefghijklmnopqrstuvwxyz"]
    seen = set(tokens)
    while len(tokens) < vocab_size:
        word = bytes(rng.choice(b" abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8)))
        if word not in seen:
            seen.add(word)
            tokens.append(word)
    tokens = tokens[:vocab_size]
    scores = [0.0] * 3 + [-1e6] * 256 + [-float(i) for i in range(vocab_size - 259)]
    return tokens, scores[:vocab_size]
