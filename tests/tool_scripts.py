"""Importing tools/ scripts in tests: tools/ is no package, so a script imports by its
name with tools/ on sys.path (as the scripts import each other when run)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def import_tools(monkeypatch: pytest.MonkeyPatch, *names: str) -> list[ModuleType]:
    """The scripts `names`, imported afresh (what an earlier test changed in a module does
    not carry over) with tools/ on sys.path for this test only."""
    monkeypatch.syspath_prepend(str(TOOLS))
    for name in names:
        sys.modules.pop(name, None)
    return [importlib.import_module(name) for name in names]
