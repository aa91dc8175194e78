"""Fewer steps to the target: Muon, schedule-free AdamW and WSD against each task's own optimizer, on the suite.

Per task, seed and learning-rate factor the planned run of the workload
(:func:`~benchmarks.workloads.time_to_target`, its own length and validations) is trained with:

- ``own``: the task's own optimizer and schedule, as its user wrote them (AdamW or Adam on every suite task);
- ``muon``: the same optimizer as the Muon hybrid (:class:`~lightning_speedups.Muon`: groups, lr and schedule kept;
  convolution kernels on AdamW), on tasks with a hidden matrix;
- ``muon_conv``: the hybrid with the convolution kernels on Muon too (``conv="muon"``), on tasks with convolutions;
- ``schedule_free_adamw``: ``AdamWScheduleFree`` at the task's lr, betas and weight decay, evaluated at its average
  (:class:`~lightning_speedups.ScheduleFreeSwitch`); the task's own schedule is dropped (schedule-free takes none);
- ``wsd``: the task's optimizer under ``FastSchedule(decay="wsd", peak_factor=1)`` (5% warm-up, constant, a cool-down
  over the last 20%), on tasks whose module returns no schedule of its own;
- ``race``: :class:`~lightning_speedups.callbacks.optimizer_race.OptimizerRace` from the task's own optimizer, its
  arms scored on the training loss (``monitor="loss"``);
- ``race_metric``: the same race scored on the task's validation metric in its direction, as where the fit's
  ``ModelCheckpoint`` or ``EarlyStopping`` monitors it.

The factors are 1 (the task's own lr) and the best factor of the LR grid for the task (``docs/_data/lr_grid.json``:
the task's own optimizer at 0.1x-10x its lr, best final quality), each applied to every method through ``model.lr``.
A row holds the time and steps to the target (``None``: not reached in the planned run), the final and best
quality, and the whole run's training seconds. Methods run in a rotating order per seed, so a drift of the machine's
speed falls on all of them alike. The JSON is rewritten atomically after each row; a re-run skips the rows it holds.

Wall time on a shared 2-core machine drifts with its load, while the steps a run needs do not. So per task the
bench also times one training step of each method interleaved in one process (:func:`step_times`: the task's own
``training_step`` on one of its batches, the same weights, each method's optimizer; medians of rounds A B C A B C),
and the summary's time to the target is ``steps to target x that method's median step time``: the steps from the
runs, the price of a step from one quiet comparison. The runs' own wall times stay in the rows.

``--no-bf16`` runs Muon's Newton-Schulz iterations in fp32 (what a CPU without bf16 units gets from
``ns_dtype="auto"``); otherwise ``"auto"`` chooses on this machine. The other methods run in fp32 either way.

Run: ``python -m benchmarks.fewer_steps --json docs/_data/fewer_steps.json [--tasks a,b]
[--methods own,muon] [--seeds 0,1,2] [--no-bf16] [--quick]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from benchmarks._rows import comma_list, read_rows, write_rows
from benchmarks.lr_grid import QUICK_OVERRIDES, NoLr, with_lr
from benchmarks.workloads import get_workload, list_workloads, time_to_target
from lightning_speedups._errors import SpeedupConfigError, check_choice
from lightning_speedups.callbacks.fast_schedule import FastSchedule
from lightning_speedups.callbacks.muon import Muon
from lightning_speedups.callbacks.optimizer_race import ARMS, OptimizerRace
from lightning_speedups.callbacks.schedule_free import ScheduleFreeSwitch
from lightning_speedups.measure import interleaved_timings, machine_info, make_train_step, median, model_copy
from lightning_speedups.measure.models import training_step_loss
from lightning_speedups.optim.muon import assign_muon, muon_from_optimizer
from lightning_speedups.optim.schedule_free import create_schedule_free_adamw

__all__ = [
    "METHODS",
    "format_markdown",
    "format_summary",
    "grid_best_factors",
    "main",
    "run",
    "step_times",
    "summarize",
    "transformer_median",
]

METHODS = ("own", "muon", "muon_conv", "schedule_free_adamw", "wsd", "race", "race_metric")
# the methods that race the optimization in the fit: on the training loss, and on the task's validation metric (as
# where the fit's ModelCheckpoint or EarlyStopping monitors it)
RACES = ("race", "race_metric")
# OptimizerRace's arguments for the "race" method (``--race-arms``, ``--race-min-steps``; default: its defaults)
RACE_KWARGS: dict[str, Any] = {}
LR_GRID_JSON = Path(__file__).resolve().parents[1] / "docs" / "_data" / "lr_grid.json"
ROW_KEYS = (
    "task",
    "split",
    "kind",
    "seed",
    "method",
    "lr_factor",
    "lr",
    "metric",
    "mode",
    "target",
    "time_to_target_s",
    "steps_to_target",
    "final",
    "best",
    "steps",
    "train_s",
    "notes",
    "no_bf16",
    "machine",
    "winner",
    "race_cost_steps",
)


class _ToScheduleFree(Callback):
    """At ``on_fit_start``: the module's optimizer becomes ``AdamWScheduleFree`` with its groups, lr, betas and weight
    decay; its LR schedulers are dropped (schedule-free keeps its own warm-up and takes no schedule)."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        replaced = []
        for optimizer in trainer.optimizers:
            groups = [{k: g[k] for k in ("params", "lr", "weight_decay")} for g in optimizer.param_groups]
            betas = optimizer.defaults.get("betas", (0.9, 0.999))
            replaced.append(create_schedule_free_adamw(groups, lr=optimizer.defaults["lr"], betas=betas))
        trainer.strategy.lr_scheduler_configs = []
        trainer.strategy.optimizers = replaced


