"""Recipes: named presets that compose the techniques into ``(callbacks, trainer_kwargs)``, with conflict checks.

Example::

    >>> from lightning_speedups.demo import DemoClassifier
    >>> model = DemoClassifier(width=8)
    >>> recipe = get_recipe("fast_train", model=model, max_epochs=2)
    >>> callbacks, trainer_kwargs = recipe
    >>> model = recipe.apply(model)   # sets model.optimizer_config / scheduler_config (SpeedupMixin models)
    >>> trainer = L.Trainer(callbacks=callbacks, **trainer_kwargs)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from lightning_speedups._errors import SpeedupConfigError, check_choice
from lightning_speedups._measure_ratio import describe_ratio
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups.callbacks.speed_flags import SpeedFlags
from lightning_speedups.data import BatchAugment, DeviceDataLoader
from lightning_speedups.optim import OptimizerConfig, SchedulerConfig, SpeedupMixin
from lightning_speedups.settings import trainer_settings

__all__ = [
    "Recipe",
    "check_conflicts",
    "device_datamodule",
    "fast_train",
    "fast_finetune",
    "get_recipe",
    "list_recipes",
]


@dataclass
class Recipe:
    """What a recipe decided: callbacks, Trainer arguments, optimizer/scheduler configs, and notes on what it dropped.

    Unpacks as ``callbacks, trainer_kwargs = recipe``.
    """

    name: str
    callbacks: list[L.Callback]
    trainer_kwargs: dict[str, Any]
    optimizer_config: OptimizerConfig | None = None
    scheduler_config: SchedulerConfig | None = None
    notes: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.callbacks, self.trainer_kwargs))

    def apply(self, model: L.LightningModule) -> L.LightningModule:
        """Set the recipe's optimizer and scheduler configs on a :class:`SpeedupMixin` model (in place)."""
        if self.optimizer_config is None and self.scheduler_config is None:
            return model
        if not isinstance(model, SpeedupMixin):
            raise SpeedupConfigError(
                f"recipe {self.name!r} sets the optimizer and LR schedule, but {type(model).__name__} does not use "
                "SpeedupMixin. HINT: add SpeedupMixin to its bases and delete its configure_optimizers, or build "
                "the recipe with `optimizer=None`."
            )
        model.optimizer_config = self.optimizer_config or model.optimizer_config
        model.scheduler_config = self.scheduler_config
        return model

    def describe(self) -> str:
        lines = [f"recipe {self.name!r}:"]
        lines += [f"  callback  {type(cb).__name__}" for cb in self.callbacks]
        lines += [f"  trainer   {k}={v!r}" for k, v in self.trainer_kwargs.items()]
        if self.optimizer_config is not None:
            lines.append(f"  optimizer {self.optimizer_config.name} lr={self.optimizer_config.lr}")
        if self.scheduler_config is not None:
            lines.append(f"  scheduler {self.scheduler_config.name}")
        lines += [f"  note      {n}" for n in self.notes]
        return "\n".join(lines)


def _has_conv(model: nn.Module | None) -> bool:
    return model is not None and any(isinstance(m, nn.Conv2d) for m in model.modules())


