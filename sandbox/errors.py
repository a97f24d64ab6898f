"""The sandbox's errors: raised for bad input from the caller, never for what a guest does.

What a guest does is always a `Status` in a `RunResult`; these exceptions are for the host side:
a job description that cannot be run as given, or a module that cannot be compiled.
"""

from __future__ import annotations


class SandboxError(Exception):
    """Base of every error raised by e31.sandbox."""


class JobSpecError(SandboxError, ValueError):
    """A job description that breaks the rules: bad limits, bad input names, symlinked inputs."""


class InvalidModule(SandboxError):
    """Bytes that are not a module we will run: malformed, truncated, oversized, or importing
    something the sandbox does not grant."""


class ProfileMismatch(SandboxError):
    """A job that requires an execution profile other than this node's."""
