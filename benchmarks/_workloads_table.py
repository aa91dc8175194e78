"""The workload suite's summary: medians over seeds per ``(task, method)``, ratios to the baseline, a markdown table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from benchmarks.workloads import get_workload, list_workloads
from lightning_speedups.measure import median

__all__ = [
    "ACC_TOLERANCE",
    "GAIN_TOLERANCE",
    "LOSS_TOLERANCE",
    "does_not_help",
    "format_gain_checks",
    "format_summary",
    "gain_checks",
    "summarize",
]

ACC_TOLERANCE = 0.005  # half a point of accuracy: a worse end than this counts against a method
LOSS_TOLERANCE = 0.01  # a loss higher by this at the end counts against a method
GAIN_TOLERANCE = 0.10  # a plan's predicted step-time gain and its fit's measured one agree within this share
_DEFAULT_COLUMNS = ("fast_train", "autotune_first", "autotune_cached")
_ORDER = ("baseline", "fast_train", "autotune_first", "autotune_cached", "advisor_top", "precision_trial", "bf16")


def _mode_target_split(task: str, metric: str, split: str) -> tuple[str, float | None, str]:
    """The registered task's mode, target and split now (a held-out task that changed a rule is dev since); a task
    no longer registered keeps its rows' split."""
    if task in list_workloads():
        w = get_workload(task)
        return w.mode, w.target, w.split
    return ("min" if "loss" in metric else "max"), None, split


def _group(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["task"], r["method"]), []).append(r)
    order = {m: i for i, m in enumerate(_ORDER)}
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    return dict(sorted(groups.items(), key=lambda kv: (tasks.index(kv[0][0]), order.get(kv[0][1], len(order)))))


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per ``(task, method)``: the median time to target over seeds (a run that missed counts as infinitely slow,
    so the median is ``None`` when most missed), min and max of the runs that reached it, how many did, the median
    ``quality`` (the metric at the end of the run) and ``ratio`` = the baseline's median over the seeds the method
    ran / the method's median (> 1: sooner), with ``ratio_min`` / ``ratio_max`` over the seeds both reached the
    target in.

    Example::

        >>> runs = [("baseline", 0, 4.0), ("baseline", 1, 6.0), ("autotune_first", 0, 2.0), ("autotune_first", 1, 3.0)]
        >>> rows = [dict(task="t", kind="tabular", split="dev", method=m, seed=s, time_to_target_s=t, quality=0.9,
        ...              metric="val_acc", trial_s=0.0) for m, s, t in runs]
        >>> [(s["method"], s["median_s"], s["ratio"]) for s in summarize(rows)]
        [('baseline', 5.0, 1.0), ('autotune_first', 2.5, 2.0)]
    """
    groups = _group(rows)
    out = []
    for (task, method), group in groups.items():
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
        _same_seed_baseline(s, groups)
        seed_times = {
            m: {r["seed"]: r["time_to_target_s"] for r in groups[(s["task"], m)]}
            for m in (s["method"], "baseline")
            if (s["task"], m) in groups
        }
        per_seed = [
            seed_times["baseline"][k] / t
            for k, t in seed_times.get(s["method"], {}).items()
            if t and seed_times.get("baseline", {}).get(k)
        ]
        s["ratio_min"], s["ratio_max"] = (min(per_seed), max(per_seed)) if per_seed else (None, None)
    return out


def _same_seed_baseline(s: dict[str, Any], groups: dict[tuple[str, str], list[dict[str, Any]]]) -> None:
    """``s["ratio"]``, ``s["base_median_s"]`` and ``s["base_quality"]``: the baseline over the seeds ``s``'s method
    ran (a one-seed check is compared with the baseline of that seed, not with the median of three)."""
    seeds = {r["seed"] for r in groups[(s["task"], s["method"])]}
    base_rows = [r for r in groups.get((s["task"], "baseline"), []) if r["seed"] in seeds]
    med = (
        median([math.inf if r["time_to_target_s"] is None else r["time_to_target_s"] for r in base_rows])
        if base_rows
        else math.inf
    )
    qualities = [r["quality"] for r in base_rows if r["quality"] is not None]
    s["base_median_s"] = med if math.isfinite(med) else None
    s["base_quality"] = median(qualities) if qualities else None
    s["ratio"] = s["base_median_s"] / s["median_s"] if s["base_median_s"] and s["median_s"] else None


def does_not_help(s: dict[str, Any], base: dict[str, Any]) -> str | None:
    """Why a method does not help against the baseline (``None`` when it does): the baseline over the method's own
    seeds where ``s`` has it (``base_median_s``, ``base_quality``), else the baseline's summary ``base``."""
    base_s = s.get("base_median_s", base["median_s"])
    base_q = s.get("base_quality", base["quality"])
    if s["ratio"] is not None and s["ratio"] < 1.0:
        return f"slower ({s['ratio']:.2f}x)"
    if s["median_s"] is None and base_s is not None:
        return "target missed"
    if s["quality"] is not None and base_q is not None:
        worse = base_q - s["quality"] if s["mode"] == "max" else s["quality"] - base_q
        if worse > (ACC_TOLERANCE if s["mode"] == "max" else LOSS_TOLERANCE):
            return f"worse end ({s['quality']:.3g} vs {base_q:.3g})"
    return None


