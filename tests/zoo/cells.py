"""The zoo's cells (architecture x technique), the table of expected outcomes, and the three checks of a cell.

A cell either **works** or is **refused**:

- works: 2 epochs train on CPU with a ``ModelCheckpoint`` every epoch; the final checkpoint reloaded into a fresh model
  with ``lightning_speedups.load_checkpoint`` gives the trained model's outputs; a fresh model resumed from the epoch-1
  checkpoint ends with the uninterrupted run's weights.
- refused: ``setup()`` raises :class:`~lightning_speedups.SpeedupConfigError` whose message matches the table's regex
  (and names the module where the reason is the model), before any training step, with the model unchanged.

:data:`EXPECTED` is the one table of expected outcomes; a cell it does not list is expected to work, so a technique
registered tomorrow is covered (and expected to work everywhere) the day it is added.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

import lightning_speedups as ls
from lightning_speedups import SpeedupConfigError, get_technique, list_techniques
from tests.zoo.models import ARCHS, build

__all__ = ["CELLS", "EXPECTED", "TECHNIQUES", "Cell", "Technique", "expected", "fit_cell", "reload_check",
           "resume_check", "quantize_check", "RESULTS"]  # fmt: skip

MAX_EPOCHS = 2
ATOL, RTOL = 1e-5, 1e-4


# ---------------------------------------------------------------------------------------------------- techniques
@dataclass(frozen=True)
class Technique:
    """One zoo column: ``callbacks()`` builds fresh callbacks for one fit (``None`` for the functional column)."""

    name: str
    callbacks: Callable[[], list[Callback]] | None
    needs: tuple[str, ...] = ()
    archs: tuple[str, ...] | None = None  # only these rows (slow techniques); None = every row
    slow: bool = False
    note: str = ""


# kwargs merged over a registered technique's `example_kwargs` for the zoo (keep each cell cheap)
ZOO_KWARGS: dict[str, dict[str, Any]] = {}
# torch.compile with the registry's cheap backend="eager" (dynamo capture only) costs a few seconds per row, so every
# row runs it; the cells are marked slow so `-m "not slow"` leaves them out
COMPILE_ARCHS: tuple[str, ...] | None = None


def _registered() -> list[Technique]:
    out = []
    for name in list_techniques():
        info = get_technique(name)
        if info.callback is None:
            continue
        kwargs = {**info.example_kwargs, **ZOO_KWARGS.get(name, {})}

        def make(cls: type = info.callback, kw: dict[str, Any] = kwargs) -> list[Callback]:
            return [cls(**kw)]

        if name == "compile":
            out.append(Technique(name, make, info.needs, archs=COMPILE_ARCHS, slow=True))
        else:
            out.append(Technique(name, make, info.needs))
    return out


def _techniques() -> dict[str, Technique]:
    techs = [Technique("baseline", lambda: [], note="no technique: the control column")]
    techs += _registered()
    techs.append(Technique("pruning_mask", lambda: [ls.Pruning(mode="unstructured", amount=0.5, start_epoch=0)],
                           ("torch_pruning",), note="Pruning(mode='unstructured')"))  # fmt: skip
    techs.append(Technique("quantize_for_inference", None, note="functional: int8 copy of the model"))
    return {t.name: t for t in techs}


TECHNIQUES: dict[str, Technique] = _techniques()


# ---------------------------------------------------------------------------------------------------- expectations
@dataclass(frozen=True)
class Refused:
    """Expected refusal: ``pattern`` must match the message; ``names_module``: it must name the model too."""

    pattern: str
    names_module: bool = True

    def __str__(self) -> str:
        return f"refused: {self.pattern}"


WORKS = "works"
_NO_CONV = ("bert", "bert_mixin", "boring", "lightning_transformer")
_NO_LR_ATTR = ("boring", "lightning_transformer")  # Lightning's demos hard-code lr=0.1 in configure_optimizers
_NO_HEAD = ("boring", "lightning_transformer")  # no submodule named fc / classifier / head(s)

# (arch, technique) -> WORKS | Refused(...); "*" matches any arch or technique. Unlisted cells are expected to work.
EXPECTED: dict[tuple[str, str], str | Refused] = {
    # float8 matmuls need CUDA compute capability >= 8.9; the zoo trains with accelerator="cpu"
    ("*", "float8"): Refused(r"(?i)float8.*(CUDA|GPU)", names_module=False),
    **{(a, "channels_last"): Refused(r"(?i)conv") for a in _NO_CONV},
    **{(a, "lr_finder"): Refused(r"(?i)learning rate") for a in _NO_LR_ATTR},
    **{(a, "finetune"): Refused(r"(?i)head|backbone") for a in _NO_HEAD},
    # BoringModel's only layer is its output layer, which pruning never touches: nothing left to prune
    ("boring", "pruning"): Refused(r"(?i)prun"),
    ("boring", "pruning_mask"): Refused(r"(?i)prun"),
}


def expected(arch: str, tech: str) -> str | Refused:
    for key in ((arch, tech), (arch, "*"), ("*", tech)):
        if key in EXPECTED:
            return EXPECTED[key]
    return WORKS


# ---------------------------------------------------------------------------------------------------- effects
def _param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _effect_pruning(model: torch.nn.Module, cbs: list[Callback], dense: int) -> str | None:
    after = _param_count(model)
    return None if after < dense else f"structured pruning left {after:,} of {dense:,} parameters"


def _effect_mask(model: torch.nn.Module, cbs: list[Callback], dense: int) -> str | None:
    zeros = sum(int((p == 0).sum()) for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1)
    return None if zeros > 0 else "mask pruning left no zero weight"


def _effect_qat(model: torch.nn.Module, cbs: list[Callback], dense: int) -> str | None:
    fake = [n for n, m in model.named_modules() if "FakeQuant" in type(m).__name__]
    return None if fake else "no fake-quantized layer in the trained model"


def _effect_channels_last(model: torch.nn.Module, cbs: list[Callback], dense: int) -> str | None:
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m.weight.dim() == 4]
    nhwc = [m for m in convs if m.weight.is_contiguous(memory_format=torch.channels_last)]
    return None if nhwc else f"none of {len(convs)} conv weights is channels_last"


def _effect_attr(attr: str, what: str) -> Callable[[torch.nn.Module, list[Callback], int], str | None]:
    def check(model: torch.nn.Module, cbs: list[Callback], dense: int) -> str | None:
        return None if getattr(cbs[0], attr, None) else f"{type(cbs[0]).__name__}.{attr} is empty: {what}"

    return check


# what a working technique must have done to the trained model (catches silent no-ops); unlisted: nothing checked
EFFECTS: dict[str, Callable[[torch.nn.Module, list[Callback], int], str | None]] = {
    "pruning": _effect_pruning,
    "pruning_mask": _effect_mask,
    "qat": _effect_qat,
    "channels_last": _effect_channels_last,
    "compile": _effect_attr("compiled_calls", "no call went through the compiled module"),
    "lr_finder": _effect_attr("result", "the range test did not run"),
    "batch_size_finder": _effect_attr("result", "no batch size search ran"),
    "advisor": _effect_attr("report", "no report"),
    "finetune": _effect_attr("groups", "no layer group was frozen"),
}


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
    Cell(a, t) for a in ARCHS for t, info in TECHNIQUES.items() if info.archs is None or a in info.archs
]

# observed outcomes, filled as cells run: {cell id: {"outcome": ..., "checks": {check: "ok" | "fail: ..."}}}
RESULTS: dict[str, dict[str, Any]] = {}


def record(cell: Cell, check: str, status: str, **extra: Any) -> None:
    entry = RESULTS.setdefault(cell.id, {"arch": cell.arch, "tech": cell.tech, "checks": {}})
    entry["checks"][check] = status
    entry.update(extra)


def missing_needs(tech: Technique) -> list[str]:
    out = []
    for need in tech.needs:
        if need == "cuda_sm89":
            continue  # float8: the zoo checks its CPU refusal instead of skipping
        if need == "cuda":
            ok = torch.cuda.is_available()
        else:
            ok = importlib.util.find_spec(need) is not None
        if not ok:
            out.append(need)
    return out


# ---------------------------------------------------------------------------------------------------- running a fit
class StepSeed(Callback):
    """Reseed torch before every training batch from the global step, so dropout / stochastic depth draw the same
    masks in an uninterrupted and a resumed run (Lightning does not checkpoint the global RNG)."""

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        torch.manual_seed(10_000 + trainer.global_step)


def make_trainer(callbacks: list[Callback], ckpt_dir: Path) -> L.Trainer:
    ckpt = ModelCheckpoint(dirpath=ckpt_dir, filename="{epoch}", save_top_k=-1, every_n_epochs=1)
    return L.Trainer(accelerator="cpu", devices=1, max_epochs=MAX_EPOCHS, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=ckpt_dir,
                     callbacks=[*callbacks, ckpt, StepSeed()])  # fmt: skip


def _snapshot(model: torch.nn.Module) -> dict[str, Any]:
    """What "the model is unchanged" means: its module tree, parameter layouts, flags and every tensor value."""
    return {
        "modules": [(n, type(m).__name__) for n, m in model.named_modules()],
        "params": [(n, tuple(p.shape), p.stride(), p.requires_grad) for n, p in model.named_parameters()],
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
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


def _outputs(model: L.LightningModule) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(*model.fixed_inputs()).detach().clone()


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


def fit_cell(cell: Cell, root: Path) -> FitRecord:
    """Fit the cell's model for 2 epochs with the technique and check the outcome against the table."""
    L.seed_everything(0, verbose=False)
    model = build(cell.arch, seed=0)
    before = _snapshot(model)
    dense = _param_count(model)
    callbacks = cell.technique.callbacks()  # type: ignore[misc]
    trainer = make_trainer(callbacks, root / "run")
    want = cell.expected
    try:
        trainer.fit(model)
    except SpeedupConfigError as err:
        rec = FitRecord("refused", _short(err), root=root)
        if not isinstance(want, Refused):
            rec.problem = f"expected to work, but was refused: {rec.message}"
            return rec
        msg = str(err)
        problems = []
        if not re.search(want.pattern, msg):
            problems.append(f"message does not match {want.pattern!r}")
        if want.names_module and not any(n in msg for n in _module_names(model)):
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
        rec.problem = f"{'crashed' if not isinstance(want, Refused) else 'crashed instead of a refusal'}: " \
                      f"{rec.message}{at}"  # fmt: skip
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
        rec.problem = f"trained, but the technique did nothing: {no_effect}"
    rec.final_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rec.outputs = _outputs(model)
    return rec


