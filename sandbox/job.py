"""One job as the sandbox runs it: module bytes, argv, env, stdin, input files, limits, seed.

Input files are named by their guest path under /input ("a/b.txt") and served from their host
files at run time. Everything that could let the guest reach a host path is refused here, at spec
time: names are plain relative paths, and a host file must be a regular file reached without
following a symbolic link at its last component.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from .errors import JobSpecError
from .limits import Limits

MAX_MODULE_BYTES = 64 * 1024 * 1024
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096
MAX_INPUTS = 100_000
MAX_ARGS_BYTES = 1024 * 1024
SEED_BYTES = 32


def check_guest_name(name: str) -> tuple[str, ...]:
    """Split a guest-relative path ("a/b.txt") into components, refusing anything unusual."""
    if not isinstance(name, str) or not name:
        raise JobSpecError(f"input name must be a non-empty string, got {name!r}")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise JobSpecError(f"input name longer than {MAX_PATH_BYTES} bytes: {name[:40]!r}...")
    if name.startswith("/"):
        raise JobSpecError(f"input name must be relative to /input: {name!r}")
    parts = tuple(name.split("/"))
    for part in parts:
        if part in ("", ".", ".."):
            raise JobSpecError(f"input name has an empty, '.' or '..' component: {name!r}")
        if "\x00" in part or "\\" in part:
            raise JobSpecError(f"input name contains NUL or backslash: {name!r}")
        try:
            encoded = part.encode("utf-8")
        except UnicodeEncodeError as e:
            raise JobSpecError(f"input name is not valid UTF-8: {name!r}") from e
        if len(encoded) > MAX_NAME_BYTES:
            raise JobSpecError(f"input name component longer than {MAX_NAME_BYTES} bytes: {name!r}")
    return parts


def check_host_file(path: Path, what: str) -> int:
    """Return the size of a regular, non-symlinked host file, or raise JobSpecError."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise JobSpecError(f"{what} {str(path)!r}: {e.strerror or e}") from e
    if stat.S_ISLNK(st.st_mode):
        raise JobSpecError(f"{what} {str(path)!r} is a symbolic link (refused: it could point anywhere)")
    if not stat.S_ISREG(st.st_mode):
        raise JobSpecError(f"{what} {str(path)!r} is not a regular file")
    return st.st_size


@dataclass(frozen=True)
class InputFile:
    parts: tuple[str, ...]
    host_path: Path
    size: int


_last_digest: tuple[bytes, str] | None = None


def module_digest(module: bytes) -> str:
    """SHA-256 of a module, hex. The last one hashed is remembered by identity (the very same bytes object,
    immutable): a worker that runs one module again and again (worker.ModuleMemo) hashes it once."""
    global _last_digest
    last = _last_digest
    if last is not None and last[0] is module:
        return last[1]
    digest = hashlib.sha256(module).hexdigest()
    _last_digest = (module, digest)
    return digest


@dataclass(frozen=True)
class JobSpec:
    module: bytes
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    stdin: Path | None = None
    inputs: Mapping[str, Path] = field(default_factory=lambda: MappingProxyType({}))
    limits: Limits = field(default_factory=Limits.default)
    seed: bytes = bytes(SEED_BYTES)

    def __post_init__(self) -> None:
        if not isinstance(self.module, (bytes, bytearray)):
            raise JobSpecError("module must be bytes")
        object.__setattr__(self, "module", bytes(self.module))
        object.__setattr__(self, "module_sha256", module_digest(self.module))
        if not isinstance(self.limits, Limits):
            raise JobSpecError("limits must be a Limits")
        if not isinstance(self.seed, (bytes, bytearray)) or len(self.seed) != SEED_BYTES:
            raise JobSpecError(f"seed must be {SEED_BYTES} bytes")
        args = tuple(self.args)
        env = tuple((k, v) for k, v in self.env)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "env", env)
        total = 0
        for a in args:
            total += _c_string_len(a, "argument")
        for k, v in env:
            if not k or "=" in k:
                raise JobSpecError(f"environment name must be non-empty and contain no '=': {k!r}")
            total += _c_string_len(k, "environment name") + _c_string_len(v, "environment value")
        if total > MAX_ARGS_BYTES:
            raise JobSpecError(f"argv and environment exceed {MAX_ARGS_BYTES} bytes")
        if self.stdin is not None:
            object.__setattr__(self, "stdin", Path(self.stdin))
            object.__setattr__(self, "stdin_size", check_host_file(self.stdin, "stdin file"))
        else:
            object.__setattr__(self, "stdin_size", 0)
        if len(self.inputs) > MAX_INPUTS:
            raise JobSpecError(f"more than {MAX_INPUTS} input files")
        files: list[InputFile] = []
        seen: dict[tuple[str, ...], str] = {}
        for name, host in self.inputs.items():
            parts = check_guest_name(name)
            if parts in seen:
                raise JobSpecError(f"input {name!r} given twice")
            seen[parts] = name
            files.append(InputFile(parts, Path(host), check_host_file(Path(host), f"input {name!r}")))
        for parts, name in seen.items():
            for i in range(1, len(parts)):
                if parts[:i] in seen:
                    raise JobSpecError(f"input {name!r} lies under input file {seen[parts[:i]]!r}")
        object.__setattr__(self, "inputs", MappingProxyType({n: Path(h) for n, h in self.inputs.items()}))
        object.__setattr__(self, "input_files", tuple(sorted(files, key=lambda f: f.parts)))

    # Set in __post_init__; declared for type checkers.
    module_sha256: str = field(init=False, repr=False, compare=False, default="")
    stdin_size: int = field(init=False, repr=False, compare=False, default=0)
    input_files: tuple[InputFile, ...] = field(init=False, repr=False, compare=False, default=())


def _c_string_len(s: str, what: str) -> int:
    if not isinstance(s, str):
        raise JobSpecError(f"{what} must be a string, got {type(s).__name__}")
    if "\x00" in s:
        raise JobSpecError(f"{what} contains a NUL byte: {s[:40]!r}")
    try:
        return len(s.encode("utf-8")) + 1
    except UnicodeEncodeError as e:
        raise JobSpecError(f"{what} is not valid UTF-8: {s[:40]!r}") from e


def input_files_from_dir(root: Path) -> dict[str, Path]:
    """Map every regular file under `root` to its guest name; refuse symlinks and special files."""
    if not root.is_dir():
        raise JobSpecError(f"input directory {str(root)!r} is not a directory")
    found: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        for d in dirnames:
            if (base / d).is_symlink():
                raise JobSpecError(f"input {str(base / d)!r} is a symbolic link (refused)")
        for f in filenames:
            p = base / f
            check_host_file(p, "input")
            found[p.relative_to(root).as_posix()] = p
            if len(found) > MAX_INPUTS:
                raise JobSpecError(f"more than {MAX_INPUTS} input files")
    return found
