"""The batch-size finder on every task of the workload suite: its choice against a sweep of every size.

Per task (its planned data and model, seed 0, the user's own optimizer and loader):

* ``sweep``: every size of the finder's ladder (``16, 32, ...`` up to ``max_val``) measured ``passes`` times with
  :func:`~lightning_speedups.tuner.find_batch_size` in ``mode="sweep"`` (real training steps, data loading included),
  each size's rate the median over the passes of its per-sample (or per-token) step time; the best size is the
  reference. The row keeps each size's step times: the step-time curve that ``tests`` replays with seeded noise.
* ``quiet``: ``runs`` default searches (``find_batch_size`` with the same ``max_val``), each choice scored as its
  sweep rate over the best size's (target: >= 0.9 on every task).
* ``paired``: each size the quiet searches chose other than the sweep's best, re-measured against the best in
  ``PAIRED_ROUNDS`` paired rounds (one size alone, then the other, the order alternating), scored as the median of
  the per-round ratios. The sweep measures the sizes one after another, so a drift of the machine's speed between
  them (minutes apart) enters its ratios; a pair measured in the same round shares the drift. Both scores are kept.
* ``load``: the same beside one CPU-bound busy-loop process (``background_load``): a sweep under that load
  (``LOAD_PASSES`` passes at least: steps are bimodal there, fast whenever the busy process is descheduled), then
  ``load_runs`` searches scored against it (target: >= 0.9 in 9 of 10 searches per task), and ``load_paired``.

Rows are written one by one to the JSON file (an interrupted run keeps them; a re-run skips the ``(task, phase)``
rows it holds). Ranks are in the finder's own unit: real tokens/s on token sequences, samples/s otherwise.

Run: ``python -m benchmarks.batch_size_suite --json docs/_data/batch_size_suite.json [--tasks a,b]
[--runs 3] [--load-runs 10] [--max-val 512] [--quick]``. Nothing else may run on the machine meanwhile (the quiet
phase is the point); the full run takes about half an hour on 2 cores.
"""

from __future__ import annotations

import logging
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L

from benchmarks._rows import comma_list, read_rows, write_rows
from benchmarks.workloads import get_workload, list_workloads, trainer_kwargs
from benchmarks.workloads._registry import Workload
from lightning_speedups._errors import SpeedupConfigError, check_bool, check_int
from lightning_speedups.benchmarks.batch_size import background_load
from lightning_speedups.functional.batch_size import BatchSizeSearchResult
from lightning_speedups.functional.batch_size.records import per_sample_time
from lightning_speedups.measure import machine_info
from lightning_speedups.tuner import find_batch_size

__all__ = ["PHASES", "format_summary", "main", "run_suite", "summarize"]

PHASES = ("sweep", "quiet", "paired", "load_sweep", "load", "load_paired")
QUICK_TASKS = ("tabular_mlp", "digits")
LOAD_PASSES = 3  # sweeps beside the busy process: one pass of 4 steps per size read a lucky fast mode as the best
# paired re-measurements of a chosen size against the sweep's best: rounds on a quiet machine and beside the busy
# process (5 quiet rounds left ratios from 0.78 to 1.25 for one pair: this guest drifts by that much)
PAIRED_ROUNDS = {"paired": 9, "load_paired": 9}
_UNTRUSTED = "timing cannot be trusted"


def _search(w: Workload, small: bool, **kwargs: Any) -> tuple[BatchSizeSearchResult, float, bool]:
    """One ``find_batch_size`` on a fresh build of ``w`` (seed 0): the result, its seconds, whether it was warned."""
    L.seed_everything(0, verbose=False)
    model, data = w.build(0, small=small)
    trainer = L.Trainer(**trainer_kwargs(w, max_epochs=1, max_steps=-1, val_check_interval=1.0))
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = find_batch_size(trainer, model, data, verbose=False, progress_bar=False, **kwargs)
    elapsed = time.perf_counter() - start
    return result, elapsed, any(_UNTRUSTED in str(c.message) for c in caught)