def _applies(method: str, model: L.LightningModule) -> str | None:
    """Why ``method`` does not apply to ``model`` (``None``: it does)."""
    has_conv = any(isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) for m in model.modules())
    if method == "muon":
        try:
            assign_muon(model)
        except SpeedupConfigError:
            return "no hidden matrix (every weight is a kernel, an embedding, the head or a vector)"
    if method == "muon_conv" and not has_conv:
        return "no convolution"
    return None


@functools.cache
def _not_applicable(task: str, method: str) -> str | None:
    """:func:`_applies` on the task's small build, once per task and method (the model's layers do not depend on
    the seed)."""
    model, _ = get_workload(task).build(0, small=True)
    return _applies(method, model)


def _callbacks(method: str, no_bf16: bool, metric: str, mode: str) -> list[Callback]:
    ns = {"ns_dtype": "float32"} if no_bf16 else {}
    if method == "muon":
        return [Muon(**ns)]
    if method == "muon_conv":
        return [Muon(conv="muon", **ns)]
    if method == "schedule_free_adamw":
        return [_ToScheduleFree(), ScheduleFreeSwitch()]
    if method == "wsd":
        return [FastSchedule(warmup=0.05, peak_factor=1.0, decay="wsd", decay_fraction=0.2)]
    if method == "race":
        return [OptimizerRace(**{"monitor": "loss", **RACE_KWARGS})]
    if method == "race_metric":
        return [OptimizerRace(**{"monitor": metric, "mode": mode, **RACE_KWARGS})]
    return []


def _step_optimizer(method: str, model: nn.Module, no_bf16: bool) -> torch.optim.Optimizer:
    """The optimizer a step of ``method`` runs on ``model`` (the suite's tasks all train AdamW or Adam)."""
    own = torch.optim.AdamW(model.parameters(), lr=float(getattr(model, "lr", 1e-3)))
    ns = {"ns_dtype": "float32"} if no_bf16 else {}
    if method == "muon":
        return muon_from_optimizer(own, model, **ns)
    if method == "muon_conv":
        return muon_from_optimizer(own, model, conv="muon", **ns)
    if method == "schedule_free_adamw":
        return create_schedule_free_adamw(model.parameters(), lr=own.defaults["lr"])
    return own  # "own" and "wsd" (a schedule costs nothing per step)


