"""The evidence page, ``docs/evidence.md``: the committed results (``docs/_data/*.json``) collected into one markdown
page, one section per technique with a stable name, each table under its machine and date. Nothing is measured here.

Regenerate it from the repository's root with ``python -m benchmarks.evidence --from-json docs/_data --markdown
docs/evidence.md`` (without ``--markdown`` it prints the page).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lightning_speedups.benchmarks._common import BenchRow
from lightning_speedups.benchmarks.runner import _HEADER, _table_rows

__all__ = ["EVIDENCE_SECTIONS", "ROW_FILES", "format_evidence", "main"]

# benchmark technique -> section of the evidence page, in page order; docstrings cite "docs/evidence.md, <section>",
# so a section keeps its name
EVIDENCE_SECTIONS: dict[str, str] = {
    "recipe": "Recipes",
    "autotune": "autotune",
    "workloads": "Workloads",
    "batch_size_finder": "Batch-size finder",
    "lr_finder": "LR finder",
    "advisor": "Advisor",
    "measure": "Measuring",
    "sequence_batching": "Sequence batching",
    "pruning": "Pruning",
    "qat": "Quantization",
    "precision": "Trainer settings",
    "optim": "Optimizers",
    "finetune": "Fine-tuning",
    "device_data": "Data on the device",
    "channels_last": "channels_last",
    "compile": "torch.compile",
    "ema": "EMA",
    "fast_schedule": "FastSchedule",
    "label_smoothing": "Label smoothing",
    "progressive_resizing": "Progressive resizing",
}
_NOTES = "evidence_notes.json"  # hand-kept findings (simulations, transcribed runs) and dates the raw files lack


def _machine_line(machine: dict[str, Any] | str, date: str | None) -> str:
    if not isinstance(machine, str):
        machine = (
            f"{machine.get('cpu')} ({machine.get('cpu_count')} cores, {machine.get('torch_threads')} torch threads), "
            f"torch {machine.get('torch')}, device {machine.get('device')}"
        )
    return f"Machine: {machine}. Date: {date or 'not recorded'}."


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows])


def _bench_run(payload: dict[str, Any], head: str, source: str) -> list[tuple[str, str, str]]:
    """A ``lightning-speedups bench --json`` run: one table per technique."""
    rows = [BenchRow(**{k: v for k, v in r.items() if k != "accuracy_delta"}) for r in payload["rows"]]
    mode = "quick" if payload.get("quick") else "full"
    out = []
    for technique in dict.fromkeys(r.technique for r in rows):
        body = _table(_HEADER[1:], [b[1:] for b in _table_rows([r for r in rows if r.technique == technique])])
        out.append((technique, f"{mode} bench run ({source})", f"{head}\n\n{body}"))
    return out


def _transcribed(payload: dict[str, Any], head: str, source: str) -> list[tuple[str, str, str]]:
    """A table transcribed from a run whose raw JSON was not kept (its first column is the technique)."""
    by_technique: dict[str, list[list[str]]] = {}
    for row in payload["rows"]:
        by_technique.setdefault(row[0], []).append(row[1:])
    head = f"{head} Command: `{payload['command']}`. {payload.get('about', '')}".rstrip()
    title = f"{payload['title']} ({source})"
    return [(t, title, f"{head}\n\n{_table(payload['columns'][1:], rows)}") for t, rows in by_technique.items()]


def _workloads_rows(payload: list[dict[str, Any]]) -> str:
    from benchmarks import _workloads_table as wt

    summary = wt.summarize(payload)
    table = wt.format_summary(summary, payload).split("\n", 2)[2]  # its own machine line dropped
    targets = wt.target_checks(summary)
    if targets:
        table += (
            f"\nautotune's first run against its targets (held-out median {wt.TARGETS['auto']:g}x with bf16 allowed, "
            f"{wt.TARGETS['no-bf16']:g}x without; never below {wt.FLOOR:g}x on any task; no end worse than the "
            f"baseline's by half a point of accuracy or 0.01 of loss):\n\n{wt.format_targets(targets)}"
        )
    checks = wt.gain_checks(payload)
    if not checks:
        return table
    return (
        f"{table}\nautotune's predicted step-time gain (`TunePlan.gain`: its kept trials' ratios times its "
        f"methods' per-step costs) against the gain its fit ran at, per sample, over the whole run:\n\n"
        f"{wt.format_gain_checks(checks)}"
    )


def _ceiling_rows(payload: list[dict[str, Any]]) -> str:
    from benchmarks.workloads_ceiling import format_summary

    return format_summary(payload)


def _batch_size_suite_rows(payload: list[dict[str, Any]]) -> str:
    from benchmarks.batch_size_suite import format_summary, summarize

    return format_summary(summarize(payload))


def _autotune_reach_rows(payload: list[dict[str, Any]]) -> str:
    from benchmarks.autotune_reach import format_summary

    return format_summary(payload)


def _fewer_steps_rows(payload: list[dict[str, Any]]) -> str:
    from benchmarks.fewer_steps import format_markdown, summarize

    return format_markdown(summarize(payload))


def _lr_grid_rows(payload: list[dict[str, Any]]) -> str:
    from benchmarks.lr_grid import format_summary, summarize

    return format_summary(summarize(payload))


# result files that hold a list of rows: file name -> (technique, title, the table of their summary)
ROW_FILES: dict[str, tuple[str, str, Callable[[list[dict[str, Any]]], str]]] = {
    "workloads.json": (
        "workloads",
        "The suite's one current run: the plain run and autotune's first run on both precision paths",
        _workloads_rows,
    ),
    "workloads_ceiling.json": (
        "workloads",
        "The most the candidates could gain, per task: an oracle's time to the target",
        _ceiling_rows,
    ),
    "workloads_precision_trial.json": (
        "precision_trial",
        'PrecisionTrial beside the plain fp32 run and the same run at `precision="bf16-mixed"`',
        _workloads_rows,
    ),
    "batch_size_suite.json": (
        "batch_size_finder",
        "The finder on every workload, against a sweep of every size",
        _batch_size_suite_rows,
    ),
    "autotune_reach.json": ("autotune", "What the default trial budget reaches, per workload", _autotune_reach_rows),
    "fewer_steps.json": (
        "optim",
        "Fewer steps to the target: Muon, schedule-free AdamW and WSD against each task's own optimizer",
        _fewer_steps_rows,
    ),
    "lr_grid.json": ("lr_finder", "The LR finder against a coarse grid of learning rates, per workload", _lr_grid_rows),
}


def _row_file(name: str, payload: list[dict[str, Any]], head: str, source: str) -> list[tuple[str, str, str]]:
    if name not in ROW_FILES:
        raise ValueError(f"docs/_data/{name} holds a list of rows, but no renderer is registered for it in ROW_FILES")
    technique, title, table = ROW_FILES[name]
    return [(technique, f"{title} ({source})", f"{head}\n\n{table(payload)}")]


def _rank(item: tuple[Path, Any]) -> tuple[int, str]:
    """Transcribed full runs, then full bench runs and the workloads, then quick runs; the name breaks ties."""
    path, payload = item
    if not isinstance(payload, dict):
        return 1, path.name
    return (0 if "columns" in payload else 2 if payload.get("quick") else 1), path.name


def _evidence_blocks(directory: Path) -> dict[str, list[str]]:
    """``{section: [markdown block, ...]}``: the notes of ``evidence_notes.json`` first, then the result files. A note
    that names a result file (``"file"``) is followed by that file's tables, so a run's words and its rows stay
    together."""
    notes_path = directory / _NOTES
    notes = json.loads(notes_path.read_text()) if notes_path.exists() else {}
    files = [(p, json.loads(p.read_text())) for p in sorted(directory.glob("*.json")) if p.name != _NOTES]
    tables: dict[str, list[tuple[str, str, str]]] = {}  # file name -> its (technique, title, body) blocks
    for path, payload in sorted(files, key=_rank):
        source = f"`docs/_data/{path.name}`"
        date = (payload.get("date") if isinstance(payload, dict) else None) or notes.get("dates", {}).get(path.name)
        if isinstance(payload, list):
            machine = payload[0]["machine"] if payload else "unknown"
            tables[path.name] = _row_file(path.name, payload, _machine_line(machine, date), source)
        else:
            render = _transcribed if "columns" in payload else _bench_run
            tables[path.name] = render(payload, _machine_line(payload["machine"], date), source)
    found: list[tuple[str, str, str]] = []  # (technique, title, body)
    for note in notes.get("notes", []):
        command = f" Command: `{note['command']}`." if note.get("command") else ""
        head = _machine_line(note["machine"], note.get("date")) + command
        found.append((note["technique"], note["title"], f"{head}\n\n{note['text']}"))
        if note.get("file"):
            if note["file"] not in tables:
                raise ValueError(f"{_NOTES}: the note {note['title']!r} names docs/_data/{note['file']}, not found")
            found += tables.pop(note["file"])
    for blocks in tables.values():
        found += blocks
    blocks: dict[str, list[str]] = {}
    for technique, title, body in found:
        blocks.setdefault(EVIDENCE_SECTIONS.get(technique, technique), []).append(f"### {title}\n\n{body.strip()}\n")
    return blocks


def format_evidence(directory: str | Path = "docs/_data") -> str:
    """The evidence page: the committed results in ``directory`` (bench runs, the workload suite, transcribed
    tables, ``evidence_notes.json``), one section per technique with a stable name, each table under its machine
    and date. Nothing is measured here.

    Example::

        >>> format_evidence("docs/_data").startswith("# Evidence")  # doctest: +SKIP
        True
    """
    blocks = _evidence_blocks(Path(directory))
    order = [*EVIDENCE_SECTIONS.values(), *sorted(set(blocks) - {*EVIDENCE_SECTIONS.values()})]  # every name, always
    lines = [
        "# Evidence",
        "",
        "<!-- generated by `python -m benchmarks.evidence --from-json docs/_data --markdown docs/evidence.md`; "
        "do not edit by hand -->",
        "",
        "Every measured number this project quotes, in one place, with the machine and the date of each table. The "
        "code's docstrings and the docs pages cite a section of this page by its name. Speedup = baseline median "
        "time / technique median time, measured interleaved in the same process; read the ranges, not the second "
        "digit, and measure on your own machine with `lightning-speedups bench`.",
        "",
        "Sections: " + ", ".join(f"[{s}](#{_anchor(s)})" for s in order) + ".",
    ]
    for section in order:
        body = "\n".join(blocks.get(section, [])).rstrip("\n") or "Nothing is committed for this section yet."
        lines += ["", f"## {section}", "", *body.split("\n")]
    return "\n".join(lines) + "\n"


def _anchor(title: str) -> str:
    """The anchor MyST gives a heading (GitHub's rule: lower case, punctuation dropped, spaces to dashes)."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.evidence --from-json docs/_data [--markdown docs/evidence.md]``: nothing is measured."""
    parser = argparse.ArgumentParser(description="Collect the committed results into the evidence page.")
    parser.add_argument("--from-json", metavar="DIR", default="docs/_data", help="the results (default docs/_data)")
    parser.add_argument("--markdown", metavar="PATH", help="write the page there (default: print it)")
    args = parser.parse_args(argv)
    page = format_evidence(args.from_json)
    if not args.markdown:
        print(page, end="")
        return 0
    Path(args.markdown).write_text(page)
    print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
