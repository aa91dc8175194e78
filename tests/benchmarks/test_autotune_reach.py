"""autotune_reach's plumbing on a small build: rows, resume, the missed list and bad input (no speed judged)."""

from __future__ import annotations

import pytest

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.benchmarks.autotune_reach import MATTERS, format_summary, main, run_suite


def test_small_run_writes_a_row_resumes_and_lists_what_the_default_missed(tmp_path):
    path = tmp_path / "reach.json"
    (row,) = run_suite(["tabular_mlp"], path, reference_s=3.0, small=True, echo=False)
    assert row["reference"]["choices"] and {"seconds", "choices", "notes"} <= set(row["default"])
    measured = {c["name"] for c in row["default"]["choices"] if c["trials"]}
    expected = [c["name"] for c in row["reference"]["choices"] if c["gain"] >= MATTERS and c["name"] not in measured]
    assert row["missed"] == expected
    assert run_suite(["tabular_mlp"], path, reference_s=3.0, small=True, echo=False) == [row]  # held: skipped
    assert "| tabular_mlp | held_out | yes |" in format_summary([row]) or "| tabular_mlp | dev | yes |" in (
        format_summary([row])
    )


def test_bad_input_is_refused_before_anything_runs(capsys):
    with pytest.raises(SpeedupConfigError, match=r"`workload`='nope' is not registered"):
        run_suite(["nope"])
    with pytest.raises(SpeedupConfigError, match=r"`reference_s`=0"):
        run_suite(["tabular_mlp"], reference_s=0)
    assert main(["--tasks", "nope"]) == 2 and "not registered" in capsys.readouterr().err
