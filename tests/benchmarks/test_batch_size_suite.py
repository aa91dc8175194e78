"""The batch-size suite bench's plumbing on a small build (no speed is judged here)."""

from __future__ import annotations

import json

import pytest

from benchmarks.batch_size_suite import format_summary, main, run_suite, summarize
from lightning_speedups._errors import SpeedupConfigError


def test_quick_run_writes_rows_resumes_and_summarizes(tmp_path):
    path = tmp_path / "bss.json"
    rows = run_suite(["tabular_mlp"], path, load_runs=0, quick=True, echo=False)
    assert [r["phase"] for r in rows] == ["sweep", "quiet", "paired"]
    sweep, quiet, paired = rows
    assert sweep["best"] in sweep["rates"] and set(sweep["step_s"]) == set(sweep["rates"])
    (search,) = quiet["searches"]
    assert search["chosen"] in {16, 32} and 0 < search["score"] <= 1.0 and quiet["best"] == sweep["best"]
    # a chosen size other than the best is re-measured against it in paired rounds (quick: one round)
    chosen_elsewhere = {search["chosen"]} - {sweep["best"]}
    assert paired["best"] == sweep["best"] and set(map(int, paired["pairs"])) == chosen_elsewhere
    assert all(len(p["ratios"]) == 1 and p["score"] > 0 for p in paired["pairs"].values())
    assert json.loads(path.read_text())[0]["phase"] == "sweep"
    again = run_suite(["tabular_mlp"], path, load_runs=0, quick=True, echo=False)  # held rows are skipped
    assert [r["searches"] for r in again if r["phase"] == "quiet"] == [quiet["searches"]]
    (entry,) = summarize(again)
    assert entry["quiet"]["n"] == 1 and "load" not in entry and len(entry["quiet"]["paired_scores"]) == 1
    table = format_summary([entry])
    assert "| tabular_mlp | held_out |" in table or "| tabular_mlp | dev |" in table


def test_bad_input_is_refused_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SpeedupConfigError, match=r"`workload`='nope' is not registered. Allowed values: 'digits'"):
        run_suite(["nope"], quick=True)
    with pytest.raises(SpeedupConfigError, match=r"`runs`=0"):
        run_suite(["tabular_mlp"], runs=0)
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "rows"}')
    with pytest.raises(SpeedupConfigError, match=r"does not hold a list of rows"):
        run_suite(["tabular_mlp"], bad, quick=True)
    assert main(["--tasks", "nope", "--quick"]) == 2 and "not registered" in capsys.readouterr().err


def test_a_chosen_size_is_paired_with_the_best_and_rescored():
    from benchmarks.batch_size_suite import _paired
    from benchmarks.workloads import get_workload

    searched = {"best": 32, "searches": [{"chosen": 16}, {"chosen": 32}, {"chosen": 16}]}
    row = _paired(get_workload("tabular_mlp"), 2, True, 2, searched)
    assert row["best"] == 32 and list(row["pairs"]) == [16]
    assert len(row["pairs"][16]["ratios"]) == 2 and row["pairs"][16]["score"] > 0
    rows = [
        {
            "task": "t",
            "split": "dev",
            "phase": "quiet",
            "best": 32,
            "searches": [{"chosen": c, "score": 0.5, "search_s": 1.0} for c in (16, 32, 16)],
        },
        {"task": "t", "split": "dev", "phase": "paired", "best": 32, "pairs": {"16": {"score": 0.95}}},
    ]  # read back
    (entry,) = summarize(rows)
    assert entry["quiet"]["hits"] == 0 and entry["quiet"]["paired_scores"] == [0.95, 1.0, 0.95]
    assert entry["quiet"]["paired_hits"] == 3 and "(paired: 3/3, min 0.95)" in format_summary([entry])
