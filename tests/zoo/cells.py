"""The zoo's cells (architecture x technique) and the three checks of a cell.

A cell either **works** or is **refused** (the table in ``tests/zoo/techniques.py`` says which):

- works: 2 epochs train on CPU with a ``ModelCheckpoint`` every epoch and the technique visibly acts; the final
  checkpoint reloaded into a fresh model with ``lightning_speedups.load_checkpoint`` gives the trained model's outputs;
  a fresh model resumed from the epoch-1 checkpoint ends with the uninterrupted run's weights.
- refused: ``setup()`` raises :class:`~lightning_speedups.SpeedupConfigError` whose message matches the table's regex
  (and names the module where the reason is the model), before any training step, with the model unchanged.
"""

from __future__ import annotations

import re
import shutil
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

import lightning_speedups as ls
from lightning_speedups import SpeedupConfigError
from lightning_speedups.functional import quantize_for_inference
from lightning_speedups.functional.channels_last import apply_channels_last, is_channels_last
from tests.zoo.models import ARCHS, build
from tests.zoo.techniques import EFFECTS, TECHNIQUES, Refused, Technique, expected, param_count

__all__ = [
    "ANY_OUTCOME",
    "CELLS",
    "RESULTS",
    "Cell",
    "FitRecord",
    "as_tensor",
    "cleanup",
    "fit_cell",
    "quantize_check",
    "record",
    "reload_check",
    "resume_check",
]

MAX_EPOCHS = 2
ATOL = 1e-5
RTOL = 1e-4
# `fit_cell(..., want=ANY_OUTCOME)`: working and refusing both conform (tools/arch_sweep.py records which); a refusal
# must still come at setup() with the model unchanged, and a working cell must show its technique's effect
ANY_OUTCOME = "any"


# ---------------------------------------------------------------------------------------------------- cells
@dataclass(frozen=True)
class Cell:
    arch: str
    tech: str

    @property
    def id(self) -> str:
        return f"{self.arch}-{self.tech}"

    @property
    def technique(self) -> Technique:
        return TECHNIQUES[self.tech]

    @property
    def expected(self) -> str | Refused:
        return expected(self.arch, self.tech)


CELLS: list[Cell] = [
    Cell(a, t)
    for a, row in ARCHS.items()
    for t, info in TECHNIQUES.items()
    if (info.archs is None or a in info.archs) and (row.techniques is None or t in row.techniques)
]

# observed outcomes, filled as cells run: {cell id: {"outcome": ..., "checks": {check: "ok" | "fail: ..."}}}
RESULTS: dict[str, dict[str, Any]] = {}


def record(cell: Cell, check: str, status: str, **extra: Any) -> None:
    entry = RESULTS.setdefault(cell.id, {"arch": cell.arch, "tech": cell.tech, "checks": {}})
    entry["checks"][check] = status
    entry.update(extra)


# ---------------------------------------------------------------------------------------------------- running a fit
class StepSeed(Callback):
    """Reseed torch before every training batch from the global step, so dropout / stochastic depth draw the same
    masks in an uninterrupted and a resumed run (Lightning does not checkpoint the global RNG)."""

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        torch.manual_seed(10_000 + trainer.global_step)


# where the cells train; the GPU check (benchmarks/gpu_check.py) sets CUDA and FSDP here
TRAINER_KWARGS: dict[str, Any] = {"accelerator": "cpu", "devices": 1}


def make_trainer(callbacks: list[Callback], ckpt_dir: Path) -> L.Trainer:
    ckpt = ModelCheckpoint(dirpath=ckpt_dir, filename="{epoch}", save_top_k=-1, every_n_epochs=1)
    return L.Trainer(
        **TRAINER_KWARGS,
        max_epochs=MAX_EPOCHS,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=ckpt_dir,
        callbacks=[*callbacks, ckpt, StepSeed()],
    )


def _fit(trainer: L.Trainer, model: L.LightningModule, **kwargs: Any) -> None:
    """``trainer.fit``, then the model on the CPU (where the checks compare it), wherever it trained."""
    try:
        trainer.fit(model, **kwargs)
    finally:
        model.cpu()


