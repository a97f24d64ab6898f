"""The two llama2.c files an inference job reads, checked before a batch is sent, and the limits they imply.

A checkpoint (llama2.c's version-0 layout, as run.c reads it) is seven little-endian int32 (dim,
hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; a negative vocab_size means the classifier
is stored apart from the token embedding), then float32 weights: token embedding, per-layer RMSNorm,
wq, wk, wv, wo, RMSNorm, w1, w2, w3, the final RMSNorm, two rotary tables of seq_len * head_size / 2
each (unused) and, when unshared, the classifier. Its size follows from the header exactly, so a
truncated or padded file is refused here, not after it has travelled. A tokenizer is an int32
max_token_length, then per token a float32 score, an int32 length and that many bytes: exactly
vocab_size tokens, nothing after.

The limits are sized from the shape (`limits_for`): fuel per position of the forward pass (the
multiply-adds of every matrix, the attention over the context, the sampling over the vocabulary; the
constants were measured on generate.wasm, with a margin) times the positions a prompt can take;
memory for the model, the tokenizer, the key/value cache and the prompts; and a wall-clock limit from
the fuel at a slow machine's rate. docs/inference.md, "Limits", gives the figures behind them.
"""

from __future__ import annotations

import math
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelFileError
from .files import file_kind

HEADER = struct.Struct("<7i")
MAX_MODEL_BYTES = 3 << 30
"""The largest checkpoint a job can carry: it is read whole into the guest's 4 GiB linear memory."""
MAX_TOKENIZER_BYTES = 64 << 20