def _sweep_pass(w: Workload, small: bool, steps: int, **sizes: int) -> BatchSizeSearchResult:
    """One ``mode="sweep"`` pass over ``sizes`` (``max_val``, and ``init_val`` for one size alone): every size one
    warm-up step (the first only, on CPU) then ``steps`` timed ones."""
    result, _s, _u = _search(
        w, small, mode="sweep", steps_per_trial=steps, warmup_steps=1, trial_samples=None, trial_time=None, **sizes
    )
    return result


def _sweep(w: Workload, max_val: int, passes: int, small: bool, steps: int) -> dict[str, Any]:
    """Every ladder size ``passes`` times; per size the median per-unit step time and every pass's step times."""
    per_unit: dict[int, list[float]] = {}
    step_s: dict[int, list[float]] = {}
    unit = "samples"
    for _ in range(passes):
        result = _sweep_pass(w, small, steps, max_val=max_val)
        unit = result.unit
        for t in result.trials:
            if t.ok:
                per_unit.setdefault(t.batch_size, []).append(per_sample_time(t))
                step_s.setdefault(t.batch_size, []).extend(t.step_times)
    rates = {b: 1.0 / statistics.median(v) for b, v in sorted(per_unit.items())}
    best = max(rates, key=rates.__getitem__)
    return {"unit": unit, "rates": rates, "best": best, "step_s": {b: step_s[b] for b in rates}}


def _searches(w: Workload, runs: int, max_val: int, small: bool, sweep: dict[str, Any]) -> dict[str, Any]:
    """``runs`` default searches, each choice scored against ``sweep``'s best size."""
    found = []
    rates = {int(b): r for b, r in sweep["rates"].items()}  # a sweep row read back has str keys
    for _ in range(runs):
        result, seconds, untrusted = _search(w, small, max_val=max_val)
        rate = rates.get(result.chosen)
        score = None if rate is None else rate / rates[int(sweep["best"])]
        found.append(
            {
                "chosen": result.chosen,
                "score": score,
                "search_s": seconds,
                "untrusted": untrusted,
                "stop": result.stop_reason,
                "sizes": [t.batch_size for t in result.trials],
                "note": result.note,
                "decisions": result.decisions,
            }
        )
    return {"searches": found, "best": sweep["best"]}


def _unit_time(w: Workload, b: int, small: bool, steps: int) -> float:
    """Per-sample (per-token) step time of size ``b`` alone: a one-size sweep, its median step."""
    result = _sweep_pass(w, small, steps, init_val=b, max_val=b)
    trial = next((t for t in result.trials if t.batch_size == b and t.ok), None)
    return per_sample_time(trial) if trial is not None else float("inf")


def _paired(w: Workload, rounds: int, small: bool, steps: int, searched: dict[str, Any]) -> dict[str, Any]:
    """Each size the searches chose other than the sweep's best, re-measured against it in ``rounds`` paired rounds
    (the order alternating): its score is the median over rounds of best's per-unit time / its own. A sweep measures
    the sizes one after another, so a drift of the machine's speed between them (this KVM guest's rate of one size
    moved 108-149 samples/s within minutes) enters its ratios; a pair measured in the same round shares it."""
    best = int(searched["best"])
    pairs: dict[int, dict[str, Any]] = {}
    for chosen in sorted({int(s["chosen"]) for s in searched["searches"]} - {best}):
        ratios = []
        for r in range(rounds):
            order = (chosen, best) if r % 2 == 0 else (best, chosen)
            times = {b: _unit_time(w, b, small, steps) for b in order}
            ratios.append(times[best] / times[chosen])
        pairs[chosen] = {"score": statistics.median(ratios), "ratios": [round(x, 4) for x in ratios]}
    return {"best": best, "pairs": pairs}


