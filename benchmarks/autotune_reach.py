"""Does autotune's default trial budget reach the candidates that matter? Per workload, a generous budget against it.

Per task (seed 0, its planned run): ``autotune`` with ``budget_s=reference_s`` (every candidate gets the rounds it
needs: the reference) and with the default budget (5% of the planned run), both with an empty cache. A candidate
whose reference gain is at least ``1.2x`` must have been measured by the default run (the issue's target); the row
lists those it missed and each run's choices with their gains and intervals.

Run: ``python -m benchmarks.autotune_reach --json docs/_data/autotune_reach.json [--tasks a,b]
[--reference-s 120] [--no-bf16]``. Timing: nothing else may run on the machine meanwhile.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L

from benchmarks._rows import comma_list, read_rows, write_rows
from benchmarks.workloads import get_workload, list_workloads, trainer_kwargs
from benchmarks.workloads._registry import Workload
from lightning_speedups._errors import SpeedupConfigError, check_bool, check_range
from lightning_speedups.autotune import autotune
from lightning_speedups.measure import machine_info

__all__ = ["MATTERS", "format_summary", "main", "run_suite"]

MATTERS = 1.2  # a candidate with at least this gain on the run must be measured by the default budget


def _tune(w: Workload, budget_s: float | None, no_bf16: bool, small: bool) -> dict[str, Any]:
    L.seed_everything(0, verbose=False)
    model, data = w.build(0, small=small)
    start = time.perf_counter()
    plan = autotune(model, data, cache=False, budget_s=budget_s, no_bf16=no_bf16, **trainer_kwargs(w))
    seconds = time.perf_counter() - start
    choices = [
        {
            "name": c.name,
            "chosen": c.chosen,
            "gain": c.gain,
            "interval": list(c.interval),
            "trials": c.trials,
            "changed": c.changed,
            "note": c.note,
        }
        for c in plan.choices
    ]
    return {"seconds": seconds, "choices": choices, "notes": list(plan.notes)}


def run_suite(
    tasks: Sequence[str] | None = None,
    json_path: str | Path | None = None,
    reference_s: float = 120.0,
    no_bf16: bool = False,
    small: bool = False,
    echo: bool = True,
) -> list[dict[str, Any]]:
    """One row per task: the reference and default runs' choices and the candidates of ``>= MATTERS`` the default
    missed (``missed``). Rows already in ``json_path`` (same task and ``no_bf16``) are skipped.

    Raises:
        SpeedupConfigError: an unknown task or a bad ``reference_s``, before anything runs.
    """
    check_range("reference_s", reference_s, 0.0, low_inclusive=False, hint="seconds of trials, e.g. 120")
    check_bool("no_bf16", no_bf16)
    workloads = [get_workload(n) for n in (tasks or list_workloads())]
    path = Path(json_path) if json_path is not None else None
    rows = read_rows(path, ("task", "no_bf16")) if path is not None else []
    machine = machine_info()
    for w in workloads:
        if any(r["task"] == w.name and r["no_bf16"] == no_bf16 for r in rows):
            continue
        reference = _tune(w, reference_s, no_bf16, small)
        default = _tune(w, None, no_bf16, small)
        measured = {c["name"] for c in default["choices"] if c["trials"] > 0}
        missed = [c["name"] for c in reference["choices"] if c["gain"] >= MATTERS and c["name"] not in measured]
        rows.append(
            {
                "task": w.name,
                "kind": w.kind,
                "split": w.split,
                "no_bf16": no_bf16,
                "machine": machine,
                "reference_s": reference_s,
                "reference": reference,
                "default": default,
                "missed": missed,
                "small": small,
            }
        )
        if path is not None:
            write_rows(path, rows)
        if echo:
            print(f"[autotune_reach] {_line(rows[-1])}", flush=True)
    names = {w.name for w in workloads}
    return [r for r in rows if r["task"] in names and r["no_bf16"] == no_bf16]


def _gains(run: dict[str, Any]) -> str:
    return ", ".join(f"{c['name']} {c['chosen']} {c['gain']:.2f}x" for c in run["choices"] if c["trials"]) or "-"


def _line(row: dict[str, Any]) -> str:
    ref = row["reference"]
    default = row["default"]
    return (
        f"{row['task']}: reference ({ref['seconds']:.0f} s) {_gains(ref)}; default ({default['seconds']:.1f} s) "
        f"{_gains(default)}; missed {row['missed'] or 'none'}"
    )


def format_summary(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table: per task, what each run measured (kept option and gain) and what the default missed."""
    lines = [
        "| task | split | bf16 allowed | generous budget measured | default budget measured (s) | missed >= "
        f"{MATTERS}x |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['split']} | {'no' if r['no_bf16'] else 'yes'} | {_gains(r['reference'])} | "
            f"{_gains(r['default'])} ({r['default']['seconds']:.1f}) | {', '.join(r['missed']) or 'none'} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.autotune_reach``: run it and print the table."""
    import argparse

    parser = argparse.ArgumentParser(description="autotune's default budget against a generous one, per workload.")
    parser.add_argument("--json", metavar="PATH", help="rows, rewritten after each one; a re-run resumes from it")
    parser.add_argument("--tasks", metavar="NAMES", help=f"comma-separated, from {', '.join(list_workloads())}")
    parser.add_argument("--reference-s", type=float, default=120.0, help="the generous budget (default 120 s)")
    parser.add_argument("--no-bf16", action="store_true", help="keep bf16 out of both runs")
    parser.add_argument("--small", action="store_true", help="smoke test: the workloads' small builds")
    args = parser.parse_args(argv)
    tasks = comma_list(args.tasks)
    try:
        rows = run_suite(tasks, args.json, args.reference_s, args.no_bf16, args.small)
    except SpeedupConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_summary(rows))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