def check_conflicts(
    callbacks: Sequence[L.Callback], model: nn.Module | None = None
) -> tuple[list[L.Callback], list[str]]:
    """Check a set of callbacks for combinations that cannot work; return the kept callbacks and notes.

    Rules:
        - structural pruning changes parameter shapes mid-run, which invalidates a compiled graph: refused with
          the reason (prune first in one run, compile in the next);
        - QAT and float8 training both replace ``nn.Linear`` layers: refused;
        - channels_last on a model without convolutions cannot help: dropped with a note.

    Raises:
        SpeedupConfigError: on a refused combination.
    """
    names = {type(cb).__name__: cb for cb in callbacks}
    pruning = names.get("Pruning")
    if pruning is not None and "TorchCompile" in names and getattr(pruning, "mode", "structured") == "structured":
        raise SpeedupConfigError(
            "`Pruning(mode='structured')` with `TorchCompile` is refused: structural pruning changes parameter "
            "shapes mid-run, which forces a full recompile after every pruning step. HINT: prune in one run, then "
            "compile the pruned model in the next (load it with `load_pruned` / `load_from_checkpoint`)."
        )
    if "QuantizationAwareTraining" in names and "Float8Training" in names:
        raise SpeedupConfigError(
            "`QuantizationAwareTraining` with `Float8Training` is refused: both replace the nn.Linear layers."
        )
    kept, notes = list(callbacks), []
    if "ChannelsLast" in names and model is not None and not _has_conv(model):
        kept.remove(names["ChannelsLast"])
        notes.append("ChannelsLast dropped: the model has no 2-D convolution, so channels_last cannot speed it up.")
    return kept, notes


def device_datamodule(
    datamodule: L.LightningDataModule,
    batch_size: int = 256,
    padding: int | None = None,
    hflip: float = 0.0,
    seed: int = 0,
) -> L.LightningDataModule:
    """An on-device twin of a datamodule that exposes uint8 ``train_images/train_labels/val_images/val_labels``.

    Training batches are sliced from tensors on the training device and augmented there with :class:`BatchAugment`
    (random crop with padding + flips + normalisation), with the same mean/std as the source's ``Normalize``.
    The demo datamodules have these attributes; for your own data, build :class:`DeviceDataLoader` directly.
    """
    datamodule.setup("fit")
    for attr in ("train_images", "train_labels", "val_images", "val_labels"):
        if not hasattr(datamodule, attr):
            raise SpeedupConfigError(
                f"`datamodule` ({type(datamodule).__name__}) has no `{attr}` tensor. HINT: use `to_tensors(dataset)` "
                "and return a `DeviceDataLoader` from your own `train_dataloader()`."
            )
    norm = next(t for t in datamodule.transforms(train=False).transforms if hasattr(t, "mean"))
    if padding is None:
        padding = next(
            (
                getattr(t, "padding", [0])[0]
                for t in datamodule.transforms(train=True).transforms
                if type(t).__name__ == "RandomCrop"
            ),
            0,
        )
    train_aug = BatchAugment(padding=padding, hflip=hflip, mean=list(norm.mean), std=list(norm.std), seed=seed)
    val_aug = BatchAugment(mean=list(norm.mean), std=list(norm.std))
    source = datamodule

    class _OnDevice(L.LightningDataModule):
        def __init__(self) -> None:
            super().__init__()
            self.batch_size = batch_size
            self.num_classes = getattr(source, "num_classes", None)

        def train_dataloader(self) -> DeviceDataLoader:
            return DeviceDataLoader(
                source.train_images,
                source.train_labels,
                batch_size=self.batch_size,
                shuffle=True,
                seed=seed,
                device=self.trainer,
                transform=train_aug,
            )

        def val_dataloader(self) -> DeviceDataLoader:
            return DeviceDataLoader(
                source.val_images,
                source.val_labels,
                batch_size=1024,
                shuffle=False,
                device=self.trainer,
                transform=val_aug,
            )

    return _OnDevice()


