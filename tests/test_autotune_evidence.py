"""autotune's evidence table ships as a data file written from the committed results; the two cannot drift apart."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks import autotune_evidence
from lightning_speedups.autotune.kinds import EVIDENCE


def test_the_shipped_file_is_what_the_committed_results_give():
    assert autotune_evidence.OUT.read_text() == autotune_evidence.render(autotune_evidence.build())
    assert autotune_evidence.main(["--check"]) == 0


def test_the_package_reads_every_row_of_the_file():
    rows = json.loads(autotune_evidence.OUT.read_text())
    assert [(e.method, e.task, e.without, e.with_method, e.helps) for e in EVIDENCE] == [
        (r["method"], r["task"], r["without"], r["with_method"], r["helps"]) for r in rows
    ]


def test_suite_rows_are_medians_of_the_committed_runs(tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(autotune_evidence.DATA / autotune_evidence.NOTES, data)
    runs = [("baseline", 40.0), ("baseline", 30.0), ("baseline", 50.0), ("autotune_first", 45.0)]
    rows = [{"task": "t", "method": m, "time_to_target_s": s} for m, s in runs]
    (data / "suite.json").write_text(json.dumps(rows))
    source = autotune_evidence.SuiteRow("ema", "conv", "t", "suite.json", "median seconds")
    row = autotune_evidence._suite_row(source, data)
    assert (row["without"], row["with_method"], row["helps"]) == ("40.0", "45.0", False)
    with pytest.raises(ValueError, match="holds no baseline, autotune_first rows of task 'other'"):
        autotune_evidence._suite_row(source.__class__("ema", "conv", "other", "suite.json", "m"), data)
    with pytest.raises(FileNotFoundError, match="missing"):
        autotune_evidence._suite_row(source.__class__("ema", "conv", "t", "gone.json", "m"), data)


def test_a_transcribed_row_the_notes_no_longer_state_fails(tmp_path: Path):
    data = tmp_path / "data"
    shutil.copytree(autotune_evidence.DATA, data)
    notes = json.loads((data / autotune_evidence.NOTES).read_text())
    text = json.dumps(notes).replace("[6, 6, 7, 5] to [3, 4, 3, 3]", "[6, 6, 7, 5] to [3, 4, 4, 3]")
    (data / autotune_evidence.NOTES).write_text(text)
    with pytest.raises(ValueError, match="no longer states"):
        autotune_evidence.build(data)


def test_check_fails_when_a_committed_run_changes(tmp_path: Path, capsys):
    data = tmp_path / "data"
    shutil.copytree(autotune_evidence.DATA, data)
    runs = json.loads((data / "workloads_segment.json").read_text())
    for run in runs:
        if run["task"] == "segment_unet" and run["method"] == "autotune_first":
            run["time_to_target_s"] = 1.0
    (data / "workloads_segment.json").write_text(json.dumps(runs))
    assert autotune_evidence.main(["--data", str(data), "--check"]) == 1
    assert "out of date" in capsys.readouterr().err
