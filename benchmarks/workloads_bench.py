"""The workload suite bench: the plain baseline vs ``fast_train`` and ``autotune`` on every registered workload.

Per task, per seed, per run (interleaved, the order rotated from seed to seed, so machine noise and drift reach
every run alike) one run of the workload's
planned length (:func:`~benchmarks.workloads.time_to_target`, validation not counted), recorded
as one row and written at once to the JSON file (the whole list rewritten atomically after every row): an
interrupted run keeps what it measured, and a re-run with the same file skips the ``(task, method, seed, no_bf16)``
rows it holds.

Precision paths (``--paths``): ``auto`` lets the recipe and autotune choose bf16, ``no-bf16`` keeps it out
(``no_bf16=True``). A method whose preparation depends on that runs once per path and its rows carry ``no_bf16``
``False`` / ``True``; the plain baseline does not, runs once per task and seed, carries ``no_bf16=None`` and is the
baseline of both paths. So one command writes both paths into one file. A row written before the field existed
reads as the auto path (the baseline: path-free); the file does not record a run made with ``--no-bf16`` then.

Methods:

* ``baseline``: the workload as its user wrote it (path-free).
* ``fast_train``: the recipe, where it applies: it sets the optimizer and its schedule through
  :class:`~lightning_speedups.optim.SpeedupMixin`, so a plain ``LightningModule`` with its own
  ``configure_optimizers`` (every workload today) gets no row (the run prints why; the table says "n/a" where other
  tasks have one). Its probe is counted.
* ``autotune_first``: :func:`~lightning_speedups.autotune.autotune` with an empty cache (its trials run), then
  ``plan.apply`` and a run with the plan's callbacks, Trainer arguments and data.
* ``autotune_cached``: the same with the cache the first run of its path filled, so the trials are skipped.
* ``advisor_top``: the advisor's top finding applied (:mod:`~benchmarks._workloads_advisor`): the
  check that its first fix does not slow a task down (on the no-bf16 path a bf16 fix is not applied). The advisor's
  own run is in the notes, not the time.
* ``precision_trial`` and ``bf16``: bf16 timed in the fit, and bf16 throughout; on the auto path only.

What a method spends before the fit (the recipe's probe, autotune's trials or cache read, ``plan.apply``; wall
seconds) is the row's ``trial_s`` and is added to its ``time_to_target_s``, less the DataModule ``setup("fit")``
autotune ran when the fit reuses it (``TunePlan.reuses_setup``; no method's fit, the baseline's included, times
its own setup). ``quality`` is the metric at the end of
the planned run (not the best value, not the value at the target crossing), so a method that reaches the target
sooner but ends worse shows it.

Run from the repository's root: ``python -m benchmarks.workloads_bench --json docs/_data/workloads.json
[--tasks a,b] [--methods baseline,autotune_first] [--seeds 0,1,2] [--paths auto,no-bf16] [--quick]`` (``--no-bf16``:
the shorthand for ``--paths no-bf16``). Every run trains the planned length (the quality at the end is part of the
result), so the cost is the number of runs per task and seed: the baseline once, every other method once per path.
``--methods baseline,autotune_first --paths auto,no-bf16`` is 3 runs per task and seed, as many as the default
methods on one path (baseline, autotune_first, autotune_cached), which took about two and a half hours for 15 tasks
x 3 seeds on 2 quiet CPU cores, most of it the GPT, the sequence classifier and the two 32 px image networks; the
default methods on both paths are 5 runs per task and seed. ``--quick`` takes a minute or two.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn

from benchmarks._rows import comma_list, read_rows, write_rows
from benchmarks._workloads_advisor import FIXES, advisor_findings, fix_for
from benchmarks._workloads_table import (
    PATH_FREE_METHODS,
    PATHS,
    baseline_of,
    format_gain_checks,
    format_headline,
    format_summary,
    format_targets,
    gain_checks,
    path_label,
    row_no_bf16,
    summarize,
    target_checks,
)
from benchmarks.workloads import get_workload, list_workloads, time_to_target, trainer_kwargs
from benchmarks.workloads._registry import Workload
from lightning_speedups._errors import SpeedupConfigError, check_bool, check_choice, check_int
from lightning_speedups.autotune import autotune
from lightning_speedups.benchmarks._common import BenchRow
from lightning_speedups.measure import machine_info
from lightning_speedups.optim import SpeedupMixin
from lightning_speedups.recipes import fast_train

__all__ = [
    "ALL_METHODS",
    "METHODS",
    "PATHS",
    "QUICK_TASKS",
    "ROW_KEYS",
    "format_summary",
    "main",
    "run",
    "run_suite",
    "summarize",
]

METHODS = ("baseline", "fast_train", "autotune_first", "autotune_cached")  # the default run
# only when named: advisor_top (the check that the advisor's first fix slows no task down), precision_trial (the plain
# run with PrecisionTrial: bf16 timed on the fit's own steps) and bf16 (the plain run at precision="bf16-mixed", the
# reference for what the trial can win)
ALL_METHODS = (*METHODS, "advisor_top", "precision_trial", "bf16")
QUICK_TASKS = ("tabular_mlp", "digits")  # a plain MLP and an image CNN (autotune's device-data path): a smoke test
ROW_KEYS = (
    "task",
    "kind",
    "split",
    "method",
    "no_bf16",
    "seed",
    "time_to_target_s",
    "quality",
    "metric",
    "machine",
    "trial_s",
    "steps",
    "train_s",
    "cpu_time_to_target_s",
    "cpu_s",
    "batch_scale",
    "predicted_gain",
    "notes",
)
SMALL_NOTE = "small build (smoke test: the target does not apply)"


@dataclass
class _Prepared:
    """What a method trains: the workload (its build returning the prepared model and data), callbacks, Trainer
    arguments, and the seconds it spent before the fit (counted in the time to target)."""

    workload: Workload
    callbacks: list[L.Callback] = field(default_factory=list)
    overrides: dict[str, Any] = field(default_factory=dict)
    trial_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    batch_scale: int = 1  # the plan's batch multiplier (samples per step relative to the baseline's)
    # the plan's own estimate of its step-time gain (``TunePlan.gain``), read after the fit: a precision timed in the
    # fit (PrecisionTrial) is part of it only once the fit has decided
    predicted_gain: Callable[[], float] | None = None


def _build_seeded(w: Workload, seed: int, small: bool) -> tuple[L.LightningModule, Any]:
    L.seed_everything(seed, workers=True, verbose=False)  # as time_to_target does: the baseline's initial weights
    return w.build(seed, small=small)


def _prebuilt(w: Workload, model: L.LightningModule, data: Any) -> Workload:
    """``w`` building the prepared ``model`` and ``data``. Its build still runs the workload's own build, whose result
    is dropped, so that the global RNG is where the baseline's is when its fit starts (``time_to_target`` seeds,
    then builds): the same seed gives the same data order and dropout as the baseline's run, and a method that changes
    nothing trains the baseline's run exactly."""

    def build(seed: int, small: bool = False) -> tuple[L.LightningModule, Any]:
        w.build(seed, small=small)
        return model, data

    return replace(w, build=build)


