"""The zoo's columns (techniques), the one table of expected outcomes, and what each technique must visibly do.

Columns are every technique registered with a callback (built from its entry in ``tests/technique_examples.py``), a
no-technique control, variants that exercise harder paths (mask pruning, pruning and gradual unfreezing in the middle
of a run) and the functional ``quantize_for_inference``.

:data:`EXPECTED` maps ``(arch, technique)`` to ``"works"`` or :class:`Refused` (``"*"`` matches any row or column); an
unlisted cell is expected to work, so a technique registered tomorrow is covered, and expected to work everywhere, the
day it is added. To change what the suite demands of a cell, change this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

import lightning_speedups as ls
from lightning_speedups._registry import get_technique, list_techniques, missing_requirements
from tests.technique_examples import EXAMPLES, Example
from tests.zoo.models import ARCHS

__all__ = [
    "EFFECTS",
    "EXPECTED",
    "TECHNIQUES",
    "WORKS",
    "Refused",
    "Technique",
    "expected",
    "missing_modules",
    "param_count",
]


# ---------------------------------------------------------------------------------------------------- techniques
@dataclass(frozen=True)
class Technique:
    """One zoo column: ``callbacks()`` builds fresh callbacks for one fit (``None`` for the functional column)."""

    name: str
    callbacks: Callable[[], list[Callback]] | None
    requires: tuple[str, ...] = ()  # as TechniqueInfo.requires: python modules and hardware
    archs: tuple[str, ...] | None = None  # only these rows (slow techniques); None = every row
    slow: bool = False
    note: str = ""
    variant_of: str | None = None  # a variant is expected to behave like its base column unless EXPECTED says more
    combo: bool = False  # several techniques in one fit (a separate table in the README)
    module_scheduler: bool = True  # False: the zoo module returns its optimizer alone (the technique owns the schedule)
    schedule_free: bool = False  # the zoo module builds a schedule-free optimizer and no scheduler


# kwargs merged over a technique's kwargs in tests/technique_examples.py for the zoo (keep each cell cheap)
ZOO_KWARGS: dict[str, dict[str, Any]] = {}
# torch.compile, even with the registry's cheap backend="eager" (dynamo capture of a train and an eval graph), costs
# 5-20 s per CNN row on 2 cores: one row per family (the EfficientNet / MobileNet / RegNet rows add no new module
# kind), marked slow so `-m "not slow"` leaves them out
COMPILE_ARCHS: tuple[str, ...] | None = (
    "resnet18",
    "convnext_tiny",
    "vit",
    "swin",
    "timm_vit_tiny",
    "bert",
    "boring",
    "lightning_transformer",
    "resnet18_mixin",
)
# schedule-free optimizers on a few rows (a plain and a mixin CNN with BatchNorm, plain and mixin BERT): the switch
# does the same on every model, so more rows would only repeat it
SCHEDULE_FREE_ARCHS = ("resnet18", "resnet18_mixin", "bert", "bert_mixin")


def _registered() -> list[Technique]:
    out = []
    for name in list_techniques():
        info = get_technique(name)
        if info.callback is None:
            continue
        # a technique without an example fails test_registry.py; here it gets its defaults
        kwargs = {**EXAMPLES.get(name, Example()).kwargs, **ZOO_KWARGS.get(name, {})}

        def make(cls: type = info.callback, kw: dict[str, Any] = kwargs) -> list[Callback]:
            return [cls(**kw)]

        note = f"{info.callback.__name__}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
        if name == "compile":
            out.append(Technique(name, make, info.requires, archs=COMPILE_ARCHS, slow=True, note=note))
        elif name == "schedule_free":
            out.append(
                Technique(
                    name,
                    make,
                    info.requires,
                    archs=SCHEDULE_FREE_ARCHS,
                    module_scheduler=False,
                    schedule_free=True,
                    note=f"{note} on schedule_free_sgd (images) / _adamw (tokens)",
                )
            )
        else:
            out.append(Technique(name, make, info.requires, note=note))
    return out


def _variant(name: str, base: str, make: Callable[[], Callback], note: str) -> Technique:
    return Technique(name, lambda: [make()], get_technique(base).requires, note=note, variant_of=base)


def _techniques() -> dict[str, Technique]:
    techs = [Technique("baseline", lambda: [], note="no technique (the control column)")]
    techs += _registered()
    techs += [
        # mask pruning: torch.nn.utils.prune masks, clean weights in checkpoints, masks in the callback state
        _variant(
            "pruning_mask",
            "pruning",
            lambda: ls.MaskPruning(amount=0.5, start_epoch=0),
            "MaskPruning(amount=0.5, start_epoch=0)",
        ),
        # structural pruning after an epoch of training: optimizer state carried over, resume prunes the dense model
        _variant(
            "pruning_epoch1",
            "pruning",
            lambda: ls.StructuredPruning(amount=0.5, start_epoch=1),
            "StructuredPruning(amount=0.5, start_epoch=1)",
        ),
        # gradual unfreezing with discriminative learning rates: optimizer groups split (or built by the mixin)
        _variant(
            "finetune_gradual",
            "finetune",
            lambda: ls.FineTuneFreezing(unfreeze_at_epoch=1, unfreeze_every=1, lr_decay=0.5, verbose=False),
            "FineTuneFreezing(unfreeze_at_epoch=1, unfreeze_every=1, lr_decay=0.5)",
        ),
    ]
    # a technique that owns the LR schedule, on modules that return their optimizer alone (the column above checks
    # the refusal of modules that return a scheduler)
    fast = get_technique("fast_schedule") if "fast_schedule" in list_techniques() else None
    if fast is not None and fast.callback is not None:
        techs.append(
            Technique(
                "fast_schedule_no_sched",
                lambda: [fast.callback(**EXAMPLES["fast_schedule"].kwargs)],
                fast.requires,
                note=f"{fast.callback.__name__}(...) on a module whose configure_optimizers returns only the optimizer",
                variant_of="fast_schedule",
                module_scheduler=False,
            )
        )
    techs.append(Technique("quantize_for_inference", None, note="quantize_for_inference(model, inputs) (functional)"))
    techs += _combinations()
    return {t.name: t for t in techs}


# techniques used together, on a few rows (plain and mixin modules, a CNN, a ViT, BERT); each callback as in its column
COMBO_ARCHS = ("resnet18", "vit", "bert", "resnet18_mixin")


def _combinations() -> list[Technique]:
    def prune() -> Callback:
        return ls.StructuredPruning(amount=0.5, start_epoch=0)

    def registered(name: str) -> Callback:
        info = get_technique(name)
        return info.callback(**EXAMPLES[name].kwargs)  # type: ignore[misc]

    combos: dict[str, Callable[[], list[Callback]]] = {
        "compile+pruning": lambda: [registered("compile"), prune()],
        "finetune_gradual+pruning": lambda: [
            ls.FineTuneFreezing(unfreeze_at_epoch=1, unfreeze_every=1, lr_decay=0.5, verbose=False),
            prune(),
        ],
        "batch_size_finder+lr_finder": lambda: [registered("batch_size_finder"), registered("lr_finder")],
        "pruning+qat": lambda: [prune(), registered("qat")],
    }
    return [
        Technique(
            name,
            make,
            ("torch_pruning", "torchao"),
            note=" + ".join(name.split("+")),
            combo=True,
            archs=COMBO_ARCHS[:2] if name.startswith("compile") else COMBO_ARCHS,
            slow=name.startswith("compile"),
        )
        for name, make in combos.items()
    ]


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
_NO_IMAGES = _NO_CONV  # batches without 4-D float tensors: nothing to resize
_FIXED_SIZE = ("vit", "vit_mixin", "timm_vit_tiny", "convnext_tiny")  # fail at 16x16: fixed position embeddings; 1x1
_NO_CE = ("boring", "lightning_transformer")  # MSE / nll_loss: no cross-entropy to smooth
_TOKEN_DATA = ("bert", "bert_mixin", "lightning_transformer")  # samples hold 1-D integer token tensors
_OWN_SCHEDULER = tuple(a for a in ARCHS if a != "lightning_transformer")  # configure_optimizers returns a StepLR
_NO_LR_ATTR = ("boring", "lightning_transformer")  # Lightning's demos hard-code lr=0.1 in configure_optimizers
# BoringModel's one layer is its output layer: the head (found as the layer giving the output's width) holds every
# parameter, so there is no backbone to freeze (Lightning's demo transformer works: its `decoder` is found so)
_NO_HEAD = ("boring",)

# (arch, technique) -> WORKS | Refused(...); "*" matches any arch or technique. Unlisted cells are expected to work.
EXPECTED: dict[tuple[str, str], str | Refused] = {
    # float8 matmuls need CUDA compute capability >= 8.9; the zoo trains with accelerator="cpu"
    ("*", "float8"): Refused(r"(?i)float8.*(CUDA|GPU)", names_module=False),
    # channels_last on a model without 2-D convolutions: a documented no-op with a warning (it trains unchanged)
    **{(a, "lr_finder"): Refused(r"(?i)learning rate") for a in _NO_LR_ATTR},
    **{(a, "finetune"): Refused(r"(?i)head|backbone") for a in _NO_HEAD},
    # BoringModel's only layer is its output layer, which pruning never touches: nothing left to prune
    ("boring", "pruning"): Refused(r"(?i)prun"),
    **{(a, "label_smoothing"): Refused(r"(?i)label smoothing") for a in _NO_CE},
    # FastSchedule owns the LR schedule: a module that returns its own scheduler is a conflict
    **{(a, "fast_schedule"): Refused(r"(?i)schedul") for a in _OWN_SCHEDULER},
    **{(a, "fast_schedule_no_sched"): WORKS for a in ARCHS if a != "boring"},  # BoringModel: StepLR hard-coded
    # structural pruning changes shapes mid-run, which would recompile after every step: one of the two per run
    ("*", "compile+pruning"): Refused(r"(?i)TorchCompile", names_module=False),
    **{(a, "progressive_resizing"): Refused(r"(?i)image|4-D|resiz") for a in _NO_IMAGES},
    **{(a, "progressive_resizing"): Refused(r"(?i)fails on|smaller|size") for a in _FIXED_SIZE},
    # sequence batching is for token data: image and vector batches are refused at setup (the data, not the model)
    **{
        (a, "sequence_batching"): Refused(r"(?i)no token tensor", names_module=False)
        for a in ARCHS
        if a not in _TOKEN_DATA
    },
    # Lightning's demo Transformer embeds its (inputs, target) targets as decoder inputs: padded targets (-100, as
    # per-token labels are padded) cannot be embedded, which the callback's trial step finds at setup
    ("lightning_transformer", "sequence_batching"): Refused(r"(?i)training_step` failed on a"),
    # BoringModel's one layer is its output head: Muon finds no hidden matrix (and the module has no conv)
    ("boring", "muon"): Refused(r"(?i)no hidden matrix"),
}


# cells that do not conform yet, each with its reason (shown as xfail, not hidden: make_table.py prints "fails")
KNOWN_ISSUES: dict[tuple[str, str], str] = {}  # none open: batch_size_finder+lr_finder in one fit was fixed

# the checks a known issue fails (the others are expected to pass, so they are not marked)
KNOWN_ISSUE_CHECKS: dict[str, tuple[str, ...]] = {}


def known_issue(arch: str, tech: str, check: str = "fit") -> str | None:
    """The reason a cell's ``check`` ("fit", "resume" or "reload") is known not to conform yet, or ``None``."""
    if check not in KNOWN_ISSUE_CHECKS.get(tech, ("fit", "resume", "reload")):
        return None
    return KNOWN_ISSUES.get((arch, tech)) or KNOWN_ISSUES.get(("*", tech))


