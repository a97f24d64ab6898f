"""Loads tests/vectors: the golden JSON file and the script that generates it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

VECTOR_DIR = Path(__file__).resolve().parent.parent / "vectors"
VECTOR_FILE = VECTOR_DIR / "envelopes.json"


def load() -> list[dict[str, Any]]:
    vectors: list[dict[str, Any]] = json.loads(VECTOR_FILE.read_text())
    return vectors


def valid() -> list[dict[str, Any]]:
    return [v for v in load() if v["valid"]]


def invalid() -> list[dict[str, Any]]:
    return [v for v in load() if not v["valid"]]


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("e31_make_vectors", VECTOR_DIR / "make_vectors.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