FUEL_PER_MAC = 3.5
"""Fuel per multiply-add of generate.wasm's SIMD matmuls (measured 3.2 at dim 64, less when wider)."""
FUEL_PER_ATTENDED = 100
"""Fuel per head per position attended, besides its 2 * head_size multiply-adds (the softmax's exp)."""
FUEL_PER_LOGIT = 40
"""Fuel per vocabulary entry per position: the classifier's softmax, sampling or argmax."""
FUEL_PER_LAYER = 20_000
"""Fuel per layer per position outside the matmuls and attention: RMSNorm, rotary embedding, SwiGLU."""
FUEL_PER_PROMPT_BYTE_SQ = 50
"""Encoding a prompt merges pairs over and over: fuel per (prompt byte)^2, an upper bound."""
FUEL_BASE = 50_000_000
"""Start-up: reading the files, building the sorted vocabulary, writing the output."""
MIN_FUEL_RATE = 100_000_000
"""Fuel per second a slow machine still runs (for the wall-clock limit; a fast one does 5-10x)."""
MIN_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class ModelShape:
    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int
    shared_classifier: bool

    @property
    def head_size(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.dim * self.n_kv_heads // self.n_heads

    @property
    def weights(self) -> int:
        """How many float32 the checkpoint holds after its header."""
        d, h, n, v = self.dim, self.hidden_dim, self.n_layers, self.vocab_size
        per_layer = 2 * d + 2 * d * d + 2 * d * self.kv_dim + 3 * d * h
        rope = self.seq_len * self.head_size  # the two unused tables of seq_len * head_size / 2
        return v * d + n * per_layer + d + rope + (0 if self.shared_classifier else v * d)

    @property
    def file_size(self) -> int:
        return HEADER.size + 4 * self.weights

    @property
    def parameters(self) -> int:
        """Trained parameters (the rotary tables are not)."""
        return self.weights - self.seq_len * self.head_size

    @property
    def matmul_macs(self) -> int:
        """Multiply-adds of the matrices of one forward pass (every layer's and the classifier)."""
        d = self.dim
        per_layer = 2 * d * d + 2 * d * self.kv_dim + 3 * d * self.hidden_dim
        return self.n_layers * per_layer + d * self.vocab_size

    def fuel_per_position(self, position: int) -> int:
        """An upper bound on the fuel of one forward pass at `position` (0-based), with sampling."""
        attended = self.n_layers * self.n_heads * (position + 1)
        return math.ceil(
            FUEL_PER_MAC * self.matmul_macs
            + attended * (4 * self.head_size + FUEL_PER_ATTENDED)
            + FUEL_PER_LOGIT * self.vocab_size
            + FUEL_PER_LAYER * self.n_layers
        )


def _stat_regular(path: Path, label: str, most: int) -> int:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ModelFileError(f"{label} {path}: no such file") from None
    except OSError as e:
        raise ModelFileError(f"{label} {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ModelFileError(f"{label} {path}: {file_kind(st.st_mode)}, not a regular file")
    if st.st_size > most:
        raise ModelFileError(f"{label} {path}: {st.st_size} bytes, more than the {most} a job can carry")
    return st.st_size


def _read_prefix(path: Path, label: str, size: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise ModelFileError(f"{label} {path}: {e.strerror or e}") from None
    try:
        chunks, left = [], size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise ModelFileError(f"{label} {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def read_model_shape(path: Path, label: str = "model") -> ModelShape:
    """The shape of the llama2.c checkpoint at `path`, once its header is sane and its size matches."""
    size = _stat_regular(path, label, MAX_MODEL_BYTES)
    head = _read_prefix(path, label, HEADER.size)
    if len(head) < HEADER.size:
        raise ModelFileError(f"{label} {path}: {len(head)} bytes, shorter than a llama2.c checkpoint header")
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = HEADER.unpack(head)
    shape = ModelShape(dim, hidden, layers, heads, kv_heads, abs(vocab), seq_len, vocab > 0)
    problems = [
        n
        for n, v in zip(
            ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"),
            (dim, hidden, layers, heads, kv_heads, abs(vocab), seq_len),
            strict=True,
        )
        if not 0 < v <= 1 << 20
    ]
    if problems:
        raise ModelFileError(
            f"{label} {path}: not a llama2.c checkpoint (header {dim}, {hidden}, {layers}, {heads}, "
            f"{kv_heads}, {vocab}, {seq_len}: {', '.join(problems)} out of range)"
        )
    if dim % heads or heads % kv_heads or shape.head_size % 2:
        raise ModelFileError(
            f"{label} {path}: dim {dim}, {heads} heads and {kv_heads} key/value heads do not divide "
            "(dim a multiple of n_heads, n_heads of n_kv_heads, an even head size)"
        )
    if size != shape.file_size:
        raise ModelFileError(
            f"{label} {path}: {size} bytes, but its header (dim {dim}, hidden {hidden}, {layers} layers, "
            f"vocab {abs(vocab)}, seq_len {seq_len}) says {shape.file_size}"
        )
    return shape


def check_tokenizer(path: Path, vocab_size: int, label: str = "tokenizer") -> int:
    """Check the llama2.c tokenizer at `path` holds exactly `vocab_size` tokens; returns its size."""
    size = _stat_regular(path, label, MAX_TOKENIZER_BYTES)
    data = _read_prefix(path, label, size + 1)
    if len(data) != size:
        raise ModelFileError(f"{label} {path}: changed while it was read")
    if len(data) < 4:
        raise ModelFileError(f"{label} {path}: too short for a llama2.c tokenizer")
    (max_len,) = struct.unpack_from("<i", data)
    if max_len <= 0:
        raise ModelFileError(f"{label} {path}: max_token_length {max_len}: not a llama2.c tokenizer")
    at = 4
    for i in range(vocab_size):
        if at + 8 > len(data):
            raise ModelFileError(
                f"{label} {path}: ends at token {i}; the model's vocabulary has {vocab_size}"
            )
        (length,) = struct.unpack_from("<i", data, at + 4)
        if not 0 <= length <= max_len or at + 8 + length > len(data):
            raise ModelFileError(f"{label} {path}: token {i} has a bad length ({length})")
        at += 8 + length
    if at != len(data):
        raise ModelFileError(
            f"{label} {path}: {len(data) - at} bytes after its {vocab_size} tokens "
            "(does it belong to this model?)"
        )
    return size


@dataclass(frozen=True, slots=True)
class InferenceLimits:
    fuel: int
    memory: int
    timeout: float


def positions(shape: ModelShape, prompt_bytes: int, max_tokens: int) -> int:
    """The most positions a prompt can run through: BOS, at most a token per byte (plus the leading
    space llama2.c's encoder adds), then the tokens generated; never more than the context."""
    return min(shape.seq_len, prompt_bytes + 2 + max_tokens)


def limits_for(
    shape: ModelShape, model_bytes: int, tokenizer_bytes: int, prompts: list[tuple[int, int]], file_bytes: int
) -> InferenceLimits:
    """Limits for one job: `prompts` is (prompt bytes, max_tokens) per line; `file_bytes` its prompts file."""
    fuel = FUEL_BASE + model_bytes // 4
    for prompt_bytes, max_tokens in prompts:
        n = positions(shape, prompt_bytes, max_tokens)
        # every position costs at most what the last one does (attention grows with the context)
        fuel += n * shape.fuel_per_position(n - 1) + FUEL_PER_PROMPT_BYTE_SQ * prompt_bytes**2
    state = 4 * (
        shape.n_layers * shape.seq_len * shape.kv_dim * 2  # key/value cache
        + 6 * shape.dim
        + 2 * shape.hidden_dim
        + shape.n_heads * shape.seq_len
        + 2 * shape.vocab_size
    )
    memory = model_bytes + 4 * tokenizer_bytes + state + 4 * file_bytes + (16 << 20)
    memory = -(-memory // (1 << 20)) << 20
    return InferenceLimits(fuel, memory, max(MIN_TIMEOUT, math.ceil(fuel / MIN_FUEL_RATE)))