def _phase(w: Workload, phase: str, args: dict[str, Any], held: dict[str, Any]) -> dict[str, Any]:
    max_val = args["max_val"]
    small = args["small"]
    if phase == "sweep":
        return _sweep(w, max_val, args["passes"], small, args["steps"])
    if phase == "quiet":
        return _searches(w, args["runs"], max_val, small, held["sweep"])
    if phase == "paired":
        return _paired(w, args["rounds"]["paired"], small, args["steps"], held["quiet"])
    with background_load():
        if phase == "load_paired":
            return _paired(w, args["rounds"]["load_paired"], small, args["steps"], held["load"])
        if phase == "load_sweep":  # steps under load are bimodal: the reference needs more passes than quiet
            return _sweep(w, max_val, args["load_passes"], small, args["steps"])
        _search(w, small, max_val=max_val)  # warm the process up under load, untimed
        return _searches(w, args["load_runs"], max_val, small, held["load_sweep"])


def run_suite(
    tasks: Sequence[str] | None = None,
    json_path: str | Path | None = None,
    runs: int = 3,
    load_runs: int = 10,
    max_val: int = 512,
    passes: int = 2,
    quick: bool = False,
    echo: bool = True,
) -> list[dict[str, Any]]:
    """Measure the ``PHASES`` on every task and return the rows (those already in ``json_path`` included).

    Args:
        tasks: registered workload names (default all; with ``quick``, two small ones).
        json_path: where the rows go, rewritten after each one; ``(task, phase)`` rows it holds are skipped.
        runs, load_runs: default searches on a quiet machine and beside one CPU-bound process.
        max_val: the largest size, for the sweep and the searches alike (the sweep must cover every possible choice).
        passes: sweeps per task on the quiet machine (their per-size medians are the reference).
        quick: a smoke test: small builds, one search per phase, sizes up to 32.
        echo: print a line per row.

    Raises:
        SpeedupConfigError: an unknown task or a bad count, before anything runs.
    """
    check_bool("quick", quick)
    for name, value, low in (
        ("runs", runs, 1),
        ("load_runs", load_runs, 0),
        ("max_val", max_val, 16),
        ("passes", passes, 1),
    ):
        check_int(name, value, low)
    workloads = [get_workload(n) for n in (tasks or (QUICK_TASKS if quick else list_workloads()))]
    args = {
        "max_val": 32 if quick else max_val,
        "small": quick,
        "passes": 1 if quick else passes,
        "runs": 1 if quick else runs,
        "load_runs": min(load_runs, 1) if quick else load_runs,
        "steps": 2 if quick else 4,
        "load_passes": 1 if quick else max(passes, LOAD_PASSES),
        "rounds": {k: 1 if quick else v for k, v in PAIRED_ROUNDS.items()},
    }
    path = Path(json_path) if json_path is not None else None
    rows = read_rows(path, ("task", "phase")) if path is not None else []
    machine = machine_info()
    for w in workloads:
        held = {r["phase"]: r for r in rows if r["task"] == w.name}
        for phase in PHASES:
            if phase in held or (phase.startswith("load") and not args["load_runs"]):
                continue
            row = {
                "task": w.name,
                "kind": w.kind,
                "split": w.split,
                "phase": phase,
                "max_val": args["max_val"],
                "machine": machine,
                "small": quick,
                **_phase(w, phase, args, held),
            }
            held[phase] = row
            rows.append(row)
            if path is not None:
                write_rows(path, rows)
            if echo:
                print(f"[batch_size_suite] {_line(row)}", flush=True)
    names = {w.name for w in workloads}
    return [r for r in rows if r["task"] in names]


