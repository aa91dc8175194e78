"""The LR finder against a coarse grid of learning rates, on every task of the workload suite.

Per task and seed, the planned run of the workload (:func:`~benchmarks.workloads.time_to_target`,
its own optimizer and length) is trained once at each learning rate of the grid, the task's own ``lr`` times
:data:`GRID` (a coarse grid around what its user wrote; ``model.lr`` is set before ``fit``), then once with
:class:`~lightning_speedups.LRFinder` (default rule and settings) as a callback, which runs its range test and trains
at its suggestion. Each run is one row, written at once to the JSON file (the whole list rewritten atomically), so an
interrupted run keeps what it measured and a re-run with the same file skips the rows it holds.

The runs are step-based: ``quality`` is the task's metric after the planned number of steps (the last validation),
so the result does not depend on the machine's load. The finder's row also holds its result: the suggestion of every
rule, the steps the range test ran of those planned, the learning rates it covered, why it stopped early (``None``:
it did not), and its curve.

The verdict per task (:func:`summarize`): the finder's quality is within :func:`tolerance` (0.01 for an accuracy
or an IoU, one point; 0.02 for a loss; 0.1 dB for a PSNR) of the best grid value, compared in the task's direction
(``mode``). A task whose module has no numeric ``lr`` attribute gets one ``"skipped"`` row saying so.

Run: ``python -m benchmarks.lr_grid --json docs/_data/lr_grid.json [--tasks a,b] [--seeds 0]
[--quick]``. ``--quick`` is a smoke test of the plumbing: :data:`QUICK_TASKS`, small builds, a few steps, a short
range test (its verdicts mean nothing).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from benchmarks._rows import comma_list
from benchmarks.workloads import get_workload, list_workloads, time_to_target
from benchmarks.workloads._registry import Workload
from lightning_speedups._errors import SpeedupConfigError, check_bool, check_int
from lightning_speedups.callbacks.lr_finder import LRFinder
from lightning_speedups.measure import machine_info

__all__ = [
    "FINDER_KEYS",
    "GRID",
    "QUICK_TASKS",
    "ROW_KEYS",
    "format_summary",
    "main",
    "run_grid",
    "summarize",
    "tolerance",
]

GRID = (0.1, 0.3, 1.0, 3.0, 10.0)  # multiples of the task's own lr
QUICK_TASKS = ("tabular_mlp", "gru_stdlib")  # an accuracy and a loss task, both cheap in their small builds
QUICK_OVERRIDES: dict[str, Any] = {
    "max_epochs": -1,
    "max_steps": 2,
    "limit_train_batches": 2,
    "val_check_interval": 1.0,
    "limit_val_batches": 1,
}
QUICK_FINDER_STEPS = 5
ROW_KEYS = (
    "task",
    "split",
    "kind",
    "seed",
    "method",
    "lr_factor",
    "task_lr",
    "lr",
    "quality",
    "metric",
    "mode",
    "steps",
    "curve",
    "notes",
    "machine",
)
FINDER_KEYS = (
    "finder_rule",
    "finder_suggestions",
    "finder_planned_steps",
    "finder_steps_run",
    "finder_lr_covered",
    "finder_stop_reason",
    "finder_curve",
)
SMALL_NOTE = "small build (smoke test: the verdict does not apply)"
# metric name contains -> how close to the best grid value the finder must land (a PSNR in dB: 0.1 dB is 2% of the
# squared error, about what 0.02 is of the suite's cross-entropy losses)
TOLERANCES: dict[str, float] = {"acc": 0.01, "iou": 0.01, "loss": 0.02, "psnr": 0.1}


class NoLr(Exception):
    """The task's module has no numeric ``lr`` to set: the task is skipped, with this reason."""


def tolerance(metric: str) -> float | None:
    """How close to the best grid value the finder must land for ``metric`` (``None``: no rule for it).

    Example::

        >>> [tolerance(m) for m in ("val_acc", "val_miou", "val_loss", "val_psnr", "val_f1")]
        [0.01, 0.01, 0.02, 0.1, None]
    """
    return next((tol for key, tol in TOLERANCES.items() if key in metric.lower()), None)


