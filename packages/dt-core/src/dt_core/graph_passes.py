"""Cache identities for plugin graph passes.

Inductor's FX graph cache keys on each custom pass's `uuid()`; a pass without one makes
Inductor bypass the cache. A plugin pass's uuid here covers everything that can change
what it does: its code (every module of the plugin's top-level package, plus any extra
files it names), its settings, and the rank / world size it compiles for.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import __version__
from .contributions import GraphPass

MAX_PACKAGE_FILES = 200
_file_digests: dict[Path, tuple[int, int, bytes]] = {}


def _file_digest(path: Path) -> bytes:
    """sha256 of a file, recomputed only when its size or mtime changes."""
    stat = path.stat()
    cached = _file_digests.get(path)
    if cached and cached[:2] == (stat.st_mtime_ns, stat.st_size):
        return cached[2]
    digest = hashlib.sha256(path.read_bytes()).digest()
    _file_digests[path] = (stat.st_mtime_ns, stat.st_size, digest)
    return digest


def source_files(graph_pass: GraphPass) -> list[Path]:
    """The files whose contents define the pass: its whole top-level package and extras."""
    fn = graph_pass.fn
    module_name = getattr(fn, "__module__", None) or type(fn).__module__
    module = sys.modules.get(module_name)
    files: set[Path] = {Path(p).resolve() for p in graph_pass.source_files}
    module_file = getattr(module, "__file__", None)
    if module_file:
        top = sys.modules.get(module_name.split(".")[0])
        top_paths = getattr(top, "__path__", None)
        package_files = [p for root in top_paths or () for p in Path(root).rglob("*.py")]
        # A plugin package: any of its modules may be part of the pass. A huge package
        # (torch itself, say) would make every compile slow: hash the defining module.
        if 0 < len(package_files) <= MAX_PACKAGE_FILES:
            files.update(p.resolve() for p in package_files)
        else:
            files.add(Path(module_file).resolve())
    return sorted(files)


def rank_and_world_size() -> tuple[int, int]:
    """(rank, world size) of the default process group, or (-1, -1) without one."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch built without distributed
        return -1, -1
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return -1, -1


def pass_uuid(identity: str, graph_pass: GraphPass) -> str:
    """A hex digest that changes when the pass's code, settings or rank/world change."""
    hasher = hashlib.sha256()
    hasher.update(f"dt-core {__version__}\0{identity}\0".encode())
    for path in source_files(graph_pass):
        hasher.update(os.fsencode(path.name) + b"\0" + _file_digest(path))
    settings = dict(graph_pass.settings())
    hasher.update(json.dumps(settings, sort_keys=True, default=repr).encode())
    hasher.update("rank {} of {}".format(*rank_and_world_size()).encode())
    return hasher.hexdigest()


def uuid_function(identity: str, graph_pass: GraphPass) -> Callable[[], str]:
    """The callable Inductor's wrapper calls each compile (settings are read then)."""

    def uuid() -> str:
        return pass_uuid(identity, graph_pass)

    return uuid


def describe_settings(graph_pass: GraphPass) -> dict[str, Any]:
    """Current settings of a pass, for `dt-plugins list`; errors shown, not raised."""
    try:
        return dict(graph_pass.settings())
    except Exception as error:  # noqa: BLE001 - a listing must not fail on one pass
        return {"error": f"{type(error).__name__}: {error}"}
