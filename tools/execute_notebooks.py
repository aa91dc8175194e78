"""Re-execute tutorial notebooks in place: outputs written back, the machine stamped into each notebook.

Usage (from the repository root)::

    python tools/execute_notebooks.py                      # every notebooks/*.ipynb
    python tools/execute_notebooks.py notebooks/03_pruning.ipynb --timeout 600
    python -m tools.execute_notebooks --check              # execute, write nothing (what CI needs)

Each notebook runs top to bottom in a fresh ``python3`` kernel, in a temporary working directory (checkpoints and
plots the notebook writes land there, not in the checkout), with ``--timeout`` seconds for the whole notebook. On
success the outputs are written back and the machine is stamped: a markdown cell tagged ``machine-stamp`` after the
title ("Executed on: CPU model, cores, torch threads, torch version, device, date") and the same fields in
``metadata["lightning_speedups"]["executed_on"]``. A notebook whose cell fails, or that runs out of time, is left
untouched on disk (stored outputs are never half-updated); the command names the notebook, the cell (its 0-based
index among all cells, and its first line) and the error, goes on with the other notebooks, and exits 1.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STAMP_TAG = "machine-stamp"


class NotebookFailure(RuntimeError):
    """A notebook did not run to the end: which notebook, which cell, what error."""

    def __init__(self, path: Path, cell_index: int | None, error: str, source: str = "") -> None:
        where = f"cell {cell_index}" if cell_index is not None else "before the first cell"
        first = next((ln.strip() for ln in source.splitlines() if ln.strip()), "")
        if first:
            where += f" ({first[:60]}{'...' if len(first) > 60 else ''})"
        super().__init__(f"{_rel(path)}: {where} failed: {error}")
        self.path = path
        self.cell_index = cell_index
        self.error = error


@dataclass
class Result:
    path: Path
    seconds: float
    written: bool


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def machine() -> dict[str, Any]:
    """CPU model, cores, torch threads, torch version and device (the fields the benchmarks print)."""
    try:
        from lightning_speedups.measure import machine_info

        info = dict(machine_info())
    except Exception:  # the stamp must not depend on the package importing cleanly
        import os
        import platform

        import torch

        info = {
            "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "device": "cpu",
        }
    info["executed"] = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return info


def stamp_text(info: dict[str, Any], seconds: float) -> str:
    return (
        f"*Executed on: {info.get('cpu')}, {info.get('cpu_count')} cores, {info.get('torch_threads')} torch threads, "
        f"torch {info.get('torch')}, device {info.get('device')}; {info.get('executed')}, {seconds:.0f} s in all. "
        "The measurements in this notebook are from that machine; re-run with "
        "`python tools/execute_notebooks.py` to measure yours.*"
    )


def _stamp(nb: Any, info: dict[str, Any], seconds: float) -> None:
    import nbformat

    nb.cells = [c for c in nb.cells if STAMP_TAG not in c.get("metadata", {}).get("tags", [])]
    cell = nbformat.v4.new_markdown_cell(stamp_text(info, seconds), metadata={"tags": [STAMP_TAG]})
    # after the title cell, so a reader sees the machine before the first measurement
    at = 1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0
    nb.cells.insert(at, cell)
    nb.metadata.setdefault("lightning_speedups", {})["executed_on"] = {**info, "seconds": round(seconds, 1)}


def _error_of(cell: Any) -> str | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return f"{out.get('ename')}: {out.get('evalue')}"
    return None


def execute_notebook(path: Path, timeout: float = 600.0, write: bool = True, kernel_name: str = "python3") -> Result:
    """Run ``path`` top to bottom; write outputs and the stamp back when ``write``. Raises :class:`NotebookFailure`."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    nb.cells = [c for c in nb.cells if STAMP_TAG not in c.get("metadata", {}).get("tags", [])]
    start = time.perf_counter()
    deadline = start + timeout
    current: dict[str, int | None] = {"index": None}

    def on_cell_start(cell: Any, cell_index: int) -> None:
        current["index"] = cell_index

    def remaining(_source: Any = None) -> int:
        # nbclient asks before each cell: the notebook's time budget left is that cell's limit
        return max(1, int(deadline - time.perf_counter()))

    with tempfile.TemporaryDirectory(prefix=f"nb-{path.stem}-") as cwd:
        client = NotebookClient(
            nb,
            timeout=int(timeout),
            timeout_func=remaining,
            kernel_name=kernel_name,
            allow_errors=False,
            record_timing=False,
            resources={"metadata": {"path": cwd}},
            on_cell_start=on_cell_start,
        )
        try:
            client.execute()
        except (CellTimeoutError, CellExecutionError, DeadKernelError) as err:
            index = current["index"]
            cell = nb.cells[index] if index is not None else None
            if isinstance(err, CellTimeoutError):
                error = f"timed out (notebook budget {timeout:.0f} s)"
            elif isinstance(err, DeadKernelError):
                error = f"the kernel died: {err}"
            else:
                error = (_error_of(cell) if cell is not None else None) or str(err).strip().splitlines()[-1]
            raise NotebookFailure(path, index, error, cell.source if cell is not None else "") from None
    seconds = time.perf_counter() - start
    if write:
        _stamp(nb, machine(), seconds)
        nbformat.validate(nb)
        nbformat.write(nb, path)
    return Result(path, seconds, write)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to run (default: notebooks/*.ipynb)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per notebook (default 600)")
    parser.add_argument("--check", action="store_true", help="execute only; write nothing back")
    parser.add_argument("--kernel", default="python3", help="Jupyter kernel name (default python3)")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    if not paths:
        print("no notebooks found", file=sys.stderr)
        return 1
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        print(f"no such notebook: {', '.join(map(str, missing))}", file=sys.stderr)
        return 1
    failures: list[NotebookFailure] = []
    for path in paths:
        print(f"[notebook] {_rel(path)} ...", flush=True)
        try:
            result = execute_notebook(path, timeout=args.timeout, write=not args.check, kernel_name=args.kernel)
        except NotebookFailure as failure:
            failures.append(failure)
            print(f"[notebook] FAILED {failure}", file=sys.stderr, flush=True)
            continue
        action = "outputs written" if result.written else "not written (--check)"
        print(f"[notebook] {_rel(path)}: ok in {result.seconds:.0f} s, {action}", flush=True)
    if failures:
        print(f"\n{len(failures)} of {len(paths)} notebook(s) failed:", file=sys.stderr)
        for failure in failures:
            print(f"  {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