def with_lr(w: Workload, factor: float, seen: dict[str, float]) -> Workload:
    """``w`` whose build sets ``model.lr`` to ``factor`` x the module's own lr (noted in ``seen``)."""

    def build(seed: int, small: bool = False) -> Any:
        model, data = w.build(seed, small=small)
        base = getattr(model, "lr", None)
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 0:
            raise NoLr(
                f"{type(model).__name__} has no positive numeric `lr` attribute (found {base!r}); the grid "
                "multiplies the task's own lr, read by its configure_optimizers"
            )
        seen["task_lr"] = float(base)
        seen["lr"] = float(base) * factor
        model.lr = seen["lr"]
        return model, data

    return replace(w, build=build)


def _base_row(w: Workload, seed: int, method: str, quick: bool) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(ROW_KEYS)
    row.update(
        task=w.name,
        split=w.split,
        kind=w.kind,
        seed=seed,
        method=method,
        metric=w.metric,
        mode=w.mode,
        notes=SMALL_NOTE if quick else "",
    )
    return row


def _finder_fields(finder: LRFinder) -> dict[str, Any]:
    res = finder.result
    if res is None:
        return {**dict.fromkeys(FINDER_KEYS), "finder_rule": finder.rule}
    return {
        "finder_rule": res.rule,
        "finder_suggestions": res.suggestions,
        "finder_planned_steps": res.planned_steps,
        "finder_steps_run": res.steps_run,
        "finder_lr_covered": list(res.lr_covered),
        "finder_stop_reason": res.stop_reason,
        "finder_curve": {"lr": [float(f"{x:.6g}") for x in res.lrs], "loss": [float(f"{x:.6g}") for x in res.losses]},
    }


def _measure(w: Workload, seed: int, method: str, factor: float | None, quick: bool, root: str) -> dict[str, Any]:
    """Train the planned run once (at ``factor`` x the task's lr, or with the LR finder) and return its row."""
    seen: dict[str, float] = {}
    finder = None
    if method == "lr_finder":
        finder = LRFinder(num_training_steps=QUICK_FINDER_STEPS) if quick else LRFinder()
    overrides = {**(QUICK_OVERRIDES if quick else {}), "default_root_dir": root}  # the range test's checkpoint
    result = time_to_target(
        with_lr(w, 1.0 if factor is None else factor, seen),
        seed,
        callbacks=[finder] if finder else [],
        trainer_overrides=overrides,
        small=quick,
    )
    row = _base_row(w, seed, method, quick)
    row.update(
        lr_factor=factor,
        task_lr=seen["task_lr"],
        lr=seen["lr"],
        quality=result["final"],
        steps=result["steps"],
        curve=[[step, v] for _, step, v in result["curve"]],
    )
    if finder is not None:
        row.update(_finder_fields(finder))
        row["lr"] = row["lr"] if finder.result is None else finder.result.lr
        row["notes"] = _join(
            row["notes"],
            f"range test of {QUICK_FINDER_STEPS} steps" if quick else "",
            "the range test did not run: trained at the task's lr" if finder.result is None else "",
        )
    return row


