"""Run the registered techniques' benchmarks and format their rows (table, JSON, markdown, PNG)."""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import inspect
import json
import sys
import textwrap
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from lightning_speedups._errors import SpeedupConfigError, check_range
from lightning_speedups._registry import get_technique, list_techniques
from lightning_speedups.benchmarks._common import BenchRow, quiet_lightning
from lightning_speedups.measure import machine_info

__all__ = [
    "END_TO_END",
    "MOVED_OUT",
    "TABLE_WIDTH",
    "BenchFailure",
    "format_markdown",
    "format_table",
    "read_json",
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


# names the bench ran before the project's evidence harness left the package (it is not installed): where they run now
MOVED_OUT: dict[str, str] = {
    "workloads": "the workload suite runs from a clone of the repository: `python -m benchmarks.workloads_bench`",
}


def _select(only: Sequence[str] | None, skip: Sequence[str] | None) -> list[str]:
    names = [n for n in list_techniques() if get_technique(n).bench is not None]
    for given in [*(only or []), *(skip or [])]:
        if given not in list_techniques():
            hint = f" HINT: {MOVED_OUT[given]}." if given in MOVED_OUT else ""
            raise SpeedupConfigError(
                f"`technique`={given!r} is not registered. Allowed values: {', '.join(map(repr, names))}.{hint}"
            )
    if only:
        names = [n for n in names if n in only]
    names = sorted(names, key=lambda n: n != "recipes")  # the end-to-end results first
    return [n for n in names if n not in (skip or [])]


def _load_bench(name: str) -> Callable[..., Any]:
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
    to those that choose a precision (so a CPU with bf16 units can check the plan for one without). With ``echo``,
    a progress bar per section (on stderr); every section runs inside :func:`quiet_lightning`.
    """
    if target is not None:
        check_range("target", target, 0.0, 1.0, low_inclusive=False)
    rows: list[BenchRow] = []
    errors: dict[str, str] = {}
    names = _select(only, skip)
    with _progress(names, echo) as progress:
        for name in names:
            progress.begin(name)
            try:
                with quiet_lightning():
                    new = list(_call_bench(name, quick, target, no_bf16))
            except Exception as err:  # one broken benchmark must not hide the others' results
                errors[name] = f"{type(err).__name__}: {err}"
                progress.end(name, "FAILED")
                if echo:
                    traceback.print_exc()
                continue
            rows.extend(new)
            progress.end(name, f"{len(new)} row{'s' if len(new) != 1 else ''}")
    return rows, errors


def _call_bench(name: str, quick: bool, target: float | None, no_bf16: bool) -> list[BenchRow]:
    bench = _load_bench(name)
    kwargs: dict[str, Any] = {"quick": quick}
    params = inspect.signature(bench).parameters
    if target is not None and "target" in params:
        kwargs["target"] = target
    if no_bf16 and "no_bf16" in params:
        kwargs["no_bf16"] = True
    return bench(**kwargs)


class _PlainProgress:
    """One line as a section starts and one as it ends: for logs (stderr is not a terminal), or without rich."""

    def __init__(self, echo: bool) -> None:
        self.echo = echo
        self.start = 0.0

    def begin(self, name: str) -> None:
        self.start = time.perf_counter()
        if self.echo:
            print(f"[bench] {name} ...", file=sys.stderr, flush=True)

    def end(self, name: str, status: str) -> None:
        if self.echo:
            print(f"[bench] {name}: {status} in {time.perf_counter() - self.start:.1f} s", file=sys.stderr, flush=True)


class _RichProgress:
    """A rich progress bar per section (rich is what Lightning's ``RichProgressBar`` uses): waiting, running (a
    pulsing bar and the elapsed time), then done with its row count."""

    def __init__(self, names: Sequence[str], console: Any) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=30),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
            console=console,
        )
        width = max((len(n) for n in names), default=0)
        self.tasks = {n: self.progress.add_task(n.ljust(width), total=1, start=False, status="") for n in names}

    def begin(self, name: str) -> None:
        self.progress.start_task(self.tasks[name])
        self.progress.update(self.tasks[name], total=None, status="running")

    def end(self, name: str, status: str) -> None:
        self.progress.update(self.tasks[name], total=1, completed=1, status=status)
        self.progress.stop_task(self.tasks[name])


@contextlib.contextmanager
def _progress(names: Sequence[str], echo: bool) -> Iterator[_PlainProgress | _RichProgress]:
    console = None
    if echo and importlib.util.find_spec("rich") is not None:
        from rich.console import Console

        console = Console(stderr=True)
    if console is None or not console.is_terminal:
        yield _PlainProgress(echo)
        return
    bars = _RichProgress(names, console)
    with bars.progress:
        yield bars


def _fmt_acc(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _fmt_delta(row: BenchRow) -> str:
    d = row.accuracy_delta
    return "-" if d is None else f"{100 * d:+.1f} pt"


def _range(r: BenchRow) -> str:
    lo = r.extra.get("ratio_min")
    hi = r.extra.get("ratio_max")
    return f"{r.ratio:.2f}x" if lo is None or hi is None else f"{r.ratio:.2f}x [{lo:.2f}-{hi:.2f}]"


def _reached(r: BenchRow) -> bool:
    return r.ratio == r.ratio and r.ratio > 0  # nan or 0: a target accuracy was not reached (the note says which)


def _no_speedup(r: BenchRow) -> bool:
    """Below 1.05x; a row scoring a choice against the best one (at most 1x by construction) is a quality ratio, not
    a speedup."""
    return _reached(r) and r.ratio < 1.05 and not r.extra.get("quality_ratio")


def _table_rows(rows: Iterable[BenchRow]) -> list[list[str]]:
    """The markdown tables' cells (the evidence page's too), notes included."""
    out = []
    for r in rows:
        # "no speedup" once: a note that already says so is not repeated
        verdict = "no speedup" if _no_speedup(r) and "no speedup" not in r.note else ""
        out.append(
            [
                r.technique,
                r.variant,
                r.metric,
                _range(r) if _reached(r) else "not reached",
                _fmt_acc(r.accuracy_baseline),
                _fmt_acc(r.accuracy_candidate),
                _fmt_delta(r),
                "; ".join(x for x in (verdict, r.note) if x),
            ]
        )
    return out


_HEADER = ["technique", "variant", "metric", "speedup", "acc base", "acc cand", "acc delta", "note"]
# the terminal table: the notes stay in the JSON and markdown outputs
_SHORT_HEADER = ["technique", "what was compared", "speedup [min-max]", "accuracy change"]
TABLE_WIDTH = 120


def _short_cells(r: BenchRow) -> list[str]:
    one_run = r.extra.get("ratio_min") == r.extra.get("ratio_max")  # an interval of one run says nothing more
    speedup = "not reached" if not _reached(r) else f"{r.ratio:.2f}x" if one_run else _range(r)
    return [
        r.technique,
        f"{r.variant}: {r.metric}",
        f"{speedup} (no speedup)" if _no_speedup(r) else speedup,
        _fmt_delta(r),
    ]


def format_table(rows: Sequence[BenchRow], width: int = TABLE_WIDTH) -> str:
    """A plain-text table at most ``width`` columns wide (technique, what was compared, speedup [min-max] over runs,
    accuracy change); the "what was compared" column wraps. Speedup = times faster than the baseline measured in the
    same run. The long notes are in :func:`format_markdown` and :func:`write_json`.

    Example::

        >>> row = BenchRow("optim", "fused Adam vs for-loop Adam", "step time", 2.0, 1.0, 2.0)
        >>> print(format_table([row]))
        technique  what was compared                       speedup [min-max]  accuracy change
        ---------  --------------------------------------  -----------------  ---------------
        optim      fused Adam vs for-loop Adam: step time  2.00x              -
    """
    body = [_short_cells(r) for r in rows]
    widths = [max([len(h), *(len(b[i]) for b in body)]) for i, h in enumerate(_SHORT_HEADER)]
    room = width - sum(widths) + widths[1] - 2 * (len(widths) - 1)  # what the other columns leave to "compared"
    widths[1] = max(min(widths[1], room), len(_SHORT_HEADER[1]))
    lines = [_line(_SHORT_HEADER, widths), _line(["-" * w for w in widths], widths)]
    for cells in body:
        wrapped = textwrap.wrap(cells[1], widths[1], break_on_hyphens=False) or [""]
        lines.append(_line([cells[0], wrapped[0], *cells[2:]], widths))
        lines += [_line(["", more, "", ""], widths) for more in wrapped[1:]]
    return "\n".join(lines)


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()


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


def read_json(path: str | Path) -> dict[str, Any]:
    """What :func:`write_json` wrote, its rows as :class:`BenchRow` s again (``machine``, ``date``, ``quick``,
    ``rows``, ``errors``), so a run's tables can be printed again without running anything.

    Raises:
        SpeedupConfigError: ``path`` is not a file that ``lightning-speedups bench --json`` wrote (a folder, another
            JSON, no JSON at all).

    Example::

        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "bench.json"
        >>> write_json(path, [BenchRow("optim", "fused Adam", "step time", 2.0, 1.0, 2.0)], {}, quick=True)
        >>> read_json(path)["rows"][0].ratio
        2.0
    """
    try:
        payload = json.loads(Path(path).read_text())
    except (OSError, ValueError):  # a folder, a missing file, not JSON
        payload = None
    if not isinstance(payload, dict) or not isinstance(payload.get("rows"), list) or "machine" not in payload:
        raise SpeedupConfigError(
            f"`from_json`={str(path)!r} is not a file `lightning-speedups bench --json` wrote (a JSON dict with "
            "`machine` and `rows`). HINT: the project's evidence page (a folder of results) is made from a clone of "
            "the repository: `python -m benchmarks.evidence --from-json docs/_data`."
        )
    rows = [BenchRow(**{k: v for k, v in r.items() if k != "accuracy_delta"}) for r in payload["rows"]]
    return {**payload, "rows": rows, "errors": payload.get("errors", {})}


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
    with quiet_lightning():
        rows = run(quick=not args.full, **extra)
    print(format_table(rows))
    print(f"({'full' if args.full else 'quick'} mode, {time.perf_counter() - start:.1f} s)")
