"""The harness's result files: a command line's comma-separated names, and rows written as JSON as they come.

Every suite here (``workloads_bench``, ``lr_grid``, ``batch_size_suite``, ...) appends a row per finished run to its
``--json`` file, so a run killed midway keeps what it measured and a rerun skips it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from lightning_speedups._errors import SpeedupConfigError

__all__ = ["comma_list", "read_rows", "write_rows"]


def comma_list(value: str | None) -> list[str] | None:
    """A command line's comma-separated names, blanks dropped; ``None`` when none were given.

    Example::

        >>> comma_list("gpt_stdlib, vit_shapes,"), comma_list(None)
        (['gpt_stdlib', 'vit_shapes'], None)
    """
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def write_rows(path: str | os.PathLike[str], rows: list[dict[str, Any]]) -> None:
    """Write ``rows`` as JSON to a temporary file and move it over ``path``: a bench killed midway never leaves half
    a file, and what it measured so far stays."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(rows, f, indent=1, default=str)
    os.replace(tmp, path)


def read_rows(path: str | os.PathLike[str], keys: Sequence[str]) -> list[dict[str, Any]]:
    """The rows a bench wrote to ``path`` (none when it does not exist); each must hold ``keys``.

    Raises:
        SpeedupConfigError: the file holds something else (it is not overwritten).
    """
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = json.load(f)
    if not isinstance(rows, list) or any(not isinstance(r, dict) or not set(keys) <= set(r) for r in rows):
        raise SpeedupConfigError(
            f"`json_path`={os.fspath(path)!r} does not hold a list of rows with the keys {list(keys)}. Allowed values: "
            "a new path or a file this bench wrote."
        )
    return rows