class _TrainLoaderSwap(L.LightningDataModule):
    """``source`` with its training loader replaced (a plan's ``train_dataloaders``), validation unchanged."""

    def __init__(self, source: Any, train_loader: Any) -> None:
        super().__init__()
        self.source = source
        self.train_loader = train_loader

    def setup(self, stage: str) -> None:
        self.source.setup(stage)

    def train_dataloader(self) -> Any:
        return self.train_loader

    def val_dataloader(self) -> Any:
        return self.source.val_dataloader()


def _baseline(w: Workload, seed: int, small: bool, no_bf16: bool, cache_dir: Path) -> _Prepared | str:
    return _Prepared(w)


def _fast_train(w: Workload, seed: int, small: bool, no_bf16: bool, cache_dir: Path) -> _Prepared | str:
    model, data = _build_seeded(w, seed, small)
    if not isinstance(model, SpeedupMixin):
        return (
            f"not applicable: {type(model).__name__} is a plain LightningModule with its own "
            "configure_optimizers; fast_train sets the optimizer and schedule through SpeedupMixin"
        )
    planned = trainer_kwargs(w)
    start = time.perf_counter()
    recipe = fast_train(
        model=model,
        precision="32-true" if no_bf16 else "auto",
        cache_dir=str(cache_dir),
        **{k: v for k, v in planned.items() if k != "precision"},
    )
    recipe.apply(model)
    return _Prepared(
        _prebuilt(w, model, data),
        list(recipe.callbacks),
        dict(recipe.trainer_kwargs),
        time.perf_counter() - start,
        list(recipe.notes),
    )


