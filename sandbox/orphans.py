"""Workers a dead pool left behind, found and killed when the next pool for the same cache starts.

A worker exits on its own when the process that started it dies (worker.watch_parent), but only while
it runs: one stopped with SIGSTOP (its jobs suspended because the machine's owner came back) cannot
notice, and would stay stopped, holding its memory, once its node was killed. Each worker carries its
pool's pid (`--parent`) and module cache (`--cache-dir`) on its command line, so a new pool can tell
such an orphan from a live pool's worker: same cache, and a parent that is no longer the one it names.
(Two live nodes never share a cache: it lies in the data directory, which one node holds locked, so
only the same node's pools and the workers of a dead one can match.) The process is then signalled
through a pidfd opened before its command line is read again, so a pid reused meanwhile is never hit.
Linux only (it reads /proc); elsewhere nothing is found.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

WORKER_MODULE = "e31.sandbox.worker"
PROC = Path("/proc")


def _options(argv: list[bytes]) -> dict[bytes, bytes]:
    """`--name value` pairs of a command line (the last value wins)."""
    return {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith(b"--")}


def _is_orphan(proc: Path, pid: str, wanted: bytes, uid: int) -> bool:
    """Whether process `pid` is a worker of cache `wanted`, of user `uid`, whose pool is gone."""
    try:
        argv = (proc / pid / "cmdline").read_bytes().split(b"\0")
        module = WORKER_MODULE.encode()
        if not any(argv[i] == b"-m" and argv[i + 1] == module for i in range(len(argv) - 1)):
            return False
        options = _options(argv)
        parent = options.get(b"--parent", b"")
        if options.get(b"--cache-dir") != wanted or not parent.isdigit():
            return False
        if (proc / pid).stat().st_uid != uid:
            return False
        ppid = int((proc / pid / "stat").read_bytes().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):  # gone meanwhile, or not readable
        return False
    return ppid != int(parent)


def orphaned_workers(cache_dir: Path | str, proc: Path = PROC) -> list[int]:
    """The pids of this user's workers for `cache_dir` whose pool process has died."""
    try:
        entries = os.listdir(proc)
    except OSError:
        return []
    wanted, uid = os.fsencode(os.fspath(cache_dir)), os.getuid()
    return [int(name) for name in entries if name.isdigit() and _is_orphan(proc, name, wanted, uid)]


def kill_orphaned_workers(cache_dir: Path | str, proc: Path = PROC) -> list[int]:
    """SIGKILL (which ends a stopped process too) every orphaned worker for `cache_dir`; their pids."""
    wanted, uid = os.fsencode(os.fspath(cache_dir)), os.getuid()
    killed = []
    for pid in orphaned_workers(cache_dir, proc):
        try:
            handle = os.pidfd_open(pid)
        except ProcessLookupError:  # gone already
            continue
        except OSError:  # no pidfds here (an old kernel, a seccomp profile): checked again, then a plain kill
            if _is_orphan(proc, str(pid), wanted, uid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            continue
        try:
            if _is_orphan(proc, str(pid), wanted, uid):  # still that process: the pidfd pins it
                signal.pidfd_send_signal(handle, signal.SIGKILL)
                killed.append(pid)
        except OSError:
            continue
        finally:
            os.close(handle)
    return killed
