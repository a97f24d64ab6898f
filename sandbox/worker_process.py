"""One sandbox worker process as its pool sees it: the process, the parent's ends of its request and reply
pipes, its paused-time page and its module memo (worker.py speaks the other side). pool.py supervises it.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import mmap
import os
import select
import signal
import subprocess
import sys
import tempfile
import termios
import threading
import time
from typing import Any

import msgpack

from .errors import SandboxError
from .worker import _LEN, _NS, MAX_FRAME, SHM_BYTES, ModuleMemo, ProtocolViolation


class PoolError(SandboxError):
    """The pool cannot take the job: closed, busy past the caller's timeout, or no worker starts."""


class _Worker:
    """One worker process and the parent's ends of its pipes and paused-time page."""

    def __init__(self, args: list[str], start_timeout: float) -> None:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        with tempfile.TemporaryFile() as shm_file:
            try:
                shm_file.truncate(SHM_BYTES)
                self.shm = mmap.mmap(shm_file.fileno(), SHM_BYTES)
                self.proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "e31.sandbox.worker",
                        "--request-fd",
                        str(req_r),
                        "--reply-fd",
                        str(rep_w),
                        "--paused-fd",
                        str(shm_file.fileno()),
                        *args,
                    ],
                    pass_fds=(req_r, rep_w, shm_file.fileno()),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except BaseException:
                os.close(req_w)
                os.close(rep_r)
                raise
            finally:
                os.close(req_r)
                os.close(rep_w)
        self.pid = self.proc.pid
        self.requests = os.fdopen(req_w, "wb")
        self.reply_fd = rep_r
        os.set_blocking(rep_r, False)
        self._buf = bytearray()
        self._lock = threading.Lock()
        self.memo = ModuleMemo(keep=False)
        """The modules this worker holds (the same as its own memo: both see the same requests)."""
        self.paused_ns = 0
        self.closed = False
        deadline = time.monotonic() + start_timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise PoolError(f"worker {self.pid} did not start within {start_timeout:g} s")
            try:
                messages, eof = self.receive(remaining)
            except ProtocolViolation as e:
                self.kill()
                raise PoolError(f"worker {self.pid} failed to start: {e}") from None
            if messages:
                if messages[0][0] != "ready" or len(messages) > 1:
                    self.kill()
                    raise PoolError(f"worker {self.pid} sent {messages[0][0]!r} instead of ready")
                return
            if eof:
                code = self.kill()
                raise PoolError(f"worker {self.pid} failed to start ({describe_exit(code)})")

    def send(self, message: list[Any]) -> None:
        payload = msgpack.packb(message, use_bin_type=True)
        self.requests.write(_LEN.pack(len(payload)) + payload)
        self.requests.flush()

    def unread_request_bytes(self) -> int | None:
        """Bytes of the requests sent that the worker has not read yet (FIONREAD of the request pipe,
        which still holds them after the worker died); None when it cannot be known."""
        if self.closed:
            return None
        try:
            raw = fcntl.ioctl(self.requests.fileno(), termios.FIONREAD, bytes(4))
        except (OSError, ValueError):
            return None
        return int.from_bytes(raw, sys.byteorder, signed=True)

    def receive(self, timeout: float | None, wake_fd: int | None = None) -> tuple[list[list[Any]], bool]:
        """Complete messages that arrive within `timeout` (or until `wake_fd` is readable), and
        whether the worker's end closed. Raises ProtocolViolation on a malformed frame."""
        poller = select.poll()  # not select(): the node may hold more than FD_SETSIZE descriptors
        poller.register(self.reply_fd, select.POLLIN)
        if wake_fd is not None:
            poller.register(wake_fd, select.POLLIN)
        ready = poller.poll(None if timeout is None else max(0, math.ceil(timeout * 1000)))
        eof = False
        if any(fd == self.reply_fd for fd, _ in ready):
            try:
                chunk = os.read(self.reply_fd, 1 << 20)
            except BlockingIOError:
                chunk = None
            if chunk == b"":
                eof = True
            elif chunk:
                self._buf += chunk
        return self._frames(), eof

    def _frames(self) -> list[list[Any]]:
        out = []
        while len(self._buf) >= _LEN.size:
            (n,) = _LEN.unpack_from(self._buf)
            if n > MAX_FRAME:
                raise ProtocolViolation(f"worker frame of {n} bytes")
            if len(self._buf) < _LEN.size + n:
                break
            payload = bytes(self._buf[_LEN.size : _LEN.size + n])
            del self._buf[: _LEN.size + n]
            try:
                message = msgpack.unpackb(payload, raw=False, strict_map_key=True, use_list=True)
            except Exception as e:  # msgpack raises several unrelated types
                raise ProtocolViolation(f"undecodable worker frame: {e}") from None
            if not isinstance(message, list) or not message or not isinstance(message[0], str):
                raise ProtocolViolation("a worker frame must be an array starting with its kind")
            out.append(message)
        return out

    def add_paused(self, ns: int) -> None:
        if self.closed:
            return
        self.paused_ns += ns
        _NS.pack_into(self.shm, 0, self.paused_ns)

    def signal(self, sig: int) -> None:
        # Under the lock that reaping takes: once reaped, the pid may belong to another process.
        with self._lock:
            if self.closed or self.proc.returncode is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> int:
        """SIGKILL and reap; returns the exit status (negative: the signal)."""
        with self._lock:
            if self.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
            code = self.proc.wait()
        self._close_fds()
        return code

    def reap(self) -> int:
        """Waits for a worker whose pipe closed (it is dying) and returns its exit status."""
        try:
            with self._lock:
                code = self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            code = self.kill()
        self._close_fds()
        return code

    def quit(self, timeout: float) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.send(["quit"])
        try:
            with self._lock:
                self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self._close_fds()

    def _close_fds(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(OSError):
            self.requests.close()
        with contextlib.suppress(OSError):
            os.close(self.reply_fd)
        self.shm.close()


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exit status {code}"
