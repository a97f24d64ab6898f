"""The execution profile: every engine setting that can change a guest's output or fuel count.

Two nodes with the same profile digest produce bit-identical outputs and fuel counts for the same job;
the digest goes into every receipt, and a job naming another digest is refused (`require`).
NaN canonicalization is off (it costs about 4.5x on float kernels); NaN bit patterns are deterministic
on one CPU architecture, so the architecture is part of the profile instead.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import asdict, dataclass
from functools import cached_property
from importlib.metadata import version
from typing import Any

import wasmtime

from .errors import ProfileMismatch

WASI_VIRTUALISATION = "e31-wasi-preview1/2"
"""Version of our virtual WASI (vfs.py, wasi.py): bump on any change a guest could observe."""

_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}


def _arch() -> str:
    m = platform.machine().lower()
    return _ARCH_ALIASES.get(m, m)


@dataclass(frozen=True)
class ExecutionProfile:
    wasmtime_version: str
    architecture: str
    wasi: str
    strategy: str = "cranelift"
    opt_level: str = "speed"
    consume_fuel: bool = True
    nan_canonicalization: bool = False
    max_wasm_stack: int = 1024 * 1024
    threads: bool = False
    simd: bool = True
    relaxed_simd: bool = True
    relaxed_simd_deterministic: bool = True
    bulk_memory: bool = True
    multi_value: bool = True
    reference_types: bool = True
    tail_call: bool = True
    multi_memory: bool = False
    memory64: bool = False
    exceptions: bool = False
    gc: bool = False
    function_references: bool = False
    wide_arithmetic: bool = False
    custom_page_sizes: bool = False
    stack_switching: bool = False
    component_model: bool = False
    max_table_elements: int = 1 << 16
    """Per-table element cap the runner sets through store limits (a guest can observe it)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @cached_property
    def digest(self) -> bytes:
        canon = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(b"e31/profile/1\x00" + canon).digest()

    @cached_property
    def digest_hex(self) -> str:
        return self.digest.hex()

    def require(self, digest_hex: str) -> None:
        """Refuse a job that was priced or verified under another profile."""
        if digest_hex.lower() != self.digest_hex:
            raise ProfileMismatch(
                f"job requires execution profile {digest_hex[:16]}..., "
                f"this node runs {self.digest_hex[:16]}..."
            )

    def config(self) -> wasmtime.Config:
        c = wasmtime.Config()
        c.strategy = self.strategy
        c.cranelift_opt_level = self.opt_level
        c.consume_fuel = self.consume_fuel
        c.cranelift_nan_canonicalization = self.nan_canonicalization
        c.max_wasm_stack = self.max_wasm_stack
        c.wasm_threads = self.threads
        c.shared_memory = self.threads
        c.wasm_simd = self.simd
        c.wasm_relaxed_simd = self.relaxed_simd
        c.wasm_relaxed_simd_deterministic = self.relaxed_simd_deterministic
        c.wasm_bulk_memory = self.bulk_memory
        c.wasm_multi_value = self.multi_value
        c.wasm_reference_types = self.reference_types
        c.wasm_tail_call = self.tail_call
        c.wasm_multi_memory = self.multi_memory
        c.wasm_memory64 = self.memory64
        c.wasm_exceptions = self.exceptions
        c.wasm_gc = self.gc
        c.gc_support = self.gc
        c.wasm_function_references = self.function_references
        c.wasm_wide_arithmetic = self.wide_arithmetic
        c.wasm_custom_page_sizes = self.custom_page_sizes
        c.wasm_stack_switching = self.stack_switching
        c.wasm_component_model = self.component_model
        # The wall-clock watchdog only: an epoch stop ends the run as `timeout`, never resumes it.
        c.epoch_interruption = True
        # The compiled-code cache stays at wasmtime's default (off): artifacts are cached, if at
        # all, by the node's own integrity-checked cache.
        return c


PROFILE = ExecutionProfile(
    wasmtime_version=version("wasmtime"),
    architecture=_arch(),
    wasi=WASI_VIRTUALISATION,
)


def new_engine() -> wasmtime.Engine:
    return wasmtime.Engine(PROFILE.config())
