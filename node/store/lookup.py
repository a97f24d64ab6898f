"""Job ids by prefix: which jobs of this store (either role) have ids that begin with some hex digits.

A job id is the primary key's first column (a 32-byte BLOB), so a hex prefix is a range of it: the
prefix padded with 0s up to the prefix padded with fs (an odd digit count pads its last nibble), and the
query reads only the matching rows of the index, however many jobs the store holds.
"""

from __future__ import annotations

from .db import Store

ID_BYTES = 32


def prefix_range(prefix: str) -> tuple[bytes, bytes]:
    """The lowest and highest 32-byte job ids that begin with the lower-case hex digits `prefix`."""
    if not 0 < len(prefix) <= 2 * ID_BYTES or prefix.strip("0123456789abcdef"):
        raise ValueError(f"not a hex prefix of a job id: {prefix[:80]!r}")
    low = bytes.fromhex(prefix.ljust(2 * ID_BYTES, "0"))
    high = bytes.fromhex(prefix.ljust(2 * ID_BYTES, "f"))
    return low, high


def jobs_with_prefix(store: Store, prefix: str, most: int) -> list[bytes]:
    """Up to `most` distinct job ids (either role) that begin with `prefix`, in id order."""
    low, high = prefix_range(prefix)
    with store.reading() as c:
        rows = c.execute(
            "SELECT DISTINCT job_id FROM jobs WHERE job_id BETWEEN ? AND ? ORDER BY job_id LIMIT ?",
            (low, high, most),
        ).fetchall()
    return [bytes(r[0]) for r in rows]
