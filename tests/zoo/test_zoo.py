"""Architecture x technique conformance: every registered technique on every zoo architecture.

Per cell (``<arch>-<technique>``; the table of expected outcomes is ``EXPECTED`` in ``tests/zoo/techniques.py``):

- ``test_zoo``: 2 epochs on CPU with a checkpoint every epoch, or the expected refusal at ``setup()``;
- ``test_zoo_resume``: a fresh model resumed from the epoch-1 checkpoint ends with the uninterrupted run's weights;
- ``test_zoo_reload``: ``lightning_speedups.load_checkpoint`` of the final checkpoint gives the trained outputs.

The three share one uninterrupted fit (the zoo conftest runs them back to back). Run them with
``pytest tests/zoo -q -p no:cacheprovider``; ``-m "not slow"`` leaves out the torch.compile cells.
"""

from __future__ import annotations

import pytest

import lightning_speedups as ls
from tests.zoo.cells import (
    CELLS,
    Cell,
    FitRecord,
    cleanup,
    fit_cell,
    quantize_check,
    record,
    reload_check,
    resume_check,
)
from tests.zoo.techniques import known_issue, missing_modules

pytestmark = [
    pytest.mark.zoo,
    # the resumed run checkpoints into its own folder; Lightning notes that the best-k bookkeeping is not carried over
    pytest.mark.filterwarnings("ignore:The dirpath has changed"),
]

_FITS: dict[str, FitRecord] = {}  # the current cell's uninterrupted fit, shared by its three tests


def _param(cell: Cell, check: str = "fit") -> object:
    marks = [pytest.mark.slow] if cell.technique.slow else []
    reason = known_issue(cell.arch, cell.tech, check)
    if reason:
        marks.append(pytest.mark.xfail(reason=reason, strict=False))
    return pytest.param(cell, id=cell.id, marks=marks)


def _skip_missing(cell: Cell) -> None:
    missing = missing_modules(cell.technique)
    if missing:
        pytest.skip(f"{cell.tech} needs {missing}")


def _fit(cell: Cell, tmp_path_factory: pytest.TempPathFactory) -> FitRecord:
    rec = _FITS.get(cell.id)
    if rec is None:
        for old in list(_FITS):  # one cell at a time: drop the previous cell's weights and checkpoints
            cleanup(_FITS.pop(old))
        rec = fit_cell(cell, tmp_path_factory.mktemp(cell.id))
        _FITS[cell.id] = rec
    return rec


FIT_CELLS = [c for c in CELLS if c.tech != "quantize_for_inference"]
WORKING_CELLS = [c for c in FIT_CELLS if c.expected == "works"]


@pytest.mark.parametrize("cell", [_param(c) for c in CELLS])
def test_zoo(cell: Cell, tmp_path_factory):
    _skip_missing(cell)
    if cell.tech == "quantize_for_inference":
        outcome, problem = quantize_check(cell)
        record(cell, "fit", "ok" if problem is None else f"fail: {problem}", outcome=outcome)
        assert problem is None, problem
        return
    rec = _fit(cell, tmp_path_factory)
    outcome = rec.outcome if rec.outcome != "refused" else f"refused: {rec.message}"
    record(cell, "fit", "ok" if rec.problem is None else f"fail: {rec.problem}", outcome=outcome)
    assert rec.problem is None, rec.problem


@pytest.mark.parametrize("cell", [_param(c, "resume") for c in WORKING_CELLS])
def test_zoo_resume(cell: Cell, tmp_path_factory):
    _skip_missing(cell)
    rec = _fit(cell, tmp_path_factory)
    if rec.outcome != "works" or len(rec.ckpts) < 2:
        record(cell, "resume", "not run: the fit failed")
        pytest.skip(f"no checkpoints to resume from: test_zoo[{cell.id}] failed")
    problem = resume_check(cell, rec)
    record(cell, "resume", "ok" if problem is None else f"fail: {problem}")
    assert problem is None, problem


@pytest.mark.parametrize("cell", [_param(c, "reload") for c in WORKING_CELLS])
def test_zoo_reload(cell: Cell, tmp_path_factory):
    _skip_missing(cell)
    try:
        has_loader = hasattr(ls, "load_checkpoint")
        if not has_loader and not cell.arch.endswith("_mixin"):
            record(cell, "reload", "not run: lightning_speedups.load_checkpoint is missing")
            pytest.skip("lightning_speedups.load_checkpoint does not exist yet")
        rec = _fit(cell, tmp_path_factory)
        if rec.outcome != "works" or not rec.ckpts:
            record(cell, "reload", "not run: the fit failed")
            pytest.skip(f"no checkpoint to reload: test_zoo[{cell.id}] failed")
        problem = reload_check(cell, rec)
        record(cell, "reload", "ok" if problem is None else f"fail: {problem}")
        assert problem is None, problem
        if not has_loader:
            record(cell, "reload", "partial: load_from_checkpoint ok; lightning_speedups.load_checkpoint is missing")
            pytest.skip("load_from_checkpoint ok; lightning_speedups.load_checkpoint does not exist yet")
    finally:
        if cell.id in _FITS:  # the cell's last test: free its weights and checkpoints
            cleanup(_FITS.pop(cell.id))
