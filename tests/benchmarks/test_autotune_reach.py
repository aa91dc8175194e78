"""autotune_reach's plumbing on a small build: rows, resume, the missed list and bad input (no speed judged)."""

from __future__ import annotations

import pytest

from benchmarks.autotune_reach import MATTERS, format_summary, main, run_suite
from lightning_speedups._errors import SpeedupConfigError


def test_small_run_writes_a_row_resumes_and_lists_what_the_default_missed(tmp_path):
    path = tmp_path / "reach.json"
    # shapes: channels_last and the data path are candidates on every CPU (the MLP had only bf16, which a CPU
    # without bf16 units never tries, so its reference plan was empty there)
    (row,) = run_suite(["shapes"], path, reference_s=3.0, small=True, echo=False)
    assert row["reference"]["choices"] and {"seconds", "choices", "notes"} <= set(row["default"])
    measured = {c["name"] for c in row["default"]["choices"] if c["trials"]}
    expected = [c["name"] for c in row["reference"]["choices"] if c["gain"] >= MATTERS and c["name"] not in measured]
    assert row["missed"] == expected
    assert run_suite(["shapes"], path, reference_s=3.0, small=True, echo=False) == [row]  # held: skipped
    assert "| shapes | dev | yes |" in format_summary([row])


def test_bad_input_is_refused_before_anything_runs(capsys):
    with pytest.raises(SpeedupConfigError, match=r"`workload`='nope' is not registered"):
        run_suite(["nope"])
    with pytest.raises(SpeedupConfigError, match=r"`reference_s`=0"):
        run_suite(["tabular_mlp"], reference_s=0)
    assert main(["--tasks", "nope"]) == 2 and "not registered" in capsys.readouterr().err
