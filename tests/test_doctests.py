"""Every example in gac's docstrings runs and prints what it shows (modules found by their ``>>>``)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
MODULES = sorted(
    ".".join(p.relative_to(SRC).with_suffix("").parts)
    for p in (SRC / "gac").rglob("*.py")
    if ">>> " in p.read_text(encoding="utf-8")
)


def test_modules_with_examples_are_found():
    assert "gac.hardware.latency" in MODULES and "gac.alignment" in MODULES and len(MODULES) >= 15


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    res = doctest.testmod(importlib.import_module(name))
    assert res.attempted > 0 and res.failed == 0, name