def step_times(task: str, methods: Sequence[str], no_bf16: bool, rounds: int = 15) -> dict[str, float]:
    """Median seconds of one training step per method, timed interleaved on one batch of ``task`` (seed 0)."""
    w = get_workload(task)
    model, data = w.build(0)
    data.prepare_data()
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    steps = {}
    for method in methods:
        if _applies(method, model) is not None:
            continue
        copy = model_copy(model, train=True)
        optimizer = _step_optimizer(method, copy, no_bf16)
        steps[method] = make_train_step(copy, batch, optimizer=optimizer, loss=training_step_loss, return_loss=False)
    times = interleaved_timings(steps, repeats=rounds, warmup=2)
    return {method: median(values) for method, values in times.items()}


def grid_best_factors(path: Path = LR_GRID_JSON) -> dict[str, float]:
    """The LR grid's best factor per task (median final quality over its seeds, in the task's direction)."""
    if not path.exists():
        return {}
    rows = json.loads(path.read_text())
    by_task: dict[str, dict[float, list[float]]] = {}
    modes: dict[str, str] = {}
    for r in rows:
        if r.get("method") == "grid" and r.get("quality") is not None:
            by_task.setdefault(r["task"], {}).setdefault(r["lr_factor"], []).append(r["quality"])
            modes[r["task"]] = r["mode"]
    best = {}
    for task, factors in by_task.items():
        sign = 1 if modes[task] == "max" else -1
        best[task] = max(factors, key=lambda f: sign * statistics.median(factors[f]))
    return best


def _measure(task: str, seed: int, method: str, factor: float, no_bf16: bool, quick: bool) -> dict[str, Any]:
    w = get_workload(task)
    row: dict[str, Any] = dict.fromkeys(ROW_KEYS)
    row.update(
        task=task,
        split=w.split,
        kind=w.kind,
        seed=seed,
        method=method,
        lr_factor=factor,
        metric=w.metric,
        mode=w.mode,
        target=w.target,
        no_bf16=no_bf16,
        notes="",
    )
    reason = _not_applicable(task, method)
    if reason is not None:
        row["notes"] = f"not applicable: {reason}"
        return row
    seen: dict[str, float] = {}
    callbacks = _callbacks(method, no_bf16, w.metric, w.mode)
    try:
        result = time_to_target(
            with_lr(w, factor, seen),
            seed,
            callbacks=callbacks,
            trainer_overrides=QUICK_OVERRIDES if quick else None,
            small=quick,
        )
    except SpeedupConfigError as refusal:  # FastSchedule refuses a module that returns its own schedule
        row["notes"] = f"not applicable: {str(refusal).split('. ')[0]}"
        return row
    row.update(
        lr=seen["lr"],
        time_to_target_s=result["time_to_target_s"],
        steps_to_target=result["steps_to_target"],
        final=result["final"],
        best=result["best"],
        steps=result["steps"],
        train_s=result["train_s"],
    )
    for cb in callbacks:
        if isinstance(cb, OptimizerRace):  # the race's own cost, in the module's steps, and what it chose
            row["winner"] = cb.winner
            row["race_cost_steps"] = cb.cost_s / cb.own_step_s if cb.own_step_s else 0.0
            row["notes"] = cb.note
    return row


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["task"], r["seed"], r["method"], r["lr_factor"], r["no_bf16"])


