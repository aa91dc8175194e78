"""What ``lightning-speedups bench`` prints: a table at most 120 columns wide with no internal goals in it, the notes
kept in the JSON and markdown, a progress line per section, and Lightning's banners silenced only inside its runs."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import lightning as L
import pytest

from lightning_speedups.benchmarks import runner
from lightning_speedups.benchmarks._common import BenchRow, quiet_lightning
from lightning_speedups.cli import main

BENCH_JSON = Path(__file__).resolve().parents[1] / "docs" / "_data" / "bench.json"
INTERNAL = ("NOT MET", "target")


def committed_rows() -> list[BenchRow]:
    payload = json.loads(BENCH_JSON.read_text())
    return [BenchRow(**{k: v for k, v in r.items() if k != "accuracy_delta"}) for r in payload["rows"]]


def long_row() -> BenchRow:
    return BenchRow(
        "batch_size_finder",
        "search time: ours vs Lightning BatchSizeFinder (uncapped), a variant long enough to need three lines " * 2,
        "search_time",
        3.0,
        1.0,
        3.0,
        "s",
        note="medians of 2 interleaved runs; target ratio >= 4 NOT MET",
        extra={"ratio_min": 123.456, "ratio_max": 789.012},
    )


def assert_readable(text: str) -> None:
    for line in text.splitlines():
        assert len(line) <= runner.TABLE_WIDTH, f"{len(line)} columns: {line!r}"
        assert not any(word.lower() in line.lower() for word in INTERNAL), line


def test_table_of_the_committed_run_fits_120_columns_and_names_no_goal() -> None:
    rows = [*committed_rows(), long_row()]
    table = runner.format_table(rows)
    assert_readable(table)
    assert table.splitlines()[0].split() == "technique what was compared speedup [min-max] accuracy change".split()
    for row in rows:  # every row is there, its technique first on its own line
        assert any(line.startswith(row.technique) for line in table.splitlines())
    assert "not reached" in table and "(no speedup)" in table  # a missed accuracy and a ratio below 1.05x say so
    assert "123.46" in table  # the [min-max] interval


def test_notes_stay_in_the_markdown_and_json(tmp_path: Path) -> None:
    rows = [long_row()]
    markdown = runner.format_markdown(
        rows, {"cpu": "c", "cpu_count": 2, "torch_threads": 2, "torch": "t", "device": "d"}
    )
    assert "medians of 2 interleaved runs" in markdown
    assert "medians of 2" not in runner.format_table(rows)
    runner.write_json(tmp_path / "bench.json", rows, {}, quick=True)
    assert json.loads((tmp_path / "bench.json").read_text())["rows"][0]["note"] == rows[0].note


def test_bench_prints_a_readable_table(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [*committed_rows(), long_row()]
    monkeypatch.setattr(runner, "run_benchmarks", lambda **kwargs: (rows, {}))
    assert main(["bench", "--quick"]) == 0
    out = capsys.readouterr().out
    table = out.split("Speedup = ", 1)[1]
    assert_readable(table)
    assert "End to end" in table and "Single techniques" in table and "--json PATH" in table


def test_run_benchmarks_shows_progress_and_quiets_only_its_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = {}

    def bench(quick: bool) -> list[BenchRow]:
        seen["info"] = logging.getLogger("lightning.pytorch").isEnabledFor(logging.INFO)
        with warnings.catch_warnings(record=True) as caught:  # keeps the filters quiet_lightning set
            warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning, stacklevel=1)
        seen["warnings"] = len(caught)
        return [BenchRow("optim", "fused vs for-loop", "step time", 2.0, 1.0, 2.0)]

    def broken(quick: bool) -> list[BenchRow]:
        raise RuntimeError("boom")

    benches = {"optim": bench, "compile": broken}
    monkeypatch.setattr(runner, "_select", lambda only, skip: list(benches))
    monkeypatch.setattr(runner, "_load_bench", benches.__getitem__)
    logger = logging.getLogger("lightning.pytorch")
    level = logger.level
    rows, errors = runner.run_benchmarks(quick=True, echo=True)
    assert [r.technique for r in rows] == ["optim"] and errors == {"compile": "RuntimeError: boom"}
    assert seen == {"info": False, "warnings": 0}
    assert logger.level == level
    err = capsys.readouterr().err
    assert "optim" in err and "1 row" in err and "FAILED" in err


def test_rich_progress_bar_per_section() -> None:
    import io

    from rich.console import Console

    out = io.StringIO()
    bars = runner._RichProgress(["recipes", "batch_size_finder"], Console(file=out, force_terminal=True, width=100))
    with bars.progress:
        bars.begin("recipes")
        bars.end("recipes", "4 rows")
        bars.begin("batch_size_finder")
        bars.end("batch_size_finder", "FAILED")
    text = out.getvalue()
    assert "recipes" in text and "4 rows" in text and "batch_size_finder" in text and "FAILED" in text


def test_quiet_lightning_silences_the_banners_and_restores(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="lightning.pytorch")

    def trainer() -> None:
        L.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)

    with quiet_lightning():
        trainer()
        with warnings.catch_warnings(record=True) as caught:
            warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning, stacklevel=1)
            warnings.warn("a user's own warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["a user's own warning"]
    assert not any("GPU available" in r.getMessage() for r in caplog.records)
    assert logging.getLogger("lightning.pytorch").level == logging.INFO
    trainer()  # outside: the banners are back
    assert any("GPU available" in r.getMessage() for r in caplog.records)


def test_quick_batch_size_bench_is_smaller_and_full_is_unchanged() -> None:
    from dataclasses import astuple

    from lightning_speedups.benchmarks.batch_size import FULL, QUICK

    assert astuple(FULL) == (32, None, 5, 8, 3, 3072, 5, 10, 3, 2048)  # the full bench's sizes, as before
    assert len(QUICK.classes or range(10)) < 10 and QUICK.image_size < FULL.image_size
    for name in ("search_runs", "sweep_steps", "samples", "repeats", "load_runs", "load_samples"):
        assert getattr(QUICK, name) < getattr(FULL, name), name
