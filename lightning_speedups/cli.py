"""The ``lightning-speedups`` command: ``info``, ``bench`` and ``advise``."""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]

_PACKAGES = ("lightning", "torch", "torchvision", "torchmetrics", "torchao", "torch-pruning", "kornia", "scikit-learn")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cmd_info(args: argparse.Namespace) -> int:
    import lightning_speedups as ls
    from lightning_speedups._registry import get_technique, list_techniques
    from lightning_speedups.measure import describe_ratio, device_peak_flops, machine_info
    from lightning_speedups.settings import (
        bf16_ratio_words,
        cpu_bf16_speed_ratio,
        enable_speed_flags,
        explain_trainer_settings,
    )

    print(f"lightning-speedups {ls.__version__} on Python {platform.python_version()} ({platform.platform()})")
    print("\nPackages:")
    for dist in _PACKAGES:
        print(f"  {dist:<14} {_version(dist)}")
    machine = machine_info()
    print("\nHardware:")
    print(f"  cpu            {machine['cpu']} ({machine['cpu_count']} cores, {machine['torch_threads']} torch threads)")
    print(f"  device         {machine['device']}")
    for dtype in ("fp32", "bf16"):  # the denominators of the advisor's utilisation
        print(f"  peak {dtype:<9} {device_peak_flops('cpu', dtype).describe()}")
    if machine["device"] != "cpu":
        print(f"  gpu peak bf16  {device_peak_flops('cuda', 'bf16').describe()}")
    ratio = cpu_bf16_speed_ratio()
    evidence = describe_ratio(ratio)
    evidence = f"; {evidence}" if evidence else ""
    print(f"  bf16 on cpu    a training step {bf16_ratio_words(ratio)} (measured now{evidence})")
    print("\nTrainer settings it would pick (trainer_settings()):")
    print("  " + explain_trainer_settings().explain().replace("\n", "\n  "))
    print("\nSpeed flags (enable_speed_flags()):")
    flags = (
        enable_speed_flags()
        if args.apply_flags
        else enable_speed_flags("cpu" if machine["device"] == "cpu" else "cuda")
    )
    for key, value in flags.items():
        print(f"  {key:<26} {value}")
    print("\nTechniques:")
    for name in list_techniques():
        info = get_technique(name)
        req = f" [needs {', '.join(info.requires)}]" if info.requires else ""
        print(f"  {name:<18} {info.summary}{req}")
    return 0


