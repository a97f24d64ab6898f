"""`e31 generate` and `e31 results --merge` without a network: the prompts file's checks and spans, the
llama2.c files' checks, the limits, the merge's order and line numbers, and the typed errors."""

from __future__ import annotations

import contextlib
import io
import json
import re
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from e31.node.cli.main import main
from e31.node.client.errors import Incomplete, LocalFileError, MergeError, ModelFileError, PromptsError
from e31.node.client.generate import (
    MODULE,
    SHIPPED_MODEL,
    SHIPPED_TOKENIZER,
    generate,
    plan,
    shipped,
    span_of,
)
from e31.node.client.llama_files import (
    ModelShape,
    check_tokenizer,
    limits_for,
    read_model_shape,
)
from e31.node.client.merge import completion_lines, merge, parts_of, write_merged
from e31.node.client.ops import Call
from e31.node.client.prompts import read_prompts, split
from e31.node.client.sync import drive

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "sandbox" / "workloads" / "models"
STORIES = ROOT.parent / "shared" / "models" / "stories260K"


def e31(*args: str) -> tuple[int, str]:
    """Run `e31 ARGS` through its entry point in this process: (exit status, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's usage errors
            code = e.code if isinstance(e.code, int) else 2
    return code, err.getvalue()


def write_lines(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def prompt(i: object, text: str = "In the beginning", **extra: object) -> str:
    return json.dumps({"id": i, "prompt": text, **extra})


# --- the prompts file ---------------------------------------------------------------------------------


def test_spans_hold_n_prompts_each_and_keep_every_byte_and_line_number(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "p.jsonl",
        "",
        prompt(1),
        prompt(2),
        "   ",
        prompt(3),
        prompt("four", max_tokens=3),
        prompt(5) + "\r",
        "",
        "",
    )
    spans = split(read_prompts(path), 2)
    assert [(s.first, s.last) for s in spans] == [(1, 4), (5, 6), (7, 7)]
    assert [[p.number for p in s.prompts] for s in spans] == [[2, 3], [5, 6], [7]]
    # the spans laid end to end are the file, less the blank lines at its end
    assert "".join(s.text for s in spans) == path.read_bytes().decode().rstrip("\n") + "\n"
    assert spans[1].prompts[1].max_tokens == 3
    assert spans[1].prompts[1].prompt_bytes == len("In the beginning")
    one = split(read_prompts(path), 100)
    assert [(s.first, s.last, len(s.prompts)) for s in one] == [(1, 7, 5)]


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"prompt": "x"}', "id is missing"),
        ('{"id": 1.5, "prompt": "x"}', "id is missing or not a string or integer"),
        ('{"id": true, "prompt": "x"}', "id is missing or not a string or integer"),
        ('{"id": 1}', "prompt is missing"),
        ('{"id": 1, "prompt": "x", "max_tokens": 0}', "max_tokens"),
        ('{"id": 1, "prompt": "x", "temperature": -1}', "temperature"),
        ('{"id": 1, "prompt": "x", "top_p": 0}', "top_p"),
        ('{"id": 1, "prompt": "x", "seed": 18446744073709551616}', "seed"),
        ('{"id": 1, "prompt": "x", "temperature": NaN}', "not JSON"),
        ('{"id": 1, "id": 2, "prompt": "x"}', "id given twice"),
    ],
)
def test_a_malformed_line_is_refused_with_its_number(tmp_path: Path, line: str, why: str) -> None:
    path = write_lines(tmp_path / "p.jsonl", prompt(1), line, prompt(3))
    with pytest.raises(PromptsError, match=f"line 2: {why}"):
        read_prompts(path)
    passed = read_prompts(path, pass_bad_lines=True)  # or sent on, for the guest to answer
    assert [p.problem is not None for p in passed.lines if p is not None] == [False, True, False]


def test_fields_the_guest_ignores_are_accepted(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "p.jsonl", prompt(1, note="mine", top_p=1, temperature=0, seed=0))
    assert read_prompts(path).lines[0] is not None


def test_files_that_are_not_prompts_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PromptsError, match="no such file"):
        read_prompts(tmp_path / "absent.jsonl")
    with pytest.raises(PromptsError, match="a directory, not a regular file"):
        read_prompts(tmp_path)
    (tmp_path / "empty.jsonl").write_text("\n  \n")
    with pytest.raises(PromptsError, match="no prompts"):
        read_prompts(tmp_path / "empty.jsonl")
    (tmp_path / "latin1.jsonl").write_bytes(b'{"id": 1, "prompt": "caf\xe9"}\n')
    with pytest.raises(PromptsError, match="not UTF-8"):
        read_prompts(tmp_path / "latin1.jsonl")


def test_more_than_five_problems_are_counted_not_all_listed(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "p.jsonl", *["nope"] * 8)
    with pytest.raises(PromptsError, match=r"8 malformed line\(s\).*line 5: .*\(and 3 more\)"):
        read_prompts(path)


# --- the model files ----------------------------------------------------------------------------------


def checkpoint(path: Path, dim: int = 8, hidden: int = 16, layers: int = 2, heads: int = 2, kv: int = 1,
               vocab: int = 300, seq: int = 16, extra: int = 0) -> ModelShape:  # fmt: skip
    shape = ModelShape(dim, hidden, layers, heads, kv, abs(vocab), seq, vocab > 0)
    path.write_bytes(
        struct.pack("<7i", dim, hidden, layers, heads, kv, vocab, seq) + bytes(4 * shape.weights + extra)
    )
    return shape


def tokenizer(path: Path, vocab: int, extra: bytes = b"") -> None:
    body = b"".join(struct.pack("<fi", float(i), 1) + bytes([i % 256]) for i in range(vocab))
    path.write_bytes(struct.pack("<i", 4) + body + extra)


def test_a_checkpoint_is_read_by_its_header_and_its_size_must_match(tmp_path: Path) -> None:
    path = tmp_path / "m.bin"
    shape = checkpoint(path)
    assert read_model_shape(path) == shape
    unshared = checkpoint(path, vocab=-300)
    assert read_model_shape(path) == unshared and not unshared.shared_classifier
    assert unshared.file_size == shape.file_size + 4 * 300 * 8
    checkpoint(path, extra=4)
    with pytest.raises(ModelFileError, match=r"but its header .* says"):
        read_model_shape(path)
    checkpoint(path, heads=3)
    with pytest.raises(ModelFileError, match="do not divide"):
        read_model_shape(path)
    path.write_bytes(struct.pack("<7i", 8, 16, 2, 2, 1, 0, 16))
    with pytest.raises(ModelFileError, match="vocab_size out of range"):
        read_model_shape(path)
    path.write_bytes(b"\x01\x02")
    with pytest.raises(ModelFileError, match=r"shorter than a llama2\.c checkpoint header"):
        read_model_shape(path)
    with pytest.raises(ModelFileError, match="no such file"):
        read_model_shape(tmp_path / "absent.bin")


def test_a_tokenizer_must_hold_exactly_the_models_vocabulary(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    tokenizer(path, 300)
    assert check_tokenizer(path, 300) == path.stat().st_size
    with pytest.raises(ModelFileError, match="ends at token 300"):
        check_tokenizer(path, 512)
    with pytest.raises(ModelFileError, match="bytes after its 200 tokens"):
        check_tokenizer(path, 200)
    tokenizer(path, 3, extra=struct.pack("<fi", 0.0, 99))
    with pytest.raises(ModelFileError, match="token 3 has a bad length"):
        check_tokenizer(path, 4)


@pytest.mark.skipif(not STORIES.is_dir(), reason="../shared/models/stories260K is not here")
def test_the_published_checkpoint_passes_the_checks() -> None:
    shape = read_model_shape(STORIES / "stories260K.bin")
    assert (shape.dim, shape.n_layers, shape.vocab_size, shape.seq_len) == (64, 5, 512, 512)
    check_tokenizer(STORIES / "tok512.bin", shape.vocab_size)


def test_the_shipped_model_and_tokenizer_pass_the_checks() -> None:
    shape = read_model_shape(MODELS / "kjv.bin")
    check_tokenizer(MODELS / "kjv-tok.bin", shape.vocab_size)
    assert shape.shared_classifier and 500_000 < shape.parameters < 2_000_000


def test_limits_grow_with_the_prompts_and_stop_at_the_context() -> None:
    shape = ModelShape(64, 172, 5, 8, 4, 512, 512, True)
    one = limits_for(shape, shape.file_size, 6000, [(16, 256)], 100)
    two = limits_for(shape, shape.file_size, 6000, [(16, 256), (16, 256)], 200)
    assert two.fuel > one.fuel
    # the same fuel from the context's end on: a prompt cannot run past seq_len positions
    longer = limits_for(shape, shape.file_size, 6000, [(16, 10_000)], 100)
    assert longer.fuel == limits_for(shape, shape.file_size, 6000, [(16, 20_000)], 100).fuel
    # generate.wasm measured: "Once upon a time" + 256 tokens on stories260K took 440M fuel
    assert 440_000_000 < one.fuel < 3 * 440_000_000
    assert one.memory >= shape.file_size and one.memory % (1 << 20) == 0
    assert one.timeout >= 60


# --- the merge ----------------------------------------------------------------------------------------


def batch_doc(*spans: tuple[int, int], states: tuple[str, ...] = ()) -> dict[str, Any]:
    jobs = []
    for i, (first, last) in enumerate(spans):
        state = states[i] if i < len(states) else "done"
        jobs.append(
            {
                "job_id": f"{i + 1:064x}",
                "args": ["--prompts", f"/input/prompts-{first}-{last}.jsonl", "--max-tokens", "8"],
                "state": state,
                "succeeded": state == "done",
                "reason": None if state == "done" else "out of fuel",
            }
        )
    return {"batch_id": "batch-0123456789abcdef", "total": len(jobs), "jobs": jobs}


def test_the_spans_of_a_batch_must_tile_the_file_from_line_one() -> None:
    parts = parts_of(batch_doc((1, 3), (4, 9), (10, 10)))
    assert [(p.seq, p.first, p.last) for p in parts] == [(1, 1, 3), (2, 4, 9), (3, 10, 10)]
    with pytest.raises(MergeError, match="expected to start at line 4"):
        parts_of(batch_doc((1, 3), (5, 9)))
    with pytest.raises(MergeError, match="expected to start at line 1"):
        parts_of(batch_doc((2, 3)))
    with pytest.raises(MergeError, match="expected to start at line 4"):
        parts_of(batch_doc((1, 3), (2, 9)))  # an overlap
    other = batch_doc((1, 3))
    other["jobs"][0]["args"] = ["42", "1000"]
    with pytest.raises(MergeError, match="not an `e31 generate` job"):
        parts_of(other)
    assert span_of(["--prompts", "/input/prompts-7-3.jsonl"]) is None
    assert span_of(["--prompts", "/input/prompts-07-9.jsonl"]) is None


def test_error_lines_get_the_prompts_files_line_numbers() -> None:
    (part,) = parts_of(batch_doc((1, 5)))[:1]
    _, later = parts_of(batch_doc((1, 5), (6, 9)))
    text = "\n".join(
        [
            json.dumps(
                {
                    "id": 1,
                    "completion": " x",
                    "prompt_tokens": 2,
                    "completion_tokens": 1,
                    "finish_reason": "stop",
                }
            ),
            json.dumps({"id": None, "line": 2, "error": "bad JSON", "finish_reason": "error"}),
        ]
    )
    lines, errors = completion_lines(text, later)
    assert errors == 1
    assert json.loads(lines[1])["line"] == 7  # line 2 of the span that starts at line 6
    assert lines[0] == text.splitlines()[0]  # other lines are kept byte for byte
    with pytest.raises(MergeError, match="outside its 4 lines"):
        completion_lines(json.dumps({"id": None, "line": 5, "error": "x", "finish_reason": "error"}), later)
    with pytest.raises(MergeError, match="not a completion"):
        completion_lines('{"id": 1}', part)
    with pytest.raises(MergeError, match="not JSON"):
        completion_lines("{", part)


def test_any_completion_line_the_guest_writes_is_kept_or_refused_by_name() -> None:
    (part,) = parts_of(batch_doc((1, 3)))
    cases = [
        ('{"id": 1, "finish_reason": []}', "completion line 1: not a completion"),
        ('{"id": 1, "finish_reason": {"a": 1}}', "completion line 1: not a completion"),
        ('{"id": 1, "finish_reason": null}', "completion line 1: not a completion"),
        ('["stop"]', "completion line 1: not a completion"),
        ('{"id": ' + "9" * 5000 + ', "finish_reason": "stop"}', "completion line 1: a number too long"),
        ('{"id": 1, "finish_reason": "stop"}\n' + "[" * 100_000, "completion line 2: not JSON"),
        (
            '{"id": 1, "line": "1", "finish_reason": "error"}',
            "completion line 1: line '1' is outside its 3 lines",
        ),
        (
            '{"id": 1, "line": true, "finish_reason": "error"}',
            "completion line 1: line True is outside its 3 lines",
        ),
    ]
    for text, why in cases:
        with pytest.raises(MergeError, match=re.escape(f"job 1 ({part.job_id[:12]}), ") + why):
            completion_lines(text, part)
    # a line separator other than \n stands raw inside a JSON string: it does not cut the line
    odd = json.dumps(
        {"id": 1, "completion": " a\u2028b\x85c\rd", "finish_reason": "stop"}, ensure_ascii=False
    )
    lines, errors = completion_lines(odd + "\r\n" + odd + "\n", part)
    assert (lines, errors) == ([odd, odd], 0)


def test_span_files_that_cannot_be_written_are_a_typed_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = write_lines(tmp_path / "p.jsonl", prompt(1), prompt(2))

    def request(call: Call) -> Any:
        raise AssertionError(f"nothing is sent when the span files cannot be written: {call}")

    # no temporary directory can be made (the system's is gone, or the disk is full)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))
    with pytest.raises(
        LocalFileError, match=r"cannot make a temporary directory .*gone/e31-generate-.*: No such file"
    ):
        drive(generate(prompts), request, time.sleep)
    # a span file cannot be written in it
    with (
        shipped(MODULE, "module") as module,
        shipped(SHIPPED_MODEL, "model") as model,
        shipped(SHIPPED_TOKENIZER, "tokenizer") as tokenizer,
        pytest.raises(LocalFileError, match=r"cannot write .*gone/prompts-1-1\.jsonl: No such file"),
    ):
        plan(
            prompts,
            model,
            tokenizer,
            module,
            tmp_path / "gone",
            prompts_per_job=1,
            max_tokens=8,
            pass_bad_lines=False,
        )
    assert LocalFileError.exit_code == 74


def test_the_merged_file_is_never_written_over_unless_asked(tmp_path: Path) -> None:
    out = tmp_path / "c.jsonl"
    write_merged(out, ["a", "b"], overwrite=False)
    assert out.read_text() == "a\nb\n"
    with pytest.raises(MergeError, match="exists: not overwritten"):
        write_merged(out, ["c"], overwrite=False)
    write_merged(out, ["c"], overwrite=True)
    assert out.read_text() == "c\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]  # no temporary left behind


def test_an_incomplete_batch_is_refused_naming_what_is_missing(tmp_path: Path) -> None:
    doc = batch_doc((1, 2), (3, 4), states=("done", "failed"))

    def request(call: Call) -> Any:
        assert (call.method, call.path) == ("GET", "/v1/batches/batch-0123456789abcdef")
        return doc

    with pytest.raises(
        Incomplete, match=r"1 of 2 jobs have not finished well: lines 3-4 \(job 000000000000: out"
    ):
        drive(merge("batch-0123456789abcdef", tmp_path / "c.jsonl"), request, time.sleep)
    assert not (tmp_path / "c.jsonl").exists()


# --- the command line ---------------------------------------------------------------------------------


def test_the_command_refuses_bad_input_with_one_line(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "nobody")]
    good = write_lines(tmp_path / "p.jsonl", prompt(1))
    bad = write_lines(tmp_path / "bad.jsonl", prompt(1), "{")
    many = write_lines(tmp_path / "many.jsonl", *(prompt(i) for i in range(6000)))
    cases = [
        (["generate", str(tmp_path / "absent.jsonl"), *data], 2, "no such file"),
        (["generate", str(bad), *data], 2, "line 2: not JSON"),
        (["generate", str(good), "--model", str(tmp_path / "m.bin"), *data], 2, "needs its pair"),
        (
            ["generate", str(good), "--model", str(tmp_path / "m.bin"), "--tokenizer", str(good), *data],
            2,
            "model .*m.bin: no such file",
        ),
        (["generate", str(good), "--prompts-per-job", "0", *data], 2, "must be more than 0"),
        (["generate", str(good), "--deadline", "soon", *data], 2, "not a duration"),
        (
            ["generate", str(many), "--prompts-per-job", "1", *data],
            2,
            "6000 jobs do not fit one batch request",
        ),
        (["generate", str(good), *data], 1, "no node is running"),
        (["results", "batch-0123456789abcdef", "--merge", str(tmp_path / "c.jsonl"), *data], 1, "no node"),
        (["results", "abcdef0123", "--merge", str(tmp_path / "c.jsonl"), *data], 2, "takes a batch id"),
        (["results", "abcdef0123", *data], 2, "--out DIR is required"),
    ]
    for argv, code, message in cases:
        status, stderr = e31(*argv)
        assert status == code, (argv, stderr)
        assert "Traceback" not in stderr
        assert len([ln for ln in stderr.strip().splitlines() if "error" in ln]) == 1, stderr
        assert re.search(message, stderr), (message, stderr)
