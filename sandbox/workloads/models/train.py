# mypy: ignore-errors
# (a training script run in its own venv with torch and sentencepiece, which e31 does not depend on)
"""Trains the model e31 ships (kjv.bin + kjv-tok.bin) and exports it to llama2.c's two file formats.

Not part of e31 at run time and not needed by its tests: it needs PyTorch and sentencepiece, which the
project does not depend on. Install them in a separate venv (docs/inference.md, "The shipped model"):

    python3 -m venv /tmp/train-venv
    /tmp/train-venv/bin/pip install torch sentencepiece numpy
    apt-get install bible-kjv            # the King James Version text and the `bible` reader
    nice -n 10 /tmp/train-venv/bin/python sandbox/workloads/models/train.py all --work /tmp/kjv-train

Steps (each can be run alone; `all` runs them in order):
- corpus: the whole KJV from Debian's bible-kjv-text, read with its `bible` program, one verse a line with
  the verse numbers and chapter headings dropped; whole chapters go to validation by a fixed rule (every
  20th chapter), the rest to training.
- vocab: a sentencepiece BPE vocabulary with byte fallback (ids 0 <unk>, 1 <s>, 2 </s>, 3..258 the
  <0xXX> bytes), trained with the settings llama2.c's tinystories.py uses, exported to llama2.c's
  tokenizer.bin layout the way llama2.c's tokenizer.py does.
- train: a Llama-style transformer (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU), the
  same architecture as llama2.c's model.py, on windows of the training tokens where every verse is
  `<s> verse </s>`; a checkpoint every --eval-every steps, so the run can be stopped and exported.
- export: the checkpoint in llama2.c's version-0 ("legacy") checkpoint layout, which run.c and e31's
  generate.wasm read: seven int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len),
  then float32 weights in run.c's order, including the two unused rotary tables run.c skips.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch
import torch.nn.functional as F
from torch import nn

# --- corpus -----------------------------------------------------------------------------------------

VERSE = re.compile(r"^\s+\d+ (.*\S)\s*$")
HEADING = re.compile(r"^\S.* \d+$")


def extract_corpus(work: Path) -> tuple[Path, Path]:
    out = subprocess.run(
        ["bible", "-l0", "gen1:1-rev22:21"], check=True, capture_output=True, text=True
    ).stdout
    train, val = [], []
    chapter = -1
    for line in out.splitlines():
        if HEADING.match(line):
            chapter += 1
            continue
        m = VERSE.match(line)
        if m:
            (val if chapter % 20 == 19 else train).append(m.group(1))
    if chapter + 1 != 1189 or len(train) + len(val) != 31102:
        sys.exit(f"unexpected KJV text: {chapter + 1} chapters, {len(train) + len(val)} verses")
    tr, va = work / "train.txt", work / "val.txt"
    tr.write_text("\n".join(train) + "\n")
    va.write_text("\n".join(val) + "\n")
    print(f"corpus: {len(train)} training verses, {len(val)} validation verses")
    return tr, va


# --- tokenizer --------------------------------------------------------------------------------------


def train_vocab(work: Path, vocab_size: int) -> Path:
    prefix = work / f"tok{vocab_size}"
    spm.SentencePieceTrainer.train(
        input=str(work / "train.txt"),
        model_prefix=str(prefix),
        model_type="bpe",
        vocab_size=vocab_size,
        input_format="text",
        character_coverage=1.0,
        num_threads=1,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        byte_fallback=True,
        unk_surface=r" \342\201\207 ",
        normalization_rule_name="identity",
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


def export_tokenizer(model_file: Path, out: Path) -> None:
    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    assert sp.bos_id() == 1 and sp.eos_id() == 2 and sp.id_to_piece(3) == "<0x00>"
    tokens, scores = [], []
    for i in range(sp.vocab_size()):
        t = sp.id_to_piece(i)
        if i == sp.bos_id():
            t = "\n<s>\n"
        elif i == sp.eos_id():
            t = "\n</s>\n"
        tokens.append(t.replace("▁", " ").encode("utf-8"))
        scores.append(sp.get_score(i))
    with open(out, "wb") as f:
        f.write(struct.pack("<i", max(len(t) for t in tokens)))
        for b, s in zip(tokens, scores, strict=True):
            f.write(struct.pack("<fi", s, len(b)))
            f.write(b)


def pretokenize(work: Path, model_file: Path) -> None:
    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    for split in ("train", "val"):
        ids: list[int] = []
        for verse in (work / f"{split}.txt").read_text().splitlines():
            ids += [1, *sp.encode(verse), 2]
        np.array(ids, dtype=np.uint16).tofile(work / f"{split}.u16")
        print(f"{split}: {len(ids)} tokens")


# --- model (llama2.c's model.py, trimmed) ----------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_size: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = 1.0 / (10000.0 ** (torch.arange(0, head_size, 2)[: head_size // 2].float() / head_size))
    angles = torch.outer(torch.arange(seq_len).float(), freqs)
    return torch.cos(angles), torch.sin(angles)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (batch, seq, heads, head_size); pairs (0,1), (2,3), ... rotate, as run.c does.
    xr, xi = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
    c, s = cos[None, : x.shape[1], None, :], sin[None, : x.shape[1], None, :]
    return torch.stack([xr * c - xi * s, xr * s + xi * c], dim=-1).flatten(3).type_as(x)


class Block(nn.Module):
    def __init__(self, a: argparse.Namespace) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.hs = a.n_heads, a.n_kv_heads, a.dim // a.n_heads
        self.wq = nn.Linear(a.dim, a.dim, bias=False)
        self.wk = nn.Linear(a.dim, self.n_kv * self.hs, bias=False)
        self.wv = nn.Linear(a.dim, self.n_kv * self.hs, bias=False)
        self.wo = nn.Linear(a.dim, a.dim, bias=False)
        self.w1 = nn.Linear(a.dim, a.hidden_dim, bias=False)
        self.w2 = nn.Linear(a.hidden_dim, a.dim, bias=False)
        self.w3 = nn.Linear(a.dim, a.hidden_dim, bias=False)
        self.attention_norm = RMSNorm(a.dim)
        self.ffn_norm = RMSNorm(a.dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.attention_norm(x)
        q = rope(self.wq(h).view(b, t, self.n_heads, self.hs), cos, sin)
        k = rope(self.wk(h).view(b, t, self.n_kv, self.hs), cos, sin)
        v = self.wv(h).view(b, t, self.n_kv, self.hs)
        rep = self.n_heads // self.n_kv
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.wo(att.transpose(1, 2).reshape(b, t, d))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Transformer(nn.Module):
    def __init__(self, a: argparse.Namespace) -> None:
        super().__init__()
        self.args = a
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        self.layers = nn.ModuleList(Block(a) for _ in range(a.n_layers))
        self.norm = RMSNorm(a.dim)
        self.output = nn.Linear(a.dim, a.vocab_size, bias=False)
        self.output.weight = self.tok_embeddings.weight  # shared classifier
        cos, sin = rope_tables(a.dim // a.n_heads, a.seq_len)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith(("wo.weight", "w2.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * a.n_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.output(self.norm(x))


# --- training ---------------------------------------------------------------------------------------


def batches(data: np.ndarray, batch: int, seq_len: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    ix = torch.randint(len(data) - seq_len - 1, (batch,), generator=gen)
    chunks = torch.stack([torch.from_numpy(data[i : i + seq_len + 1].astype(np.int64)) for i in ix])
    return chunks[:, :-1], chunks[:, 1:]


@torch.no_grad()
def val_loss(model: Transformer, data: np.ndarray, seq_len: int) -> float:
    """Mean loss over every whole seq_len window of the validation tokens (a fixed set, no sampling)."""
    model.eval()
    n = (len(data) - 1) // seq_len
    xs = torch.from_numpy(data[: n * seq_len].astype(np.int64)).view(n, seq_len)
    ys = torch.from_numpy(data[1 : n * seq_len + 1].astype(np.int64)).view(n, seq_len)
    total = 0.0
    for i in range(0, n, 32):
        logits = model(xs[i : i + 32])
        total += F.cross_entropy(logits.flatten(0, 1), ys[i : i + 32].flatten(), reduction="sum").item()
    model.train()
    return total / (n * seq_len)


def train(a: argparse.Namespace, work: Path) -> None:
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    tr = np.fromfile(work / "train.u16", dtype=np.uint16)
    va = np.fromfile(work / "val.u16", dtype=np.uint16)
    model = Transformer(a)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params} parameters; {len(tr)} training tokens", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(a.seed)
    log = []
    t0 = time.monotonic()
    for step in range(a.max_iters + 1):
        out_of_time = time.monotonic() - t0 > a.max_minutes * 60
        if step % a.eval_every == 0 or step == a.max_iters or out_of_time:
            vl = val_loss(model, va, a.seq_len)
            elapsed = time.monotonic() - t0
            log.append({"step": step, "val_loss": round(vl, 4), "seconds": round(elapsed)})
            print(f"step {step}: val loss {vl:.4f} ({elapsed:.0f} s)", flush=True)
            ckpt = {"model": model.state_dict(), "args": vars(a), "step": step, "log": log}
            torch.save(ckpt, work / "ckpt.pt.tmp")
            os.replace(work / "ckpt.pt.tmp", work / "ckpt.pt")
            if out_of_time:
                print("time budget spent: stopping", flush=True)
                break
        if step == a.max_iters:
            break
        # cosine decay over the steps or the time budget, whichever runs out first (a shared machine
        # may give the run fewer steps than planned: the rate still comes down by the end)
        done = max(step / a.max_iters, (time.monotonic() - t0) / (a.max_minutes * 60))
        warm = min(1.0, (step + 1) / a.warmup)
        decay = 0.5 * (1 + math.cos(math.pi * min(1.0, done)))
        for g in opt.param_groups:
            g["lr"] = a.lr * warm * (0.1 + 0.9 * decay)
        x, y = batches(tr, a.batch_size, a.seq_len, gen)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            print(f"  step {step}: train loss {loss.item():.4f}", flush=True)


# --- export -----------------------------------------------------------------------------------------


def export_model(work: Path, out: Path) -> dict[str, object]:
    ckpt = torch.load(work / "ckpt.pt", weights_only=False)
    a = argparse.Namespace(**ckpt["args"])
    model = Transformer(a)
    model.load_state_dict(ckpt["model"])
    hs = a.dim // a.n_heads

    def w(t: torch.Tensor) -> bytes:
        return t.detach().contiguous().view(-1).to(torch.float32).numpy().astype("<f4").tobytes()

    layers = list(model.layers)
    parts = [
        struct.pack("<7i", a.dim, a.hidden_dim, a.n_layers, a.n_heads, a.n_kv_heads, a.vocab_size, a.seq_len)
    ]
    parts.append(w(model.tok_embeddings.weight))
    for name in ("attention_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w2", "w3"):
        parts += [w(getattr(layer, name).weight) for layer in layers]
    parts.append(w(model.norm.weight))
    cos, sin = rope_tables(hs, a.seq_len)
    parts += [w(cos), w(sin)]
    blob = b"".join(parts)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, out)
    return {"step": ckpt["step"], "log": ckpt["log"], "args": ckpt["args"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=["corpus", "vocab", "train", "export", "all"])
    p.add_argument("--work", type=Path, required=True, help="scratch directory (corpus, checkpoints)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    p.add_argument("--vocab-size", type=int, default=1024)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--hidden-dim", type=int, default=384)
    p.add_argument("--n-layers", type=int, default=5)
    p.add_argument("--n-heads", type=int, default=8)
    p.add_argument("--n-kv-heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--max-iters", type=int, default=2000)
    p.add_argument("--max-minutes", type=float, default=25.0, help="stop after the first eval past this")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1337)
    a = p.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    if a.step in ("corpus", "all"):
        extract_corpus(a.work)
    if a.step in ("vocab", "all"):
        sp_model = train_vocab(a.work, a.vocab_size)
        export_tokenizer(sp_model, a.out / "kjv-tok.bin")
        pretokenize(a.work, sp_model)
    if a.step in ("train", "all"):
        train(a, a.work)
    if a.step in ("export", "all"):
        info = export_model(a.work, a.out / "kjv.bin")
        for name in ("kjv.bin", "kjv-tok.bin"):
            info[name] = hashlib.sha256((a.out / name).read_bytes()).hexdigest()
        (a.work / "export.json").write_text(json.dumps(info, indent=1, default=str))
        print(json.dumps({k: v for k, v in info.items() if k != "log"}, indent=1, default=str))


if __name__ == "__main__":
    main()
