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
from lightning_speedups._recipe_probe import cached_probe, measure_cpu_layout_and_precision
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups.callbacks.speed_flags import SpeedFlags
from lightning_speedups.data import BatchAugment, DeviceDataLoader
from lightning_speedups.measure import describe_ratio
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
    "measure_cpu_layout_and_precision",
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
    probe_s: float = 0.0  # seconds spent on the layout / precision probe (a cache read when cached, 0 when not run)

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
    if "StructuredPruning" in names and "TorchCompile" in names:
        raise SpeedupConfigError(
            "`StructuredPruning` with `TorchCompile` is refused: structural pruning changes parameter "
            "shapes mid-run, which forces a full recompile after every pruning step. HINT: prune in one run, then "
            "compile the pruned model in the next (load it with `load_pruned` / `load_from_checkpoint`)."
        )
    if "QuantizationAwareTraining" in names and "Float8Training" in names:
        raise SpeedupConfigError(
            "`QuantizationAwareTraining` with `Float8Training` is refused: both replace the nn.Linear layers."
        )
    kept = list(callbacks)
    notes = []
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
    cache: bool = True,
    cache_dir: Any = None,
    scheduler: SchedulerConfig | None = None,
) -> Recipe:
    check_choice("channels_last", channels_last, (True, False, "auto"))
    check_choice("compile", compile, (True, False))
    check_choice("cache", cache, (True, False))
    callbacks: list[L.Callback] = [SpeedFlags(verbose=False), *extra]
    notes: list[str] = []
    probe_s = 0.0
    example = getattr(model, "example_input_array", None)
    cpu_run = not torch.cuda.is_available() or trainer_overrides.get("accelerator") == "cpu"
    if cpu_run and model is not None and isinstance(example, torch.Tensor) and "auto" in (channels_last, precision):
        # a precision given by the caller is not re-measured: only the layout is, at that precision
        precisions = (
            ("32-true", "bf16-mixed")
            if precision == "auto"
            else (("bf16-mixed",) if precision in ("bf16-mixed", "bf16") else ("32-true",))
        )
        measured_cl, measured_precision, ratios, probe_s, hit = cached_probe(
            model, example, precisions, cache, cache_dir
        )
        notes.append(
            ("cached measurement" if hit else "measured")
            + f" on this CPU (vs {next(iter(ratios))}, the conservative end of each interval): "
            + "; ".join(
                f"{k} {v:.2f}x" + (f" ({describe_ratio(v)})" if describe_ratio(v) else "") for k, v in ratios.items()
            )
        )
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
    scheduler = scheduler or SchedulerConfig("onecycle", pct_start=0.2)
    return Recipe(name, callbacks, kwargs, optimizer, scheduler, notes + conflict_notes, probe_s)


def fast_train(
    model: nn.Module | None = None,
    max_epochs: int = 10,
    lr: float = 3e-3,
    channels_last: bool | str = "auto",
    compile: bool = False,
    precision: str = "auto",
    callbacks: Sequence[L.Callback] = (),
    ema: float | None = 0.99,
    cache: bool = True,
    cache_dir: Any = None,
    **trainer_overrides: Any,
) -> Recipe:
    """Training from scratch, fast: AdamW with a 5% linear warm-up then cosine decay (per step), an EMA of the
    weights, trainer settings for this hardware, speed flags, channels_last where it helps, optional
    ``torch.compile``; pair it with
    :func:`device_datamodule` (data on the device, batch augmentation). Keep your batch size unless the batch-size
    finder shows a larger one is faster: on both small bench tasks batch 64 needed half an epoch to one epoch more
    than 32 to reach the target, which cost more than its faster steps saved.

    The EMA (:class:`~lightning_speedups.callbacks.ema.EMA`, validated and checkpointed with the averaged weights)
    is in the recipe because it reached the target sooner on both bench tasks against the recipe's own OneCycle
    schedule: the averaged weights are good while the learning rate is still high. It does not help every conv net:
    on the workload suite's U-Net segmentation task it reached the target later (autotune leaves it out of its
    default plan since); pass ``ema=None`` to train without it.

    The schedule is tuned for time to a target, not for the last tenth of a point: a short warm-up (5% of the run)
    to a peak of 3e-3, then cosine decay. Against the earlier OneCycle (20% warm-up to 1e-2), over 5 seeds (digits)
    and 4 seeds (shapes), validated every half epoch, the median to the target fell from 2.5 to 1.5 epochs (digits,
    95%) and from 1.5 to 1.0 epoch (shapes, 90%). On digits, peaks of 2e-3 and 5e-3 needed half an epoch more in most
    seeds; OneCycle with the same peak and warm-up was about as fast (``python benchmarks/recipe_schedule.py``).

    Args:
        model: the model (used to check conflicts, e.g. channels_last without convolutions).
        max_epochs: a bounded run (OneCycle needs the total number of steps).
        lr: the peak learning rate, reached after the warm-up.
        channels_last: True, False or "auto" (on CPU: measured on a copy of ``model``, see
            :func:`measure_cpu_layout_and_precision`; on GPU: on for conv nets).
        compile: add :class:`TorchCompile` (worth it for long runs; compiling costs tens of seconds).
        precision: passed to :func:`trainer_settings`; "auto" on CPU measures bf16 on a copy of ``model``.
        callbacks: more callbacks to compose (conflicts are checked).
        ema: the EMA's decay per step (``warmup=True``), or ``None`` for no EMA.
        cache: keep the CPU layout/precision measurement in the plan cache (``cache_dir``, default
            ``~/.cache/lightning_speedups``), so the next recipe for the same model and machine skips it; the seconds
            spent are in ``Recipe.probe_s``.
        **trainer_overrides: other Trainer arguments.
    """
    extra = list(callbacks)
    if ema is not None:
        from lightning_speedups.callbacks.ema import EMA

        if not any(isinstance(cb, EMA) for cb in extra):
            extra.append(EMA(decay=ema, warmup=True))
    schedule = SchedulerConfig("linear_warmup_cosine", warmup=0.05)
    return _common(
        "fast_train",
        model,
        max_epochs,
        lr,
        channels_last,
        compile,
        precision,
        extra,
        trainer_overrides,
        cache,
        cache_dir,
        schedule,
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
        ways=(1, 2, 3, 4, 5, 6, 7, 8, 9),
        bench="lightning_speedups.benchmarks.recipes:run",
    )
)
