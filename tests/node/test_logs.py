"""Log lines: one line per record, UTC timestamp, level, component, message."""

from __future__ import annotations

import io
import logging
import re

import pytest
from e31.node.logs import logger, setup_logging

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (INFO|DEBUG|WARNING|ERROR) +([\w.]+): (.*)$")


def test_format_and_level() -> None:
    out = io.StringIO()
    handler = setup_logging("info", out)
    try:
        log = logger("transport")
        log.debug("hidden")
        log.info("listening on %s", "127.0.0.1:7531")
        logging.getLogger("zeroconf").info("chatter")
        logging.getLogger("zeroconf").warning("loud")
        lines = out.getvalue().splitlines()
        assert [LINE.match(x).groups() for x in lines] == [  # type: ignore[union-attr]
            ("INFO", "transport", "listening on 127.0.0.1:7531"),
            ("WARNING", "zeroconf", "loud"),
        ]
    finally:
        logging.getLogger().removeHandler(handler)


def test_setup_replaces_its_own_handler_and_indents_tracebacks() -> None:
    first, second = io.StringIO(), io.StringIO()
    setup_logging("debug", first)
    handler = setup_logging("debug", second)
    try:
        try:
            raise ValueError("boom")
        except ValueError:
            logger("store").exception("failed")
        assert first.getvalue() == ""
        lines = second.getvalue().splitlines()
        assert LINE.match(lines[0])
        assert all(line.startswith("    ") for line in lines[1:]) and "ValueError: boom" in lines[-1]
    finally:
        logging.getLogger().removeHandler(handler)


def test_unknown_level() -> None:
    with pytest.raises(ValueError, match="unknown log level"):
        setup_logging("chatty")
