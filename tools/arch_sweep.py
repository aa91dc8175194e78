"""Architecture sweep: every registered technique on whole model families, outside CI.

Usage::

    python tools/arch_sweep.py --out docs/_generated/arch_sweep.json --md docs/_generated/arch_sweep.md
    python tools/arch_sweep.py ... --chunk 2/8                 # the 2nd of 8 deterministic slices of the rows
    python tools/arch_sweep.py ... --families hf seq           # hf, seq, torchvision, timm
    python tools/arch_sweep.py ... --techniques pruning qat    # zoo technique names (default: every non-combo one)
    python tools/arch_sweep.py ... --sample                    # the CI sample (tests/zoo/test_arch_sweep_sample.py)
    python tools/arch_sweep.py ... --smallest-first            # rows in order of parameter count (a partial sweep)
    python tools/arch_sweep.py --md docs/_generated/arch_sweep.md --out ... --table-only   # re-render the table

Rows come from ``tools/arch_sweep_models.py``; columns are the zoo's techniques (``tests/zoo/techniques.py``: every
registered technique, its variants and ``quantize_for_inference``). Each cell runs the zoo's checks
(``tests/zoo/cells.py``): 2 epochs of 2 batches with a checkpoint per epoch, reload into a fresh model, resume from
epoch 1, and records

- ``works``: it trained, reloaded and resumed, and the technique's effect shows (``EFFECTS`` below);
- ``refused``: ``setup()`` raised ``SpeedupConfigError`` before any step with the model unchanged (the reason kept);
- ``fails``: anything else (exception type, message and where; ``no effect: ...``; a late or destructive refusal);
- ``skipped``: the row does not build offline / at any input size, or is over ``--max-params``.

Cells run in a worker subprocess per row; the parent kills a worker past ``--cell-timeout`` or ``--max-rss-mb`` (the
cell is recorded as ``fails``) and starts a new one for the rest. Results are appended to ``<out>.jsonl`` cell by cell,
so an interrupted sweep resumes where it stopped; ``<out>`` (JSON) and the markdown table are rewritten after each row.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.arch_sweep_table import load_results, write_outputs  # noqa: E402 - after the path set-up

FAMILIES = ("hf", "seq", "torchvision", "timm")

DEFAULT_OUT = ROOT / "docs/_generated/arch_sweep.json"
# the worker's cells write their checkpoints under this folder, which the parent removes when the worker ends: a worker
# killed mid-cell (time or memory limit) leaves no checkpoints behind (several GB each on the largest models)
SCRATCH_ENV = "LS_SWEEP_SCRATCH"


def timm_plan(out: Path) -> Path:
    """Where the sweep writing ``out`` keeps its choice of each timm family's smallest model (counting every family
    takes minutes, so it is computed once and committed beside the results)."""
    return out.with_name("arch_sweep_timm_plan.json")


# the CI sample (tests/zoo/test_arch_sweep_sample.py): one model of every failure class the sweep found, each with the
# techniques that class is about; `--sample` runs exactly these cells
SAMPLE: dict[str, tuple[str, ...]] = {
    # aux logits, only in train mode: the still-runs checks must run the model as training will
    "tv_googlenet": ("pruning", "progressive_resizing", "finetune"),
    "aux_tiny": ("pruning", "progressive_resizing", "finetune"),
    # {'out', 'aux'} dict output with per-pixel targets
    "seg_tiny": ("pruning", "progressive_resizing", "label_smoothing", "quantize_for_inference"),
    # encoder-decoder transformers (tied embeddings, ModelOutput outputs)
    "hf_t5": ("pruning", "pruning_mask", "qat", "quantize_for_inference"),
    "hf_whisper": ("pruning", "quantize_for_inference"),
    # weight-norm parametrized positional conv
    "hf_wav2vec2": ("pruning_mask", "pruning", "quantize_for_inference"),
    "tv_shufflenet_v2_x0_5": ("pruning", "pruning_mask"),  # channel shuffle
    "mixer_tiny": ("pruning", "qat"),  # token-mixing MLP
    # tied input / output embeddings, HF Conv1D layers: the tied lm_head found and trained, Conv1D masked
    "hf_gpt2": ("pruning", "pruning_mask", "sequence_batching", "finetune"),
    "hf_llama": ("pruning",),  # rotary embeddings: torch-pruning's dependency propagation loops
    "lstm": ("pruning", "pruning_mask", "qat", "quantize_for_inference"),  # recurrent weights
    # modules whose _load_from_state_dict reads the version in the state dict's _metadata (MNASNet's stem)
    "tv_mnasnet0_5": ("ema", "pruning", "pruning_mask", "qat"),
    "bn_cnn": ("pruning", "qat"),  # plain BatchNorm (version 2 metadata, num_batches_tracked)
    # the refusal classes of the sweep, one timm model each (the smallest of its family)
    "timm_fasternet": ("pruning",),  # a partial convolution: torch-pruning cannot follow the channel split
    "timm_mixnet": ("pruning",),  # mixed kernels split by fixed sizes: the pruned forward fails, model restored
    "timm_ghostnet": ("pruning",),  # coupled concatenated halves: the amount would empty a layer
    "timm_pvt": ("pruning", "progressive_resizing"),  # attention without a free feed-forward block; a kernel > side
    "timm_pit": ("progressive_resizing",),  # a patch grid that only some sides divide
    # classes the sweep found and the mechanism now handles (works cells)
    "timm_eva": ("quantize_for_inference",),  # a Linear whose weight the parent reads itself (F.linear): stays float
    "timm_convit": ("ema",),  # a buffer the forward pass rebuilds at another shape (rel_indices)
    "clipped_cnn": ("ema",),  # buffers holding infinities (Gemma 4's clip bounds): an average of them is NaN
    # a Conv3d's 5-D weight beside the 2-D convolutions (Module.to(memory_format=channels_last) raises on it), and a
    # model whose bf16 steps must be checked before the fit's weights take one
    "timm_lambda": ("channels_last", "precision_trial"),
}


# ---------------------------------------------------------------------------------------------------- effects
def _cb(cbs: list[Any], name: str) -> Any:
    return next((cb for cb in cbs if type(cb).__name__ == name), None)


def _effect_ema(model: Any, cbs: list[Any]) -> str | None:
    avg = getattr(_cb(cbs, "EMA"), "_average_model", None)  # Lightning's EMAWeightAveraging keeps an AveragedModel
    n = int(avg.n_averaged) if avg is not None else 0
    return None if n > 0 else "no EMA update was made"


def _effect_lr_changed(model: Any, cbs: list[Any]) -> str | None:
    cb = _cb(cbs, "FastSchedule")
    lrs = {g["lr"] for opt in model.trainer.optimizers for g in opt.param_groups}
    if cb is None or not cb.peak_lrs:
        return "FastSchedule set no peak learning rate"
    return None if lrs != {model.lr} else f"the optimizer still trains at the module's lr {model.lr}"


def _effect_resized(model: Any, cbs: list[Any]) -> str | None:
    sizes = _cb(cbs, "ProgressiveResizing").sizes
    full = f"{model.size}x{model.size}"
    return None if any(k != full for k in sizes) else f"no training batch was resized from {full} (seen: {sizes})"


def _effect_mask(model: Any, cbs: list[Any]) -> str | None:
    # the zoo's check reads `*.weight` only; recurrent weights are `weight_ih_l0`, ...
    zeros = sum(int((p == 0).sum()) for n, p in model.named_parameters() if "weight" in n and p.dim() > 1)
    return None if zeros > 0 else "mask pruning left no zero weight"


def _effect_flags(model: Any, cbs: list[Any]) -> str | None:
    return None if _cb(cbs, "SpeedFlags").applied else "SpeedFlags reported no flag"


def _effect_tokens(model: Any, cbs: list[Any]) -> str | None:
    cb = _cb(cbs, "TokenThroughput")
    if not cb.active:  # its documented stop: a warning, nothing logged for the rest of the fit
        return "no-op: TokenThroughput found no token tensor in the batches and stopped with a warning"
    return None if cb.last_count is not None or cb.metrics else "TokenThroughput counted no token"


def _effect_sequences(model: Any, cbs: list[Any]) -> str | None:
    cb = _cb(cbs, "SequenceBatching")
    return None if cb.chosen is not None or cb.loader is not None else "SequenceBatching built no loader"


# effects the zoo's `EFFECTS` (tests/zoo/techniques.py) does not check, or checks only for its rows (32 px images,
# `*.weight` names); where a technique has an entry here, it decides instead of the zoo's
EFFECTS: dict[str, Callable[[Any, list[Any]], str | None]] = {
    "ema": _effect_ema,
    "fast_schedule": _effect_lr_changed,
    "fast_schedule_no_sched": _effect_lr_changed,
    "progressive_resizing": _effect_resized,
    "pruning_mask": _effect_mask,
    "speed_flags": _effect_flags,
    "token_throughput": _effect_tokens,
    "sequence_batching": _effect_sequences,
}
# and quantize_for_inference: an int8 model with >= 1 quantized layer, or a float result for timing reasons only (not
# because every candidate failed): see `_quantize`


# ---------------------------------------------------------------------------------------------------- one cell
def _where(problem: str) -> str:
    m = re.search(r"\[at ([^\]]+)\]", problem)
    return m.group(1) if m else ""


def _fails(kind: str, message: str, where: str = "") -> dict[str, Any]:
    return {"outcome": "fails", "error": kind, "message": " ".join(message.split())[:400], "where": where}


def _error_parts(text: str) -> tuple[str, str]:
    m = re.match(r"(\w+(?:Error|Exception|Warning|Interrupt)?): (.*)", text, re.S)
    return (m.group(1), m.group(2)) if m else ("Error", text)


def _quantize(arch: str) -> dict[str, Any]:
    import lightning as L
    import torch

    import lightning_speedups as ls
    from tests.zoo.cells import _diff_snapshots, _outputs, _short, _snapshot, as_tensor
    from tests.zoo.models import build

    L.seed_everything(0, verbose=False)
    model = build(arch, seed=0).eval()
    inputs = model.fixed_inputs()
    before = _snapshot(model)
    ref = _outputs(model)
    try:
        qmodel, report = ls.functional.quantize_for_inference(model, inputs, repeats=2, budget_s=1.0)
    except ls.SpeedupConfigError as err:
        return {"outcome": "refused", "message": _short(err)}
    except Exception as err:  # noqa: BLE001
        return _fails(*_error_parts(_short(err)), where="quantize_for_inference")
    changed = _diff_snapshots(before, _snapshot(model))
    if changed:
        return _fails("Changed", f"the input model was changed: {changed}")
    with torch.no_grad():
        out = as_tensor(qmodel(*inputs)).float()
    if out.shape != ref.shape or float((out - ref).abs().max()) > 0.1 * float(ref.abs().max()) + 1e-6:
        return _fails("Inaccurate", f"backend {report.backend!r} output differs from the float model's")
    cands = report.candidates
    ok = [n for n, c in cands.items() if c.get("status") == "ok"]
    errs = "; ".join(f"{n}: {c.get('error', c.get('status'))}" for n, c in cands.items())
    if report.backend == "none" and all(c.get("status") == "failed" for c in cands.values()):
        # a float model back because no path could quantize it (only recorded in the report): a silent no-op
        return _fails("NoEffect", f"no effect: every int8 candidate failed ({errs})")
    if report.backend == "none" and not ok:  # the accuracy gate rejected them: by design, said in the report
        return {"outcome": "works", "message": f"no-op: float model back, no candidate within tolerance ({errs})"}
    kinds = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)  # what the report counts as float
    layers = sum(1 for m in model.modules() if type(m) in kinds)
    if report.backend != "none" and len(report.unsupported_layers) >= layers:
        return _fails("NoEffect", f"no effect: backend {report.backend!r} left all {layers} layers in float")
    note = report.backend if report.backend != "none" else f"none, {len(ok)} candidate(s) accurate but not faster"
    return {"outcome": "works", "message": f"backend {note}"}


def _release_training_state(model: Any) -> None:
    """Free the trained run's gradients and optimizer state before the checks, which need its weights only.

    The resume check builds a second model with its own optimizer and loads a checkpoint beside the first: with
    AdamW, the first run's gradients and moments are 12 of the about 40 bytes per parameter that a cell holds at its
    peak, which decides whether a model of several hundred million parameters fits the machine at all.
    """
    model.zero_grad(set_to_none=True)
    with contextlib.suppress(RuntimeError):  # a module no longer attached to its trainer has no optimizers here
        for opt in model.trainer.optimizers:
            opt.state.clear()


def run_cell(arch: str, tech: str) -> dict[str, Any]:
    """Run one cell of a registered row; return its record (outcome, message, error, where, checks)."""
    from tests.zoo.cells import ANY_OUTCOME, Cell, cleanup, fit_cell, reload_check, resume_check
    from tests.zoo.techniques import missing_modules

    cell = Cell(arch, tech)
    if tech == "quantize_for_inference":
        return _quantize(arch)
    missing = missing_modules(cell.technique)
    if missing:
        return {"outcome": "skipped", "message": f"needs {missing}"}
    root = Path(tempfile.mkdtemp(prefix=f"sweep-{arch}-{tech}-", dir=os.environ.get(SCRATCH_ENV)))
    try:
        rec = fit_cell(cell, root, want=ANY_OUTCOME)
        if rec.outcome == "refused":
            if rec.problem:
                return _fails("BadRefusal", rec.problem)
            return {"outcome": "refused", "message": rec.message}
        if rec.outcome == "error":
            kind, msg = _error_parts(rec.message)
            return _fails(kind, msg, _where(rec.problem or ""))
        if rec.outputs is not None and not bool(rec.outputs.isfinite().all()):
            return _fails("Diverged", "training ended with non-finite outputs (NaN/inf)")
        effect = EFFECTS.get(tech)
        if rec.problem and not (effect is not None and "effect is missing" in rec.problem):
            if "effect is missing" in rec.problem:
                return _fails("NoEffect", "no effect: " + rec.problem.split("missing: ", 1)[-1])
            return _fails("Run", rec.problem)
        missing_effect = effect(rec.model, rec.callbacks) if effect is not None else None  # ours decides, if any
        note = missing_effect if missing_effect and missing_effect.startswith("no-op:") else None
        if missing_effect and not note:
            return _fails("NoEffect", f"no effect: {missing_effect}")
        _release_training_state(rec.model)
        checks = {}
        for name, check in (("resume", resume_check), ("reload", reload_check)):
            problem = check(cell, rec)
            checks[name] = "ok" if problem is None else problem
            if problem:
                kind = "Crash" if "crashed" in problem else "Mismatch"
                return {**_fails(kind, f"{name}: {problem}"), "checks": checks}
        return {"outcome": "works", "checks": checks, **({"message": note} if note else {})}
    finally:
        if "rec" in locals():
            cleanup(rec)
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------- worker process
def _free_memory() -> None:
    """Collect Lightning's trainer <-> module cycles, then hand the freed heap back to the system.

    glibc keeps what a process freed for its next allocations: after registering a 412M-parameter ViT (its sizes
    tried, its learning rate probed), the worker held 20 GB resident of which 19 GB was free heap, and the next cell's
    own peak came on top of it. ``malloc_trim`` returns it (Linux; elsewhere a no-op).
    """
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def worker(row_name: str, techs: list[str], results: Path, progress: Path, timm_cache: Path | None) -> None:
    """Build ``row_name``, then run its cells for ``techs``, appending one JSON line per cell to ``results``."""
    import warnings

    import torch

    from tools.arch_sweep_models import LRS, find_row, register

    warnings.filterwarnings("ignore")
    torch.set_num_threads(int(os.environ.get("LS_SWEEP_THREADS", "1")))
    row = find_row(row_name, timm_cache)
    base = {"row": row.name, "family": row.family, "source": row.source}
    try:
        size = register(row)
    except Exception as err:  # noqa: BLE001 - the row does not build offline / run at any size
        for tech in techs:
            _append(results, {**base, "tech": tech, "outcome": "skipped", "message": f"does not build: {err}"[:400]})
        return
    base["size"] = size
    _free_memory()  # the sizes and learning rates register() tried
    if row.name in LRS:  # its baseline diverges at the default learning rate: the row trains at the probed one
        base["lr"] = LRS[row.name]
    for tech in techs:
        tmp = progress.with_suffix(".tmp")
        tmp.write_text(json.dumps({"tech": tech, "start": time.time()}))
        tmp.replace(progress)  # atomic: the parent polls this file
        t0 = time.time()
        try:
            rec = run_cell(row.name, tech)
        except Exception as err:  # noqa: BLE001 - a crash of the harness itself is still this cell's result
            rec = _fails(type(err).__name__, f"sweep harness: {err}")
        _free_memory()  # the cell's models, before the next one
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB (Linux); this cell or an earlier one
        _append(
            results,
            {
                **base,
                "tech": tech,
                **rec,
                "seconds": round(time.time() - t0, 1),
                "at": at,
                "worker_peak_rss_mb": round(peak),
            },
        )


def _append(path: Path, rec: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(rec, sort_keys=True) + "\n")
        f.flush()


# ---------------------------------------------------------------------------------------------------- the parent
def _record_counts(path: Path) -> Counter[tuple[str, str]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return Counter((r["row"], r["tech"]) for r in map(json.loads, filter(str.strip, lines)))


def _rss_mb(pid: int) -> float:
    import psutil

    try:
        proc = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20
    except psutil.Error:
        return 0.0


def _progress_path(parent_pid: int) -> Path:
    return Path(tempfile.gettempdir()) / f"arch_sweep.{parent_pid}.progress"  # the running cell of the parent's worker


def _redo(rec: dict[str, Any], redo: list[str], row: Any) -> bool:
    """Whether the recorded cell ``rec`` runs again: its error type or outcome is in ``redo``, or it was recorded for
    another model than the row builds now (a timm family whose smallest model was chosen again)."""
    stale = rec.get("source", row.source) != row.source
    return stale or rec.get("error") in redo or (rec["outcome"] in redo and rec["outcome"] != "works")


def _read_progress(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _memory_cgroup(limit_mb: float) -> Path | None:
    """A fresh child memory cgroup (v2, else v1) of this process's own, limited to ``limit_mb``, so that what the
    library reads as the memory it may use (``MemoryMeter.capacity``) is the sweep's limit, as in a container; None
    where cgroups cannot be written (not root, not Linux): the RSS poll enforces the limit there. In the group, the
    kernel enforces it: it pages the worker out where the machine has swap (so a model larger than the limit runs,
    slower) and stops it otherwise; RSS is not polled there, as it counts pages the group is not charged for."""
    from lightning_speedups.functional.batch_size.cgroup import own_memory_cgroups

    for parent, limit_file in own_memory_cgroups():
        group = parent / f"arch_sweep-{os.getpid()}"
        try:
            group.mkdir(exist_ok=True)
            if not (group / limit_file).exists():  # the kernel creates the file in a real memory cgroup
                raise OSError(f"no {limit_file} in {group}")
            (group / limit_file).write_text(str(int(limit_mb * 2**20)))
            return group
        except OSError:
            if group.exists():
                group.rmdir()
    return None


def _joiner(group: Path) -> Callable[[], None]:
    def join() -> None:  # runs in the child before exec: all the worker's memory is charged to the group
        (group / "cgroup.procs").write_text(str(os.getpid()))

    return join


def _watch_worker(cmd: list[str], logf: Any, progress: Path, args: argparse.Namespace) -> tuple[Any, Any]:
    """Run one worker to its end, killing it past the cell time or memory limit; return it and why it was killed.

    Its memory cgroup and its scratch folder (the cells' checkpoints) are removed however it ends, the parent's own
    interruption included.
    """
    group = _memory_cgroup(args.max_rss_mb) if args.max_rss_mb else None
    scratch = tempfile.mkdtemp(prefix="arch_sweep-worker-")
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=logf,
        stderr=subprocess.STDOUT,
        env={**os.environ, SCRATCH_ENV: scratch},
        preexec_fn=None if group is None else _joiner(group),
    )
    killed = None
    try:
        while killed is None and proc.poll() is None:
            time.sleep(1.0)
            state = _read_progress(progress)
            if state and time.time() - state["start"] > args.cell_timeout:
                killed = ("Timeout", f"the cell ran past --cell-timeout {args.cell_timeout} s")
            elif group is None and args.max_rss_mb and _rss_mb(proc.pid) > args.max_rss_mb:
                killed = ("MemoryLimit", f"the worker grew past --max-rss-mb {args.max_rss_mb}")
        if killed is None and group is not None and proc.returncode == -signal.SIGKILL:
            killed = (
                "MemoryLimit",
                f"the kernel stopped the worker at its memory cgroup's --max-rss-mb "
                f"{args.max_rss_mb} (a machine with swap pages out instead)",
            )
    finally:
        if proc.poll() is None:  # past a limit, or the parent was interrupted: the worker goes
            proc.kill()
            proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)
        if group is not None:
            with contextlib.suppress(OSError):  # a grandchild still in it: the group stays, empty and harmless
                group.rmdir()
    return proc, killed


def run_row(row: Any, techs: list[str], results: Path, args: argparse.Namespace) -> None:
    """Run the row's pending cells in worker subprocesses; a cell past the time or memory limit is a ``fails``.

    Cells recorded with an error type in ``args.redo`` (e.g. a ``NameError`` of a library caught mid-edit), or for
    another model than the row's, run once more.
    """
    base = {"row": row.name, "family": row.family, "source": row.source}
    first = load_results(results)
    redo = {t for t in techs if (row.name, t) in first and _redo(first[(row.name, t)], args.redo, row)}
    runs = _record_counts(results)
    while True:
        done = load_results(results)
        counts = _record_counts(results)
        redo = {t for t in redo if counts[(row.name, t)] == runs[(row.name, t)]}  # not yet run again
        pending = [t for t in techs if (row.name, t) not in done or t in redo]
        if not pending:
            return
        progress = _progress_path(os.getpid())
        progress.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            row.name,
            "--techniques",
            *pending,
            "--out",
            str(args.out),
        ]
        log = Path(tempfile.gettempdir()) / f"{results.stem}.worker.log"  # the workers' output, for debugging
        with log.open("a") as logf:
            logf.write(f"\n=== {row.name}: {' '.join(pending)}\n")
            logf.flush()
            proc, killed = _watch_worker(cmd, logf, progress, args)
        state = _read_progress(progress)
        progress.unlink(missing_ok=True)
        current = state["tech"] if state else pending[0]
        if _record_counts(results)[(row.name, current)] > counts[(row.name, current)] and not killed:
            continue  # the worker recorded its last cell: done, or restarted for the rest
        if killed is None:  # died without a record: a segfault, an os._exit in a dependency
            tail = log.read_text()[-300:] if log.exists() else ""
            killed = ("WorkerDied", f"the worker exited with code {proc.returncode}: {tail}")
        _append(results, {**base, "tech": current, **_fails(*killed), "seconds": None})


def select_rows(args: argparse.Namespace) -> list[Any]:
    from tools.arch_sweep_models import all_rows, sample_rows

    if args.sample:
        return [r for r in sample_rows() if r.name in SAMPLE]
    cache = timm_plan(args.out) if "timm" in args.families else None
    rows = all_rows(tuple(args.families), cache)
    i, n = (int(v) for v in args.chunk.split("/"))
    rows = [r for k, r in enumerate(rows) if k % n == i - 1]
    if args.smallest_first:  # a partial sweep covers the most families per hour (unknown sizes last)
        rows.sort(key=lambda r: (r.params is None, r.params or 0, r.name))
    return rows


def techniques_for(row: Any, args: argparse.Namespace) -> list[str]:
    from tests.zoo.techniques import TECHNIQUES

    if args.sample:
        return [t for t in SAMPLE[row.name] if not args.techniques or t in args.techniques]
    names = [t.name for t in TECHNIQUES.values() if not t.combo]
    return [t for t in names if not args.techniques or t in args.techniques]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--md", type=Path, default=None)
    p.add_argument("--chunk", default="1/1", help="i/n: the i-th of n deterministic slices of the rows")
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    p.add_argument("--techniques", nargs="+", default=[])
    p.add_argument("--rows", nargs="+", default=[], help="only these rows (names as in the table)")
    p.add_argument("--sample", action="store_true", help="the CI sample cells only")
    p.add_argument("--smallest-first", action="store_true", help="run the rows in order of parameter count")
    p.add_argument("--max-params", type=float, default=40e6, help="rows above it are skipped (0: no limit)")
    p.add_argument("--cell-timeout", type=float, default=600.0)
    p.add_argument("--max-rss-mb", type=float, default=6000.0)
    p.add_argument(
        "--redo",
        nargs="*",
        default=["NameError", "ImportError"],
        help="run again cells recorded with these error types (a library caught mid-edit), or with these outcomes "
        "('fails', 'refused', 'skipped')",
    )
    p.add_argument("--table-only", action="store_true", help="re-render the JSON and markdown from the results")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    results = args.out.with_suffix(".jsonl")
    results.parent.mkdir(parents=True, exist_ok=True)
    if args.worker:
        timm_cache = timm_plan(args.out)
        progress = _progress_path(os.getppid())
        worker(args.worker, args.techniques, results, progress, timm_cache)
        return
    # pkill's SIGTERM unwinds the parent as Ctrl-C does, so that its running worker and scratch folder go with it
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    rows = [] if args.table_only else select_rows(args)
    for row in rows:
        if args.rows and row.name not in args.rows:
            continue
        techs = techniques_for(row, args)
        if args.max_params and row.params and row.params > args.max_params:
            done = load_results(results)
            for t in techs:
                if (row.name, t) not in done or _redo(done[(row.name, t)], args.redo, row):  # e.g. a new limit's reason
                    _append(
                        results,
                        {
                            "row": row.name,
                            "family": row.family,
                            "source": row.source,
                            "tech": t,
                            "outcome": "skipped",
                            "params": row.params,
                            "message": f"{row.params / 1e6:.0f}M parameters > --max-params "
                            f"{args.max_params / 1e6:.0f}M",
                        },
                    )
            continue
        print(f"[sweep] {row.name}: {len(techs)} cells", file=sys.stderr, flush=True)
        run_row(row, techs, results, args)
        write_outputs(results, args.out, args.md)
    write_outputs(results, args.out, args.md)


if __name__ == "__main__":
    main()
