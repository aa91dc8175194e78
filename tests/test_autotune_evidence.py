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


def test_a_transcribed_row_the_notes_no_longer_state_fails(tmp_path: Path):
    data = tmp_path / "data"
    shutil.copytree(autotune_evidence.DATA, data)
    notes = json.loads((data / autotune_evidence.NOTES).read_text())
    text = json.dumps(notes).replace("[6, 6, 7, 5] to [3, 4, 3, 3]", "[6, 6, 7, 5] to [3, 4, 4, 3]")
    (data / autotune_evidence.NOTES).write_text(text)
    with pytest.raises(ValueError, match="no longer states"):
        autotune_evidence.build(data)


def test_check_fails_when_the_shipped_file_differs(tmp_path: Path, capsys):
    shipped = tmp_path / "evidence.json"
    shipped.write_text(autotune_evidence.OUT.read_text().replace('"38.3"', '"38.0"'))
    assert autotune_evidence.main(["--out", str(shipped), "--check"]) == 1
    assert "out of date" in capsys.readouterr().err