def run(
    tasks: Sequence[str],
    methods: Sequence[str] = METHODS,
    seeds: Sequence[int] = (0, 1, 2),
    no_bf16: bool = False,
    path: Path | None = None,
    quick: bool = False,
    runs: bool = True,
    timings: bool = True,
) -> list[dict[str, Any]]:
    """Train every task x seed x factor x method (rotating the methods' order per seed) and return the rows.

    ``runs=False`` only times the steps; ``timings=False`` only trains (the runs' steps do not depend on the
    machine's load, so they may train beside other jobs; the step times should not)."""
    for m in methods:
        check_choice("methods", m, METHODS)
    rows = read_rows(path, ("task", "method", "no_bf16")) if path is not None else []
    done = {_key(r) for r in rows}
    best = grid_best_factors()
    machine = machine_info()
    for task in tasks:
        timed = any(
            r["task"] == task and r["method"].startswith("step_time:") and r["no_bf16"] == no_bf16 for r in rows
        )
        if timings and not quick and not timed:
            for method, seconds in step_times(task, [m for m in methods if m not in RACES], no_bf16).items():
                row = {**dict.fromkeys(ROW_KEYS), "task": task, "method": f"step_time:{method}", "no_bf16": no_bf16}
                row.update(step_s=seconds, machine=machine)
                rows.append(row)
            if path is not None:
                write_rows(path, rows)
        factors = sorted({1.0, float(best.get(task, 1.0))})
        for seed in seeds if runs else ():
            order = list(methods[seed % len(methods) :]) + list(methods[: seed % len(methods)])
            for factor in factors:
                for method in order:
                    if (task, seed, method, factor, no_bf16) in done or (method in RACES and factor != 1.0):
                        continue  # the race tries other rates itself: it starts from the module's own
                    try:
                        row = _measure(task, seed, method, factor, no_bf16, quick)
                    except NoLr as reason:
                        row = {
                            **dict.fromkeys(ROW_KEYS),
                            "task": task,
                            "seed": seed,
                            "method": method,
                            "lr_factor": factor,
                            "no_bf16": no_bf16,
                            "notes": f"skipped: {reason}",
                        }
                    row["machine"] = machine
                    rows.append(row)
                    if path is not None:
                        write_rows(path, rows)
                    _echo(row)
    return rows


