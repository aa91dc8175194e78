"""The LR-grid benchmark: the quick run's rows and resume, the verdicts on synthetic rows, skipped tasks, errors."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest
import torch

from benchmarks import lr_grid
from benchmarks.workloads import _registry, get_workload
from lightning_speedups import SpeedupConfigError


@pytest.fixture
def one_thread():
    """One torch thread: the GRU's many small ops crawl when two threads fight other jobs for a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_lr_grid_quick_rows_and_resume(one_thread, tmp_path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    path = tmp_path / "lr.json"
    assert lr_grid.main(["--quick", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())
    assert [(r["task"], r["method"], r["lr_factor"]) for r in rows] == [
        (task, m, f)
        for task in lr_grid.QUICK_TASKS
        for m, f in [*(("grid", f) for f in lr_grid.GRID), ("lr_finder", None)]
    ]
    for r in rows:
        assert set(lr_grid.ROW_KEYS) <= set(r)
        assert r["seed"] == 0 and r["steps"] == 2 and r["notes"].startswith(lr_grid.SMALL_NOTE)
        assert r["quality"] is not None and r["machine"]["cpu"]
        if r["method"] == "grid":
            assert r["lr"] == pytest.approx(r["task_lr"] * r["lr_factor"])
        else:  # the finder's own fields: the range test ran its planned steps over its whole range
            assert set(lr_grid.FINDER_KEYS) <= set(r)
            assert (r["finder_rule"], r["finder_steps_run"], r["finder_planned_steps"]) == ("valley", 5, 5)
            assert r["finder_stop_reason"] is None and r["lr"] == r["finder_suggestions"]["valley"]
    out = capsys.readouterr().out
    assert "| tabular_mlp | val_acc (max) |" in out and "| gru_stdlib | val_loss (min) |" in out

    def no_training(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a held row was trained again")

    monkeypatch.setattr(lr_grid, "time_to_target", no_training)
    assert lr_grid.main(["--quick", "--json", str(path)]) == 0  # everything held: nothing trains
    assert json.loads(path.read_text()) == rows
    with pytest.raises(SpeedupConfigError, match="holds small \\(quick\\) rows"):
        lr_grid.run_grid(json_path=path, quick=False)


def test_lr_grid_skips_a_task_without_lr(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    tab = get_workload("tabular_mlp")

    def build(seed: int, small: bool = False) -> Any:
        model, data = tab.build(seed, small=small)
        del model.lr  # its optimizer reads something else
        return model, data

    monkeypatch.setitem(_registry._WORKLOADS, "no_lr", replace(tab, name="no_lr", build=build))
    rows = lr_grid.run_grid(["no_lr"], json_path=tmp_path / "lr.json", quick=True, echo=False)
    assert [r["method"] for r in rows] == ["skipped"]
    assert "no positive numeric `lr` attribute" in rows[0]["notes"]
    assert lr_grid.summarize(rows)[0]["verdict"].startswith("skipped: ")
    assert lr_grid.run_grid(["no_lr"], json_path=tmp_path / "lr.json", quick=True, echo=False) == rows  # held


def _rows(task: str, metric: str, mode: str, grid: list[float], finder: float | None) -> list[dict[str, Any]]:
    base = {
        "task": task,
        "split": "dev",
        "kind": "tabular",
        "metric": metric,
        "mode": mode,
        "seed": 0,
        "task_lr": 1e-3,
        "notes": "",
        "machine": {},
    }
    rows = [
        {**base, "method": "grid", "lr_factor": f, "lr": f * 1e-3, "quality": q} for f, q in zip(lr_grid.GRID, grid)
    ]
    if finder is not None:
        rows.append(
            {
                **base,
                "method": "lr_finder",
                "lr_factor": None,
                "lr": 2e-3,
                "quality": finder,
                "finder_steps_run": 60,
                "finder_planned_steps": 100,
                "finder_lr_covered": [1e-6, 0.02],
                "finder_stop_reason": "the loss diverged",
            }
        )
    return rows


def test_lr_grid_summarize_verdicts() -> None:
    rows = [
        *_rows("acc_in", "val_acc", "max", [0.80, 0.85, 0.90, 0.92, 0.50], 0.915),  # 0.005 below the best
        *_rows("acc_miss", "val_acc", "max", [0.80, 0.85, 0.90, 0.92, 0.50], 0.90),  # 0.02 below
        *_rows("acc_better", "val_acc", "max", [0.80, 0.85, 0.90, 0.92, 0.50], 0.95),
        *_rows("loss_in", "val_loss", "min", [3.0, 2.5, 2.2, 2.1, math.nan], 2.115),  # a diverged grid point
        *_rows("loss_miss", "val_loss", "min", [3.0, 2.5, 2.2, 2.1, 2.6], 2.2),
        *_rows("loss_nan", "val_loss", "min", [3.0, 2.5, 2.2, 2.1, 2.6], math.nan),
        *_rows("no_finder", "val_acc", "max", [0.80, 0.85, 0.90, 0.92, 0.50], None),
        *_rows("other_metric", "val_f1", "max", [0.80, 0.85, 0.90, 0.92, 0.50], 0.9),
    ]
    s = {x["task"]: x for x in lr_grid.summarize(rows)}
    assert {t: x["verdict"] for t, x in s.items()} == {
        "acc_in": "within",
        "acc_miss": "miss",
        "acc_better": "within",
        "loss_in": "within",
        "loss_miss": "miss",
        "loss_nan": "miss",
        "no_finder": "no finder row",
        "other_metric": "no tolerance for metric 'val_f1'",
    }
    assert (s["acc_in"]["best_factor"], s["acc_in"]["best_lr"]) == (3.0, pytest.approx(3e-3))
    assert s["acc_in"]["gap"] == pytest.approx(0.005) and s["acc_better"]["gap"] == pytest.approx(-0.03)
    assert s["loss_in"]["best_factor"] == 3.0 and s["loss_in"]["gap"] == pytest.approx(0.015)
    assert s["loss_miss"]["gap"] == pytest.approx(0.1) and s["loss_nan"]["gap"] == math.inf
    assert (s["no_finder"]["best_quality"], s["no_finder"]["finder_lr"]) == (0.92, None)
    table = lr_grid.format_summary(list(s.values()))
    assert table.count("\n") == len(s) + 1  # header, rule, one line per task
    assert "60/100 steps, lr 1e-06-0.02, stopped early: the loss diverged" in table


def test_lr_grid_reports_how_far_each_seed_moved() -> None:
    # one seed's quality moves by more than the tolerance on several suite tasks: the table says how much, per task
    seeds = [
        [{**r, "seed": seed, "quality": r["quality"] + shift} for r in _rows("t", "val_acc", "max", grid, finder)]
        for seed, (shift, grid, finder) in enumerate(
            [(0.0, [0.8, 0.85, 0.9, 0.92, 0.5], 0.91), (0.03, [0.8, 0.85, 0.9, 0.92, 0.5], 0.87)]
        )
    ]
    (s,) = lr_grid.summarize([r for rows in seeds for r in rows])
    assert s["seeds"] == [0, 1] and s["best_factor"] == 3.0
    assert s["best_range"] == pytest.approx(0.03) and s["finder_range"] == pytest.approx(0.01)
    table = lr_grid.format_summary([s])
    assert "| 2: 0.03 / 0.01 |" in table and "2 seeds: 60/100 steps" in table
    (one,) = lr_grid.summarize(seeds[0])
    assert one["best_range"] is None and "| 1: - |" in lr_grid.format_summary([one])


def test_lr_grid_bad_input(tmp_path, capsys) -> None:
    with pytest.raises(SpeedupConfigError, match="`workload`='nope' is not registered. Allowed values: .*'digits'"):
        lr_grid.run_grid(["nope"])
    assert lr_grid.main(["--tasks", "nope"]) == 2
    assert "is not registered. Allowed values:" in capsys.readouterr().err
    assert lr_grid.main(["--seeds", "a"]) == 2
    (tmp_path / "x.json").write_text('{"not": "rows"}')
    with pytest.raises(SpeedupConfigError, match="does not hold a list of LR-grid rows"):
        lr_grid.run_grid(["tabular_mlp"], json_path=tmp_path / "x.json")