def _snapshot(model: torch.nn.Module) -> dict[str, Any]:
    """What "the model is unchanged" means: its module tree, parameter layouts, flags and every tensor value."""
    return {
        "modules": [(n, type(m).__name__) for n, m in model.named_modules()],
        "params": [(n, tuple(p.shape), p.stride(), p.requires_grad) for n, p in model.named_parameters()],
        "state": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "forward_pre_hooks": len(model._forward_pre_hooks),
    }


def _diff_snapshots(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    for key in ("modules", "params", "forward_pre_hooks"):
        if a[key] != b[key]:
            return f"its {key} changed"
    if a["state"].keys() != b["state"].keys():
        return "its state_dict keys changed"
    for k, v in a["state"].items():
        w = b["state"][k]
        if v.shape != w.shape or not torch.equal(v, w):
            return f"state_dict[{k!r}] changed"
    return None


def as_tensor(out: Any) -> torch.Tensor:
    """A model output as one tensor: itself, or the flattened tensors of a dict / ModelOutput / tuple, in order."""
    if isinstance(out, torch.Tensor):
        return out
    values = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else []
    parts = [as_tensor(v).flatten().float() for v in values if isinstance(v, (torch.Tensor, dict, tuple, list))]
    if not parts:
        raise TypeError(f"the model output ({type(out).__name__}) holds no tensor to compare")
    return torch.cat(parts)


def _outputs(model: L.LightningModule) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return as_tensor(model(*model.fixed_inputs())).detach().clone()


def _module_names(model: L.LightningModule) -> list[str]:
    net = getattr(model, "net", None)
    names = [type(model).__name__]
    if net is not None:
        names.append(type(net).__name__)
    return names


def _short(err: BaseException) -> str:
    msg = " ".join(str(err).split())
    return f"{type(err).__name__}: {msg[:300]}"


@dataclass
class FitRecord:
    """The uninterrupted 2-epoch run of one cell: what happened and what the other checks compare against."""

    outcome: str  # "works" | "refused" | "error"
    message: str = ""
    problem: str | None = None  # why the outcome does not conform, None when it does
    ckpts: list[Path] = field(default_factory=list)
    final_state: dict[str, torch.Tensor] = field(default_factory=dict)
    outputs: torch.Tensor | None = None
    global_step: int = 0
    root: Path | None = None
    model: L.LightningModule | None = None  # the trained model and its callbacks (works), for further effect checks
    callbacks: list[Callback] = field(default_factory=list)


def fit_cell(cell: Cell, root: Path, want: str | Refused | None = None) -> FitRecord:
    """Fit the cell's model for 2 epochs with the technique and check the outcome against the table (or ``want``)."""
    L.seed_everything(0, verbose=False)
    model = build(
        cell.arch, seed=0, scheduler=cell.technique.module_scheduler, schedule_free=cell.technique.schedule_free
    )
    before = _snapshot(model)
    dense = param_count(model)
    callbacks = cell.technique.callbacks()  # type: ignore[misc]
    trainer = make_trainer(callbacks, root / "run")
    want = cell.expected if want is None else want
    try:
        _fit(trainer, model)
    except SpeedupConfigError as err:
        rec = FitRecord("refused", _short(err), root=root)
        if not isinstance(want, Refused) and want != ANY_OUTCOME:
            rec.problem = f"expected to work, but was refused: {rec.message}"
            return rec
        msg = str(err)
        problems = []
        if isinstance(want, Refused) and not re.search(want.pattern, msg):
            problems.append(f"message does not match {want.pattern!r}")
        if isinstance(want, Refused) and want.names_module and not any(n in msg for n in _module_names(model)):
            problems.append(f"message does not name the module ({' / '.join(_module_names(model))})")
        if getattr(model, "steps_run", 0) or trainer.global_step:
            problems.append(f"refused after {getattr(model, 'steps_run', 0)} training steps, not at setup()")
        changed = _diff_snapshots(before, _snapshot(model))
        if changed:
            problems.append(f"the model was changed before the refusal: {changed}")
        if problems:
            rec.problem = "; ".join(problems) + f" (got: {rec.message})"
        return rec
    except Exception as err:  # noqa: BLE001 - any crash is this cell's result
        rec = FitRecord("error", _short(err), root=root)
        tb = traceback.extract_tb(err.__traceback__)
        where = next((f for f in reversed(tb) if "lightning_speedups" in f.filename), tb[-1] if tb else None)
        at = f" [at {Path(where.filename).name}:{where.lineno} {where.name}]" if where else ""
        rec.problem = (
            f"{'crashed' if not isinstance(want, Refused) else 'crashed instead of a refusal'}: {rec.message}{at}"
        )
        return rec
    rec = FitRecord("works", root=root, global_step=trainer.global_step)
    if isinstance(want, Refused):
        rec.problem = f"expected a refusal matching {want.pattern!r}, but it trained"
    if trainer.current_epoch != MAX_EPOCHS:
        rec.problem = f"stopped at epoch {trainer.current_epoch} instead of {MAX_EPOCHS}"
    rec.ckpts = sorted((root / "run").glob("epoch=*.ckpt"), key=lambda p: int(p.stem.split("=")[1]))
    if len(rec.ckpts) != MAX_EPOCHS and rec.problem is None:
        rec.problem = f"expected {MAX_EPOCHS} checkpoints, found {[p.name for p in rec.ckpts]}"
    effect = EFFECTS.get(cell.tech)
    no_effect = effect(model, callbacks, dense) if effect is not None and rec.problem is None else None
    if no_effect:
        rec.problem = f"trained, but the technique's effect is missing: {no_effect}"
    rec.final_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rec.outputs = _outputs(model)
    rec.model = model
    rec.callbacks = callbacks
    return rec


def cleanup(rec: FitRecord) -> None:
    if rec.root is not None:
        shutil.rmtree(rec.root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------- checks
def _compare_states(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> str | None:
    if got.keys() != want.keys():
        missing = sorted(want.keys() - got.keys())
        extra = sorted(got.keys() - want.keys())
        return f"state_dict keys differ: missing {missing[:3]}, unexpected {extra[:3]}"
    worst = 0.0
    worst_key = ""
    for k, w in want.items():
        g = got[k]
        if g.shape != w.shape:
            return f"{k}: shape {tuple(g.shape)} != {tuple(w.shape)}"
        if not w.is_floating_point():
            if not torch.equal(g, w):
                return f"{k}: {g.flatten()[:4].tolist()} != {w.flatten()[:4].tolist()}"
            continue
        if not torch.allclose(g.float(), w.float(), atol=ATOL, rtol=RTOL, equal_nan=True):
            d = float((g.float() - w.float()).abs().max())
            if d > worst:
                worst = d
                worst_key = k
    if worst_key:
        return f"weights differ from the uninterrupted run: max |diff| {worst:.3g} at {worst_key!r}"
    return None


def resume_check(cell: Cell, rec: FitRecord) -> str | None:
    """Resume a fresh model from the epoch-1 checkpoint; return why it differs from the uninterrupted run, or None."""
    assert rec.root is not None
    L.seed_everything(0, verbose=False)
    # other initial weights: everything must come from the checkpoint
    model = build(
        cell.arch, seed=1, scheduler=cell.technique.module_scheduler, schedule_free=cell.technique.schedule_free
    )
    trainer = make_trainer(cell.technique.callbacks(), rec.root / "resume")  # type: ignore[misc]
    try:
        _fit(trainer, model, ckpt_path=rec.ckpts[0])
    except Exception as err:  # noqa: BLE001
        return f"resume crashed: {_short(err)}"
    if trainer.global_step != rec.global_step:
        return f"resumed run ended at global_step {trainer.global_step}, uninterrupted at {rec.global_step}"
    got = {k: v.detach() for k, v in model.state_dict().items()}
    return _compare_states(got, rec.final_state)


def _channels_last(model: torch.nn.Module) -> bool:
    weights = [p for p in model.parameters() if p.dim() == 4 and p.shape[-1] * p.shape[-2] > 1]
    return any(is_channels_last(p) and not p.is_contiguous() for p in weights)


def _same_memory_format(loaded: torch.nn.Module, trained: torch.nn.Module | None) -> None:
    """Put a reloaded model in the trained one's memory format, as the technique would at the next fit.

    NHWC and NCHW convolutions round differently; on a deep network whose outputs have grown large (EfficientNetV2
    after a few steps on noise: about 2e7), the same weights then differ by about 1e4, far over the tolerance,
    while the reloaded model in NHWC gives the trained model's outputs exactly.
    """
    if trained is not None and _channels_last(trained):
        apply_channels_last(loaded, warn=False)  # as the callback converts: 4-D tensors only (a Conv3d stays)


def reload_check(cell: Cell, rec: FitRecord) -> str | None:
    """Load the final checkpoint into a fresh model; return why its outputs differ from the trained model's.

    Uses ``lightning_speedups.load_checkpoint(model, path)`` (when it exists) and, for SpeedupMixin models, the
    documented ``MyModel.load_from_checkpoint(path)`` too.
    """
    assert rec.outputs is not None
    fresh = build(cell.arch, seed=1)
    problems = []
    if hasattr(ls, "load_checkpoint"):
        try:
            loaded = ls.load_checkpoint(fresh, rec.ckpts[-1])
        except Exception as err:  # noqa: BLE001
            loaded = None
            problems.append(f"load_checkpoint crashed: {_short(err)}")
        if loaded is not None and not isinstance(loaded, torch.nn.Module):
            problems.append(f"load_checkpoint returned {type(loaded).__name__}, not the model")
        elif loaded is not None:
            _same_memory_format(loaded, rec.model)  # type: ignore[arg-type]
            out = _outputs(loaded)  # type: ignore[arg-type]
            if out.shape != rec.outputs.shape:
                problems.append(f"load_checkpoint: output shape {tuple(out.shape)} != {tuple(rec.outputs.shape)}")
            elif not torch.allclose(out, rec.outputs, atol=ATOL, rtol=RTOL):
                d = float((out - rec.outputs).abs().max())
                problems.append(f"load_checkpoint: outputs differ from the trained model's (max |diff| {d:.3g})")
    if isinstance(fresh, ls.SpeedupMixin):  # documented: MyModel.load_from_checkpoint(path) works for mixin models
        try:
            via_cls = type(fresh).load_from_checkpoint(rec.ckpts[-1], map_location="cpu")
            _same_memory_format(via_cls, rec.model)
            out2 = _outputs(via_cls)
            if not torch.allclose(out2, rec.outputs, atol=ATOL, rtol=RTOL):
                problems.append("load_from_checkpoint: outputs differ from the trained model's")
        except Exception as err:  # noqa: BLE001
            problems.append(f"load_from_checkpoint crashed: {_short(err)}")
    return "; ".join(problems) or None


def quantize_check(cell: Cell) -> tuple[str, str | None]:
    """``quantize_for_inference`` on the cell's model: (observed outcome, problem or None).

    It must leave the model unchanged and return a model whose outputs are within its own tolerance (10% of the float
    output's range) of the float model's, or the float copy (``report.backend == "none"``) when nothing qualifies.
    """
    L.seed_everything(0, verbose=False)
    model = build(cell.arch, seed=0).eval()
    inputs = model.fixed_inputs()
    before = _snapshot(model)
    ref = _outputs(model)
    want = cell.expected
    try:
        qmodel, report = quantize_for_inference(model, inputs, repeats=2)
    except SpeedupConfigError as err:
        if isinstance(want, Refused) and re.search(want.pattern, str(err)):
            return f"refused: {_short(err)}", None
        return f"refused: {_short(err)}", f"refused unexpectedly: {_short(err)}"
    except Exception as err:  # noqa: BLE001
        return "error", f"crashed: {_short(err)}"
    problems = []
    changed = _diff_snapshots(before, _snapshot(model))
    if changed:
        problems.append(f"the input model was changed: {changed}")
    with torch.no_grad():
        out = qmodel(*inputs)
    if not isinstance(out, torch.Tensor) or out.shape != ref.shape:
        problems.append(f"quantized output has shape {getattr(out, 'shape', type(out))}, float {tuple(ref.shape)}")
    else:
        tol = 0.1 * float(ref.abs().max()) + 1e-6
        diff = float((out.float() - ref).abs().max())
        if diff > tol:
            problems.append(f"quantized output off by {diff:.3g} (> {tol:.3g}) with backend {report.backend!r}")
    if isinstance(want, Refused):
        problems.append(f"expected a refusal matching {want.pattern!r}")
    return f"works ({report.backend})", "; ".join(problems) or None