def _split(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def _machine_line(machine: dict[str, Any], quick: bool) -> str:
    return (
        f"Machine: {machine['cpu']}, {machine['cpu_count']} cores, {machine['torch_threads']} torch threads, "
        f"torch {machine['torch']}, device {machine['device']}. Mode: {'quick' if quick else 'full'}."
    )


# what only a new run uses: with --from-json nothing runs
_RUN_OPTIONS = ("quick", "json", "only", "skip", "target_accuracy", "no_bf16")


def _rows_from_json(args: argparse.Namespace) -> tuple[list[Any], dict[str, str], dict[str, Any]]:
    from lightning_speedups._errors import SpeedupConfigError
    from lightning_speedups.benchmarks.runner import read_json

    given = [f"--{name.replace('_', '-')}" for name in _RUN_OPTIONS if getattr(args, name)]
    if given:
        raise SpeedupConfigError(
            f"`--from-json` runs nothing, so {', '.join(given)} would do nothing. Allowed with it: --markdown, --plots."
        )
    run = read_json(args.from_json)
    print(f"{_machine_line(run['machine'], run.get('quick', False))} Date: {run.get('date')}. From {args.from_json}.")
    return run["rows"], run["errors"], run["machine"]


def _rows_from_a_run(args: argparse.Namespace) -> tuple[list[Any], dict[str, str], dict[str, Any]]:
    import lightning_speedups  # noqa: F401  (registers the techniques)
    from lightning_speedups.benchmarks.runner import run_benchmarks
    from lightning_speedups.measure import machine_info

    machine = machine_info()
    print(_machine_line(machine, args.quick))
    rows, errors = run_benchmarks(
        quick=args.quick,
        only=_split(args.only),
        skip=_split(args.skip),
        target=args.target_accuracy,
        no_bf16=args.no_bf16,
    )
    return rows, errors, machine


def _cmd_bench(args: argparse.Namespace) -> int:
    from lightning_speedups.benchmarks.runner import format_markdown, format_table, split_rows, write_json, write_plots

    rows, errors, machine = _rows_from_json(args) if args.from_json else _rows_from_a_run(args)
    end_to_end, components = split_rows(rows)
    print("\nSpeedup = baseline median time / technique median time, measured interleaved in this run.")
    if end_to_end:
        print("\nEnd to end: a whole run to the accuracy in its row, against the plain Lightning baseline:\n")
        print(format_table(end_to_end))
    if components:
        print("\nSingle techniques, each on its own metric (the end-to-end rows show what a whole run gains):\n")
        print(format_table(components))
    if rows and not (args.json or args.markdown):
        where = "--markdown PATH" if args.from_json else "--json PATH or --markdown PATH"
        print(f"\nEach row's notes (what was held equal, counts, caveats): add {where}.")
    if args.json:
        write_json(args.json, rows, errors, args.quick)
        print(f"\nwrote {args.json}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(format_markdown(rows, machine))
        print(f"wrote {args.markdown}")
    if args.plots and rows:
        for path in write_plots(args.plots, rows):
            print(f"wrote {path}")
    if errors:
        print(f"\nFAILED benchmarks{' in that run' if args.from_json else ''}:", file=sys.stderr)
        for name, err in errors.items():
            print(f"  {name}: {err}", file=sys.stderr)
        return 0 if args.from_json else 1  # re-printing a run succeeded, whatever that run did
    return 0


def _cmd_advise(args: argparse.Namespace) -> int:
    from lightning_speedups.benchmarks.advise import run_advice

    run_advice(quick=args.quick)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-speedups",
        description="Measure PyTorch Lightning speedups on this machine: info, bench, advise.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="versions, hardware, and the trainer settings it would pick and why")
    info.add_argument("--apply-flags", action="store_true", help="also set TF32/cuDNN flags in this process")
    info.set_defaults(func=_cmd_info)
    bench = sub.add_parser("bench", help="baseline vs each technique on the demo task, interleaved, as ratios")
    bench.add_argument(
        "--quick", action="store_true", help="small sizes: about two and a half minutes on 2 idle CPU cores"
    )
    bench.add_argument("--json", metavar="PATH", help="write the results as JSON")
    bench.add_argument(
        "--markdown",
        metavar="PATH",
        help="write the results as a markdown table (with their notes)",
    )
    bench.add_argument(
        "--from-json",
        metavar="FILE",
        help="run nothing: print again the results a `bench --json FILE` run wrote (with --markdown, --plots: write "
        "them too). The project's evidence page is made from a clone: python -m benchmarks.evidence",
    )
    bench.add_argument("--plots", metavar="DIR", help="write PNG charts (needs matplotlib)")
    bench.add_argument(
        "--only",
        metavar="NAMES",
        help="comma-separated technique names to run (the project's workload suite runs from a clone: "
        "python -m benchmarks.workloads_bench)",
    )
    bench.add_argument("--skip", metavar="NAMES", help="comma-separated technique names to skip")
    bench.add_argument(
        "--target-accuracy",
        type=float,
        metavar="ACC",
        help="validation accuracy for the time-to-accuracy benchmarks (recipes: default 0.95)",
    )
    bench.add_argument(
        "--no-bf16",
        action="store_true",
        help="never choose bf16 (checks the plan a CPU without bf16 units would get, on one that has them)",
    )
    bench.set_defaults(func=_cmd_bench)
    advise = sub.add_parser("advise", help="run the SpeedAdvisor on the plain demo baseline and print its report")
    advise.add_argument("--quick", action="store_true", help="a shorter window")
    advise.set_defaults(func=_cmd_advise)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lightning-speedups`` console script."""
    args = build_parser().parse_args(argv)
    from lightning_speedups._errors import SpeedupConfigError, SpeedupRuntimeError

    try:
        return int(args.func(args))
    except (SpeedupConfigError, SpeedupRuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
