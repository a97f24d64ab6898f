"""The inference workload (sandbox/workloads/generate.wasm) through the real sandbox runner: the published
stories260K greedy text reproduced exactly, determinism of output and fuel, seeded sampling, the error
lines, the output order, and malformed checkpoints and tokenizers refused with a message, never a trap."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
import shutil
import struct
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
import wasmtime
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits, RunResult, Status
from e31.sandbox.runner import compile_module, default_engine, run
from llama2_files import (
    Shape,
    byte_tokens,
    random_vocabulary,
    write_model,
    write_random_model,
    write_tokenizer,
)

ROOT = Path(__file__).resolve().parents[2]
WASM = ROOT / "sandbox" / "workloads" / "generate.wasm"
STORIES = ROOT.parent / "shared" / "models" / "stories260K"
LIMITS = Limits(fuel=50_000_000_000, memory_bytes=256 * 1024 * 1024, wall_seconds=120.0)

TINY = Shape(dim=16, hidden_dim=40, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=320, seq_len=48)


@functools.cache
def compiled() -> tuple[bytes, wasmtime.Module]:
    wasm = WASM.read_bytes()
    return wasm, compile_module(default_engine(), wasm)


def generate(
    model: Path,
    tokenizer: Path,
    prompts: Path | bytes,
    out: Path,
    *args: str,
    limits: Limits = LIMITS,
) -> RunResult:
    """Runs generate.wasm with the three inputs under their default names; out is the output directory."""
    if isinstance(prompts, bytes):
        path = out.parent / f"{out.name}-prompts.jsonl"
        path.write_bytes(prompts)
        prompts = path
    wasm, module = compiled()
    inputs = {"model.bin": model, "tokenizer.bin": tokenizer, "prompts.jsonl": prompts}
    spec = JobSpec(wasm, args=args, inputs=inputs, limits=limits)
    out.mkdir(parents=True, exist_ok=True)
    return run(spec, out, engine=default_engine(), module=module)


def completions(r: RunResult, out: Path) -> list[dict[str, object]]:
    assert (r.status, r.exit_code) == (Status.EXITED, 0), r
    data = (out / "completions.jsonl").read_bytes()
    lines = data.decode("utf-8").split("\n")  # strict: the file must be valid UTF-8
    assert lines[-1] == ""
    return [json.loads(line) for line in lines[:-1]]


def jsonl(*rows: dict[str, object] | str) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tiny")
    write_random_model(d / "model.bin", TINY, scale=0.5)
    tokens, scores = tiny_vocabulary()
    write_tokenizer(d / "tokenizer.bin", tokens, scores)
    return d / "model.bin", d / "tokenizer.bin"


def tiny_vocabulary() -> tuple[list[bytes], list[float]]:
    """Byte tokens, letters, and a few merges whose scores decide the encoding."""
    tokens, scores = random_vocabulary(TINY.vocab_size - 6)
    merges = [(b"th", 5.0), (b"he", 6.0), (b"the", 7.0), (b" the", 8.0), (b"\xc3\xa9", 1.0), (b"ab", 0.5)]
    for tok, score in merges:
        if tok in tokens:
            scores[tokens.index(tok)] = score
        else:
            tokens.append(tok)
            scores.append(score)
    while len(tokens) < TINY.vocab_size:
        tokens.append(b"zz%d" % len(tokens))
        scores.append(-1e9)
    return tokens, scores


# -- the published reference ------------------------------------------------------------------------


def stories_or_skip() -> tuple[Path, Path, str]:
    source = STORIES / "SOURCE.md"
    if not source.is_file():
        pytest.skip(f"the stories260K reference directory is absent ({STORIES} relative to the repository)")
    text = source.read_text()
    for name in ("stories260K.bin", "tok512.bin"):
        m = re.search(rf"{re.escape(name)}\s+[\d,]+ bytes\s+([0-9a-f]{{64}})", text)
        assert m, f"SOURCE.md names no sha256 for {name}"
        digest = hashlib.sha256((STORIES / name).read_bytes()).hexdigest()
        assert digest == m.group(1), f"{name} is not the published file (sha256 {digest})"
    blocks = re.findall(r"```\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "SOURCE.md should hold exactly one reference text block"
    return STORIES / "stories260K.bin", STORIES / "tok512.bin", blocks[0].removesuffix("\n")


def test_reproduces_the_published_stories260k_greedy_text(tmp_path: Path) -> None:
    model, tok, reference = stories_or_skip()
    r = generate(model, tok, jsonl({"id": "ref", "prompt": ""}), tmp_path / "out")
    (row,) = completions(r, tmp_path / "out")
    # llama2.c's run prints 256 steps by default; the published text is those steps.
    assert row["completion"] == reference
    assert (row["id"], row["prompt_tokens"], row["completion_tokens"], row["finish_reason"]) == (
        "ref",
        1,
        256,
        "length",
    )


def test_stories260k_prompt_continues_the_story_and_sampling_follows_the_seed(tmp_path: Path) -> None:
    model, tok, reference = stories_or_skip()
    prompts = jsonl(
        {"id": 1, "prompt": "Once upon a time", "max_tokens": 20},
        {"id": 2, "prompt": "Once upon a time", "max_tokens": 30, "temperature": 1.0, "seed": 7},
        {"id": 3, "prompt": "Once upon a time", "max_tokens": 30, "temperature": 1.0, "seed": 7},
        {"id": 4, "prompt": "Once upon a time", "max_tokens": 30, "temperature": 1.0, "seed": 8},
    )
    rows = completions(generate(model, tok, prompts, tmp_path / "out"), tmp_path / "out")
    assert reference.startswith("Once upon a time" + str(rows[0]["completion"]))
    assert rows[1]["completion"] == rows[2]["completion"]
    assert rows[1]["completion"] != rows[3]["completion"]


# -- determinism and sampling ------------------------------------------------------------------------


def test_two_runs_give_the_same_bytes_and_fuel(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    prompts = jsonl(
        {"id": 1, "prompt": "the cat", "max_tokens": 20},
        {"id": 2, "prompt": "", "max_tokens": 12, "temperature": 0.9, "top_p": 0.8, "seed": 3},
        {"id": 3, "prompt": "abc", "max_tokens": 10, "temperature": 1.5, "seed": 2**64 - 1},
    )
    a = generate(*tiny, prompts, tmp_path / "a")
    b = generate(*tiny, prompts, tmp_path / "b")
    assert len(completions(a, tmp_path / "a")) == 3
    assert (tmp_path / "a" / "completions.jsonl").read_bytes() == (
        tmp_path / "b" / "completions.jsonl"
    ).read_bytes()
    assert a.fuel_used == b.fuel_used > 0


def test_sampling_is_reproducible_by_seed_and_differs_across_seeds(
    tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    def line(i: int, seed: int, **kw: object) -> dict[str, object]:
        return {"id": i, "prompt": "the", "max_tokens": 16, "temperature": 1.0, "seed": seed, **kw}

    rows = completions(
        generate(
            *tiny,
            jsonl(
                line(0, 11),
                line(1, 12),
                line(2, 11),
                line(3, 13),
                line(4, 11, top_p=0.5),
                line(5, 11, top_p=0.5),
                line(6, 14, top_p=0.5),
                {"id": 7, "prompt": "the", "max_tokens": 16, "seed": 1},
                {"id": 8, "prompt": "the", "max_tokens": 16, "seed": 2},
            ),
            tmp_path / "out",
        ),
        tmp_path / "out",
    )
    text = [r["completion"] for r in rows]
    assert text[0] == text[2]
    assert len({text[0], text[1], text[3]}) == 3
    assert text[4] == text[5] != text[6]
    # Greedy (temperature 0, the default) does not use the seed.
    assert text[7] == text[8]


def test_nucleus_of_a_tiny_top_p_is_the_greedy_token(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    rows = completions(
        generate(
            *tiny,
            jsonl(
                {"id": "greedy", "prompt": "ab", "max_tokens": 12},
                {"id": "nucleus", "prompt": "ab", "max_tokens": 12, "temperature": 0.7, "top_p": 1e-30},
            ),
            tmp_path / "out",
        ),
        tmp_path / "out",
    )
    assert rows[0]["completion"] == rows[1]["completion"]


# -- hand-made weights: known greedy output ----------------------------------------------------------

SMALL = Shape(
    dim=8, hidden_dim=8, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=300, seq_len=16, shared=False
)


def steered_model(path: Path, rows: dict[int, float]) -> None:
    """All layer weights zero, so the final state is the token's embedding (here e0 for every token):
    the logit of token i is rows.get(i, 0) times a positive constant."""
    d, v = SMALL.dim, SMALL.vocab_size
    embedding = [1.0 if j == 0 else 0.0 for _ in range(v) for j in range(d)]
    wcls = [0.0] * (v * d)
    for token, weight in rows.items():
        wcls[token * d] = weight
    write_model(path, SMALL, {"token_embedding": embedding, "rms_final": [1.0] * d, "wcls": wcls})


def small_tokenizer(path: Path) -> None:
    tokens = [*byte_tokens(), b" hello", b"world", b" ", b"\xe2\x82\xac"]
    tokens += [b"t%d" % i for i in range(SMALL.vocab_size - len(tokens))]
    write_tokenizer(path, tokens, [0.0] * len(tokens))


def test_greedy_ties_go_to_the_lowest_token_id(tmp_path: Path) -> None:
    small_tokenizer(tmp_path / "tok.bin")
    steered_model(tmp_path / "model.bin", {260: 2.0, 259: 2.0, 261: 1.0})  # 259 " hello", 260 "world"
    rows = completions(
        generate(
            tmp_path / "model.bin", tmp_path / "tok.bin", jsonl({"id": 1, "prompt": ""}), tmp_path / "out"
        ),
        tmp_path / "out",
    )
    # The first token after BOS loses its leading space (llama2.c's decode); the context (16) ends it.
    assert rows == [
        {
            "id": 1,
            "completion": "hello" + " hello" * 14,
            "prompt_tokens": 1,
            "completion_tokens": 15,
            "finish_reason": "length",
        }
    ]
    # All logits equal: token 0 wins.
    steered_model(tmp_path / "model.bin", {})
    out = tmp_path / "zero"
    rows = completions(
        generate(
            tmp_path / "model.bin",
            tmp_path / "tok.bin",
            jsonl({"id": 1, "prompt": "x", "max_tokens": 3}),
            out,
        ),
        out,
    )
    assert rows[0]["completion"] == "<unk>" * 3 and rows[0]["completion_tokens"] == 3


@pytest.mark.parametrize(("stop_token", "stop_name"), [(1, "BOS"), (2, "EOS")])
def test_bos_or_eos_stops_with_finish_reason_stop(tmp_path: Path, stop_token: int, stop_name: str) -> None:
    small_tokenizer(tmp_path / "tok.bin")
    steered_model(tmp_path / "model.bin", {stop_token: 1.0})
    rows = completions(
        generate(
            tmp_path / "model.bin",
            tmp_path / "tok.bin",
            jsonl({"id": stop_name, "prompt": "hi"}),
            tmp_path / "o",
        ),
        tmp_path / "o",
    )
    assert rows == [
        {
            "id": stop_name,
            "completion": "",
            "prompt_tokens": 4,
            "completion_tokens": 0,
            "finish_reason": "stop",
        }
    ]


def test_max_tokens_from_the_line_then_the_argument_then_256(tmp_path: Path) -> None:
    small_tokenizer(tmp_path / "tok.bin")
    big = dataclasses.replace(SMALL, seq_len=300)
    d, v = big.dim, big.vocab_size
    embedding = [1.0 if j == 0 else 0.0 for _ in range(v) for j in range(d)]
    wcls = [0.0] * (v * d)
    wcls[260 * d] = 1.0
    write_model(tmp_path / "m.bin", big, {"token_embedding": embedding, "rms_final": [1.0] * d, "wcls": wcls})
    prompts = jsonl({"id": 1, "prompt": "", "max_tokens": 3}, {"id": 2, "prompt": ""})
    rows = completions(
        generate(tmp_path / "m.bin", tmp_path / "tok.bin", prompts, tmp_path / "a"), tmp_path / "a"
    )
    assert [r["completion_tokens"] for r in rows] == [3, 256]
    assert rows[0]["completion"] == "world" * 3
    r = generate(tmp_path / "m.bin", tmp_path / "tok.bin", prompts, tmp_path / "b", "--max-tokens", "5")
    assert [r["completion_tokens"] for r in completions(r, tmp_path / "b")] == [3, 5]


# -- text in and out ---------------------------------------------------------------------------------


def llama2c_encode(tokens: Sequence[bytes], scores: Sequence[float], text: bytes) -> list[int]:
    """llama2.c's encode, transcribed (with byte strings), as the reference for the workload's faster one."""
    ids = {}
    for i, t in enumerate(tokens):
        ids.setdefault(t, i)
    out = [1]
    if text:
        out.append(ids[b" "])
    buf = b""
    for i, c in enumerate(text):
        if c & 0xC0 != 0x80:
            buf = b""
        buf += bytes([c])
        if i + 1 < len(text) and text[i + 1] & 0xC0 == 0x80 and len(buf) < 4:
            continue
        if buf in ids:
            out.append(ids[buf])
        else:
            out.extend(b + 3 for b in buf)
        buf = b""
    while True:
        best, best_id, best_idx = -1e10, -1, -1
        for i in range(len(out) - 1):
            j = ids.get(tokens[out[i]] + tokens[out[i + 1]], -1)
            if j != -1 and scores[j] > best:
                best, best_id, best_idx = scores[j], j, i
        if best_idx == -1:
            return out
        out[best_idx : best_idx + 2] = [best_id]


def test_prompt_tokens_follow_llama2c_encode(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    tokens, scores = tiny_vocabulary()
    prompts = [
        "the",
        "the the",
        "ab the he th",
        "é café",
        "\U0001f600 x",
        "tab\there",
        "nul\x00byte",
        "x" * 30,
        "  leading and trailing  ",
    ]
    rows = completions(
        generate(
            *tiny,
            jsonl(*({"id": i, "prompt": p, "max_tokens": 1} for i, p in enumerate(prompts))),
            tmp_path / "o",
        ),
        tmp_path / "o",
    )
    want = [len(llama2c_encode(tokens, scores, p.encode())) for p in prompts]
    assert [r["prompt_tokens"] for r in rows] == want
    assert want[0] == 2 and want[3] < len("é café".encode()) + 2  # " the" and "é" merged


def test_json_escapes_in_and_valid_utf8_out(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    # Surrogate pairs and escapes in, as raw text so that json.dumps does not choose the form.
    lines = [
        r'{"id": "\ud83d\ude00\u00e9\"\\\/\b\f\n\r\t", "prompt": "\ud83d\ude00 x", "max_tokens": 1}',
        '{"id": "\U0001f600\u00e9", "prompt": "\U0001f600 x", "max_tokens": 1}',
    ]
    # A random model over 256 byte tokens emits invalid UTF-8 and control bytes: the output stays valid.
    sampled = [{"id": i, "prompt": "", "max_tokens": 40, "temperature": 2.0, "seed": i} for i in range(8)]
    rows = completions(generate(*tiny, jsonl(*lines, *sampled), tmp_path / "o"), tmp_path / "o")
    assert rows[0]["id"] == '\U0001f600\u00e9"\\/\b\f\n\r\t'
    assert rows[1]["id"] == "\U0001f600\u00e9"
    tokens, scores = tiny_vocabulary()
    assert (
        rows[0]["prompt_tokens"]
        == rows[1]["prompt_tokens"]
        == len(llama2c_encode(tokens, scores, "\U0001f600 x".encode()))
    )
    assert rows[0]["completion"] == rows[1]["completion"]
    text = "".join(str(r["completion"]) for r in rows[2:])
    assert "\ufffd" in text  # invalid sequences replaced
    raw = (tmp_path / "o" / "completions.jsonl").read_bytes()
    assert not any(b < 0x20 and b != 0x0A for b in raw)  # control bytes escaped; newline only between lines


# -- error lines and the output order ----------------------------------------------------------------


def test_malformed_lines_give_error_lines_and_the_rest_go_on(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    long_prompt = "\u0101" * TINY.seq_len  # not a token: two byte tokens each
    lines: list[tuple[str, object]] = [
        ('{"id": 1, "prompt": "the", "max_tokens": 2}', None),
        ("not json", None),
        ("[1, 2]", None),
        ('{"id": 2, "prompt": "a"', 2),
        ('{"id": 3, "prompt": 5}', 3),
        ('{"prompt": "x", "id": 4.5}', None),
        ('{"id": true, "prompt": "x"}', None),
        ('{"id": 5}', 5),
        ('{"prompt": "x"}', None),
        ('{"id": 6, "prompt": "x", "max_tokens": 0}', 6),
        ('{"id": 7, "prompt": "x", "max_tokens": 2.0}', 7),
        ('{"id": 8, "prompt": "x", "temperature": -0.5}', 8),
        ('{"id": 9, "prompt": "x", "top_p": 0}', 9),
        ('{"id": 10, "prompt": "x", "top_p": 1.5}', 10),
        ('{"id": 11, "prompt": "x", "seed": -1}', 11),
        ('{"id": 12, "prompt": "x", "seed": 18446744073709551616}', 12),
        ('{"id": 13, "prompt": "x", "prompt": "y"}', 13),
        (r'{"id": 14, "prompt": "\ud800"}', 14),
        ('{"id": "k", "prompt": "x", "temperature": "hot"}', "k"),
        (json.dumps({"id": 15, "prompt": long_prompt}), 15),
        ('{"id": 16, "prompt": "x"} trailing', 16),
        ('{"id": 17, "prompt": "x", "extra": {"nested": [1, {"a": null}]}, "max_tokens": 1}', None),
        ('{"id": "last", "prompt": "he", "max_tokens": 3}', None),
    ]
    body = (
        "\n".join(line for line, _ in lines[:5]) + "\n\n  \t\r\n" + "\n".join(line for line, _ in lines[5:])
    )
    raw = body.encode() + b'\n{"id": "bad-utf8", "prompt": "\xff"}\n'
    rows = completions(generate(*tiny, raw, tmp_path / "o"), tmp_path / "o")
    assert len(rows) == len(lines) + 1
    file_line = [1, 2, 3, 4, 5] + [8 + i for i in range(len(lines) - 5)] + [8 + len(lines) - 5]
    ok = {0, 21, 22}
    for i, row in enumerate(rows):
        if i in ok:
            assert row["finish_reason"] == "length" and "error" not in row, row
            continue
        assert row["finish_reason"] == "error", (i, row)
        assert row["line"] == file_line[i], (i, row)
        assert isinstance(row["error"], str) and row["error"], row
        want_id = lines[i][1] if i < len(lines) else None
        assert row["id"] == want_id, (i, row)
    assert rows[0]["id"] == 1 and rows[21]["id"] == 17 and rows[22]["id"] == "last"
    assert "context" in str(rows[19]["error"])


def test_results_come_in_the_prompts_order(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    ids: list[object] = ["z", 3, "a", -7, 12345678901234567890, "m", 0, "é"]
    prompts = jsonl(*({"id": i, "prompt": "ab" * n, "max_tokens": 1 + n % 3} for n, i in enumerate(ids)))
    # CRLF line ends, as a Windows editor saves them.
    rows = completions(generate(*tiny, prompts.replace(b"\n", b"\r\n"), tmp_path / "o"), tmp_path / "o")
    assert [r["id"] for r in rows] == ids
    assert [r["completion_tokens"] for r in rows] == [1 + n % 3 for n in range(len(ids))]


# -- malformed checkpoints and tokenizers ------------------------------------------------------------


def good_files(d: Path) -> tuple[bytes, bytes]:
    write_random_model(d / "good-model.bin", TINY)
    write_tokenizer(d / "good-tok.bin", *tiny_vocabulary())
    return (d / "good-model.bin").read_bytes(), (d / "good-tok.bin").read_bytes()


def header(**change: int) -> bytes:
    values = {
        "dim": TINY.dim,
        "hidden_dim": TINY.hidden_dim,
        "n_layers": TINY.n_layers,
        "n_heads": TINY.n_heads,
        "n_kv_heads": TINY.n_kv_heads,
        "vocab_size": TINY.vocab_size,
        "seq_len": TINY.seq_len,
        **change,
    }
    return struct.pack("<7i", *values.values())


def bad_models(model: bytes) -> dict[str, bytes]:
    body = model[28:]
    return {
        "empty": b"",
        "short header": model[:20],
        "header only": model[:28],
        "truncated": model[:-4],
        "one float too many": model + bytes(4),
        "dim 0": header(dim=0) + body,
        "negative layers": header(n_layers=-2) + body,
        "heads do not divide dim": header(n_heads=3) + body,
        "kv heads do not divide heads": header(n_kv_heads=3) + body,
        "more kv heads than heads": header(n_kv_heads=8) + body,
        "odd head size": header(dim=12, n_heads=4) + body,
        "vocab INT_MIN": header(vocab_size=-(2**31)) + body,
        "separate classifier missing": header(vocab_size=-TINY.vocab_size) + body,
        "huge seq_len": header(seq_len=2**31 - 1) + body,
        "huge everything": header(dim=2**16, hidden_dim=2**20, n_layers=2**10, seq_len=2**20) + body,
        "vocab differs from the tokenizer": header(vocab_size=TINY.vocab_size + 1)
        + body
        + bytes(4 * TINY.dim),
    }


def bad_tokenizers(tok: bytes) -> dict[str, bytes]:
    first = struct.pack("<fi", 0.0, 5) + b"<unk>"
    return {
        "empty": b"",
        "header only": tok[:4],
        "truncated in a token": tok[:-1],
        "truncated in a length": tok[: 4 + len(first) + 6],
        "trailing bytes": tok + b"x",
        "negative length": tok[:4] + struct.pack("<fi", 0.0, -1) + tok[4 + 8 :],
        "length past the end": tok[:4] + struct.pack("<fi", 0.0, 1 << 30) + tok[4 + 8 :],
        "max_token_length 0": struct.pack("<i", 0) + tok[4:],
        "one token too few": tok[: len(tok) - 8 - len(tiny_vocabulary()[0][-1])],
    }


def refused(r: RunResult, out: Path) -> str:
    assert r.status is Status.EXITED, r  # a clean exit, never a trap
    assert r.exit_code == 1, r
    message = r.stderr.decode()
    assert message.startswith("generate: ") and message.count("\n") == 1, message
    assert not (out / "completions.jsonl").exists()
    return message


def test_malformed_checkpoints_are_refused_with_a_message(tmp_path: Path) -> None:
    model, _ = good_files(tmp_path)
    for i, (name, data) in enumerate(bad_models(model).items()):
        path = tmp_path / f"model{i}.bin"
        path.write_bytes(data)
        out = tmp_path / f"out{i}"
        msg = refused(generate(path, tmp_path / "good-tok.bin", jsonl({"id": 1, "prompt": ""}), out), out)
        assert "model" in msg or "tokenizer" in msg, (name, msg)


def test_malformed_tokenizers_are_refused_with_a_message(tmp_path: Path) -> None:
    _, tok = good_files(tmp_path)
    for i, (name, data) in enumerate(bad_tokenizers(tok).items()):
        path = tmp_path / f"tok{i}.bin"
        path.write_bytes(data)
        out = tmp_path / f"out{i}"
        msg = refused(generate(tmp_path / "good-model.bin", path, jsonl({"id": 1, "prompt": ""}), out), out)
        assert "tokenizer" in msg, (name, msg)


def test_missing_inputs_too_little_memory_and_bad_arguments(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    model, tok = tiny
    wasm, module = compiled()
    missing = run(JobSpec(wasm, limits=LIMITS), tmp_path / "a", engine=default_engine(), module=module)
    assert "model /input/model.bin" in refused(missing, tmp_path / "a")
    only_model = run(
        JobSpec(wasm, inputs={"model.bin": model, "tokenizer.bin": tok}, limits=LIMITS),
        tmp_path / "b",
        engine=default_engine(),
        module=module,
    )
    assert "prompts /input/prompts.jsonl" in refused(only_model, tmp_path / "b")
    # 4 MiB of memory cannot hold a 15M-float checkpoint: malloc fails, the job says so.
    big = tmp_path / "big.bin"
    write_random_model(
        big, Shape(dim=64, hidden_dim=512, n_layers=16, n_heads=4, n_kv_heads=4, vocab_size=320, seq_len=32)
    )
    small = Limits(fuel=LIMITS.fuel, memory_bytes=4 * 1024 * 1024, wall_seconds=60.0)
    msg = refused(
        generate(big, tok, jsonl({"id": 1, "prompt": ""}), tmp_path / "c", limits=small), tmp_path / "c"
    )
    assert "memory" in msg
    for args in (("--max-tokens", "0"), ("--max-tokens", "x"), ("--bogus", "1"), ("--model",)):
        r = generate(model, tok, jsonl({"id": 1, "prompt": ""}), tmp_path / "d", *args)
        assert (r.status, r.exit_code) == (Status.EXITED, 2), (args, r)
        assert r.stderr.decode().startswith("generate: ")


def test_paths_given_as_arguments(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    model, tok = tiny
    (tmp_path / "p.jsonl").write_bytes(jsonl({"id": "x", "prompt": "the", "max_tokens": 2}))
    wasm, module = compiled()
    spec = JobSpec(
        wasm,
        args=(
            "--model",
            "/input/m/weights",
            "--tokenizer",
            "/input/t",
            "--prompts",
            "/input/p",
            "--out",
            "/output/r.jsonl",
        ),
        inputs={"m/weights": model, "t": tok, "p": tmp_path / "p.jsonl"},
        limits=LIMITS,
    )
    r = run(spec, tmp_path / "o", engine=default_engine(), module=module)
    assert (r.status, r.exit_code) == (Status.EXITED, 0), r
    (row,) = [json.loads(x) for x in (tmp_path / "o" / "r.jsonl").read_text().splitlines()]
    assert (row["id"], row["completion_tokens"]) == ("x", 2)


# -- rebuilding from source --------------------------------------------------------------------------


def test_rebuilt_module_gives_the_same_completions_and_fuel(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    """build.sh's generate.wasm computes what the shipped one does (test_workloads.py checks its bytes)."""
    if shutil.which("clang") is None:
        pytest.skip("clang is not installed: cannot rebuild generate.wasm from source")
    out = tmp_path / "rebuilt"
    built = subprocess.run(["sh", str(WASM.parent / "build.sh"), str(out)], capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(f"clang cannot build for wasm32-wasi here: {built.stderr.strip()[:200]}")
    prompts = jsonl(
        {"id": 1, "prompt": "the end", "max_tokens": 8},
        {"id": 2, "prompt": "", "max_tokens": 8, "temperature": 0.8, "top_p": 0.9, "seed": 4},
    )
    shipped = generate(*tiny, prompts, tmp_path / "a")
    wasm = (out / "generate.wasm").read_bytes()
    spec = JobSpec(
        wasm,
        inputs={
            "model.bin": tiny[0],
            "tokenizer.bin": tiny[1],
            "prompts.jsonl": tmp_path / "a-prompts.jsonl",
        },
        limits=LIMITS,
    )
    again = run(spec, tmp_path / "b", engine=default_engine())
    assert len(completions(again, tmp_path / "b")) == 2
    assert (tmp_path / "b" / "completions.jsonl").read_bytes() == (
        tmp_path / "a" / "completions.jsonl"
    ).read_bytes()
    if (out / "TOOLCHAIN").read_text() == (WASM.parent / "TOOLCHAIN").read_text():
        assert again.fuel_used == shipped.fuel_used
