"""The workload suite's summary: medians over seeds per ``(task, method, path)``, ratios to the baseline, markdown
tables.

A path is a precision path of the suite: ``auto`` (bf16 among autotune's and the recipe's choices) or ``no-bf16``
(``no_bf16=True``). A row's ``no_bf16`` says which one it ran (``False`` / ``True``), or ``None`` for a method whose
run does not depend on it (the plain baseline): that row is the baseline of both paths.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from typing import Any

from benchmarks.workloads import get_workload, list_workloads
from lightning_speedups.measure import median

__all__ = [
    "ACC_TOLERANCE",
    "FLOOR",
    "GAIN_TOLERANCE",
    "LOSS_TOLERANCE",
    "PATHS",
    "PATH_FREE_METHODS",
    "TARGETS",
    "baseline_of",
    "does_not_help",
    "format_gain_checks",
    "format_headline",
    "format_summary",
    "format_targets",
    "gain_checks",
    "path_label",
    "row_no_bf16",
    "summarize",
    "target_checks",
]

ACC_TOLERANCE = 0.005  # half a point of accuracy: a worse end than this counts against a method
LOSS_TOLERANCE = 0.01  # a loss higher by this at the end counts against a method
GAIN_TOLERANCE = 0.10  # a plan's predicted step-time gain and its fit's measured one agree within this share
PATHS = {"auto": False, "no-bf16": True}  # a path's name -> the ``no_bf16`` its rows carry
PATH_FREE_METHODS = ("baseline",)  # methods whose run is the same on both paths (their rows carry ``no_bf16=None``)
# autotune's targets on the suite (its first run, medians of 3 seeds): the median held-out task per path, and tasks with
# a target of their own; FLOOR holds on every task, dev and held out
TARGETS = {"auto": 1.5, "no-bf16": 1.3, "gpt_stdlib": 1.5}
FLOOR = 0.97
_ORDER = ("baseline", "fast_train", "autotune_first", "autotune_cached", "advisor_top", "precision_trial", "bf16")
_PATH_ORDER = (None, False, True)


def row_no_bf16(row: dict[str, Any]) -> bool | None:
    """The row's ``no_bf16``. A row written before the field existed reads as ``None`` for a path-free method and as
    ``False`` (the auto path) for the others: what such a run was unless it ran with ``--no-bf16``, which its file
    does not record.

    Example::

        >>> row_no_bf16({"method": "autotune_first"}), row_no_bf16({"method": "baseline"})
        (False, None)
    """
    if "no_bf16" in row:
        return row["no_bf16"]
    return None if row["method"] in PATH_FREE_METHODS else False


def path_label(no_bf16: bool | None) -> str:
    """The path's name in tables: ``auto``, ``no-bf16``, or ``-`` for a path-free row (the baseline of both)."""
    return "-" if no_bf16 is None else ("no-bf16" if no_bf16 else "auto")


def _mode_target_split(task: str, metric: str, split: str) -> tuple[str, float | None, str]:
    """The registered task's mode, target and split now (a held-out task that changed a rule is dev since); a task
    no longer registered keeps its rows' split."""
    if task in list_workloads():
        w = get_workload(task)
        return w.mode, w.target, w.split
    return ("min" if "loss" in metric else "max"), None, split


def _sort_key(tasks: list[str], task: str, method: str, no_bf16: bool | None) -> tuple[int, int, int]:
    """Tables' order: the rows' task order, then path (path-free, auto, no-bf16), then method."""
    return tasks.index(task), _PATH_ORDER.index(no_bf16), _ORDER.index(method) if method in _ORDER else len(_ORDER)


def _group(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str, bool | None], list[dict[str, Any]]]:
    """The rows per ``(task, method, no_bf16)``, in :func:`_sort_key`'s order."""
    groups: dict[tuple[str, str, bool | None], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["task"], r["method"], row_no_bf16(r)), []).append(r)
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    return dict(sorted(groups.items(), key=lambda kv: _sort_key(tasks, *kv[0])))


