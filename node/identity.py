"""The node's key file: load it, or create it once, atomically and private.

Format (text, so a wrong file is recognised): the line "e31-ed25519-seed-v1", then the 32-byte
Ed25519 seed as 64 lower-case hex digits, each line ending in "\\n". The file must be a regular
file owned by the user running the node, with no group or world permissions (mode 0600 or
stricter); anything else is refused with IdentityError and never overwritten.

Creation writes a temporary file (mode 0600) in the same directory, fsyncs it, and links it into
place, so a crash leaves either no key file or a complete one, and two nodes starting at once end
up with the same key rather than one silently replacing the other's.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import nacl.signing
from e31.protocol.ids import NodeId

from .errors import NodeError

HEADER = "e31-ed25519-seed-v1"
SEED_SIZE = 32


class IdentityError(NodeError):
    """A key file that is missing, unreadable, malformed or too widely readable."""


def node_id(key: nacl.signing.SigningKey) -> NodeId:
    return NodeId(bytes(key.verify_key))


def encode_key_file(seed: bytes) -> bytes:
    if len(seed) != SEED_SIZE:
        raise IdentityError(f"an Ed25519 seed is {SEED_SIZE} bytes, got {len(seed)}")
    return f"{HEADER}\n{seed.hex()}\n".encode("ascii")


def decode_key_file(data: bytes, path: Path | str = "key file") -> nacl.signing.SigningKey:
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise IdentityError(f"{path}: not an e31 key file (not ASCII text)") from None
    lines = text.split("\n")
    if len(lines) != 3 or lines[0] != HEADER or lines[2] != "":
        raise IdentityError(f"{path}: not an e31 key file (expected the line {HEADER!r} and one hex line)")
    hexseed = lines[1]
    if len(hexseed) != 2 * SEED_SIZE or hexseed != hexseed.lower():
        raise IdentityError(f"{path}: malformed key file (the seed is {2 * SEED_SIZE} lower-case hex digits)")
    try:
        seed = bytes.fromhex(hexseed)
    except ValueError:
        raise IdentityError(f"{path}: malformed key file (the seed is not hex)") from None
    return nacl.signing.SigningKey(seed)


def load_identity(path: Path) -> nacl.signing.SigningKey:
    """Read the key file at `path`, refusing it unless it is private to this user."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise IdentityError(f"{path}: no key file") from None
    except OSError as e:
        raise IdentityError(f"{path}: cannot open the key file: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IdentityError(f"{path}: the key file is not a regular file")
        if st.st_mode & 0o077:
            raise IdentityError(
                f"{path}: the key file is readable by others (mode "
                f"{stat.S_IMODE(st.st_mode):04o}); run: chmod 600 {path}"
            )
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise IdentityError(f"{path}: the key file belongs to another user (uid {st.st_uid})")
        data = os.read(fd, 4096)
    except OSError as e:
        raise IdentityError(f"{path}: cannot read the key file: {e.strerror}") from None
    finally:
        os.close(fd)
    return decode_key_file(data, path)


def create_identity(path: Path, seed: bytes | None = None) -> nacl.signing.SigningKey:
    """Write a new key file at `path` (a fresh random seed unless one is given).

    Refuses (IdentityError) if a file already exists there; never overwrites.
    """
    key = nacl.signing.SigningKey.generate() if seed is None else nacl.signing.SigningKey(seed)
    data = encode_key_file(bytes(key))
    directory = path.parent
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = directory / f".{path.name}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise IdentityError(f"{path}: a key file already exists") from None
        finally:
            tmp.unlink()
        _fsync_dir(directory)
    except OSError as e:
        raise IdentityError(f"{path}: cannot write the key file: {e.strerror or e}") from None
    return key


def load_or_create_identity(path: Path) -> nacl.signing.SigningKey:
    """The node's key: loaded from `path`, or created there on first start."""
    if not os.path.lexists(path):
        try:
            return create_identity(path)
        except IdentityError:
            if not os.path.lexists(path):
                raise
            # another process created it first: use theirs
    return load_identity(path)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