def measure_cpu_layout_and_precision(
    model: nn.Module, example: torch.Tensor, batch_size: int = 64, repeats: int = 3, margin: float = 1.1,
    budget_s: float = 5.0, clock: Any = None,
) -> tuple[bool, str, dict[str, float]]:
    """Time a training step of copies of ``model`` on this CPU in fp32 / channels_last / bf16 / both; pick the best.

    Returns ``(channels_last, precision, {candidate: times faster than fp32 NCHW})``. The candidates run interleaved
    through :func:`lightning_speedups.measure.compare` (at least ``repeats`` shuffled rounds, more until every
    interval clears or misses ``margin``, at most ``budget_s`` seconds; ``clock`` is injectable). A candidate is chosen
    only when it is clearly ``margin`` faster than fp32 NCHW; within noise the conservative fp32 / NCHW stays. The
    ratios are :class:`~lightning_speedups._measure_ratio.MeasuredRatio` values (conservative, with their median,
    interval and rounds). About a second or two for a small CNN; the user's model is not touched. On a Xeon with AMX,
    bf16 + channels_last measured 2-3x faster for the demo CNN; on CPUs without bf16 units bf16 is ~10x slower, and
    channels_last helps some CPUs and not others: hence measure, not assume.
    """
    import time

    from lightning_speedups._measure_ratio import MeasuredRatio, conservative_ratio
    from lightning_speedups.measure import compare, make_train_step, model_copy

    x = example.expand(batch_size, *example.shape[1:]).contiguous()
    y = torch.zeros(batch_size, dtype=torch.long)
    candidates = {}
    for cl, bf16 in ((False, False), (True, False), (False, True), (True, True)):
        if cl and x.dim() != 4:
            continue
        m = model_copy(model).cpu()
        xi = x.contiguous(memory_format=torch.channels_last) if cl else x
        if cl:
            m = m.to(memory_format=torch.channels_last)
        name = ("channels_last" if cl else "nchw") + ("+bf16" if bf16 else "+fp32")
        candidates[name] = make_train_step(m, xi, y, autocast_dtype=torch.bfloat16 if bf16 else None)
    conservative_first = ["nchw+fp32", "channels_last+fp32", "nchw+bf16", "channels_last+bf16"]
    cmp = compare(candidates, "nchw+fp32", min_gain=margin - 1.0, budget_s=budget_s, min_rounds=max(2, repeats),
                  prefer=conservative_first, clock=clock or time.perf_counter)
    ratios: dict[str, float] = {"nchw+fp32": MeasuredRatio(1.0)}
    ratios.update({k: MeasuredRatio(conservative_ratio(cmp, k), cmp, k) for k in cmp.ratios})
    best = cmp.winner
    return best.startswith("channels_last"), "bf16-mixed" if best.endswith("bf16") else "32-true", ratios


def _common(
    name: str,
    model: nn.Module | None,
    max_epochs: int,
    lr: float,
    channels_last: bool | str,
    compile: bool,
    precision: str,
    extra: list[L.Callback],
    trainer_overrides: dict[str, Any],
) -> Recipe:
    check_choice("channels_last", channels_last, (True, False, "auto"))
    check_choice("compile", compile, (True, False))
    callbacks: list[L.Callback] = [SpeedFlags(verbose=False), *extra]
    notes: list[str] = []
    example = getattr(model, "example_input_array", None)
    cpu_run = not torch.cuda.is_available() or trainer_overrides.get("accelerator") == "cpu"
    if cpu_run and model is not None and isinstance(example, torch.Tensor) and "auto" in (channels_last, precision):
        measured_cl, measured_precision, ratios = measure_cpu_layout_and_precision(model, example)
        notes.append("measured on this CPU (vs nchw+fp32, the conservative end of each interval): " + "; ".join(
            f"{k} {v:.2f}x" + (f" ({describe_ratio(v)})" if describe_ratio(v) else "") for k, v in ratios.items()))
        channels_last = measured_cl if channels_last == "auto" else channels_last
        precision = measured_precision if precision == "auto" else precision
    if channels_last == "auto":  # on GPUs NHWC feeds the tensor cores of convolutions
        channels_last = torch.cuda.is_available() and _has_conv(model)
    if channels_last:
        from lightning_speedups.callbacks.channels_last import ChannelsLast

        callbacks.append(ChannelsLast())
    if compile:
        from lightning_speedups.callbacks.compile import TorchCompile

        callbacks.append(TorchCompile())
    callbacks, conflict_notes = check_conflicts(callbacks, model)
    kwargs = trainer_settings(precision=precision, max_epochs=max_epochs, **trainer_overrides)
    optimizer = OptimizerConfig("adamw", lr=lr, weight_decay=5e-4)
    scheduler = SchedulerConfig("onecycle", pct_start=0.2)
    return Recipe(name, callbacks, kwargs, optimizer, scheduler, notes + conflict_notes)