def _join(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["task"], r["seed"], r["method"], r.get("lr_factor") if r["method"] == "grid" else None)


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """The whole list, written to a temporary file and moved over ``path`` (never half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(rows, indent=1, default=str))
    os.replace(tmp, path)


def _read_rows(path: Path, small: bool) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = json.loads(path.read_text())
    if not isinstance(rows, list) or any(
        not isinstance(r, dict) or not {"task", "seed", "method"} <= set(r) for r in rows
    ):
        raise SpeedupConfigError(
            f"`json_path`={str(path)!r} does not hold a list of LR-grid rows. Allowed values: a "
            "new path or a file this benchmark wrote."
        )
    if any(str(r.get("notes") or "").startswith(SMALL_NOTE) != small for r in rows):
        raise SpeedupConfigError(
            f"`json_path`={str(path)!r} holds {'full' if small else 'small (quick)'} rows; `quick`={small} would mix "
            "them. Allowed values: another path. HINT: keep the quick smoke test out of the benchmark's JSON."
        )
    return rows


def _echo(r: dict[str, Any]) -> None:
    if r["method"] == "skipped":
        print(f"[lr_grid] {r['task']} seed {r['seed']}: skipped, {r['notes']}", flush=True)
        return
    what = f"x{r['lr_factor']:g}" if r["method"] == "grid" else f"LR finder ({r.get('finder_rule')})"
    quality = "-" if r["quality"] is None else f"{r['quality']:.4g}"
    print(
        f"[lr_grid] {r['task']} seed {r['seed']} {what}: lr {r['lr']:.3g}, {r['metric']} {quality} after "
        f"{r['steps']} steps",
        flush=True,
    )


def _run_task_seed(
    w: Workload,
    seed: int,
    rows: list[dict[str, Any]],
    path: Path | None,
    quick: bool,
    machine: dict[str, Any],
    root: str,
    echo: bool,
) -> None:
    """The grid, then the finder, for one task and seed; rows already held are skipped."""
    done = {_key(r) for r in rows}
    if (w.name, seed, "skipped", None) in done:
        return
    for method, factor in [*(("grid", f) for f in GRID), ("lr_finder", None)]:
        if (w.name, seed, method, factor) in done:
            continue
        try:
            row = _measure(w, seed, method, factor, quick, root)
        except NoLr as reason:
            row = {**_base_row(w, seed, "skipped", quick), "notes": _join(SMALL_NOTE if quick else "", str(reason))}
        row["machine"] = machine
        rows.append(row)
        if path is not None:
            _write_rows(path, rows)
        if echo:
            _echo(row)
        if row["method"] == "skipped":
            return


def run_grid(
    tasks: Sequence[str] | None = None,
    seeds: Sequence[int] = (0,),
    json_path: str | os.PathLike[str] | None = None,
    quick: bool = False,
    echo: bool = True,
) -> list[dict[str, Any]]:
    """Train every task at each grid learning rate and with the LR finder; return the rows (held ones included).

    Args:
        tasks: registered workload names (default: every registered one; with ``quick``, :data:`QUICK_TASKS`).
        seeds: the seeds, each a full grid + finder per task.
        json_path: where the rows go, rewritten after each one; rows it already holds are skipped (resume).
        quick: a smoke test: small builds, a few steps, a short range test.
        echo: print a line per row.

    Returns:
        Rows with the keys :data:`ROW_KEYS` (the finder's rows also :data:`FINDER_KEYS`); ``quality`` is the metric
        at the end of the planned run; ``method`` is ``"grid"``, ``"lr_finder"`` or ``"skipped"`` (the task's module
        has no ``lr`` to set: ``notes`` says so).

    Raises:
        SpeedupConfigError: an unknown task, a bad seed, or a ``json_path`` this benchmark did not write; before any
            training.
    """
    check_bool("quick", quick)
    for s in seeds:
        check_int("seeds", s, 0)
    names = list(tasks) if tasks is not None else list(QUICK_TASKS if quick else list_workloads())
    workloads = [get_workload(n) for n in names]  # an unknown task raises here, listing the registered ones
    path = Path(json_path) if json_path is not None else None
    rows = _read_rows(path, quick) if path is not None else []
    machine = machine_info()
    others = {str((r.get("machine") or {}).get("cpu")) for r in rows} - {str(machine["cpu"])}
    if others:  # step-based quality should not depend on the machine, but say so
        rank_zero_warn(f"`json_path` holds rows measured on {sorted(others)}; this run is on {machine['cpu']!r}")
    with tempfile.TemporaryDirectory(prefix="ls_lr_grid_") as root:
        for w in workloads:
            for seed in seeds:
                _run_task_seed(w, seed, rows, path, quick, machine, root, echo)
    return [r for r in rows if r["task"] in set(names) and r["seed"] in set(seeds)]


def _mean(values: list[float | None]) -> float | None:
    """Mean over seeds; a missing or non-finite value (no validation, a diverged loss) makes it NaN."""
    if not values:
        return None
    if any(v is None or not math.isfinite(v) for v in values):
        return math.nan
    return statistics.fmean(v for v in values if v is not None)


def _better(a: float, b: float, mode: str) -> bool:
    return a > b if mode == "max" else a < b


def _task_summary(task_rows: list[dict[str, Any]]) -> dict[str, Any]:
    first = task_rows[0]
    mode = first["mode"]
    metric = first["metric"]
    s: dict[str, Any] = {k: first[k] for k in ("task", "split", "kind", "metric", "mode")}
    s.update(
        task_lr=next((r["task_lr"] for r in task_rows if r.get("task_lr")), None),
        grid={},
        best_factor=None,
        best_lr=None,
        best_quality=None,
        finder_lr=None,
        finder_quality=None,
        gap=None,
        tolerance=tolerance(metric),
        range_test=[],
        seeds=sorted({r["seed"] for r in task_rows}),
        best_range=None,
        finder_range=None,
    )
    skipped = [r for r in task_rows if r["method"] == "skipped"]
    if skipped:
        return {**s, "verdict": f"skipped: {skipped[0]['notes']}"}
    for f in GRID:
        q = _mean([r["quality"] for r in task_rows if r["method"] == "grid" and r["lr_factor"] == f])
        if q is not None:
            s["grid"][f] = q
    finite = {f: q for f, q in s["grid"].items() if math.isfinite(q)}
    if finite:
        s["best_factor"] = max(finite, key=lambda f: finite[f] if mode == "max" else -finite[f])
        s["best_quality"] = finite[s["best_factor"]]
        s["best_lr"] = s["best_factor"] * s["task_lr"] if s["task_lr"] else None
        s["best_range"] = _seed_range(
            [r for r in task_rows if r["method"] == "grid" and r["lr_factor"] == s["best_factor"]]
        )
    finder = [r for r in task_rows if r["method"] == "lr_finder"]
    if finder:
        s["finder_lr"] = statistics.median(r["lr"] for r in finder)
        s["finder_quality"] = _mean([r["quality"] for r in finder])
        s["finder_range"] = _seed_range(finder)
        texts = [_range_text(r) for r in finder]
        s["range_test"] = [t if texts.count(t) == 1 else f"{texts.count(t)} seeds: {t}" for t in dict.fromkeys(texts)]
    return {**s, **_verdict(s, mode)}


def _seed_range(rows: list[dict[str, Any]]) -> float | None:
    """How far one configuration's quality moved between seeds (max - min; ``None`` below two finite seeds)."""
    values = [float(r["quality"]) for r in rows if r.get("quality") is not None and math.isfinite(float(r["quality"]))]
    return max(values) - min(values) if len(values) > 1 else None


def _verdict(s: dict[str, Any], mode: str) -> dict[str, Any]:
    best = s["best_quality"]
    found = s["finder_quality"]
    tol = s["tolerance"]
    if best is None:
        return {"verdict": "no grid rows"}
    if found is None:
        return {"verdict": "no finder row"}
    gap = math.inf if not math.isfinite(found) else (best - found if mode == "max" else found - best)
    if tol is None:
        return {"gap": gap, "verdict": f"no tolerance for metric {s['metric']!r}"}
    return {"gap": gap, "verdict": "within" if gap <= tol + 1e-12 else "miss"}


def _range_text(r: dict[str, Any]) -> str:
    if r.get("finder_steps_run") is None:
        return "the range test did not run"
    lo, hi = r["finder_lr_covered"]
    text = f"{r['finder_steps_run']}/{r['finder_planned_steps']} steps, lr {lo:.2g}-{hi:.2g}"
    return text + (f", stopped early: {r['finder_stop_reason']}" if r.get("finder_stop_reason") else "")


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per task (means over its seeds): the grid's qualities, the best grid lr and quality, the finder's lr and
    quality, the gap (how much worse the finder is, in the task's direction; negative: better) and the verdict.

    Each also has ``best_range`` and ``finder_range``: how far the best grid lr's and the finder's quality moved
    between seeds (max - min; ``None`` for one seed). A gap smaller than those is within the seed noise, which the
    verdict does not take into account.

    The verdict is ``"within"`` when the gap is at most :func:`tolerance` of the metric, else ``"miss"``; or says
    what is missing (``"no finder row"``, ``"no grid rows"``), or why the task was skipped. A non-finite quality
    (a diverged loss) counts as the worst.

    Example::

        >>> rows = [{"task": "t", "split": "dev", "kind": "tabular", "metric": "val_acc", "mode": "max", "seed": 0,
        ...          "method": "grid", "lr_factor": f, "task_lr": 1e-3, "lr": f * 1e-3, "quality": q}
        ...         for f, q in [(0.1, 0.80), (0.3, 0.85), (1.0, 0.90), (3.0, 0.92), (10.0, 0.5)]]
        >>> rows.append({**rows[2], "method": "lr_finder", "lr_factor": None, "lr": 2e-3, "quality": 0.915})
        >>> s = summarize(rows)[0]
        >>> s["best_factor"], round(s["gap"], 3), s["verdict"]
        (3.0, 0.005, 'within')
    """
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_task.setdefault(r["task"], []).append(r)
    return [_task_summary(task_rows) for task_rows in by_task.values()]


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def format_summary(summary: Sequence[dict[str, Any]]) -> str:
    """:func:`summarize`'s result as a markdown table (lrs also as multiples of the task's own lr)."""
    grid_head = " / ".join(f"x{f:g}" for f in GRID)
    lines = [
        f"| task | metric | task's lr | grid ({grid_head}) | best grid lr | best grid | LR finder lr | LR finder "
        "| gap | verdict | seeds: range of best grid / finder | range test |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        base = s["task_lr"]
        grid = " / ".join(_fmt(s["grid"].get(f)) for f in GRID)
        best = "-" if s["best_lr"] is None else f"{s['best_lr']:.3g} (x{s['best_factor']:g})"
        found = (
            "-"
            if s["finder_lr"] is None
            else f"{s['finder_lr']:.3g}" + (f" (x{s['finder_lr'] / base:.2g})" if base else "")
        )
        gap = "-" if s["gap"] is None else f"{s['gap']:+.4f} (tol {_fmt(s['tolerance'])})"
        lines.append(
            f"| {s['task']} | {s['metric']} ({s['mode']}) | {_fmt(base, 3)} | {grid} | {best} | "
            f"{_fmt(s['best_quality'])} | {found} | {_fmt(s['finder_quality'])} | {gap} | {s['verdict']} | "
            f"{_ranges(s)} | {'; '.join(s['range_test']) or '-'} |"
        )
    return "\n".join(lines)


def _ranges(s: dict[str, Any]) -> str:
    """``"3: 0.021 / 0.034"``: the seeds, and how far the best grid lr's and the finder's quality moved between them."""
    n = len(s.get("seeds") or [])
    if n < 2:
        return f"{n}: -"
    return f"{n}: {_fmt(s.get('best_range'), 2)} / {_fmt(s.get('finder_range'), 2)}"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.lr_grid``: run the grid and the finder, print the summary table."""
    import argparse

    parser = argparse.ArgumentParser(description="The LR finder vs a coarse grid of learning rates, per suite task.")
    parser.add_argument("--json", metavar="PATH", help="rows, rewritten after each one; a re-run resumes from it")
    parser.add_argument("--tasks", metavar="NAMES", help=f"comma-separated, from {', '.join(list_workloads())}")
    parser.add_argument("--seeds", metavar="N,N", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 2 tasks, small builds, a few steps")
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in comma_list(args.seeds) or []]
    except ValueError:
        print(f"error: `--seeds`={args.seeds!r} is not a list of integers. Allowed values: e.g. 0,1,2", file=sys.stderr)
        return 2
    try:
        rows = run_grid(comma_list(args.tasks), seeds, args.json, quick=args.quick)
    except SpeedupConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_summary(summarize(rows)))
    machines = {json.dumps(r["machine"], sort_keys=True) for r in rows if r.get("machine")}
    for m in sorted(machines):
        print(f"machine: {m}")
    if args.json:
        print(f"rows in {args.json}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
