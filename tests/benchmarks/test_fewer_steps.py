"""The fewer-steps bench: its summary on hand-made rows, and a smoke run of the plumbing (small builds, 2 steps)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import fewer_steps
from lightning_speedups._errors import SpeedupConfigError


def _run(method: str, factor: float, seed: int, steps_to_target: int | None, final: float) -> dict:
    return {
        "task": "gpt_stdlib",
        "seed": seed,
        "method": method,
        "lr_factor": factor,
        "no_bf16": False,
        "mode": "min",
        "metric": "val_loss",
        "steps": 300,
        "steps_to_target": steps_to_target,
        "time_to_target_s": None if steps_to_target is None else steps_to_target * 0.5,
        "train_s": 150.0,
        "final": final,
    }


def _step(method: str, seconds: float, no_bf16: bool = False) -> dict:
    return {"task": "gpt_stdlib", "method": f"step_time:{method}", "no_bf16": no_bf16, "step_s": seconds}


def test_fewer_steps_summary_prices_steps_and_picks_each_methods_best_factor() -> None:
    rows = [
        *(_run("own", 1.0, s, 200, 2.8) for s in range(3)),
        *(_run("own", 3.0, s, n, 2.6) for s, n in enumerate((150, 150, 100))),
        *(_run("muon", 1.0, s, None, 3.1) for s in range(3)),  # never reached: counts the whole run
        *(_run("muon", 3.0, s, 100, 2.4) for s in range(3)),
        _step("own", 0.2),
        _step("muon", 0.22),
        _step("own", 0.2, no_bf16=True),
        _step("muon", 0.25, no_bf16=True),
    ]
    cells = {(c["method"], c["no_bf16"]): c for c in fewer_steps.summarize(rows)}
    own, muon = cells["own", False], cells["muon", False]
    assert (own["lr_factor"], own["steps"], own["time_s"]) == (3.0, 150, pytest.approx(30.0))
    assert (muon["lr_factor"], muon["steps"], muon["reached"]) == (3.0, 100, 3)
    assert muon["ratio"] == pytest.approx(150 * 0.2 / (100 * 0.22))
    # the no-bf16 path was only timed: the auto runs' steps, priced at its own step times, and marked so
    assert cells["muon", True]["ratio"] == pytest.approx(150 * 0.2 / (100 * 0.25))
    assert cells["muon", True]["clock"] == "timed*" and muon["clock"] == "timed"
    assert fewer_steps.transformer_median(list(cells.values())) == pytest.approx(muon["ratio"])
    table = fewer_steps.format_summary(list(cells.values()))
    assert all(len(line) <= 120 for line in table.splitlines())
    assert "| gpt_stdlib | no-bf16 | muon | 3 | 3/3 | 100 | 25.0 s (timed*) | 2.4 | 1.20x |" in (
        fewer_steps.format_markdown(list(cells.values()))
    )


def test_fewer_steps_smoke_run_writes_rows_and_skips_them_on_a_rerun(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    args = ["--quick", "--tasks", "tabular_mlp", "--methods", "own,muon,muon_conv", "--seeds", "0", "--json", str(path)]
    assert fewer_steps.main(args) == 0
    rows = json.loads(path.read_text())
    by_method = {r["method"]: r for r in rows}
    assert by_method["own"]["steps"] == 2 and by_method["muon"]["steps"] == 2
    assert by_method["muon_conv"]["notes"] == "not applicable: no convolution"
    assert fewer_steps.main(args) == 0  # every row is held: nothing trains again
    assert json.loads(path.read_text()) == rows
    with pytest.raises(SpeedupConfigError, match=r"`methods`='lion' is not supported"):
        fewer_steps.run(["tabular_mlp"], ["lion"])


def test_the_committed_lr_grid_is_found():
    # the bench reads the LR grid's best factor per task from the committed results; a move of the bench once left
    # it looking one folder too high, where it found no file and silently raced every task at its own rate only
    assert fewer_steps.LR_GRID_JSON.is_file()
    best = fewer_steps.grid_best_factors()
    assert {"gpt_stdlib", "gcn_sbm", "ncf_ratings"} <= set(best) and best["ncf_ratings"] == 1.0