def _baseline_rows(
    groups: dict[tuple[str, str, bool | None], list[dict[str, Any]]], task: str, no_bf16: bool | None
) -> list[dict[str, Any]]:
    """The baseline rows a method on path ``no_bf16`` is compared with: the path-free ones, and those of the same path
    where a file holds path-specific baselines."""
    rows = groups.get((task, "baseline", None), [])
    return rows if no_bf16 is None else rows + groups.get((task, "baseline", no_bf16), [])


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per ``(task, method, no_bf16)``: the median time to target over seeds (a run that missed counts as infinitely
    slow, so the median is ``None`` when most missed), min and max of the runs that reached it, how many did, the
    median ``quality`` (the metric at the end of the run) and ``ratio`` = the baseline's median over the seeds the
    method ran / the method's median (> 1: sooner), with ``ratio_min`` / ``ratio_max`` over the seeds both reached
    the target in. A method's rows on a path are compared with the baseline rows of that path (:func:`row_no_bf16`
    ``None``, or the same path's); ``no_bf16`` and ``path`` (:func:`path_label`) say which path an entry is.

    Example::

        >>> runs = [("baseline", 0, 4.0), ("baseline", 1, 6.0), ("autotune_first", 0, 2.0), ("autotune_first", 1, 3.0)]
        >>> rows = [dict(task="t", kind="tabular", split="dev", method=m, seed=s, time_to_target_s=t, quality=0.9,
        ...              metric="val_acc", trial_s=0.0) for m, s, t in runs]
        >>> [(s["method"], s["path"], s["median_s"], s["ratio"]) for s in summarize(rows)]
        [('baseline', '-', 5.0, 1.0), ('autotune_first', 'auto', 2.5, 2.0)]
    """
    groups = _group(rows)
    out = []
    for (task, method, no_bf16), group in groups.items():
        times = [r["time_to_target_s"] for r in group]
        reached = [t for t in times if t is not None]
        med = median([math.inf if t is None else t for t in times])
        qualities = [r["quality"] for r in group if r["quality"] is not None]
        metric = group[0]["metric"]
        mode, target, split = _mode_target_split(task, metric, group[0]["split"])
        out.append(
            {
                "task": task,
                "kind": group[0]["kind"],
                "split": split,
                "method": method,
                "no_bf16": no_bf16,
                "path": path_label(no_bf16),
                "metric": metric,
                "mode": mode,
                "target": target,
                "n": len(group),
                "reached": len(reached),
                "median_s": med if math.isfinite(med) else None,
                "min_s": min(reached) if reached else None,
                "max_s": max(reached) if reached else None,
                "quality": median(qualities) if qualities else None,
                "trial_s": median([float(r.get("trial_s") or 0.0) for r in group]),
            }
        )
    for s in out:
        own = groups[(s["task"], s["method"], s["no_bf16"])]
        base_rows = _baseline_rows(groups, s["task"], s["no_bf16"])
        _same_seed_baseline(s, own, base_rows)
        base_times = {r["seed"]: r["time_to_target_s"] for r in base_rows}
        per_seed = [
            base_times[r["seed"]] / r["time_to_target_s"]
            for r in own
            if r["time_to_target_s"] and base_times.get(r["seed"])
        ]
        s["ratio_min"], s["ratio_max"] = (min(per_seed), max(per_seed)) if per_seed else (None, None)
    return out


def _same_seed_baseline(s: dict[str, Any], own: list[dict[str, Any]], base_rows: list[dict[str, Any]]) -> None:
    """``s["ratio"]``, ``s["base_median_s"]`` and ``s["base_quality"]``: the baseline rows ``base_rows`` of the seeds
    ``s``'s rows ``own`` ran (a one-seed check is compared with the baseline of that seed, not with the median of
    three)."""
    seeds = {r["seed"] for r in own}
    base_rows = [r for r in base_rows if r["seed"] in seeds]
    med = (
        median([math.inf if r["time_to_target_s"] is None else r["time_to_target_s"] for r in base_rows])
        if base_rows
        else math.inf
    )
    qualities = [r["quality"] for r in base_rows if r["quality"] is not None]
    s["base_median_s"] = med if math.isfinite(med) else None
    s["base_quality"] = median(qualities) if qualities else None
    s["ratio"] = s["base_median_s"] / s["median_s"] if s["base_median_s"] and s["median_s"] else None


def baseline_of(summary: Sequence[dict[str, Any]], task: str, no_bf16: bool | None) -> dict[str, Any] | None:
    """The baseline entry of :func:`summarize` that a method of ``task`` on path ``no_bf16`` is compared with: that
    path's own baseline where a file holds one, else the path-free one (``None``: the task has no baseline)."""
    by_path = {s["no_bf16"]: s for s in summary if s["task"] == task and s["method"] == "baseline"}
    return by_path.get(no_bf16) or by_path.get(None)