def expected(arch: str, tech: str) -> str | Refused:
    """The expected outcome of a cell: its own entry, else its row's or column's, else its base column's."""
    for key in ((arch, tech), (arch, "*"), ("*", tech)):
        if key in EXPECTED:
            return EXPECTED[key]
    base = TECHNIQUES[tech].variant_of if tech in TECHNIQUES else None
    return expected(arch, base) if base else WORKS


# ---------------------------------------------------------------------------------------------------- effects
def param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _effect_pruning(model: torch.nn.Module, cbs: list[Callback], dense: int) -> str | None:
    after = param_count(model)
    return None if after < dense else f"structured pruning left {after:,} of {dense:,} parameters"


def _effect_mask(model: torch.nn.Module, cbs: list[Callback], dense: int) -> str | None:
    # recurrent (weight_hh_l0) and weight-normed (parametrizations.weight.original1) matrices count too
    zeros = sum(int((p == 0).sum()) for n, p in model.named_parameters() if "weight" in n and p.dim() > 1)
    return None if zeros > 0 else "mask pruning left no zero weight"


def _effect_qat(model: torch.nn.Module, cbs: list[Callback], dense: int) -> str | None:
    fake = [n for n, m in model.named_modules() if "FakeQuant" in type(m).__name__]
    return None if fake else "no fake-quantized layer in the trained model"