def _autotune(cached: bool) -> Callable[..., _Prepared | str]:
    def prepare(w: Workload, seed: int, small: bool, no_bf16: bool, cache_dir: Path) -> _Prepared | str:
        notes: list[str] = []
        if not cached:
            shutil.rmtree(cache_dir, ignore_errors=True)  # a first run on this machine: nothing cached
        elif not any(cache_dir.rglob("*")):  # no first run here (resumed suite, or not selected): fill it, untimed
            fill_model, fill_data = _build_seeded(w, seed, small)
            autotune(fill_model, fill_data, cache_dir=str(cache_dir), no_bf16=no_bf16, **trainer_kwargs(w))
            notes.append("the first run's cache was not there (resumed suite?): filled once, untimed")
        model, data = _build_seeded(w, seed, small)
        start = time.perf_counter()
        plan = autotune(model, data, cache_dir=str(cache_dir), no_bf16=no_bf16, **trainer_kwargs(w))
        plan.apply(model, data)
        # the fit then skips the setup autotune ran, and the baseline's setup is not timed either
        trial_s = time.perf_counter() - start - (plan.setup_s if plan.reuses_setup(data) else 0.0)
        if cached and not plan.from_cache:
            notes.append("the cache missed: trials ran again")
        fit_data = plan.datamodule or (
            _TrainLoaderSwap(data, plan.train_dataloaders) if plan.train_dataloaders is not None else data
        )
        # the changed choices (a filter on the value read channels_last=True as 1, "unchanged", and left it out)
        kept = [f"{c.name}={c.chosen} ({c.gain:.2f}x per step)" for c in plan.choices if c.changed]
        notes = [f"kept: {', '.join(kept) or 'nothing'}", *notes, *plan.notes]
        return _Prepared(
            _prebuilt(w, model, fit_data),
            list(plan.callbacks),
            dict(plan.trainer_kwargs),
            trial_s,
            notes,
            int(plan.settings.get("batch_scale", 1)),
            lambda: plan.gain,
        )

    return prepare


def _advisor_top(w: Workload, seed: int, small: bool, no_bf16: bool, cache_dir: Path) -> _Prepared | str:
    findings, advise_s = advisor_findings(w, seed, small, no_bf16)
    finding, skipped = fix_for(findings)
    above = f"; ranked above it, a code change or a measurement first: {', '.join(skipped)}" if skipped else ""
    if finding is None:  # the user changes nothing: the run is the baseline's again (its spread is the noise)
        keys = ", ".join(f["key"] for f in findings) or "none"
        why = f"nothing applied: the advisor's findings ({keys}) ask for a code change or a measurement first"
        return _Prepared(w, [], {}, 0.0, [why, f"the advisor's run took {advise_s:.1f} s"])
    callbacks, overrides = FIXES[finding["key"]]()
    notes = [
        f"applied: {finding['key']}: {finding['title']} ({finding['fix']}){above}",
        f"the advisor's run took {advise_s:.1f} s",
    ]
    return _Prepared(w, callbacks, overrides, 0.0, notes)