def cleanup(rec: FitRecord) -> None:
    if rec.root is not None:
        shutil.rmtree(rec.root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------- checks
def _compare_states(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> str | None:
    if got.keys() != want.keys():
        missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
        return f"state_dict keys differ: missing {missing[:3]}, unexpected {extra[:3]}"
    worst, worst_key = 0.0, ""
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
                worst, worst_key = d, k
    if worst_key:
        return f"weights differ from the uninterrupted run: max |diff| {worst:.3g} at {worst_key!r}"
    return None


def resume_check(cell: Cell, rec: FitRecord) -> str | None:
    """Resume a fresh model from the epoch-1 checkpoint; return why it differs from the uninterrupted run, or None."""
    assert rec.root is not None
    L.seed_everything(0, verbose=False)
    model = build(cell.arch, seed=1)  # other initial weights: everything must come from the checkpoint
    trainer = make_trainer(cell.technique.callbacks(), rec.root / "resume")  # type: ignore[misc]
    try:
        trainer.fit(model, ckpt_path=rec.ckpts[0])
    except Exception as err:  # noqa: BLE001
        return f"resume crashed: {_short(err)}"
    if trainer.global_step != rec.global_step:
        return f"resumed run ended at global_step {trainer.global_step}, uninterrupted at {rec.global_step}"
    got = {k: v.detach() for k, v in model.state_dict().items()}
    return _compare_states(got, rec.final_state)


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
            out = _outputs(loaded)  # type: ignore[arg-type]
            if out.shape != rec.outputs.shape:
                problems.append(f"load_checkpoint: output shape {tuple(out.shape)} != {tuple(rec.outputs.shape)}")
            elif not torch.allclose(out, rec.outputs, atol=ATOL, rtol=RTOL):
                d = float((out - rec.outputs).abs().max())
                problems.append(f"load_checkpoint: outputs differ from the trained model's (max |diff| {d:.3g})")
    if isinstance(fresh, ls.SpeedupMixin):  # documented: MyModel.load_from_checkpoint(path) works for mixin models
        try:
            via_cls = type(fresh).load_from_checkpoint(rec.ckpts[-1], map_location="cpu")
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
        qmodel, report = ls.quantize_for_inference(model, inputs, repeats=1)
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