def _time(s: dict[str, Any] | None, with_range: bool = False) -> str:
    if s is None:
        return "n/a"
    if s["median_s"] is None:
        return f"not reached ({s['reached']}/{s['n']})"
    text = f"{s['median_s']:.1f} s"
    if with_range:
        text += f" [{s['min_s']:.1f}-{s['max_s']:.1f}]"
    if s["reached"] < s["n"]:
        text += f" ({s['reached']}/{s['n']} reached)"
    return text if s["method"] == "baseline" or s["ratio"] is None else f"{text}, {s['ratio']:.2f}x"


def format_summary(summary: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]] = ()) -> str:
    """A markdown table, one line per task: the baseline's median [min-max] time to target, each method's median and
    ratio, the qualities at the end, and where a method does not help (slower, missed, or ending worse by more than
    half a point of accuracy / 0.01 of loss). "n/a": the method has no row (it does not apply to the task)."""
    present = {s["method"] for s in summary}  # the default methods always (n/a says one does not apply), others if run
    methods = [m for m in _ORDER if m != "baseline" and (m in _DEFAULT_COLUMNS or m in present)]
    by_key = {(s["task"], s["method"]): s for s in summary}
    tasks = list(dict.fromkeys(s["task"] for s in summary))
    lines = []
    if rows:
        m = rows[0]["machine"]
        lines += [
            f"Machine: {m.get('cpu')} ({m.get('cpu_count')} cores, {m.get('torch_threads')} torch threads), "
            f"torch {m.get('torch')}, device {m.get('device')}.",
            "",
        ]
    header = [
        "task",
        "split",
        "metric (target)",
        "baseline [min-max]",
        *methods,
        "quality at the end",
        "where it does not help",
    ]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for task in tasks:
        base = by_key.get((task, "baseline"))
        any_s = base or next(s for s in summary if s["task"] == task)
        target = "" if any_s["target"] is None else f" {any_s['target']:g}"
        qualities = [
            f"{m}: {'n/a' if by_key.get((task, m)) is None else _q(by_key[(task, m)])}" for m in ("baseline", *methods)
        ]
        bad = [
            f"{m}: {why}"
            for m in methods
            if base and (task, m) in by_key
            for why in [does_not_help(by_key[(task, m)], base)]
            if why
        ]
        cells = [
            task,
            any_s["split"],
            f"{any_s['metric']} ({any_s['mode']}{target})",
            _time(base, True),
            *(_time(by_key.get((task, m))) for m in methods),
            "; ".join(qualities),
            "; ".join(bad) or "-",
        ]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    lines += [
        "",
        "Times: median over seeds of the training seconds to the target (validation not counted), the "
        "method's trials or probe included; ratio = the baseline's median over the method's seeds / the "
        "method's median. n/a: no row (fast_train applies to SpeedupMixin models only).",
    ]
    return "\n".join(lines) + "\n"


def _q(s: dict[str, Any]) -> str:
    return "-" if s["quality"] is None else f"{s['quality']:.3f}"


def gain_checks(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per autotune row that predicted a gain: the gain its fit measured against the same seed's baseline.

    ``fit_gain`` = the baseline's training seconds per sample / the plan's (per step, with the plan's batch
    multiplier), over the whole planned run with validation excluded: what the Trainer ran, with every kept callback's
    cost in it. ``within`` says whether it is within :data:`GAIN_TOLERANCE` of ``predicted`` (the plan's
    ``TunePlan.gain``: its kept trials' ratios times its methods' per-step costs). Rows without the fields (older
    files) are left out.

    Example::

        >>> rows = [dict(task="t", method="baseline", seed=0, train_s=10.0, steps=100, batch_scale=1),
        ...         dict(task="t", method="autotune_first", seed=0, train_s=8.0, steps=50, batch_scale=2,
        ...              predicted_gain=1.3)]
        >>> [(c["fit_gain"], c["within"]) for c in gain_checks(rows)]
        [(1.25, True)]
    """
    base = {(r["task"], r["seed"]): r for r in rows if r["method"] == "baseline" and r.get("train_s")}
    out = []
    for r in rows:
        b = base.get((r["task"], r["seed"]))
        if not str(r["method"]).startswith("autotune") or r.get("predicted_gain") is None or not r.get("train_s"):
            continue
        if b is None or not b.get("steps") or not r.get("steps"):
            continue
        fit = (b["train_s"] / b["steps"]) / (r["train_s"] / (r["steps"] * int(r.get("batch_scale") or 1)))
        predicted = float(r["predicted_gain"])
        out.append(
            {
                "task": r["task"],
                "method": r["method"],
                "seed": r["seed"],
                "predicted": predicted,
                "fit_gain": fit,
                "within": abs(fit / predicted - 1.0) <= GAIN_TOLERANCE,
            }
        )
    return out


def format_gain_checks(checks: Sequence[dict[str, Any]]) -> str:
    """A markdown table of :func:`gain_checks`, one line per task and method: the seeds' predicted and measured
    gains, and how many agree within 10%."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for c in checks:
        groups.setdefault((c["task"], c["method"]), []).append(c)
    lines = [
        "| task | method | predicted (per seed) | the fit measured (per seed) | within 10% |",
        "|---|---|---|---|---|",
    ]
    for (task, method), group in groups.items():
        predicted = ", ".join(f"{c['predicted']:.2f}x" for c in group)
        fit = ", ".join(f"{c['fit_gain']:.2f}x" for c in group)
        lines.append(f"| {task} | {method} | {predicted} | {fit} | {sum(c['within'] for c in group)}/{len(group)} |")
    return "\n".join(lines) + "\n"
