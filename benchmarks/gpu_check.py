"""The prepared GPU check (issue 14, item 6): every CUDA row in one run, within about 8 minutes on an H100/H200.

Usage::

    python benchmarks/gpu_check.py --out DIR            # on a CUDA GPU: DIR/gpu_check.json and DIR/gpu_check.md
    python benchmarks/gpu_check.py --dry-run --out DIR  # CPU, tiny sizes: checks the plumbing (the tests run this)

Rows, each timed interleaved (A B A B ...) with medians; ratio > 1 means the technique is faster:

1. ``bf16``: bf16-mixed vs fp32 (TF32 off) training step of torchvision's resnet18 (``weights=None``), 64x64 inputs;
2. ``channels_last``: on top of bf16, the same model;
3. ``compile``: ``torch.compile`` on top of bf16 + channels_last: the step ratio, the compile seconds and the steps
   that pay them back;
4. ``float8``: torchao float8 vs bf16 MLP blocks (``benchmarks/float8_vs_bf16.py``) at widths 4096 and 8192, on a GPU
   with compute capability >= 8.9;
5. ``device data``: batches sliced and augmented on the GPU vs a DataLoader with per-sample transforms (4 workers),
   one batch fetched plus one bf16 step each;
6. ``sequence``: the sequence-batching bench (:mod:`lightning_speedups.benchmarks.sequences`) on the GPU at GPU
   sizes (d=256 models, bf16 autocast, batches collated on the CPU and moved per step): non-pad tokens/s and time to
   the baseline's accuracy of dynamic padding, length grouping and token budgets against pad-to-max, and packing
   against per-document padding for a byte-level GPT;
7. ``fsdp``: the zoo's cells (``tests/zoo/cells.py``: 2 epochs, a checkpoint per epoch, resume from epoch 1, reload
   into a fresh model) of the techniques that touch parameters or data, under ``Trainer(strategy="fsdp")`` on one GPU:
   ``works``, ``refused`` (with the reason, before any step) or ``fails``. With one GPU, FSDP runs ``NO_SHARD`` (it
   wraps the model and flattens its parameters, but every rank holds all of them), so this checks the strategy's code
   paths, not sharded shapes;
8. ``recipe`` and ``autotune``: ``fast_train`` and a cached ``autotune`` plan vs the plain baseline, time to 90% on
   the shapes task (the end-to-end bench's ``time_to_accuracy``, alternating, 2 runs each).

A row that cannot run on this machine records why, and the script goes on; the results are written after every
section, and ``--budget-s`` skips the sections that would start after it. ``--dry-run`` runs every row on the CPU at
toy sizes in fp32 (no float8, no compile; ``fsdp`` under ``ddp`` with one CPU process, as Lightning refuses FSDP on
a CPU), so its numbers mean nothing; it only proves the script works before device time is spent on it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightning_speedups.measure import interleaved_timings, median, model_copy

Row = dict[str, Any]
ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _train_steps(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype | None, steps: int, tf32: bool = True
) -> Callable[[], None]:
    """``steps`` optimizer steps (forward, backward, fused AdamW) of ``model`` on one fixed batch. Not
    :func:`~lightning_speedups.measure.make_train_step`: that returns the loss as a float, a host sync per step that
    would hide how much of a CUDA step is kernel-launch time (what compile removes)."""
    fused = x.device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    loss_fn = nn.CrossEntropyLoss()

    def run() -> None:
        with _tf32(tf32):
            for _ in range(steps):
                with torch.autocast(x.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                    loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

    return run


def _row(name: str, base_s: float, cand_s: float, note: str, **extra: Any) -> Row:
    return {
        "row": name,
        "baseline_s": base_s,
        "candidate_s": cand_s,
        "ratio": base_s / max(cand_s, 1e-12),
        "note": note,
        **extra,
    }


def step_rows(device: torch.device, dry: bool, repeats: int) -> list[Row]:
    """bf16 vs fp32, channels_last on bf16, compile on bf16 + channels_last (resnet18, 64x64)."""
    from torchvision.models import resnet18

    batch, size, steps = (8, 32, 1) if dry else (256, 64, 10)
    torch.manual_seed(0)
    net = resnet18(weights=None, num_classes=10).to(device)
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    bf16 = None if dry else torch.bfloat16
    cl_net = model_copy(net).to(memory_format=torch.channels_last)
    x_cl = x.contiguous(memory_format=torch.channels_last)
    fns = {
        "fp32": _train_steps(model_copy(net), x, y, None, steps, tf32=False),
        "bf16": _train_steps(model_copy(net), x, y, bf16, steps),
        "bf16_cl": _train_steps(cl_net, x_cl, y, bf16, steps),
    }
    times = {k: median(v) / steps for k, v in interleaved_timings(fns, repeats, warmup=2).items()}
    rows = [
        _row(
            "bf16",
            times["fp32"],
            times["bf16"],
            f"resnet18 train step, batch {batch}, {size}x{size}, fp32 with TF32 off vs bf16-mixed autocast",
        ),
        _row("channels_last", times["bf16"], times["bf16_cl"], "on top of bf16, same model and batch"),
    ]
    if dry:
        rows.append({"row": "compile", "note": "not run in the dry run (compiling takes tens of seconds on a CPU)"})
        return rows
    compiled = torch.compile(model_copy(cl_net))
    first = _train_steps(compiled, x_cl, y, bf16, 1)
    t0 = time.perf_counter()
    first()  # the compile happens here
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    fns = {
        "eager": _train_steps(cl_net, x_cl, y, bf16, steps),
        "compiled": _train_steps(compiled, x_cl, y, bf16, steps),
    }
    t = {k: median(v) / steps for k, v in interleaved_timings(fns, repeats, warmup=2).items()}
    saved = t["eager"] - t["compiled"]
    payback = f"pays back after {compile_s / saved:.0f} steps" if saved > 0 else "never pays back"
    rows.append(
        _row(
            "compile",
            t["eager"],
            t["compiled"],
            f"on top of bf16 + channels_last; compiling took {compile_s:.1f} s, {payback}",
            compile_s=compile_s,
        )
    )
    return rows


def float8_rows(device: torch.device, dry: bool) -> list[Row]:
    """torchao float8 vs bf16 through ``benchmarks/float8_vs_bf16.py``."""
    if not dry and torch.cuda.get_device_capability() < (8, 9):
        return [{"row": "float8", "note": "skipped: float8 needs compute capability >= 8.9"}]
    path = Path(__file__).with_name("float8_vs_bf16.py")
    spec = importlib.util.spec_from_file_location("float8_vs_bf16", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    sizes, tokens, repeats = ([32], 16, 2) if dry else ([4096, 8192], 16384, 10)
    out = module.run(sizes, tokens, 2, "tensorwise", not dry, repeats, dry)
    return [
        _row(
            "float8",
            r["bf16_s"],
            r["float8_s"],
            f"MLP block width {r['size']}, {r['tokens']} tokens, "
            f"{r['float8_layers']} Float8Linear layers, compiled" + (" (dry run: fp32 vs fp32)" if dry else ""),
            width=r["size"],
        )
        for r in out
    ]


def data_rows(device: torch.device, dry: bool, repeats: int) -> list[Row]:
    """A DataLoader with per-sample transforms vs data on the device (the shapes task), fetch + one step."""
    from torchvision.models import resnet18

    from lightning_speedups.demo import ShapesDataModule
    from lightning_speedups.recipes import device_datamodule

    batch, n = (16, 128) if dry else (256, 8192)
    dm = ShapesDataModule(n_train=n, n_val=64, batch_size=batch, num_workers=0 if dry else 4, seed=0)
    dm.setup("fit")
    twin = device_datamodule(dm, batch_size=batch)
    twin.trainer = None
    torch.manual_seed(0)
    net = resnet18(weights=None, num_classes=10).to(device).to(memory_format=torch.channels_last)
    bf16 = None if dry else torch.bfloat16

    def loop(loader: Any) -> Callable[[], None]:
        state: dict[str, Any] = {"it": iter(loader)}
        model = model_copy(net)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device.type == "cuda")

        def run() -> None:
            try:
                xb, yb = next(state["it"])
            except StopIteration:
                state["it"] = iter(loader)
                xb, yb = next(state["it"])
            xb = xb.to(device, non_blocking=True)
            yb = yb.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=bf16 or torch.float32, enabled=bf16 is not None):
                loss = nn.functional.cross_entropy(model(xb.contiguous(memory_format=torch.channels_last)), yb)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return run

    device_loader = twin.train_dataloader().to(device)  # built without a trainer: moved to the device here
    fns = {"loader": loop(dm.train_dataloader()), "device": loop(device_loader)}
    t = {k: median(v) for k, v in interleaved_timings(fns, repeats * 3, warmup=3).items()}
    return [
        _row(
            "device data",
            t["loader"],
            t["device"],
            f"shapes, batch {batch}: one batch fetched + one bf16 "
            f"channels_last resnet18 step; DataLoader with per-sample transforms ({dm.num_workers} workers) vs "
            "batches sliced and augmented on the device",
        )
    ]


def recipe_rows(device: torch.device, dry: bool) -> list[Row]:
    """``fast_train`` and a cached ``autotune`` plan vs the plain baseline: time to 90% on shapes (end-to-end bench)."""
    from lightning_speedups.benchmarks import recipes as bench

    accelerator = "cpu" if dry else "cuda"
    target, max_epochs, width, recipe_epochs = (0.0, 1, 4, 1) if dry else (0.9, 12, 32, 5)
    runs = 1 if dry else 2
    cache_dir = tempfile.mkdtemp(prefix="ls_gpu_check_")
    bench.fill_caches("shapes", max_epochs, width, recipe_epochs, False, cache_dir, accelerator=accelerator)
    reached: dict[str, list[float]] = {"baseline": [], "fast_train_cached": [], "autotune_cached": []}
    for seed in range(runs):
        for kind in reached:
            rec = bench.time_to_accuracy(
                kind,
                target,
                max_epochs,
                width,
                seed,
                recipe_epochs=recipe_epochs,
                task="shapes",
                cache_dir=cache_dir,
                accelerator=accelerator,
            )
            reached[kind].append(rec.reached_at if rec.reached_at is not None else float("nan"))
    base = statistics.median(reached["baseline"])
    return [
        _row(
            name,
            base,
            statistics.median(reached[kind]),
            f"time to val_acc {target:.2f} on shapes (training "
            f"time, validation every half epoch not counted); medians of {runs} alternating runs",
            reached_at=reached[kind],
        )
        for name, kind in (("recipe", "fast_train_cached"), ("autotune", "autotune_cached"))
    ]


def sequence_rows(device: torch.device, dry: bool, repeats: int) -> list[Row]:
    """The sequence-batching bench at GPU sizes: each strategy's tokens/s and time to accuracy vs pad-to-max."""
    from lightning_speedups.benchmarks import sequences

    size = (
        sequences.SIZES["tiny"]
        if dry
        else sequences.BenchSize(
            per_class=1000,
            val_per_class=100,
            batch_size=64,
            epochs=2,
            evals_per_epoch=4,
            d=256,
            heads=4,
            lr=1e-3,
            window_steps=4,
            repeats=repeats,
            lm_docs=4000,
            lm_batch=32,
            lm_d=256,
            lm_window_steps=4,
            lm_repeats=repeats,
        )
    )
    out = sequences.run(size=size, device=device, dtype=None if dry else torch.bfloat16)
    rows = []
    for r in out:
        rows.append(
            {
                "row": f"sequence: {r.variant}",
                "baseline": r.baseline,
                "candidate": r.candidate,
                "ratio": r.ratio,
                "unit": r.unit,
                "note": f"{r.metric}; {r.note}",
            }
        )
    return rows