def _line(row: dict[str, Any]) -> str:
    if "pairs" in row:
        scores = {int(b): round(p["score"], 3) for b, p in row["pairs"].items()}
        return f"{row['task']} {row['phase']}: best {row['best']}, paired score per chosen size {scores}"
    if "searches" in row:
        chosen = [(s["chosen"], None if s["score"] is None else round(s["score"], 2)) for s in row["searches"]]
        return f"{row['task']} {row['phase']}: best {row['best']}, (chosen, score) {chosen}"
    rates = {b: round(r, 1) for b, r in row["rates"].items()}
    return f"{row['task']} {row['phase']}: best {row['best']}, {row['unit']}/s {rates}"


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per task: the quiet and loaded scores, how many reach 0.9x of the best size, and the search seconds."""
    out = []
    for task in dict.fromkeys(r["task"] for r in rows):
        by = {r["phase"]: r for r in rows if r["task"] == task}
        entry: dict[str, Any] = {"task": task, "split": next(iter(by.values()))["split"]}
        for phase in ("quiet", "load"):
            if phase not in by:
                continue
            scores = [s["score"] or 0.0 for s in by[phase]["searches"]]
            entry[phase] = {
                "best": by[phase]["best"],
                "chosen": [s["chosen"] for s in by[phase]["searches"]],
                "scores": [round(s, 3) for s in scores],
                "hits": sum(s >= 0.9 for s in scores),
                "n": len(scores),
                "search_s": statistics.median(s["search_s"] for s in by[phase]["searches"]),
            }
            paired = by.get("paired" if phase == "quiet" else "load_paired")
            if paired is not None:
                pair = {int(b): p["score"] for b, p in paired["pairs"].items()}
                again = [1.0 if c == int(paired["best"]) else pair.get(int(c), 0.0) for c in entry[phase]["chosen"]]
                entry[phase]["paired_scores"] = [round(x, 3) for x in again]
                entry[phase]["paired_hits"] = sum(x >= 0.9 for x in again)
        out.append(entry)
    return out


def _cell(d: dict[str, Any] | None, key: str, spec: str = "") -> str:
    return "-" if d is None else format(d[key], spec)


def _hits(d: dict[str, Any] | None) -> str:
    if d is None:
        return "-"
    again = f" (paired: {d['paired_hits']}/{d['n']}, min {min(d['paired_scores'])})" if "paired_hits" in d else ""
    return f"{d['hits']}/{d['n']}{again}"


def format_summary(summary: Sequence[dict[str, Any]]) -> str:
    """A markdown table: per task the best size, the choices, their scores and the searches at >= 0.9x."""
    lines = [
        "| task | split | best (quiet) | chosen (quiet) | score, min | >= 0.9x quiet | best (load) | >= 0.9x under "
        "load | search s (quiet / load) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        q = s.get("quiet")
        ld = s.get("load")
        lines.append(
            f"| {s['task']} | {s['split']} | {_cell(q, 'best')} | {_cell(q, 'chosen')} | "
            f"{'-' if q is None else min(q['scores'])} | {_hits(q)} | {_cell(ld, 'best')} | {_hits(ld)} | "
            f"{_cell(q, 'search_s', '.1f')} / {_cell(ld, 'search_s', '.1f')} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.batch_size_suite``: run it and print the table."""
    import argparse

    parser = argparse.ArgumentParser(description="The batch-size finder's choice on every workload vs a sweep.")
    parser.add_argument("--json", metavar="PATH", help="rows, rewritten after each one; a re-run resumes from it")
    parser.add_argument("--tasks", metavar="NAMES", help=f"comma-separated, from {', '.join(list_workloads())}")
    parser.add_argument("--runs", type=int, default=3, help="searches on the quiet machine per task (default 3)")
    parser.add_argument("--load-runs", type=int, default=10, help="searches beside a busy process (default 10)")
    parser.add_argument("--max-val", type=int, default=512, help="largest size for sweep and search (default 512)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 2 small tasks, sizes up to 32")
    args = parser.parse_args(argv)
    tasks = comma_list(args.tasks)
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:  # one line per row, not Lightning's lines per fit
        lg.setLevel(logging.ERROR)
    try:
        rows = run_suite(tasks, args.json, args.runs, args.load_runs, args.max_val, quick=args.quick)
    except SpeedupConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
    print(format_summary(summarize(rows)))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
