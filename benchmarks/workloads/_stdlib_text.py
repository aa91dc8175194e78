"""Real text that ships with every Python: the standard library's own ``.py`` sources, read once and cached.

The files are taken in sorted path order, skipping tests, bundled data tables (``encodings``, ``pydoc_data``),
``idlelib``, ``lib2to3`` and installed packages. The corpus depends on the Python version, so targets were set on
the one named in each workload's description. Paragraphs are cut by the package's
:func:`lightning_speedups.benchmarks._sequence_tasks.paragraphs` (the sequences bench reads them too).
"""

from __future__ import annotations

import math
import pathlib
import sysconfig
from functools import lru_cache

__all__ = ["read_source", "stdlib_corpus", "stdlib_files", "stdlib_package_files"]

_SKIP_TOP = {"site-packages", "dist-packages", "test", "idlelib", "lib2to3", "encodings", "pydoc_data", "turtledemo"}
_MAX_FILE_BYTES = 200_000  # a few generated or table-like files are huge; users' code is not


def _root() -> pathlib.Path:
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


@lru_cache(maxsize=1)
def stdlib_files() -> tuple[str, ...]:
    """Relative paths of the kept stdlib ``.py`` files, sorted (deterministic for one Python install)."""
    root = _root()
    out = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if rel.parts[0] in _SKIP_TOP or "tests" in rel.parts or "test" in rel.parts[1:-1]:
            continue
        if path.stat().st_size <= _MAX_FILE_BYTES:
            out.append(rel.as_posix())
    return tuple(sorted(out))


@lru_cache(maxsize=4096)
def read_source(rel: str) -> bytes:
    """The bytes of one stdlib file (cached)."""
    return (_root() / rel).read_bytes()


def stdlib_package_files(package: str) -> tuple[str, ...]:
    """The kept files of one top-level stdlib package (``"asyncio"``, ``"email"``), sorted; empty when absent."""
    return tuple(rel for rel in stdlib_files() if rel.split("/", 1)[0] == package and "/" in rel)


@lru_cache(maxsize=4)
def stdlib_corpus(max_bytes: int = 3_000_000) -> tuple[tuple[str, bytes], ...]:
    """About ``max_bytes`` of stdlib sources as ``(path, bytes)``, every k-th file so the whole library is sampled."""
    files = stdlib_files()
    root = _root()
    total = sum((root / rel).stat().st_size for rel in files)
    stride = max(1, math.ceil(total / max_bytes))
    out = []
    size = 0
    for rel in files[::stride]:
        data = read_source(rel)
        if size + len(data) > max_bytes:
            break
        out.append((rel, data))
        size += len(data)
    return tuple(out)