def fsdp_rows(device: torch.device, dry: bool) -> list[Row]:
    """The zoo's cells under FSDP on one GPU (``ddp`` on one CPU process in the dry run)."""
    import os

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.zoo import cells
    from tools.arch_sweep import run_cell

    cells.TRAINER_KWARGS = {"accelerator": device.type, "devices": 1, "strategy": "ddp" if dry else "fsdp"}
    cudnn = torch.backends.cudnn
    old = cudnn.deterministic, cudnn.benchmark, torch.are_deterministic_algorithms_enabled()
    if not dry:  # a resumed run must match the uninterrupted one to the zoo's tolerance: no atomics-order noise
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        return _fsdp_cells(FSDP_DRY if dry else FSDP_CELLS, run_cell)
    finally:  # the later sections time the usual, faster kernels
        torch.backends.cudnn.deterministic = old[0]
        torch.backends.cudnn.benchmark = old[1]
        torch.use_deterministic_algorithms(old[2])
        cells.TRAINER_KWARGS = {"accelerator": "cpu", "devices": 1}


def _fsdp_cells(
    plan: tuple[tuple[str, tuple[str, ...]], ...], run_cell: Callable[[str, str], dict[str, Any]]
) -> list[Row]:
    rows = []
    for arch, techs in plan:
        for tech in techs:
            start = time.perf_counter()
            try:
                rec = run_cell(arch, tech)
            except Exception as err:  # a crash outside the cell's own checks
                rec = {"outcome": "fails", "message": f"{type(err).__name__}: {err}"}
            msg = " ".join(str(rec.get("message", "")).split())[:300]
            where = f" [at {rec['where']}]" if rec.get("where") else ""
            rows.append(
                {
                    "row": f"fsdp {arch} x {tech}",
                    "outcome": rec["outcome"],
                    "note": f"{rec['outcome']}" + (f": {rec.get('error', '')} {msg}{where}".rstrip() if msg else ""),
                    "cell_s": round(time.perf_counter() - start, 1),
                }
            )
    return rows


