"""Run the registered techniques' benchmarks and format their rows (table, JSON, markdown, PNG)."""

from __future__ import annotations

import datetime
import importlib
import inspect
import json
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from lightning_speedups._errors import SpeedupConfigError, check_range
from lightning_speedups._registry import get_technique, list_techniques
from lightning_speedups.benchmarks._common import BenchRow
from lightning_speedups.measure import machine_info

__all__ = [
    "END_TO_END",
    "SUITES",
    "BenchFailure",
    "format_markdown",
    "format_table",
    "run_benchmarks",
    "split_rows",
    "write_json",
    "write_plots",
]

# rows that measure a whole run reaching its accuracy (what users feel), shown first and charted first
END_TO_END = ("recipe", "autotune", "workloads")


def split_rows(rows: Sequence[BenchRow]) -> tuple[list[BenchRow], list[BenchRow]]:
    """``(end_to_end, components)``: whole-run time-to-accuracy rows, then single-technique rows."""
    return [r for r in rows if r.technique in END_TO_END], [r for r in rows if r.technique not in END_TO_END]


class BenchFailure(RuntimeError):
    """A technique's benchmark raised; the other techniques still ran."""


# benchmarks that are not one technique's: run only when named in ``--only`` (the workload suite trains seven tasks
# with every method over three seeds, hours in full mode), so they are not registered techniques (no callback,
# notebook or docs page of their own)
SUITES: dict[str, str] = {"workloads": "lightning_speedups.benchmarks.workloads_bench:run"}


def _select(only: Sequence[str] | None, skip: Sequence[str] | None) -> list[str]:
    names = [n for n in list_techniques() if get_technique(n).bench is not None]
    for given in [*(only or []), *(skip or [])]:
        if given not in list_techniques() and given not in SUITES:
            raise SpeedupConfigError(
                f"`technique`={given!r} is not registered. Allowed values: {', '.join(map(repr, [*names, *SUITES]))}."
            )
    if only:
        names = [n for n in names if n in only]
    names = sorted(names, key=lambda n: n != "recipes")  # the end-to-end results first
    names = [n for n in names if n not in (skip or [])]
    return names + [n for n in SUITES if n in (only or []) and n not in (skip or [])]


def _load_bench(name: str) -> Callable[..., Any]:
    if name in SUITES:
        module, func = SUITES[name].split(":")
        return getattr(importlib.import_module(module), func)
    bench = get_technique(name).load_bench()
    assert bench is not None  # _select keeps only techniques with a bench
    return bench


def run_benchmarks(
    quick: bool = True,
    only: Sequence[str] | None = None,
    skip: Sequence[str] | None = None,
    echo: bool = True,
    target: float | None = None,
    no_bf16: bool = False,
) -> tuple[list[BenchRow], dict[str, str]]:
    """Run each selected technique's ``run(quick)`` in turn; return all rows and ``{technique: error}``.

    ``target`` (a validation accuracy) goes to the benchmarks that measure time to a target accuracy; ``no_bf16``
    to those that choose a precision (so a CPU with bf16 units can check the plan for one without).
    """
    if target is not None:
        check_range("target", target, 0.0, 1.0, low_inclusive=False)
    rows: list[BenchRow] = []
    errors: dict[str, str] = {}
    for name in _select(only, skip):
        bench = _load_bench(name)
        start = time.perf_counter()
        if echo:
            print(f"[bench] {name} ...", flush=True)
        try:
            kwargs: dict[str, Any] = {"quick": quick}
            params = inspect.signature(bench).parameters
            if target is not None and "target" in params:
                kwargs["target"] = target
            if no_bf16 and "no_bf16" in params:
                kwargs["no_bf16"] = True
            new = list(bench(**kwargs))
        except Exception as err:  # one broken benchmark must not hide the others' results
            errors[name] = f"{type(err).__name__}: {err}"
            if echo:
                traceback.print_exc()
            continue
        rows.extend(new)
        if echo:
            print(f"[bench] {name}: {len(new)} row(s) in {time.perf_counter() - start:.1f} s", flush=True)
    return rows, errors


