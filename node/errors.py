"""The node's errors: one base, and a subclass for each party whose fault an error is.

Every error the node raises on purpose derives from NodeError, so the CLI turns any of them into one
line on stderr and `exit_code` (cli/main.py), and a service can tell an expected failure from a bug.
The module-level classes elsewhere (TransportError, BlobError, ...) subclass one of these:

- UsageError: the user's or the operator's: a bad argument, file, config value or request.
- PeerError: a peer's: it broke the protocol, sent bytes that do not match their hash, went away.
- StoreError: the disk's or the database's: cannot open, read, write or trust what is stored.
- Unavailable: something needed is not there now: the node is not running, an address cannot be
  dialled, the owner has taken the machine back. Trying again later may work.

The exit codes follow sysexits(3) where one fits.
"""

from __future__ import annotations


class NodeError(Exception):
    """An expected failure; the message is one line for whoever has to act on it."""

    exit_code: int = 1


class UsageError(NodeError):
    """The user's or operator's input cannot be used: the message says which and why."""

    exit_code = 2


class PeerError(NodeError):
    """A peer broke the protocol or a promise; the link or the exchange with it ends, nothing else."""

    exit_code = 76  # EX_PROTOCOL


class StoreError(NodeError):
    """The store cannot be opened or used; the message says which file and why."""

    exit_code = 74  # EX_IOERR


class Unavailable(NodeError):
    """Something the operation needs is not reachable or not running now."""

    exit_code = 69  # EX_UNAVAILABLE