def _precision_trial(w: Workload, seed: int, small: bool, no_bf16: bool, cache_dir: Path) -> _Prepared | str:
    from lightning_speedups.callbacks.precision_trial import PrecisionTrial

    if no_bf16:
        return "not applicable: no_bf16 keeps bf16 out"
    return _Prepared(w, [PrecisionTrial()], {"precision": "32-true"})


def _bf16(w: Workload, seed: int, small: bool, no_bf16: bool, cache_dir: Path) -> _Prepared | str:
    return "not applicable: no_bf16 keeps bf16 out" if no_bf16 else _Prepared(w, [], {"precision": "bf16-mixed"})


# method -> how it prepares a run; a string result says why the method does not apply (no row)
_PREPARE: dict[str, Callable[..., _Prepared | str]] = {
    "baseline": _baseline,
    "fast_train": _fast_train,
    "autotune_first": _autotune(cached=False),
    "autotune_cached": _autotune(cached=True),
    "advisor_top": _advisor_top,
    "precision_trial": _precision_trial,
    "bf16": _bf16,
}


def _row(
    w: Workload,
    method: str,
    no_bf16: bool | None,
    seed: int,
    result: dict[str, Any],
    prep: _Prepared,
    machine: dict[str, Any],
    small: bool,
) -> dict[str, Any]:
    hit = result["time_to_target_s"]
    notes = [SMALL_NOTE] if small else []
    notes += [f"PrecisionTrial: {cb.note}" for cb in prep.callbacks if type(cb).__name__ == "PrecisionTrial"]
    return {
        "task": w.name,
        "kind": w.kind,
        "split": w.split,
        "method": method,
        "no_bf16": no_bf16,
        "seed": seed,
        "time_to_target_s": None if hit is None else hit + prep.trial_s,
        "quality": result["final"],
        "metric": w.metric,
        "machine": machine,
        "trial_s": prep.trial_s,
        "steps": result["steps"],
        "train_s": result.get("train_s"),
        "cpu_time_to_target_s": result.get("cpu_time_to_target_s"),  # process CPU seconds, trials not counted
        "cpu_s": result.get("cpu_s"),
        "batch_scale": prep.batch_scale,
        "predicted_gain": None if prep.predicted_gain is None else prep.predicted_gain(),
        "notes": "; ".join([*notes, *prep.notes]),
    }


def _warm_up(w: Workload) -> None:
    """Three steps and one validation of the small build, untimed: the process's one-time costs (lazy imports,
    kernel selection, the first allocator growth) are then paid before the task's first measured run."""
    warm = {
        "max_epochs": 1,
        "max_steps": 3,
        "limit_train_batches": 3,
        "limit_val_batches": 1,
        "val_check_interval": 1.0,
    }
    time_to_target(w, 0, trainer_overrides=warm, small=True)


def _unit_name(method: str, no_bf16: bool | None) -> str:
    """A run's method and, for a path-dependent method, its path: ``autotune_first [no-bf16]``, ``baseline``."""
    return method if no_bf16 is None else f"{method} [{path_label(no_bf16)}]"


def _echo(r: dict[str, Any]) -> None:
    t = "target not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f} s to target"
    quality = "-" if r["quality"] is None else f"{r['quality']:.4g}"
    print(
        f"[workloads] {r['task']} {_unit_name(r['method'], r['no_bf16'])} seed {r['seed']}: {t} "
        f"(trial {r['trial_s']:.1f} s), {r['metric']} {quality} at the end, {r['steps']} steps",
        flush=True,
    )


def _read_rows(path: Path, small: bool) -> list[dict[str, Any]]:
    rows = read_rows(path, ("task", "method", "seed"))
    if any(str(r.get("notes", "")).startswith(SMALL_NOTE) != small for r in rows):
        raise SpeedupConfigError(
            f"`json_path`={str(path)!r} holds {'full' if small else 'small (quick)'} rows; `quick`={small} would mix "
            "them. Allowed values: another path. HINT: keep the quick smoke test out of the suite's JSON."
        )
    return rows