# the techniques that touch parameters or data (the rest only set flags or read), most telling first
FSDP_CELLS = (
    (
        "resnet18",
        (
            "pruning",
            "pruning_mask",
            "finetune_gradual",
            "ema",
            "qat",
            "channels_last",
            "batch_size_finder",
            "lr_finder",
            "progressive_resizing",
            "precision_trial",
            "float8",
            "fast_schedule",
        ),
    ),
    ("bert", ("sequence_batching", "token_throughput", "pruning_mask", "finetune")),
)
FSDP_DRY = (("resnet18", ("ema", "pruning_mask")),)

SECTIONS: dict[str, Callable[..., list[Row]]] = {
    "steps": step_rows,
    "float8": float8_rows,
    "data": data_rows,
    "sequence": sequence_rows,
    "fsdp": fsdp_rows,
    "recipe": recipe_rows,
}
NO_REPEATS = ("float8", "fsdp", "recipe")  # the sections that take no ``repeats``


def _seconds(t: float) -> str:
    return f"{t:.2f} s" if t >= 1.0 else f"{t * 1e3:.2f} ms"


def _value(r: Row, which: str) -> str:
    if f"{which}_s" in r:
        return _seconds(r[f"{which}_s"])
    value = r[which]
    unit = r.get("unit", "")
    if unit == "s":
        return _seconds(value)
    return f"{value:,.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}"