def _echo(r: dict[str, Any]) -> None:
    if r.get("steps") is None:
        print(f"[fewer_steps] {r['task']} seed {r['seed']} {r['method']} x{r['lr_factor']:g}: {r['notes']}", flush=True)
        return
    ttt = (
        "not reached"
        if r["time_to_target_s"] is None
        else f"{r['time_to_target_s']:.1f} s ({r['steps_to_target']} steps)"
    )
    print(
        f"[fewer_steps] {r['task']} seed {r['seed']} {r['method']} x{r['lr_factor']:g}: target {ttt}, "
        f"final {r['metric']} {r['final']:.4g}, {r['train_s']:.1f} s",
        flush=True,
    )


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _race_steps(r: dict[str, Any], step_s: dict[tuple[Any, ...], float], task: str, no_bf16: bool) -> float:
    """A run's steps to the target (its whole run where not reached); for a race, in the module's own steps: its
    cost added, and the steps after the race at the winner's price (a Muon step costs more than an AdamW one)."""
    steps = r["steps_to_target"] if r["steps_to_target"] is not None else r["steps"]
    if r["method"] not in RACES:
        return steps
    own = step_s.get((task, no_bf16, "own"))
    # the winning arm's kind ("own", "muon", "schedule_free_adamw") is the method whose step it trains with
    winner = step_s.get((task, no_bf16, ARMS[r.get("winner") or "own"].kind))
    scale = winner / own if own and winner else 1.0
    return steps * scale + (r.get("race_cost_steps") or 0.0)


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per task, path (bf16 or not) and method: the factor with the shortest median time to the target, its median
    steps, time and final quality, and ``ratio``: the task's own optimizer's best median time over this one's (> 1:
    sooner). The time is steps x the method's interleaved step time where the task's step times were measured
    (``"timed"``), else the runs' wall time (``"wall"``). A run that never reached the target counts its whole run
    (``reached`` says how many did)."""
    out = []
    step_s = {
        (r["task"], r["no_bf16"], r["method"].split(":", 1)[1]): r["step_s"]
        for r in rows
        if r["method"].startswith("step_time:")
    }
    runs_only = [r for r in rows if r.get("steps") is not None]
    paths = {(r["task"], r["no_bf16"]) for r in runs_only} | {(task, no_bf16) for task, no_bf16, _ in step_s}
    for task, no_bf16 in sorted(paths):
        task_rows = [r for r in runs_only if r["task"] == task and r["no_bf16"] == no_bf16]
        if not task_rows:  # a path only timed: the other path's runs give the steps (`steps_from`)
            task_rows = [{**r, "no_bf16": no_bf16} for r in runs_only if r["task"] == task]
        per: dict[str, dict[str, Any]] = {}
        plain: float | None = None  # the task's own optimizer at its own lr: what a user starts from
        for method in METHODS:
            price = step_s.get((task, no_bf16, "own" if method in ("wsd", *RACES) else method))
            cells = []
            for factor in sorted({r["lr_factor"] for r in task_rows if r["method"] == method}):
                runs = [r for r in task_rows if r["method"] == method and r["lr_factor"] == factor]
                steps = [_race_steps(r, step_s, task, no_bf16) for r in runs]
                wall = [r["time_to_target_s"] if r["time_to_target_s"] is not None else r["train_s"] for r in runs]
                cells.append(
                    {
                        "task": task,
                        "no_bf16": no_bf16,
                        "method": method,
                        "lr_factor": factor,
                        "steps": _median(steps),
                        "time_s": _median(steps) * price if price else _median(wall),
                        "clock": ("timed" if price else "wall")
                        + ("" if any(r["task"] == task and r["no_bf16"] == no_bf16 for r in runs_only) else "*"),
                        "wall_s": _median(wall),
                        "final": _median([r["final"] for r in runs]),
                        "reached": sum(r["time_to_target_s"] is not None for r in runs),
                        "runs": len(runs),
                        "mode": runs[0]["mode"],
                        "metric": runs[0]["metric"],
                    }
                )
            if cells:
                per[method] = min(cells, key=lambda c: (-c["reached"], c["time_s"]))
            if method == "own":
                plain = next((c["time_s"] for c in cells if c["lr_factor"] == 1.0), None)
        base = per.get("own")
        for cell in per.values():
            cell["ratio"] = base["time_s"] / cell["time_s"] if base and cell["time_s"] else None
            cell["ratio_plain"] = plain / cell["time_s"] if plain and cell["time_s"] else None
            out.append(cell)
    return out


def format_summary(cells: list[dict[str, Any]]) -> str:
    """The summary as a table of at most 120 columns, one line per task and method."""
    lines = [
        f"{'task':16} {'path':7} {'method':20} {'lr x':>5} {'reached':>7} {'time to target':>14} "
        f"{'steps':>6} {'final':>8} {'vs own':>7} {'vs plain':>8}"
    ]
    for c in cells:
        path = "no-bf16" if c["no_bf16"] else "auto"
        ratio = "-" if c["ratio"] is None else f"{c['ratio']:.2f}x"
        plain = "-" if c.get("ratio_plain") is None else f"{c['ratio_plain']:.2f}x"
        lines.append(
            f"{c['task']:16} {path:7} {c['method']:20} {c['lr_factor']:>5g} {c['reached']:>3}/{c['runs']:<3} "
            f"{c['time_s']:>12.1f} s {c['steps']:>6.0f} {c['final']:>8.4g} {ratio:>7} {plain:>8}"
        )
    return "\n".join(lines)


def format_markdown(cells: list[dict[str, Any]]) -> str:
    """The summary as a markdown table (the evidence page), with how each time was taken."""
    lines = [
        "| task | path | method | lr x | reached | steps to target | time to target | final | vs own | vs plain |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        ratio = "-" if c["ratio"] is None else f"{c['ratio']:.2f}x"
        plain = "-" if c.get("ratio_plain") is None else f"{c['ratio_plain']:.2f}x"
        lines.append(
            f"| {c['task']} | {'no-bf16' if c['no_bf16'] else 'auto'} | {c['method']} | {c['lr_factor']:g} | "
            f"{c['reached']}/{c['runs']} | {c['steps']:.0f} | {c['time_s']:.1f} s ({c['clock']}) | "
            f"{c['final']:.4g} | {ratio} | {plain} |"
        )
    lines.append(
        "\nTimes: median steps to the target x the method's median step time, both steps timed interleaved on one "
        "batch (timed), or the runs' wall time where no step was timed (wall); a run that never reached the target "
        "counts its whole run. Best factor per method (x1: the task's lr; the other: the LR grid's best for the "
        "task's own optimizer). vs own: the task's own optimizer's time at its best factor over this one's; vs "
        "plain: at its own lr (x1), what a user starts from. race, race_metric: OptimizerRace from the task's own "
        "optimizer at x1 (scored on the loss, on the task's metric), its steps counted in the module's steps (its "
        "cost added, the steps after it at the winner's step time). "
        "*: the "
        "steps of the other path's runs (Muon's Newton-Schulz in bf16), priced at this path's step time."
    )
    return "\n".join(lines)


def transformer_median(cells: list[dict[str, Any]], method: str = "muon", no_bf16: bool = False) -> float | None:
    """The median ratio of ``method`` over the transformer tasks of the suite (kinds ``*transformer*``)."""
    ratios = [
        c["ratio"]
        for c in cells
        if c["method"] == method
        and c["no_bf16"] == no_bf16
        and "transformer" in get_workload(c["task"]).kind
        and c["ratio"] is not None
    ]
    return statistics.median(ratios) if ratios else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None, help="rows file (re-runs skip the rows it holds)")
    parser.add_argument("--tasks", default=None, help="comma-separated workloads (default: all)")
    parser.add_argument("--methods", default=None, help=f"comma-separated, from {', '.join(METHODS)}")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--no-bf16", action="store_true", help="Muon's Newton-Schulz in fp32")
    parser.add_argument("--quick", action="store_true", help="smoke test: small builds, 2 steps")
    parser.add_argument("--summary-only", action="store_true", help="print the summary of --json, train nothing")
    parser.add_argument("--runs-only", action="store_true", help="train the runs, time no step")
    parser.add_argument("--step-times-only", action="store_true", help="time the steps, train no run")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--race-arms", default=None, help="the race method's arms, comma-separated (OptimizerRace)")
    parser.add_argument("--race-min-steps", type=int, default=None, help="the race method's min_steps")
    args = parser.parse_args(argv)
    if args.race_arms:
        RACE_KWARGS["arms"] = comma_list(args.race_arms)
    if args.race_min_steps:
        RACE_KWARGS["min_steps"] = args.race_min_steps
    tasks = comma_list(args.tasks) or list_workloads()
    methods = comma_list(args.methods) or list(METHODS)
    seeds = [int(s) for s in comma_list(args.seeds) or ["0"]]
    if args.summary_only:
        if args.json is None or not args.json.exists():
            raise SpeedupConfigError("`--summary-only` needs an existing `--json` file. Allowed values: a rows file.")
        rows = json.loads(args.json.read_text())
    else:
        torch.set_float32_matmul_precision("highest")
        if args.threads:
            torch.set_num_threads(args.threads)
        rows = run(
            tasks,
            methods,
            seeds,
            args.no_bf16,
            args.json,
            args.quick,
            runs=not args.step_times_only,
            timings=not args.runs_only,
        )
    cells = summarize(rows)
    print(format_summary(cells))
    for no_bf16 in sorted({c["no_bf16"] for c in cells}):
        median = transformer_median(cells, "muon", no_bf16)
        if median is not None and not math.isnan(median):
            print(f"Muon on the transformer tasks ({'no-bf16' if no_bf16 else 'auto'}): median {median:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
