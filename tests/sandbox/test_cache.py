"""The compiled-module cache: hits, integrity checks before deserialization, keys, eviction."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
import wasmtime
from e31.sandbox import cache as cache_mod
from e31.sandbox.cache import MAGIC, TAG_BYTES, CacheError, ModuleCache, load_or_create_key
from e31.sandbox.errors import InvalidModule
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Status
from e31.sandbox.profile import PROFILE, new_engine
from e31.sandbox.runner import run, wat_to_wasm

ECHO = (Path(__file__).resolve().parents[2] / "sandbox" / "workloads" / "echo.wasm").read_bytes()


def tiny(i: int) -> bytes:
    """A distinct minimal WASI command per `i`."""
    return wat_to_wasm(
        f'(module (memory 1) (export "memory" (memory 0)) (func (export "_start") (drop (i32.const {i}))))'
    )


@pytest.fixture(scope="module")
def engine() -> wasmtime.Engine:
    return new_engine()


def runs_echo(engine: wasmtime.Engine, module: wasmtime.Module) -> bool:
    r = run(JobSpec(ECHO, args=("ok",)), engine=engine, module=module)
    return (r.status, r.stdout) == (Status.EXITED, b"ok\n")


def only_entry(cache: ModuleCache) -> Path:
    [(path, _, _)] = cache.entries()
    return path


def test_miss_then_disk_hit_then_memory_hit(tmp_path: Path, engine: wasmtime.Engine) -> None:
    c = ModuleCache(tmp_path)
    assert runs_echo(engine, c.get(engine, ECHO))
    assert (c.stats.misses, c.stats.disk_hits) == (1, 0)
    path = only_entry(c)
    assert path == c.path_for(hashlib.sha256(ECHO).digest())
    assert path.name.endswith(f"-{PROFILE.digest_hex}.cwasm")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    entry = path.read_bytes()
    assert entry[-(len(MAGIC) + TAG_BYTES) : -TAG_BYTES] == MAGIC  # the artifact, then MAGIC and the tag

    c.get(engine, ECHO)
    assert c.stats.memory_hits == 1

    fresh = ModuleCache(tmp_path)
    assert runs_echo(engine, fresh.get(engine, ECHO))
    assert (fresh.stats.misses, fresh.stats.disk_hits, fresh.stats.discarded) == (0, 1, 0)


def test_key_file_is_private_and_stable(tmp_path: Path) -> None:
    ModuleCache(tmp_path)
    key_path = tmp_path / "key"
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    key = key_path.read_bytes()
    assert len(key) == 32
    ModuleCache(tmp_path)
    assert key_path.read_bytes() == key
    assert load_or_create_key(key_path) == key


def test_a_readable_or_malformed_key_is_refused(tmp_path: Path) -> None:
    ModuleCache(tmp_path)
    key_path = tmp_path / "key"
    key_path.chmod(0o644)
    with pytest.raises(CacheError, match="readable by others"):
        ModuleCache(tmp_path)
    key_path.chmod(0o600)
    key_path.write_bytes(b"short")
    with pytest.raises(CacheError, match="exactly 32 bytes"):
        ModuleCache(tmp_path)
    with pytest.raises(CacheError, match="at least 16 bytes"):
        ModuleCache(tmp_path / "other", key=b"x")


def corrupt_artifact(path: Path) -> None:
    blob = bytearray(path.read_bytes())
    blob[(len(blob) - len(MAGIC) - TAG_BYTES) // 2] ^= 0x01
    path.write_bytes(bytes(blob))


def corrupt_tag(path: Path) -> None:
    blob = bytearray(path.read_bytes())
    blob[-TAG_BYTES] ^= 0x80
    path.write_bytes(bytes(blob))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(MAGIC) + 10])


def garbage(path: Path) -> None:
    path.write_bytes(os.urandom(5000))


@pytest.mark.parametrize("damage", [corrupt_artifact, corrupt_tag, truncate, garbage])
def test_a_damaged_entry_is_never_deserialized_and_is_recompiled(
    tmp_path: Path, engine: wasmtime.Engine, monkeypatch: pytest.MonkeyPatch, damage: object
) -> None:
    ModuleCache(tmp_path).get(engine, ECHO)
    c = ModuleCache(tmp_path)
    path = only_entry(c)
    assert callable(damage)
    damage(path)

    deserialized: list[int] = []
    real, real_file = wasmtime.Module.deserialize, wasmtime.Module.deserialize_file

    def spy(engine: wasmtime.Engine, data: bytes) -> wasmtime.Module:
        deserialized.append(len(data))
        return real(engine, data)

    def spy_file(engine: wasmtime.Engine, path: str) -> wasmtime.Module:
        deserialized.append(-1)
        return real_file(engine, path)

    monkeypatch.setattr(wasmtime.Module, "deserialize", staticmethod(spy))
    monkeypatch.setattr(wasmtime.Module, "deserialize_file", staticmethod(spy_file))
    assert runs_echo(engine, c.get(engine, ECHO))
    assert deserialized == []
    assert (c.stats.discarded, c.stats.misses, c.stats.disk_hits) == (1, 1, 0)

    # The recompiled entry replaced the damaged one and verifies again.
    again = ModuleCache(tmp_path)
    assert runs_echo(engine, again.get(engine, ECHO))
    assert (again.stats.disk_hits, again.stats.discarded) == (1, 0)


def test_an_entry_tagged_under_another_key_is_discarded(tmp_path: Path, engine: wasmtime.Engine) -> None:
    ModuleCache(tmp_path / "theirs", key=os.urandom(32)).get(engine, ECHO)
    theirs = only_entry(ModuleCache(tmp_path / "theirs", key=os.urandom(32)))
    mine = ModuleCache(tmp_path / "mine")
    os.link(theirs, mine.path_for(hashlib.sha256(ECHO).digest()))
    assert runs_echo(engine, mine.get(engine, ECHO))
    assert (mine.stats.discarded, mine.stats.misses) == (1, 1)


def test_an_entry_replayed_under_another_module_name_is_discarded(
    tmp_path: Path, engine: wasmtime.Engine
) -> None:
    c = ModuleCache(tmp_path)
    c.get(engine, tiny(1))
    entry = only_entry(c)
    other = c.path_for(hashlib.sha256(ECHO).digest())
    other.write_bytes(entry.read_bytes())
    fresh = ModuleCache(tmp_path)
    assert runs_echo(engine, fresh.get(engine, ECHO))
    assert fresh.stats.discarded == 1


def test_an_artifact_the_engine_rejects_is_discarded(tmp_path: Path, engine: wasmtime.Engine) -> None:
    c = ModuleCache(tmp_path)
    digest = hashlib.sha256(ECHO).digest()
    bogus = b"\x7fELF not a wasmtime artifact" * 10
    c.path_for(digest).write_bytes(bogus + MAGIC + c._tag(digest, bogus))
    assert runs_echo(engine, c.get(engine, ECHO))
    assert (c.stats.discarded, c.stats.misses) == (1, 1)


def test_a_symlinked_entry_is_not_followed(tmp_path: Path, engine: wasmtime.Engine) -> None:
    c = ModuleCache(tmp_path / "c")
    target = tmp_path / "elsewhere"
    target.write_bytes(b"x")
    c.path_for(hashlib.sha256(ECHO).digest()).symlink_to(target)
    assert runs_echo(engine, c.get(engine, ECHO))
    assert c.stats.discarded == 1
    assert target.read_bytes() == b"x"


def test_invalid_module_raises_and_stores_nothing(tmp_path: Path, engine: wasmtime.Engine) -> None:
    c = ModuleCache(tmp_path)
    with pytest.raises(InvalidModule):
        c.get(engine, b"\x00asm\x01\x00\x00\x00garbage")
    assert c.entries() == []


def test_lru_eviction_keeps_the_size_bound(tmp_path: Path, engine: wasmtime.Engine) -> None:
    probe = ModuleCache(tmp_path / "probe")
    probe.get(engine, tiny(0))
    size = probe.size_bytes()

    c = ModuleCache(tmp_path / "c", max_bytes=2 * size + size // 2, memory_entries=0)
    a, b, d = tiny(1), tiny(2), tiny(3)
    c.get(engine, a)
    c.get(engine, b)
    path_a, path_b = (c.path_for(hashlib.sha256(m).digest()) for m in (a, b))
    os.utime(path_a, (1_000_000, 1_000_000))
    os.utime(path_b, (2_000_000, 2_000_000))
    c.get(engine, a)  # a disk hit makes `a` the most recently used
    assert c.stats.disk_hits == 1
    c.get(engine, d)
    assert c.stats.evicted == 1
    assert path_a.exists() and not path_b.exists()
    assert c.size_bytes() <= c.max_bytes


def test_an_artifact_larger_than_the_whole_cache_is_not_stored(
    tmp_path: Path, engine: wasmtime.Engine
) -> None:
    c = ModuleCache(tmp_path, max_bytes=100)
    assert runs_echo(engine, c.get(engine, ECHO))
    assert c.entries() == []


def test_an_unwritable_cache_costs_a_recompile_not_the_job(
    tmp_path: Path, engine: wasmtime.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = ModuleCache(tmp_path)

    def refuse(*a: object, **kw: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_mod.os, "fsync", refuse)
    assert runs_echo(engine, c.get(engine, ECHO))
    monkeypatch.undo()
    assert c.entries() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key"]


def test_a_disk_hit_maps_the_checked_file_which_may_then_go(
    tmp_path: Path, engine: wasmtime.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """wasmtime maps the entry's open file (the inode whose tag was checked); the module keeps working
    after the entry is deleted (evicted) or replaced."""
    ModuleCache(tmp_path).get(engine, ECHO)
    mapped: list[str] = []
    real = wasmtime.Module.deserialize_file

    def spy(engine: wasmtime.Engine, path: str) -> wasmtime.Module:
        mapped.append(path)
        return real(engine, path)

    monkeypatch.setattr(wasmtime.Module, "deserialize_file", staticmethod(spy))
    c = ModuleCache(tmp_path)
    module = c.get(engine, ECHO)
    assert c.stats.disk_hits == 1 and len(mapped) == 1 and mapped[0].startswith("/proc/self/fd/")
    only_entry(c).unlink()
    assert runs_echo(engine, module)
