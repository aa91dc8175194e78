"""One hop to every technique: each registered technique has its module(s), a test file and a notebook.

A new technique is checked the day it is registered (``register_technique``); see ARCHITECTURE.md for where each
file goes.
"""

from __future__ import annotations

import inspect
import json
import re
from functools import lru_cache
from pathlib import Path

import pytest

import lightning_speedups  # noqa: F401  (registers every technique)
from lightning_speedups._registry import get_technique, list_techniques

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lightning_speedups"


@lru_cache(maxsize=1)
def _test_sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "tests").rglob("test_*.py"))}


@lru_cache(maxsize=1)
def _notebook_sources() -> dict[str, str]:
    out = {}
    for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(p.read_text())["cells"]
        out[p.name] = "\n".join("".join(c["source"]) for c in cells)
    return out


def _mentions(text: str, names: list[str]) -> bool:
    return any(re.search(rf"\b{re.escape(n)}\b", text) for n in names)


def _module_file(obj: object) -> Path | None:
    try:
        path = inspect.getsourcefile(obj)  # type: ignore[arg-type]
    except TypeError:
        return None
    return Path(path).resolve() if path else None


@pytest.mark.parametrize("name", list_techniques())
def test_technique_has_its_files(name: str) -> None:
    info = get_technique(name)
    missing: list[str] = []
    names = []
    for role, obj in (("functional", info.functional), ("callback", info.callback)):
        if obj is None:
            continue
        names.append(obj.__name__)
        path = _module_file(obj)
        if path is None or not path.is_file() or PACKAGE not in path.parents:
            missing.append(f"the {role} module of {obj.__module__}.{obj.__qualname__} inside lightning_speedups/")
    if not names:
        missing.append("a `functional` or a `callback` in its TechniqueInfo")
    if not any(_mentions(src, names) for src in _test_sources().values()):
        missing.append(f"a tests/**/test_*.py that mentions {' or '.join(names)}")
    if not any(_mentions(src, names) for src in _notebook_sources().values()):
        missing.append(f"a notebooks/NN_*.ipynb that mentions {' or '.join(names)}")
    assert not missing, f"technique {name!r} lacks: " + "; ".join(missing) + " (see ARCHITECTURE.md)"


def test_every_registered_callback_lives_in_callbacks() -> None:
    wrong = {
        n: get_technique(n).callback.__module__  # type: ignore[union-attr]
        for n in list_techniques()
        if get_technique(n).callback is not None
        and not get_technique(n).callback.__module__.startswith("lightning_speedups.callbacks.")  # type: ignore[union-attr]
    }
    assert not wrong, f"callbacks outside lightning_speedups/callbacks/: {wrong}"


def test_notebooks_are_numbered_and_unique() -> None:
    names = [p.name for p in (ROOT / "notebooks").glob("*.ipynb")]
    bad = [n for n in names if not re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", n)]
    numbers = [n[:2] for n in names if n not in bad]
    dupes = sorted({x for x in numbers if numbers.count(x) > 1})
    assert not bad and not dupes, f"notebooks must be NN_name.ipynb with unique NN: bad names {bad}, repeated {dupes}"