def _effect_channels_last(model: torch.nn.Module, cbs: list[Callback], dense: int) -> str | None:
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m.weight.dim() == 4]
    if not convs:  # the documented no-op: the callback warned and left the model as it was
        return None if not any(getattr(cb, "active", False) for cb in cbs) else "active on a model without convs"
    nhwc = [m for m in convs if m.weight.is_contiguous(memory_format=torch.channels_last)]
    return None if nhwc else f"none of {len(convs)} conv weights is channels_last"


Effect = Callable[[torch.nn.Module, list[Callback], int], "str | None"]


def _find(cbs: list[Callback], cls: type) -> Any:
    return next(cb for cb in cbs if isinstance(cb, cls))


def _effect_attr(cls: type, attr: str, what: str) -> Effect:
    def check(model: torch.nn.Module, cbs: list[Callback], dense: int) -> str | None:
        return None if getattr(_find(cbs, cls), attr, None) else f"{cls.__name__}.{attr} is empty: {what}"

    return check


def _effect_batch_size(model: torch.nn.Module, cbs: list[Callback], dense: int) -> str | None:
    finder = _find(cbs, ls.ThroughputBatchSizeFinder)
    if finder.result is None:
        return "ThroughputBatchSizeFinder.result is empty: no batch size search ran"
    used = model.trainer.train_dataloader.batch_size  # type: ignore[union-attr]
    if used != finder.result.chosen:
        return f"it chose batch size {finder.result.chosen}, but the fit trained with batches of {used}"
    return None


