"""The batch-size suite bench's plumbing on a small build (no speed is judged here)."""

from __future__ import annotations

import json

import pytest

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.benchmarks.batch_size_suite import format_summary, main, run_suite, summarize


def test_quick_run_writes_rows_resumes_and_summarizes(tmp_path):
    path = tmp_path / "bss.json"
    rows = run_suite(["tabular_mlp"], path, load_runs=0, quick=True, echo=False)
    assert [r["phase"] for r in rows] == ["sweep", "quiet"]
    sweep, quiet = rows
    assert sweep["best"] in sweep["rates"] and set(sweep["step_s"]) == set(sweep["rates"])
    (search,) = quiet["searches"]
    assert search["chosen"] in {16, 32} and 0 < search["score"] <= 1.0 and quiet["best"] == sweep["best"]
    assert json.loads(path.read_text())[0]["phase"] == "sweep"
    again = run_suite(["tabular_mlp"], path, load_runs=0, quick=True, echo=False)  # held rows are skipped
    assert [r["searches"] for r in again if r["phase"] == "quiet"] == [quiet["searches"]]
    (entry,) = summarize(again)
    assert entry["quiet"]["n"] == 1 and "load" not in entry
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
