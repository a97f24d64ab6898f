"""Logging for the node: one readable line per record, UTC timestamp, level, component, message.

    2026-11-29T23:02:09.123Z INFO    transport: listening on 0.0.0.0:7531

Components are logger names under "e31." (shown without the prefix); use `logger("transport")`.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
ROOT = "e31"
# Third-party loggers that are chatty at INFO and below; they speak only at WARNING and above.
_QUIET = ("zeroconf", "hypercorn", "trio", "asyncio")


class _Formatter(logging.Formatter):
    def __init__(self) -> None:
        self.converter = time.gmtime
        super().__init__(
            "%(asctime)s.%(msecs)03dZ %(levelname)-7s %(component)s: %(message)s", datefmt="%Y-%m-%dT%H:%M:%S"
        )

    def format(self, record: logging.LogRecord) -> str:
        name = record.name
        record.component = name[len(ROOT) + 1 :] if name.startswith(ROOT + ".") else name
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and getattr(error, "log_traceback", True) is False:
            # An expected condition the message explains (a full disk): one line, not a traceback.
            line = {"msg": f"{record.getMessage()}: {error}", "args": (), "exc_info": None, "exc_text": None}
            record = logging.makeLogRecord({**record.__dict__, **line})
        text = super().format(record)
        # One record, one line: continuation lines (tracebacks, multi-line messages) are indented.
        return text.replace("\n", "\n    ")


def setup_logging(level: str | int = "info", stream: TextIO | None = None) -> logging.Handler:
    """Send e31's records at `level` and above to `stream` (stderr); returns the installed handler.

    Calling it again replaces the handler it installed before, so tests and restarts do not double lines.
    """
    if isinstance(level, str):
        try:
            numeric = LEVELS[level.lower()]
        except KeyError:
            raise ValueError(f"unknown log level {level!r}; expected one of {', '.join(LEVELS)}") from None
    else:
        numeric = level
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(_Formatter())
    handler.set_name("e31")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "e31"]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(min(numeric, logging.WARNING))
    logging.getLogger(ROOT).setLevel(numeric)
    for name in _QUIET:
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))
    return handler


def logger(component: str) -> logging.Logger:
    return logging.getLogger(f"{ROOT}.{component}")