def does_not_help(s: dict[str, Any], base: dict[str, Any]) -> str | None:
    """Why a method does not help against the baseline (``None`` when it does): the baseline over the method's own
    seeds where ``s`` has it (``base_median_s``, ``base_quality``), else the baseline's summary ``base``."""
    base_s = s.get("base_median_s", base["median_s"])
    base_q = s.get("base_quality", base["quality"])
    if s["ratio"] is not None and s["ratio"] < 1.0:
        return f"slower ({s['ratio']:.2f}x)"
    if s["median_s"] is None and base_s is not None:
        return "target missed"
    return _worse_end(s, base_q)


def _worse_end(s: dict[str, Any], base_q: float | None) -> str | None:
    """Whether ``s`` ends worse than the baseline's quality ``base_q`` by more than half a point of accuracy or 0.01
    of loss (``None``: it does not)."""
    if s["quality"] is not None and base_q is not None:
        worse = base_q - s["quality"] if s["mode"] == "max" else s["quality"] - base_q
        if worse > (ACC_TOLERANCE if s["mode"] == "max" else LOSS_TOLERANCE):
            return f"worse end ({s['quality']:.3g} vs {base_q:.3g})"
    return None


def _time(s: dict[str, Any], with_range: bool = False) -> str:
    if s["median_s"] is None:
        return f"not reached ({s['reached']}/{s['n']})"
    text = f"{s['median_s']:.1f} s"
    if with_range:
        text += f" [{s['min_s']:.1f}-{s['max_s']:.1f}]"
    if s["reached"] < s["n"]:
        text += f" ({s['reached']}/{s['n']} reached)"
    return text


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def format_summary(summary: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]] = ()) -> str:
    """Two markdown tables: each task's split, metric and target; then one line per task, path and method: the median
    time to target (the baseline's with its [min-max]), the ratio to the baseline of that path, the quality at the end,
    and where a method does not help (slower, missed, or ending worse by more than half a point of accuracy / 0.01 of
    loss). The baseline's path is "-": its run serves both paths. "n/a": a method with rows on other tasks or paths
    has none here (it does not apply). One line per method rather than a column each keeps every line within 120
    columns, whichever methods ran. With ``rows``, the machine heads the tables and a note says when rows written
    before the ``no_bf16`` field were read as the auto path (:func:`row_no_bf16`)."""
    present = {s["method"] for s in summary}
    methods = [m for m in _ORDER if m != "baseline" and m in present]
    paths = [p for p in (False, True) if any(s["no_bf16"] is p and s["method"] != "baseline" for s in summary)]
    by_key = {(s["task"], s["method"], s["no_bf16"]): s for s in summary}
    tasks = list(dict.fromkeys(s["task"] for s in summary))
    lines = []
    if rows:
        m = rows[0]["machine"]
        lines += [
            f"Machine: {m.get('cpu')} ({m.get('cpu_count')} cores, {m.get('torch_threads')} torch threads), "
            f"torch {m.get('torch')}, device {m.get('device')}.",
            "",
        ]
    lines += ["| task | split | metric (target) |", "|---|---|---|"]
    for task in tasks:
        first = next(s for s in summary if s["task"] == task)
        target = "" if first["target"] is None else f" {first['target']:g}"
        lines.append(_line([task, first["split"], f"{first['metric']} ({first['mode']}{target})"]))
    header = ["task", "path", "method", "time to target", "vs baseline", "quality at the end", "where it does not help"]
    lines += ["", _line(header), "|" + "---|" * len(header)]
    for task in tasks:
        for base in (s for s in summary if s["task"] == task and s["method"] == "baseline"):
            lines.append(_line([task, base["path"], "baseline", _time(base, True), "-", _q(base), "-"]))
        for no_bf16 in paths:
            base = baseline_of(summary, task, no_bf16)
            for method in methods:
                s = by_key.get((task, method, no_bf16))
                if s is None:
                    lines.append(_line([task, path_label(no_bf16), method, "n/a", "-", "-", "-"]))
                    continue
                why = does_not_help(s, base) if base is not None else None
                ratio = "-" if s["ratio"] is None else f"{s['ratio']:.2f}x"
                lines.append(_line([task, s["path"], method, _time(s), ratio, _q(s), why or "-"]))
    notes = (
        "Times: median over seeds of the training seconds to the target (validation not counted), the method's trials "
        "or probe included; vs baseline = the baseline's median over the method's seeds / the method's median. Paths: "
        "auto (bf16 among the choices), no-bf16 (no_bf16=True), - (the plain baseline: one run, the baseline of both). "
        "n/a: no row (fast_train applies to SpeedupMixin models only; precision_trial and bf16 run on auto only)."
    )
    if any("no_bf16" not in r and r["method"] not in PATH_FREE_METHODS for r in rows):
        notes += (
            " Rows without a no_bf16 field (written before it) read as the auto path; those of a run with --no-bf16 "
            "were the no-bf16 path, which their file does not record."
        )
    lines += ["", textwrap.fill(notes, 120)]
    return "\n".join(lines) + "\n"