def _check(
    tasks: Sequence[str] | None,
    methods: Sequence[str],
    seeds: Sequence[int],
    quick: bool,
    paths: Sequence[str] | None,
    no_bf16: bool,
) -> tuple[list[Workload], list[bool]]:
    """The workloads and the paths' ``no_bf16`` values (``paths`` default: ``("no-bf16",)`` with ``no_bf16``, else
    ``("auto",)``), every argument checked."""
    check_bool("quick", quick)
    check_bool("no_bf16", no_bf16)
    for m in methods:
        check_choice("methods", m, ALL_METHODS)
    for s in seeds:
        check_int("seeds", s, 0)
    if paths is None:
        paths = ["no-bf16"] if no_bf16 else ["auto"]
    if isinstance(paths, str) or not paths:
        raise SpeedupConfigError(
            f"`paths`={paths!r} is not a non-empty sequence of paths. Allowed values: {', '.join(map(repr, PATHS))}. "
            "HINT: both paths in one run: paths=('auto', 'no-bf16')."
        )
    for p in paths:
        check_choice("paths", p, PATHS)
    if no_bf16 and list(dict.fromkeys(paths)) != ["no-bf16"]:
        raise SpeedupConfigError(
            f"`no_bf16`=True conflicts with `paths`={list(paths)!r}. Allowed values: no_bf16=False, or "
            "paths=('no-bf16',). HINT: no_bf16=True is the shorthand for paths=('no-bf16',)."
        )
    names = list(tasks) if tasks is not None else list(QUICK_TASKS if quick else list_workloads())
    workloads = [get_workload(n) for n in names]  # an unknown task raises here, listing the registered ones
    return workloads, [PATHS[p] for p in dict.fromkeys(paths)]


def _units(methods: Sequence[str], flags: Sequence[bool]) -> list[tuple[str, bool | None]]:
    """The runs of one task and seed as ``(method, no_bf16)``: a path-free method once (``None``: it is the same run on
    every path), every other method once per path, in the order of ``methods`` and then of ``flags``."""
    units: list[tuple[str, bool | None]] = []
    for m in methods:
        units += [(m, None)] if m in PATH_FREE_METHODS else [(m, f) for f in flags]
    return units


def _rotated(units: Sequence[tuple[str, bool | None]], k: int) -> list[tuple[str, bool | None]]:
    """The runs ``(method, no_bf16)`` in the order the ``k``-th seed runs them: rotated by ``k``, so no run always
    goes first (this guest's speed drifts within minutes, and a fixed order would hand the drift to one method or
    path), with ``autotune_first`` still before ``autotune_cached`` of the same path (the cache the second reads is
    the first's)."""
    order = list(units)[k % len(units) :] + list(units)[: k % len(units)] if units else []
    for no_bf16 in dict.fromkeys(f for _, f in order):
        first, cached = ("autotune_first", no_bf16), ("autotune_cached", no_bf16)
        if first in order and cached in order:
            i = order.index(first)
            j = order.index(cached)
            if j < i:
                order[i], order[j] = order[j], order[i]
    return order


