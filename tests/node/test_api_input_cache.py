"""A batch whose jobs share one input file (a model) stores it once: the local API keys the files it
stored by path and the opened file's (device, inode, size, mtime, ctime), and reads a file again only
when one of them changed or its blob is gone."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from e31.node.api.jobs import JobsApi
from e31.protocol.blobs import blob_ref
from e31.sandbox.profile import PROFILE
from market_nodes import Net, RealNode


def api_of(node: RealNode) -> JobsApi:
    return JobsApi(
        submitter=node.submitter, blobs=node.blobs, profile=PROFILE.digest, compile_check=lambda m: None
    )


async def test_a_shared_input_is_stored_once_and_again_after_it_changes(net: Net, tmp_path: Path) -> None:
    node = RealNode(net, tmp_path, "a", 1)
    api = api_of(node)
    writes: list[Any] = []
    put_stream = node.blobs.put_stream

    def counting(chunks: Any, expected: Any = None) -> tuple[str, int]:
        writes.append(1)
        return put_stream(chunks, expected)

    node.blobs.put_stream = counting  # type: ignore[method-assign]
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights" * 10_000)
    refs = [await api._put_file(model, "input 'model.bin'") for _ in range(50)]
    assert len(writes) == 1 and all(r == blob_ref(model.read_bytes()) for r in refs)

    st = model.stat()
    model.write_bytes(model.read_bytes() + b"more")  # a write changes size and ctime: read again
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert await api._put_file(model, "input") == blob_ref(model.read_bytes())
    assert len(writes) == 2

    node.blobs.delete(blob_ref(model.read_bytes()).root.raw)  # its blob is gone (collected): stored again
    assert await api._put_file(model, "input") == blob_ref(model.read_bytes())
    assert len(writes) == 3 and node.blobs.has(blob_ref(model.read_bytes()).root.raw)
