"""workloads_ceiling's plumbing on a small build: a row, resume, the table and bad input (no speed judged)."""

from __future__ import annotations

import json

import pytest

from benchmarks.workloads_ceiling import ROW_KEYS, ceilings, format_summary, main, run_suite
from lightning_speedups._errors import SpeedupConfigError


def test_small_run_writes_a_row_with_its_oracle_and_resumes(tmp_path):
    base = tmp_path / "data"
    base.mkdir()
    (base / "workloads_x.json").write_text(
        json.dumps(
            [
                {"task": "tabular_mlp", "method": "baseline", "steps": 100, "train_s": 10.0, "time_to_target_s": 4.0},
                {
                    "task": "tabular_mlp",
                    "method": "autotune_first",
                    "steps": 100,
                    "train_s": 10.0,
                    "time_to_target_s": 1.0,
                },
            ]
        )
    )
    path = tmp_path / "ceiling.json"
    (row,) = run_suite(["tabular_mlp"], path, baselines=base, rounds=3, small=True, echo=False)
    assert set(ROW_KEYS) <= set(row) and row["steps_to_target"] == 40  # the baseline row only
    assert "fp32" in row["step_s"] and "batch_x2" in row["step_s"] and row["loader_s"] >= 0.0
    compiled = row["compiled"]["best"]
    assert compiled["compile_s"] > 0.0 and compiled["plan"] == row["best"]["plan"]
    assert {k: row[k] for k in ("ceiling", "ceiling_fp32", "ceiling_loader", "ceiling_batch")} == ceilings(row)
    assert row["ceiling_batch"] >= row["ceiling"] >= row["ceiling_loader"] > 0.0
    assert run_suite(["tabular_mlp"], path, baselines=base, rounds=3, small=True, echo=False) == [row]  # held
    table = format_summary([row])
    assert "| tabular_mlp | dev | 40 |" in table and "Median over the 1 dev tasks" in table


def test_the_oracle_pays_the_compile_only_where_it_wins():
    row = {
        "steps_to_target": 10,
        "loader_s": 0.0,
        "step_s": {"fp32": 1.0},
        "best": {"step_s": 0.8},
        "best_fp32": {"step_s": 1.0},
        "compiled": {"best": {"step_s": 0.5, "compile_s": 30.0}, "best_fp32": {"step_s": 0.5, "compile_s": 1.0}},
    }
    out = ceilings(row)
    assert out["ceiling"] == pytest.approx(10 / 8)  # 10 x 0.5 + 30 s loses to 10 x 0.8 eager
    assert out["ceiling_fp32"] == pytest.approx(10 / 6)  # 10 x 0.5 + 1 s wins over 10 x 1.0
    assert out["ceiling_batch"] == out["ceiling"]  # no doubled batch measured


def test_bad_input_is_refused_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SpeedupConfigError, match=r"`workload`='nope' is not registered"):
        run_suite(["nope"])
    with pytest.raises(SpeedupConfigError, match=r"`rounds`=2"):
        run_suite(["tabular_mlp"], rounds=2)
    with pytest.raises(SpeedupConfigError, match=r"`baselines`=.*is not a folder"):
        run_suite(["tabular_mlp"], baselines=tmp_path / "missing")
    assert main(["--tasks", "nope"]) == 2 and "not registered" in capsys.readouterr().err
