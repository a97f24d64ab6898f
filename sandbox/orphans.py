"""Workers a dead pool left behind, found and killed when the next pool for the same cache starts.

A worker exits on its own when the process that started it dies (worker.watch_parent), but only while
it runs: one stopped with SIGSTOP (its jobs suspended because the machine's owner came back) cannot
notice, and would stay stopped, holding its memory, once its node was killed. Each worker carries its
pool's pid (`--parent`) and module cache (`--cache-dir`) on its command line, so a new pool can tell
such an orphan from a live pool's worker: same cache, and a parent that is no longer the one it names.
Linux only (it reads /proc); elsewhere nothing is found.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

WORKER_MODULE = "e31.sandbox.worker"
PROC = Path("/proc")


def _options(argv: list[bytes]) -> dict[bytes, bytes]:
    """`--name value` pairs of a command line (the last value wins)."""
    return {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith(b"--")}


def orphaned_workers(cache_dir: Path | str, proc: Path = PROC) -> list[int]:
    """The pids of this user's workers for `cache_dir` whose pool process has died."""
    try:
        entries = os.listdir(proc)
    except OSError:
        return []
    wanted = os.fsencode(os.fspath(cache_dir))
    module = WORKER_MODULE.encode()
    uid = os.getuid()
    found = []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            argv = (proc / name / "cmdline").read_bytes().split(b"\0")
            if module not in argv:
                continue
            options = _options(argv)
            if options.get(b"--cache-dir") != wanted:
                continue
            parent = options.get(b"--parent", b"")
            if not parent.isdigit() or (proc / name).stat().st_uid != uid:
                continue
            ppid = int((proc / name / "stat").read_bytes().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):  # gone meanwhile, or not readable
            continue
        if ppid != int(parent):
            found.append(int(name))
    return found


def kill_orphaned_workers(cache_dir: Path | str, proc: Path = PROC) -> list[int]:
    """SIGKILL (which ends a stopped process too) every orphaned worker for `cache_dir`; their pids."""
    killed = []
    for pid in orphaned_workers(cache_dir, proc):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        killed.append(pid)
    return killed
