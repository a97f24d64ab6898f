from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from e31.node.identity import (
    HEADER,
    IdentityError,
    create_identity,
    load_identity,
    load_or_create_identity,
    node_id,
)


def test_first_start_creates_a_private_key_file_and_later_starts_load_it(tmp_path: Path) -> None:
    path = tmp_path / "state" / "node.key"
    key = load_or_create_identity(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text() == f"{HEADER}\n{bytes(key).hex()}\n"
    again = load_or_create_identity(path)
    assert bytes(again) == bytes(key)
    assert node_id(again) == node_id(key)
    assert [p.name for p in path.parent.iterdir()] == ["node.key"]  # no temporary file left


def test_create_with_a_seed_is_deterministic_and_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    key = create_identity(path, seed=b"\x01" * 32)
    assert bytes(key) == b"\x01" * 32
    with pytest.raises(IdentityError, match="already exists"):
        create_identity(path, seed=b"\x02" * 32)
    assert bytes(load_identity(path)) == b"\x01" * 32


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660, 0o666])
def test_group_or_world_readable_key_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "node.key"
    create_identity(path, seed=b"\x01" * 32)
    os.chmod(path, mode)
    with pytest.raises(IdentityError, match="chmod 600"):
        load_identity(path)
    with pytest.raises(IdentityError):
        load_or_create_identity(path)
    assert path.read_text().startswith(HEADER)  # refused, not rewritten


def test_stricter_modes_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    create_identity(path, seed=b"\x01" * 32)
    os.chmod(path, 0o400)
    assert bytes(load_identity(path)) == b"\x01" * 32


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\x01" * 32,  # a raw seed is not our format
        f"{HEADER}\n".encode(),
        f"{HEADER}\n{'ab' * 31}\n".encode(),
        f"{HEADER}\n{'AB' * 32}\n".encode(),
        f"{HEADER}\n{'zz' * 32}\n".encode(),
        f"{HEADER}\n{'ab' * 32}".encode(),  # missing final newline
        f"{HEADER}\n{'ab' * 32}\nextra\n".encode(),
        f"other-header\n{'ab' * 32}\n".encode(),
        b"\xff" * 90,
    ],
)
def test_malformed_key_file_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "node.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, content)
    os.close(fd)
    with pytest.raises(IdentityError, match="key file"):
        load_identity(path)
    assert path.read_bytes() == content


def test_missing_directory_and_symlink(tmp_path: Path) -> None:
    with pytest.raises(IdentityError, match="no key file"):
        load_identity(tmp_path / "absent.key")
    target = tmp_path / "real.key"
    create_identity(target, seed=b"\x01" * 32)
    link = tmp_path / "link.key"
    link.symlink_to(target)
    with pytest.raises(IdentityError):
        load_identity(link)
    with pytest.raises(IdentityError, match="regular file"):
        load_identity(tmp_path)


def test_unwritable_location_gives_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    with pytest.raises(IdentityError, match="cannot write"):
        create_identity(blocker / "node.key")
    with pytest.raises(IdentityError, match="cannot write"):
        load_or_create_identity(blocker / "node.key")