def target_checks(summary: Sequence[dict[str, Any]], method: str = "autotune_first") -> list[dict[str, Any]]:
    """``method`` against :data:`TARGETS` and :data:`FLOOR`, per path it ran on: the median ratio over the held-out
    tasks, the lowest ratio over every task, the tasks that end worse than their baseline, and each task with a target
    of its own. A task whose run missed its target counts as a ratio of 0.

    Example::

        >>> summary = [dict(task=t, split=sp, method="autotune_first", path="auto", ratio=r, quality=None, mode="max",
        ...                 base_quality=None) for t, sp, r in [("a", "held_out", 1.2), ("b", "held_out", 0.9),
        ...                                                     ("c", "held_out", 1.6), ("d", "dev", 2.0)]]
        >>> c = target_checks(summary)[0]
        >>> (c["path"], c["median"], c["lowest"], c["met"])
        ('auto', 1.2, ('b', 0.9), False)
    """
    out = []
    for path in PATHS:
        rows = [s for s in summary if s["method"] == method and s["path"] == path]
        if not rows:
            continue
        ratios = {s["task"]: s["ratio"] or 0.0 for s in rows}
        held = [ratios[s["task"]] for s in rows if s["split"] == "held_out"]
        worse = [(s["task"], why) for s in rows if (why := _worse_end(s, s.get("base_quality")))]
        lowest = min(ratios.items(), key=lambda kv: kv[1])
        own = {t: (ratios[t], goal) for t, goal in TARGETS.items() if t in ratios}
        med = median(held) if held else None
        met = (
            med is not None
            and med >= TARGETS[path]
            and lowest[1] >= FLOOR
            and not worse
            and all(r >= goal for r, goal in own.values())
        )
        out.append(
            {
                "path": path,
                "held_out": len(held),
                "median": med,
                "lowest": lowest,
                "worse": worse,
                "own": own,
                "met": met,
            }
        )
    return out


def format_targets(checks: Sequence[dict[str, Any]]) -> str:
    """A markdown table of :func:`target_checks`: one line per path, each figure beside its target."""

    def against(value: float, goal: float) -> str:
        return f"{value:.2f}x ({'met' if value >= goal else f'target {goal:g}x'})"

    lines = [
        "| path | held-out median | lowest task (floor) | ends worse | own targets | all met |",
        "|---|---|---|---|---|---|",
    ]
    for c in checks:
        med = "-" if c["median"] is None else against(c["median"], TARGETS[c["path"]])
        task, low = c["lowest"]
        worse = ", ".join(t for t, _ in c["worse"]) or "none"
        own = ", ".join(f"{t} {against(r, goal)}" for t, (r, goal) in c["own"].items()) or "-"
        cells = [c["path"], f"{med} over {c['held_out']}", f"{task} {against(low, FLOOR)}", worse, own]
        lines.append(_line([*cells, "yes" if c["met"] else "no"]))
    return "\n".join(lines) + "\n"


def format_headline(summary: Sequence[dict[str, Any]], method: str = "autotune_first") -> str:
    """The README's table: ``method`` against the plain run on each held-out task and each task with a target of its
    own, one column per path (the ratio, and where it does not help, why), then the held-out median against its
    target. It is written from the suite's file alone, so the README cannot quote rows of another run."""
    by_key = {(s["task"], s["path"]): s for s in summary if s["method"] == method}
    tasks = list(dict.fromkeys(s["task"] for s in summary if s["method"] == method))
    splits = {s["task"]: s["split"] for s in summary}
    shown = [t for t in tasks if splits[t] == "held_out" or t in TARGETS]
    paths = [p for p in PATHS if any(k[1] == p for k in by_key)]
    names = {"auto": "bf16 allowed", "no-bf16": "`no_bf16=True`"}
    lines = [
        _line(["task (metric, target)", "split", "plain run", *(names[p] for p in paths)]),
        "|" + "---|" * (3 + len(paths)),
    ]
    for task in shown:
        cells = []
        for path in paths:
            s = by_key.get((task, path))
            base = baseline_of(summary, task, PATHS[path])
            why = does_not_help(s, base) if s is not None and base is not None else None
            ratio = "-" if s is None or s["ratio"] is None else f"{s['ratio']:.2f}x"
            cells.append(ratio if why is None or why.startswith("slower") else f"{ratio}, {why}")
        first = next(s for s in summary if s["task"] == task)
        base = baseline_of(summary, task, None)
        plain = "-" if base is None else _time(base)
        metric = f"{first['metric']} {first['target']:g}" if first["target"] is not None else first["metric"]
        lines.append(_line([f"{task} ({metric})", first["split"].replace("_", " "), plain, *cells]))
    checks = {c["path"]: c for c in target_checks(summary, method)}
    medians = []
    for path in paths:
        c = checks[path]
        medians.append("-" if c["median"] is None else f"**{c['median']:.2f}x** (target {TARGETS[path]:g}x)")
    lines.append(_line(["median held-out task", "", "", *medians]))
    return "\n".join(lines) + "\n"