def markdown(rows: list[Row], machine: str) -> str:
    lines = [f"GPU check: {machine}", "", "| row | baseline | candidate | ratio | note |", "|---|---|---|---|---|"]
    for r in rows:
        if "ratio" not in r:
            lines.append(f"| {r['row']} | - | - | - | {r['note']} |")
            continue
        verdict = "" if r["ratio"] > 1.0 else ", no speedup"
        lines.append(
            f"| {r['row']} | {_value(r, 'baseline')} | {_value(r, 'candidate')} | "
            f"{r['ratio']:.2f}x{verdict} | {r['note']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[Row]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."), help="folder for gpu_check.json and gpu_check.md")
    p.add_argument("--dry-run", action="store_true", help="CPU, toy sizes, fp32: checks that the script runs")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {list(SECTIONS)}")
    p.add_argument(
        "--budget-s",
        type=float,
        default=0.0,
        help="skip the sections that would start after this many seconds (0: no limit)",
    )
    a = p.parse_args(argv)
    names = a.only.split(",")
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        p.error(f"--only {unknown} unknown. Allowed values: {', '.join(SECTIONS)}")
    if not a.dry_run and not torch.cuda.is_available():
        raise SystemExit("gpu_check needs a CUDA GPU (use --dry-run on a CPU to check the plumbing)")
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    device = torch.device("cpu" if a.dry_run else "cuda")
    import lightning

    machine = ("cpu dry run (numbers mean nothing)" if a.dry_run else torch.cuda.get_device_name(0)) + (
        f", torch {torch.__version__}, lightning {lightning.__version__}, {time.strftime('%Y-%m-%d')}"
    )
    repeats = 2 if a.dry_run else 10
    rows: list[Row] = []
    a.out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    for name in names:
        start = time.perf_counter()
        if a.budget_s and start - began > a.budget_s:
            got = [{"row": name, "note": f"skipped: the {a.budget_s:.0f} s budget was spent"}]
        else:
            try:
                fn = SECTIONS[name]
                got = fn(device, a.dry_run) if name in NO_REPEATS else fn(device, a.dry_run, repeats)
            except Exception as err:  # one row failing must not cost the others their device time
                got = [{"row": name, "note": f"failed: {type(err).__name__}: {err}"}]
        for r in got:
            r["section_s"] = round(time.perf_counter() - start, 1)
        rows += got
        print("\n".join(markdown(got, machine).splitlines()[4:]), flush=True)
        # after every section: a command stopped at its time limit still leaves what it measured
        (a.out / "gpu_check.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))
        (a.out / "gpu_check.md").write_text(markdown(rows, machine))
    print(markdown(rows, machine))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