def _effect_lr_decay(model: torch.nn.Module, cbs: list[Callback], dense: int) -> str | None:
    problem = _effect_attr(ls.FineTuneFreezing, "unfrozen", "no layer group was unfrozen at epoch 1")(model, cbs, dense)
    lrs = {round(g["lr"], 12) for opt in model.trainer.optimizers for g in opt.param_groups}  # type: ignore[union-attr]
    if problem is None and len(lrs) < 2:
        problem = f"lr_decay=0.5, but every optimizer param group trains at the same lr {sorted(lrs)}"
    return problem


def _effect_resized(model: torch.nn.Module, cbs: list[Callback], dense: int) -> str | None:
    sizes = _find(cbs, ls.ProgressiveResizing).sizes
    return None if any(k != "32x32" for k in sizes) else f"no training batch was resized (sizes seen: {sizes})"


def _effect_smoothing(model: torch.nn.Module, cbs: list[Callback], dense: int) -> str | None:
    want = {("train", _find(cbs, ls.LabelSmoothing).smoothing), ("val", 0.0)}  # smoothed training loss, plain val_loss
    seen = getattr(model, "smoothing_seen", set())
    return None if seen == want else f"the losses saw label_smoothing {sorted(seen)}, expected {sorted(want)}"


def _all(*effects: Effect) -> Effect:
    def check(model: torch.nn.Module, cbs: list[Callback], dense: int) -> str | None:
        return "; ".join(p for e in effects if (p := e(model, cbs, dense))) or None

    return check


# what a working technique must have done to the trained model (catches silent no-ops); unlisted: nothing checked
EFFECTS: dict[str, Effect] = {
    "pruning": _effect_pruning,
    "pruning_mask": _effect_mask,
    "pruning_epoch1": _effect_pruning,
    "qat": _effect_qat,
    "channels_last": _effect_channels_last,
    "compile": _effect_attr(ls.TorchCompile, "compiled_calls", "no call went through the compiled module"),
    "lr_finder": _effect_attr(ls.LRFinder, "result", "the range test did not run"),
    "batch_size_finder": _effect_batch_size,
    "advisor": _effect_attr(ls.SpeedAdvisor, "report", "no report"),
    "precision_trial": lambda model, cbs, dense: (
        None if (t := _find(cbs, ls.PrecisionTrial)).rounds or t.kept else "no round timed and no precision kept"
    ),
    "channels_last_trial": lambda model, cbs, dense: (
        None if (t := _find(cbs, ls.ChannelsLastTrial)).rounds or t.kept else "no round timed and no layout kept"
    ),
    "finetune": _effect_attr(ls.FineTuneFreezing, "groups", "no layer group was frozen"),
    "schedule_free": lambda model, cbs, dense: (
        None
        if all(ls.optim.is_schedule_free(o) and not ls.optim.in_train_mode(o) for o in model.trainer.optimizers)
        else "the fit did not end on a schedule-free optimizer's eval weights"
    ),
    "muon": lambda model, cbs, dense: (
        None
        if all(isinstance(o, ls.optim.MuonWithAdamW) for o in model.trainer.optimizers)
        else "the fit did not train with the Muon hybrid"
    ),
    "finetune_gradual": _effect_lr_decay,
    "label_smoothing": _effect_smoothing,
    "progressive_resizing": _effect_resized,
    "fast_schedule_no_sched": lambda model, cbs, dense: (
        None
        if model.trainer.lr_scheduler_configs  # type: ignore
        else "no LR scheduler was attached"
    ),
    # combinations
    "compile+pruning": _all(_effect_pruning, _effect_attr(ls.TorchCompile, "compiled_calls", "nothing compiled")),
    "finetune_gradual+pruning": _all(_effect_pruning, _effect_lr_decay),
    "batch_size_finder+lr_finder": _all(_effect_batch_size, _effect_attr(ls.LRFinder, "result", "no range test")),
    "pruning+qat": _all(_effect_pruning, _effect_qat),
}


def missing_modules(tech: Technique) -> list[str]:
    """The python modules ``tech`` requires that are not installed; its hardware is not checked: the zoo trains on
    the CPU and expects a technique that needs a GPU (float8) to refuse there, as ``EXPECTED`` says."""
    return missing_requirements(tech.requires, hardware=False)