def _q(s: dict[str, Any]) -> str:
    return "-" if s["quality"] is None else f"{s['quality']:.3f}"


def gain_checks(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per autotune row that predicted a gain: the gain its fit measured against the same seed's baseline of its path
    (path-free, or the same path's where a file holds one).

    ``fit_gain`` = the baseline's training seconds per sample / the plan's (per step, with the plan's batch
    multiplier), over the whole planned run with validation excluded: what the Trainer ran, with every kept callback's
    cost in it. ``within`` says whether it is within :data:`GAIN_TOLERANCE` of ``predicted`` (the plan's
    ``TunePlan.gain``: its kept trials' ratios times its methods' per-step costs). ``no_bf16`` and ``path`` say the
    row's path. Rows without the fields (older files) are left out.

    Example::

        >>> rows = [dict(task="t", method="baseline", seed=0, train_s=10.0, steps=100, batch_scale=1),
        ...         dict(task="t", method="autotune_first", seed=0, train_s=8.0, steps=50, batch_scale=2,
        ...              predicted_gain=1.3, no_bf16=True)]
        >>> [(c["path"], c["fit_gain"], c["within"]) for c in gain_checks(rows)]
        [('no-bf16', 1.25, True)]
    """
    base = {(r["task"], r["seed"], row_no_bf16(r)): r for r in rows if r["method"] == "baseline" and r.get("train_s")}
    out = []
    for r in rows:
        if not str(r["method"]).startswith("autotune") or r.get("predicted_gain") is None or not r.get("train_s"):
            continue
        no_bf16 = row_no_bf16(r)
        b = base.get((r["task"], r["seed"], no_bf16)) or base.get((r["task"], r["seed"], None))
        if b is None or not b.get("steps") or not r.get("steps"):
            continue
        fit = (b["train_s"] / b["steps"]) / (r["train_s"] / (r["steps"] * int(r.get("batch_scale") or 1)))
        predicted = float(r["predicted_gain"])
        out.append(
            {
                "task": r["task"],
                "method": r["method"],
                "no_bf16": no_bf16,
                "path": path_label(no_bf16),
                "seed": r["seed"],
                "predicted": predicted,
                "fit_gain": fit,
                "within": abs(fit / predicted - 1.0) <= GAIN_TOLERANCE,
            }
        )
    return out


def format_gain_checks(checks: Sequence[dict[str, Any]]) -> str:
    """A markdown table of :func:`gain_checks`, one line per task, path and method: the seeds' predicted and measured
    gains, and how many agree within 10%."""
    groups: dict[tuple[str, str, bool | None], list[dict[str, Any]]] = {}
    for c in checks:
        groups.setdefault((c["task"], c["method"], c["no_bf16"]), []).append(c)
    tasks = list(dict.fromkeys(c["task"] for c in checks))
    lines = [
        "| task | path | method | predicted (per seed) | the fit measured (per seed) | within 10% |",
        "|---|---|---|---|---|---|",
    ]
    for (task, method, no_bf16), group in sorted(groups.items(), key=lambda kv: _sort_key(tasks, *kv[0])):
        predicted = ", ".join(f"{c['predicted']:.2f}x" for c in group)
        fit = ", ".join(f"{c['fit_gain']:.2f}x" for c in group)
        within = f"{sum(c['within'] for c in group)}/{len(group)}"
        lines.append(_line([task, path_label(no_bf16), method, predicted, fit, within]))
    return "\n".join(lines) + "\n"