def _fmt_acc(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _fmt_delta(row: BenchRow) -> str:
    d = row.accuracy_delta
    return "-" if d is None else f"{100 * d:+.1f} pt"


def _range(r: BenchRow) -> str:
    lo = r.extra.get("ratio_min")
    hi = r.extra.get("ratio_max")
    return f"{r.ratio:.2f}x" if lo is None or hi is None else f"{r.ratio:.2f}x [{lo:.2f}-{hi:.2f}]"


def _table_rows(rows: Iterable[BenchRow]) -> list[list[str]]:
    out = []
    for r in rows:
        reached = r.ratio == r.ratio and r.ratio > 0  # nan or 0: a target was not reached (the note says which)
        # below 1.05x: "no speedup", once (a note that already says so is not repeated); a row scoring a choice
        # against the best one (at most 1x by construction) is a quality ratio, not a speedup
        quality = bool(r.extra.get("quality_ratio"))
        verdict = "no speedup" if reached and r.ratio < 1.05 and "no speedup" not in r.note and not quality else ""
        out.append(
            [
                r.technique,
                r.variant,
                r.metric,
                _range(r) if reached else "not reached",
                _fmt_acc(r.accuracy_baseline),
                _fmt_acc(r.accuracy_candidate),
                _fmt_delta(r),
                "; ".join(x for x in (verdict, r.note) if x),
            ]
        )
    return out


_HEADER = ["technique", "variant", "metric", "speedup", "acc base", "acc cand", "acc delta", "note"]


def format_table(rows: Sequence[BenchRow]) -> str:
    """A plain-text table, one line per row, ratio = times faster than the baseline measured in the same run."""
    body = _table_rows(rows)
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(_HEADER)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(_HEADER, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def format_markdown(rows: Sequence[BenchRow], machine: dict[str, Any] | None = None) -> str:
    """Markdown: the machine, then the end-to-end table, then the single-technique table."""
    machine = machine or machine_info()
    lines = [
        f"Machine: {machine['cpu']} ({machine['cpu_count']} cores, {machine['torch_threads']} torch threads), "
        f"torch {machine['torch']}, device {machine['device']}.",
    ]
    end_to_end, components = split_rows(rows)
    for title, group in (
        ("End to end (time to accuracy, [min-max] over runs)", end_to_end),
        ("Single techniques", components),
    ):
        if not group:
            continue
        lines += ["", f"**{title}**", "", "| " + " | ".join(_HEADER) + " |", "|" + "---|" * len(_HEADER)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in b) + " |" for b in _table_rows(group)]
    return "\n".join(lines) + "\n"


def write_json(path: str | Path, rows: Sequence[BenchRow], errors: dict[str, str], quick: bool) -> None:
    payload = {
        "machine": machine_info(),
        "date": datetime.date.today().isoformat(),  # the evidence page prints it once per table
        "quick": quick,
        "rows": [r.as_dict() for r in rows],
        "errors": errors,
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload, indent=2, default=str))


def write_plots(directory: str | Path, rows: Sequence[BenchRow]) -> list[Path]:
    """Speedup bars (log scale) and, where rows carry ``extra['curve']``, accuracy-vs-time curves, as PNG files."""
    from lightning_speedups._errors import require

    require("matplotlib", "plots", "Benchmark charts")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    end_to_end, components = split_rows(rows)
    for name, group, title in (
        ("end_to_end.png", end_to_end, "whole run: time to the target accuracy vs the plain baseline (min-max bars)"),
        ("components.png", components, "single techniques (their own metric; not the whole run)"),
    ):
        if group:
            written.append(_bars(plt, directory / name, group, title))
    curves = [r for r in rows if r.extra.get("curves")]
    if curves:
        fig, ax = plt.subplots(figsize=(7, 4))
        for r in curves:
            for label, (times, accs) in r.extra["curves"].items():
                ax.plot(times, accs, marker=".", label=f"{r.technique}: {label}")
        ax.set_xlabel("wall-clock seconds")
        ax.set_ylabel("validation accuracy")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = directory / "accuracy_vs_time.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def _bars(plt: Any, path: Path, rows: Sequence[BenchRow], title: str) -> Path:
    import textwrap

    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.55 * len(rows) + 1.2)))
    labels = ["\n".join(textwrap.wrap(f"{r.technique}: {r.variant}", 48)) for r in rows]
    ratios = [r.ratio if r.ratio == r.ratio else 0.0 for r in rows]
    lo = [max(x - r.extra.get("ratio_min", x), 0.0) for r, x in zip(rows, ratios)]
    hi = [max(r.extra.get("ratio_max", x) - x, 0.0) for r, x in zip(rows, ratios)]
    ax.barh(
        range(len(rows)),
        [max(x, 1e-3) for x in ratios],
        xerr=[lo, hi],
        capsize=3,
        color=["tab:green" if x >= 1.05 else "tab:gray" for x in ratios],
    )
    for i, x in enumerate(ratios):  # the median, written at the bar's end
        ax.text(max(x, 1e-3) * 1.03, i - 0.25, f"{x:.2f}x" if x > 0 else "not reached", fontsize=8)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}x"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: f"{v:g}x"))
    ax.set_xlabel("times faster than the baseline (same run; median, bars: min-max over runs)")
    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=9)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def bench_main(run: Callable[..., list[BenchRow]], argv: Sequence[str] | None = None) -> None:
    """Command-line entry of one benchmark module: ``python -m lightning_speedups.benchmarks.<x> [--full]
    [--threads N]``; prints the machine, the table and the wall time.

    ``--threads 1`` helps on a machine shared with other jobs, where spinning OpenMP threads distort timings.
    """
    import argparse

    import torch

    parser = argparse.ArgumentParser(description=(run.__doc__ or "").strip().splitlines()[0] if run.__doc__ else None)
    parser.add_argument("--full", action="store_true", help="full mode: larger sizes, more repeats")
    parser.add_argument("--threads", type=int, metavar="N", help="torch intra-op threads")
    parser.add_argument("--no-bf16", action="store_true", help="never choose bf16 (where the bench chooses one)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(machine_info())
    start = time.perf_counter()
    extra = {"no_bf16": True} if args.no_bf16 and "no_bf16" in inspect.signature(run).parameters else {}
    rows = run(quick=not args.full, **extra)
    print(format_table(rows))
    print(f"({'full' if args.full else 'quick'} mode, {time.perf_counter() - start:.1f} s)")
