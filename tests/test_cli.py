"""The console script: --help, info, bench --quick (JSON + PNG), bench --from-json, bad technique names."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from lightning_speedups.cli import main


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "info" in out and "bench" in out and "advise" in out


def test_cli_console_script_installed():
    exe = shutil.which("lightning-speedups") or shutil.which("lightning-speedups", path=str(sys.prefix) + "/bin")
    assert exe, "console script `lightning-speedups` is not installed"
    proc = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "bench" in proc.stdout


def test_cli_info(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for needle in ("torch", "lightning", "Trainer settings", "accelerator", "precision", "Techniques", "peak fp32"):
        assert needle in out
    peak = next(line for line in out.splitlines() if "peak fp32" in line)
    assert "an estimate" in peak or "unknown" in peak  # the CPU peak is estimated (ISA x cores x clock) or says why not


def test_cli_bench_only_json_and_plots(tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            "--quick",
            "--only",
            "trainer_settings",
            "--json",
            str(out_json),
            "--plots",
            str(tmp_path),
            "--markdown",
            str(tmp_path / "bench.md"),
        ]
    )
    assert code == 0
    payload = json.loads(out_json.read_text())
    assert payload["quick"] is True and payload["errors"] == {}
    assert [r["technique"] for r in payload["rows"]] == ["precision"]
    assert payload["rows"][0]["ratio"] > 0
    assert (tmp_path / "components.png").stat().st_size > 1000 and not (tmp_path / "end_to_end.png").exists()
    assert "| technique |" in (tmp_path / "bench.md").read_text()
    assert "speedup" in capsys.readouterr().out
    # --from-json prints the saved run again, runs nothing, and writes the same markdown the run wrote
    assert main(["bench", "--from-json", str(out_json), "--markdown", str(tmp_path / "again.md")]) == 0
    assert (tmp_path / "again.md").read_text() == (tmp_path / "bench.md").read_text()
    out = capsys.readouterr().out
    assert f"From {out_json}." in out and "precision" in out and "[bench]" not in out


def _saved_run(tmp_path, errors=None):
    path = tmp_path / "run.json"
    machine = {"cpu": "TestCPU", "cpu_count": 2, "torch_threads": 2, "torch": "x", "device": "cpu"}
    row = {"technique": "pruning", "variant": "v", "metric": "m", "baseline": 2.0, "candidate": 1.0, "ratio": 2.0}
    row["accuracy_delta"] = None  # as write_json writes it
    payload = {"machine": machine, "date": "D", "quick": True, "errors": errors or {}, "rows": [row]}
    path.write_text(json.dumps(payload))
    return path


def test_cli_bench_from_json_prints_a_saved_run(tmp_path, capsys):
    path = _saved_run(tmp_path, errors={"qat": "RuntimeError: boom"})
    assert main(["bench", "--from-json", str(path)]) == 0  # re-printing a run that had a failure succeeds
    captured = capsys.readouterr()
    assert captured.out.startswith("Machine: TestCPU, 2 cores, 2 torch threads, torch x, device cpu. Mode: quick.")
    assert "Date: D." in captured.out and "pruning    v: m" in captured.out and "2.00x" in captured.out
    assert "add --markdown PATH" in captured.out
    assert "FAILED benchmarks in that run:" in captured.err and "qat: RuntimeError: boom" in captured.err


def test_cli_bench_from_json_misconfiguration(tmp_path, capsys):
    path = _saved_run(tmp_path)
    assert main(["bench", "--from-json", str(path), "--quick", "--only", "pruning"]) == 2
    assert "`--from-json` runs nothing, so --quick, --only would do nothing" in capsys.readouterr().err
    rows = tmp_path / "rows.json"  # what the evidence harness reads (a list of rows), not a bench run
    rows.write_text("[]")
    assert main(["bench", "--from-json", str(rows)]) == 2
    err = capsys.readouterr().err
    assert "is not a file `lightning-speedups bench --json` wrote" in err and "python -m benchmarks.evidence" in err
    assert main(["bench", "--from-json", str(tmp_path)]) == 2  # a folder of results: what the evidence page reads
    assert "HINT: the project's evidence page" in capsys.readouterr().err


def test_cli_bench_names_where_the_workload_suite_went(capsys):
    assert main(["bench", "--quick", "--only", "workloads"]) == 2
    err = capsys.readouterr().err
    assert "`technique`='workloads' is not registered." in err and "python -m benchmarks.workloads_bench" in err


def test_cli_bench_unknown_technique(capsys):
    assert main(["bench", "--quick", "--only", "warp_drive"]) == 2
    err = capsys.readouterr().err
    assert "`technique`='warp_drive' is not registered. Allowed values:" in err


def test_cli_bench_target_out_of_range(capsys):
    assert main(["bench", "--quick", "--only", "recipes", "--target-accuracy", "1.5"]) == 2
    assert "`target`=1.5 is out of range" in capsys.readouterr().err


def test_cli_bench_unreachable_target_errors_in_bounded_time(capsys):
    # the digits task cannot reach 100% validation accuracy: the bench stops after its epoch budget and says so
    assert main(["bench", "--quick", "--only", "recipes", "--target-accuracy", "1.0"]) == 1
    err = capsys.readouterr().err
    assert "recipes: SpeedupConfigError: `target`=1.0 was not reached" in err and "lower the target" in err


@pytest.mark.slow
def test_cli_bench_quick_every_technique(tmp_path):
    from lightning_speedups._registry import get_technique, list_techniques

    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--json", str(out), "--plots", str(tmp_path)]) == 0
    payload = json.loads(out.read_text())
    with_bench = {n for n in list_techniques() if get_technique(n).bench is not None}
    assert len(payload["rows"]) >= len(with_bench)
    for r in payload["rows"]:
        assert r["technique"] and r["metric"] and isinstance(r["ratio"], float)
        if not (0 < r["ratio"] < float("inf")):  # only a target that one side missed may leave no finite ratio
            assert "not reach" in r["note"], r
    for chart in ("end_to_end.png", "components.png", "accuracy_vs_time.png"):  # the end-to-end chart comes first
        assert (tmp_path / chart).exists(), chart
    assert payload["rows"][0]["technique"] in ("recipe", "autotune")  # the headline: whole-run results first


def test_bench_table_says_no_speedup_once_and_never_beside_a_gain():
    from lightning_speedups.benchmarks._common import BenchRow
    from lightning_speedups.benchmarks.runner import _table_rows

    rows = [
        BenchRow("optim", "a", "m", 1.0, 1.0, 1.02, note=""),
        BenchRow("optim", "b", "m", 1.0, 1.0, 0.9, note="no speedup (masks keep dense kernels); x"),
        BenchRow("optim", "c", "m", 1.0, 1.0, 1.5, note="fused kernel faster"),
        BenchRow("finetune", "d", "m", float("nan"), float("nan"), float("nan"), note="target not reached"),
    ]
    notes = [r[-1] for r in _table_rows(rows)]
    assert notes[0] == "no speedup" and notes[1].count("no speedup") == 1
    assert notes[2] == "fused kernel faster" and "not reached" in notes[3] and "no speedup" not in notes[3]
    assert _table_rows(rows)[3][3] == "not reached"
    # a choice scored against the best one (the batch-size finder's rows) is a quality ratio: no speedup verdict
    quality = BenchRow(
        "batch_size_finder",
        "e",
        "throughput",
        1.0,
        0.93,
        0.93,
        note="target ratio >= 0.9",
        extra={"quality_ratio": True},
    )
    assert _table_rows([quality])[0][-1] == "target ratio >= 0.9"