def fast_train(
    model: nn.Module | None = None,
    max_epochs: int = 10,
    lr: float = 1e-2,
    channels_last: bool | str = "auto",
    compile: bool = False,
    precision: str = "auto",
    callbacks: Sequence[L.Callback] = (),
    **trainer_overrides: Any,
) -> Recipe:
    """Training from scratch, fast: AdamW + OneCycle (per step), trainer settings for this hardware, speed flags,
    channels_last where it helps (GPU + convolutions), optional ``torch.compile``; pair it with
    :func:`device_datamodule` (data on the device, batch augmentation) and a larger batch.

    Args:
        model: the model (used to check conflicts, e.g. channels_last without convolutions).
        max_epochs: a bounded run (OneCycle needs the total number of steps).
        lr: OneCycle's peak learning rate.
        channels_last: True, False or "auto" (on CPU: measured on a copy of ``model``, see
            :func:`measure_cpu_layout_and_precision`; on GPU: on for conv nets).
        compile: add :class:`TorchCompile` (worth it for long runs; compiling costs tens of seconds).
        precision: passed to :func:`trainer_settings`; "auto" on CPU measures bf16 on a copy of ``model``.
        callbacks: more callbacks to compose (conflicts are checked).
        **trainer_overrides: other Trainer arguments.
    """
    return _common(
        "fast_train", model, max_epochs, lr, channels_last, compile, precision, list(callbacks), trainer_overrides
    )


def fast_finetune(
    model: nn.Module | None = None,
    max_epochs: int = 6,
    lr: float = 1e-2,
    unfreeze_at_epoch: int = 2,
    backbone: Any = None,
    channels_last: bool | str = "auto",
    compile: bool = False,
    precision: str = "auto",
    callbacks: Sequence[L.Callback] = (),
    **trainer_overrides: Any,
) -> Recipe:
    """Fine-tuning a pretrained model, fast: the :func:`fast_train` settings plus :class:`FineTuneFreezing` (head
    only until ``unfreeze_at_epoch``, then the backbone with a smaller learning rate).
    """
    from lightning_speedups.callbacks.finetuning import FineTuneFreezing

    freezing = FineTuneFreezing(backbone=backbone, unfreeze_at_epoch=unfreeze_at_epoch)
    return _common(
        "fast_finetune",
        model,
        max_epochs,
        lr,
        channels_last,
        compile,
        precision,
        [freezing, *callbacks],
        trainer_overrides,
    )


_RECIPES: dict[str, Callable[..., Recipe]] = {"fast_train": fast_train, "fast_finetune": fast_finetune}


def list_recipes() -> list[str]:
    """Names of the recipes."""
    return list(_RECIPES)


def get_recipe(name: str, **kwargs: Any) -> Recipe:
    """Build a recipe by name; unknown names raise and list the valid ones."""
    if name not in _RECIPES:
        raise SpeedupConfigError(f"`recipe`={name!r} is unknown. Allowed values: {', '.join(map(repr, _RECIPES))}.")
    recipe = _RECIPES[name](**kwargs)
    for note in recipe.notes:
        rank_zero_info(f"recipe {name}: {note}")
    return recipe


register_technique(
    TechniqueInfo(
        name="recipes",
        callback=None,
        functional=get_recipe,
        summary="fast_train / fast_finetune presets composing the techniques, with conflict checks",
        mission_tip="1, 2, 3, 4, 5, 6, 7, 8, 9",
        bench="lightning_speedups.benchmarks.recipes:run",
    )
)