def run_suite(
    tasks: Sequence[str] | None = None,
    methods: Sequence[str] = METHODS,
    seeds: Sequence[int] = (0, 1, 2),
    json_path: str | os.PathLike[str] | None = None,
    quick: bool = False,
    no_bf16: bool = False,
    echo: bool = True,
    paths: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Train every task, seed and run once and return the rows (those already in ``json_path`` included).

    A run is a path-free method (the baseline) once, or another method once per path (``paths``): both precision
    paths' rows in one call and one file, the baseline's run shared by them.

    Args:
        tasks: registered workload names (default: all; with ``quick``, :data:`QUICK_TASKS`).
        methods: a subset of :data:`ALL_METHODS`. Each seed's runs go in this order, each method's paths in the order
            of ``paths``, rotated by the seed's position (the ``k``-th seed starts at the ``k``-th run),
            ``autotune_first`` always before ``autotune_cached`` of its path.
        seeds: the seeds (with ``quick``, only the first).
        json_path: where the rows go, rewritten after each one; rows it already holds are skipped (resume), by
            ``(task, method, seed, no_bf16)``. A row written before the ``no_bf16`` field counts as
            :func:`~benchmarks._workloads_table.row_no_bf16` reads it: the auto path for a path-dependent method, so
            to resume a file of an older ``no_bf16=True`` run, set ``"no_bf16": true`` in its rows first.
        quick: a smoke test: one seed, the workloads' ``small=True`` builds (their targets do not apply).
        no_bf16: the shorthand for ``paths=("no-bf16",)`` (with other ``paths``: an error).
        echo: print a line per row.
        paths: from :data:`PATHS`: ``"auto"`` (bf16 among the recipe's and autotune's choices) and ``"no-bf16"``
            (``no_bf16=True``: kept out). Default ``("auto",)``. Each path has its own autotune cache.

    Returns:
        Rows with the keys :data:`ROW_KEYS`: ``no_bf16`` is ``False`` (auto) or ``True`` (no-bf16), ``None`` for a
        path-free method; ``time_to_target_s`` (``None`` when not reached) includes ``trial_s``; ``quality`` is the
        metric at the end of the planned run.

    Raises:
        SpeedupConfigError: an unknown task, method or path, a bad seed, ``no_bf16`` with other ``paths``, or a
            ``json_path`` this suite did not write; before any training.
    """
    workloads, flags = _check(tasks, methods, seeds, quick, paths, no_bf16)
    seeds = list(seeds)[:1] if quick else list(seeds)
    units = _units(methods, flags)
    path = Path(json_path) if json_path is not None else None
    rows = _read_rows(path, quick) if path is not None else []
    done = {(r["task"], r["method"], r["seed"], row_no_bf16(r)) for r in rows}
    machine = machine_info()
    others = {str(r.get("machine", {}).get("cpu")) for r in rows} - {str(machine["cpu"])}
    if others:  # ratios across machines mean little: say so, keep the rows
        rank_zero_warn(f"`json_path` holds rows measured on {sorted(others)}; this run is on {machine['cpu']!r}")
    cache_root = Path(tempfile.mkdtemp(prefix="ls_workloads_cache_"))
    try:
        for w in workloads:
            if any((w.name, m, seed, f) not in done for m, f in units for seed in seeds):
                _warm_up(w)
            for k, seed in enumerate(seeds):
                for method, flag in _rotated(units, k):
                    if (w.name, method, seed, flag) in done:
                        continue
                    # a path-free method ignores no_bf16 and the cache; each path fills its own cache
                    cache_dir = cache_root / f"{w.name}_seed{seed}_{path_label(bool(flag))}"
                    prep = _PREPARE[method](w, seed, quick, bool(flag), cache_dir)
                    if isinstance(prep, str):
                        if echo:
                            print(f"[workloads] {w.name} {_unit_name(method, flag)} seed {seed}: {prep}", flush=True)
                        continue
                    result = time_to_target(
                        prep.workload, seed, callbacks=prep.callbacks, trainer_overrides=prep.overrides, small=quick
                    )
                    rows.append(_row(w, method, flag, seed, result, prep, machine, quick))
                    if path is not None:
                        write_rows(path, rows)
                    if echo:
                        _echo(rows[-1])
    finally:
        shutil.rmtree(cache_root, ignore_errors=True)
    names = {w.name for w in workloads}
    return [
        r
        for r in rows
        if r["task"] in names and r["method"] in methods and r["seed"] in seeds and row_no_bf16(r) in (None, *flags)
    ]


def run(
    quick: bool = True,
    no_bf16: bool = False,
    tasks: Sequence[str] | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    json_path: str | None = None,
    echo: bool = True,
    paths: Sequence[str] | None = None,
) -> list[BenchRow]:
    """The workload suite (each method on each path vs the plain baseline, medians over seeds) as :class:`BenchRow`
    s, the rows ``lightning-speedups bench`` prints (``runner.format_table(run())``, ``runner.write_json``); the
    variant names the path.

    ``quick``: :data:`QUICK_TASKS`, one seed, small builds (a smoke test of the plumbing, about a minute).
    ``no_bf16``, ``paths``: as :func:`run_suite`'s.
    """
    rows = run_suite(tasks, METHODS, seeds, json_path, quick=quick, no_bf16=no_bf16, echo=echo, paths=paths)
    summary = summarize(rows)
    if echo:
        print(format_summary(summary, rows))
    out = []
    for s in summary:
        base = baseline_of(summary, s["task"], s["no_bf16"])
        if s["method"] == "baseline" or base is None:
            continue
        acc = s["metric"].endswith("acc")
        ratio = s["ratio"] if s["ratio"] is not None else float("nan")
        note = (
            f"{s['reached']}/{s['n']} runs reached the target (baseline {base['reached']}/{base['n']}); "
            f"{s['metric']} at the end: {s['quality']} vs {base['quality']}; trials {s['trial_s']:.1f} s counted"
        )
        out.append(
            BenchRow(
                technique="workloads",
                variant=f"{s['method']} vs plain baseline ({s['task']}, {s['split']}, {s['path']} path)",
                metric=f"time to {s['metric']} target",
                baseline=_nan(base["median_s"]),
                candidate=_nan(s["median_s"]),
                ratio=ratio,
                unit="s",
                accuracy_baseline=base["quality"] if acc else None,
                accuracy_candidate=s["quality"] if acc else None,
                note=note,
                extra={k: s[k] for k in ("ratio_min", "ratio_max") if s.get(k) is not None},
            )
        )
    return out


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.workloads_bench``: run the suite, print the summary as markdown."""
    import argparse

    parser = argparse.ArgumentParser(
        description="The workload suite: baseline vs fast_train and autotune. One command writes the rows of both "
        "precision paths (bf16 allowed, and no_bf16=True) into one --json file: --paths auto,no-bf16."
    )
    parser.add_argument("--json", metavar="PATH", help="rows, rewritten after each one; a re-run resumes from it")
    parser.add_argument(
        "--tasks", metavar="NAMES", help=f"comma-separated workloads, from {', '.join(list_workloads())}"
    )
    parser.add_argument(
        "--methods",
        metavar="NAMES",
        help=f"comma-separated, from {', '.join(ALL_METHODS)} (default: {', '.join(METHODS)})",
    )
    parser.add_argument("--seeds", metavar="N,N", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument(
        "--paths",
        metavar="NAMES",
        help=f"comma-separated precision paths, from {', '.join(PATHS)} (default: auto): auto lets the recipe and "
        "autotune choose bf16, no-bf16 keeps it out; --paths auto,no-bf16 runs both in one command and file, the "
        "baseline once for both",
    )
    parser.add_argument("--no-bf16", action="store_true", help="the shorthand for --paths no-bf16")
    parser.add_argument("--quick", action="store_true", help="smoke test: 2 tasks, one seed, small builds")
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in comma_list(args.seeds) or []]
    except ValueError:
        print(f"error: `--seeds`={args.seeds!r} is not a list of integers. Allowed values: e.g. 0,1,2", file=sys.stderr)
        return 2
    paths = comma_list(args.paths)
    if args.no_bf16 and paths is not None and list(dict.fromkeys(paths)) != ["no-bf16"]:
        print(
            f"error: `--no-bf16` (the shorthand for --paths no-bf16) conflicts with `--paths`={args.paths!r}. "
            "Allowed values: one of them, or --paths no-bf16.",
            file=sys.stderr,
        )
        return 2
    try:
        rows = run_suite(
            comma_list(args.tasks),
            comma_list(args.methods) or METHODS,
            seeds,
            args.json,
            quick=args.quick,
            no_bf16=args.no_bf16,
            paths=paths,
        )
    except SpeedupConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    summary = summarize(rows)
    print(format_summary(summary, rows))
    targets = target_checks(summary)
    if targets:
        print(format_targets(targets))
        print(format_headline(summary))
    checks = gain_checks(rows)
    if checks:
        print(format_gain_checks(checks))
    if args.json:
        print(f"rows in {args.json}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
