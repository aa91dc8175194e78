"""ProgressiveResizing callback: small training batches early in the run; full size at the end and in validation."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn
from typing_extensions import override

from lightning_speedups._compat import after_batch_to_device, fit_train_dataloader
from lightning_speedups._errors import SpeedupConfigError, check_choice, check_int
from lightning_speedups._inputs import (
    call_model,
    candidate_inputs,
    example_from_batch,
    failing_module,
    first_batch,
    flat_tensors,
    head_samples,
    train_mode,
)
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups.functional.progressive_resizing import (
    INTERPOLATIONS,
    MODES,
    check_resize_schedule,
    progressive_scale,
    resize_batch,
    scaled_side,
)

__all__ = ["ProgressiveResizing"]


def _at_least_two(batch: Any) -> Any:
    """``batch`` with a batch of one doubled: BatchNorm in training mode needs more than one value per channel."""
    return apply_to_collection(
        batch, torch.Tensor, lambda t: torch.cat([t, t]) if t.dim() == 4 and t.shape[0] == 1 else t
    )


def _train_forward_error(model: nn.Module, inputs: Any) -> tuple[str, str] | None:
    """Why one forward fails the way a training step runs it (train mode, with gradients), or ``None`` if it runs.

    Returns ``("Type: message", "`name` (Type)")``, the second naming the innermost module that raised
    (:func:`~lightning_speedups._inputs.failing_module`). The model is left as it was: train/eval flags, buffers
    (BatchNorm running statistics) and the RNG state are restored.
    """
    try:
        with train_mode(model), torch.enable_grad():  # dropout draws: the global RNG is kept
            call_model(model, inputs)
        return None
    except Exception as err:  # any failure of the user's forward
        name = failing_module(model, err)
        where = f"`{name}` ({type(model.get_submodule(name)).__name__})" if name else f"`{type(model).__name__}`"
        return f"{type(err).__name__}: {' '.join(str(err).split())[:300]}", where


class ProgressiveResizing(Callback):
    """Resize every training batch on the fly with Composer's progressive schedule; validate at full size.

    The scale follows :func:`~lightning_speedups.functional.progressive_resizing.progressive_scale` of the training
    progress ``trainer.global_step / total_steps`` (optimizer steps, so all micro-batches of an accumulated step share
    one size): ``initial_scale`` until ``delay_fraction``, a linear ramp, full size for the last
    ``finetune_fraction``. Each batch is resized by
    :func:`~lightning_speedups.functional.progressive_resizing.resize_batch` (floating-point 4-D tensors only) right
    after the strategy moved it to the device, so resizing runs on the accelerator, any batch structure works
    (tuples, dicts, bare tensors) and ``training_step`` as well as every batch hook see the resized images.
    Validation, test and predict batches are left at full size.

    The model must accept smaller inputs (global pooling before the classifier, as torchvision's CNNs have); at
    ``fit`` start the callback runs ``example_input_array`` (or two samples of the first batch) at the smallest size
    the way a training step does (train mode, with gradients, so training-only branches such as an auxiliary head
    run too; BatchNorm statistics and the RNG are restored) and refuses a model that fails, naming the size, the
    module that failed and the smallest scale that runs. Then each side the schedule trains at between the smallest
    and the full size runs once too: a patch embedding that needs sides divisible by its patch refuses there, with
    the ``size_increment`` that runs. Per-pixel targets (segmentation masks) are resized with the
    images, by nearest neighbour.

    Resume: the scale is a function of ``global_step``, which the checkpoint restores, so a resumed run sees the same
    sizes as an uninterrupted one (crop offsets too: they are drawn from ``seed`` and the step). The run length and
    the per-size batch counts are saved; resuming with a different run length stretches the schedule, with a warning.

    Args:
        initial_scale: image side scale at the start, in ``(0, 1]``.
        finetune_fraction: final share of training at full size, in ``[0, 1]``.
        delay_fraction: initial share of training at ``initial_scale``, in ``[0, 1]``; with ``finetune_fraction`` at
            most 1 in total.
        size_increment: sides are multiples of this (fewer distinct shapes for cuDNN benchmark / torch.compile).
        mode: ``"resize"`` (interpolate) or ``"crop"`` (random crops of the scaled size).
        interpolation: ``"bilinear"`` (antialiased), ``"bicubic"``, ``"nearest"`` or ``"area"``.
        seed: seed of the crop offsets (``mode="crop"``).
        total_steps: run length in optimizer steps; ``None`` uses ``trainer.estimated_stepping_batches``.

    Example::

        >>> trainer = L.Trainer(max_epochs=10, callbacks=[ProgressiveResizing(initial_scale=0.5)])  # doctest: +SKIP
    """

    def __init__(
        self,
        initial_scale: float = 0.5,
        finetune_fraction: float = 0.2,
        delay_fraction: float = 0.5,
        size_increment: int = 4,
        mode: str = "resize",
        interpolation: str = "bilinear",
        seed: int = 0,
        total_steps: int | None = None,
    ) -> None:
        check_resize_schedule(initial_scale, finetune_fraction, delay_fraction)
        scaled_side(8, 1.0, size_increment)  # validates size_increment
        check_choice("mode", mode, MODES)
        check_choice("interpolation", interpolation, INTERPOLATIONS)
        check_int("seed", seed, 0)
        check_int("total_steps", total_steps, 1, optional=True)
        self.initial_scale = initial_scale
        self.finetune_fraction = finetune_fraction
        self.delay_fraction = delay_fraction
        self.size_increment = size_increment
        self.mode = mode
        self.interpolation = interpolation
        self.seed = seed
        self.total_steps = total_steps
        self.sizes: dict[str, int] = {}  # "HxW" -> training batches seen at that size
        self.last_scale = 1.0
        self._total: int | None = None
        self._saved_total: int | None = None
        self._strategy: Any = None

    def scale_at(self, step: int) -> float:
        """The scale of the batches of optimizer step ``step`` (needs the run length: after ``fit`` started)."""
        if self._total is None:
            raise SpeedupConfigError("ProgressiveResizing.scale_at() needs the run length: call it once fit started.")
        progress = min(1.0, step / self._total)
        return progressive_scale(progress, self.initial_scale, self.finetune_fraction, self.delay_fraction)

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._strategy = trainer.strategy
        after_batch_to_device(trainer.strategy, self.state_key, lambda batch, idx: self._resize(trainer, batch))

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        total = self.total_steps or trainer.estimated_stepping_batches
        if not math.isfinite(total):
            raise SpeedupConfigError(
                "ProgressiveResizing needs the run length, but the Trainer is unbounded (max_epochs=-1 and no "
                "max_steps). HINT: set Trainer(max_steps=...) or max_epochs, or ProgressiveResizing(total_steps=...)."
            )
        self._total = int(total)
        if self._saved_total is not None and self._saved_total != self._total:
            rank_zero_warn(
                f"ProgressiveResizing: the checkpoint's run had {self._saved_total} steps, this one {self._total}; "
                "the resizing schedule is stretched to the new length."
            )
        self._check_small_input(trainer, pl_module)
        rank_zero_info(
            f"ProgressiveResizing: scale {self.initial_scale} until {self.delay_fraction:.0%} of {self._total} steps, "
            f"full size for the last {self.finetune_fraction:.0%}."
        )

    def _check_small_input(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Refuse, before any step, a run with nothing to resize or a model that fails at a size of the schedule (the
        smallest, then each side between it and the full size).

        The smallest size runs the way a training step will: train mode, with gradients, so branches that only run in
        training (Inception's auxiliary classifier) are checked too; the model is left exactly as it was.
        """
        example = getattr(pl_module, "example_input_array", None)
        if isinstance(example, torch.Tensor):
            batch: Any = example
        else:  # no example input: the first two samples of the first training batch (the global RNG is kept)
            loader = fit_train_dataloader(trainer)
            batch = head_samples(first_batch(loader)) if loader is not None else None
            if batch is None:
                return
        batch = move_data_to_device(_at_least_two(batch), pl_module.device)
        images = [t for t in flat_tensors(batch) if t.dim() == 4 and t.is_floating_point()]
        if not images:
            raise SpeedupConfigError(
                f"ProgressiveResizing: the training batches of `{type(pl_module).__name__}` hold no 4-D float image "
                "tensor, so there is nothing to resize. Allowed values: image batches (N, C, H, W). HINT: remove "
                "ProgressiveResizing for this model."
            )
        runs_full = example_from_batch(pl_module, batch)
        if runs_full is None or _train_forward_error(pl_module, runs_full) is not None:
            return  # the full-size batch does not run through forward alone either: nothing to compare against
        failure = self._train_error_at(pl_module, batch, runs_full, self.initial_scale)
        if failure is None:
            self._check_schedule_sides(pl_module, batch, runs_full, images[0].shape[-2])
            return
        error, where, shape = failure
        lowest = self._lowest_working_scale(pl_module, batch, runs_full, images[0].shape[-2])
        raise SpeedupConfigError(
            f"ProgressiveResizing: `{type(pl_module).__name__}` fails on {shape} inputs in training mode, the "
            f"smallest size of this schedule (`initial_scale`={self.initial_scale}), in {where}: {error}. "
            f"Allowed values: an `initial_scale` whose images the model accepts in training{lowest}. HINT: pool "
            "globally (nn.AdaptiveAvgPool2d) before the classifier and any training-only (auxiliary) head, or raise "
            "initial_scale."
        )

    def _schedule_scales(self, side: int) -> dict[int, float]:
        """The sides the schedule trains at between its smallest and full size, each with a scale that gives it."""
        inc = self.size_increment
        total = self._total or 0
        if 0 < total <= 20_000:  # the sides of this run's steps
            found = {scaled_side(side, self.scale_at(step), inc): self.scale_at(step) for step in range(total)}
        else:  # a long run's ramp passes every multiple of the increment
            start = scaled_side(side, self.initial_scale, inc)
            found = {k: k / side for k in range(start, side, inc)}
        smallest = scaled_side(side, self.initial_scale, inc)
        return {k: v for k, v in sorted(found.items()) if smallest < k < side}

    def _check_schedule_sides(self, pl_module: L.LightningModule, batch: Any, runs_full: Any, side: int) -> None:
        """Refuse a model that runs at the smallest and full size but not at a size in between (a patch embedding
        or a stride that needs sides of a multiple of 16, say), naming those sizes and an increment that avoids them."""
        failed: list[tuple[int, tuple[str, str, tuple[int, int]]]] = []
        runs = [side, scaled_side(side, self.initial_scale, self.size_increment)]
        for k, scale in self._schedule_scales(side).items():
            failure = self._train_error_at(pl_module, batch, runs_full, scale)
            if failure is None:
                runs.append(k)
            else:
                failed.append((k, failure))
        if not failed:
            return
        error, where, _ = failed[0][1]
        step = math.gcd(*runs)
        hint = (
            f"size_increment={step} (every side that runs here is a multiple of {step}: a patch size or stride)"
            if step > self.size_increment
            else "a larger initial_scale, or a model that pools globally before its classifier"
        )
        sides = ", ".join(str(k) for k, _ in failed)
        working = ", ".join(str(k) for k in sorted(set(runs)))
        raise SpeedupConfigError(
            f"ProgressiveResizing: `{type(pl_module).__name__}` fails in training mode on sides {sides}, sizes this "
            f"schedule trains at (`size_increment`={self.size_increment}, `initial_scale`={self.initial_scale}), in "
            f"{where}: {error.rstrip('.')}. Sides that run: {working}. Allowed values: a `size_increment` whose "
            f"multiples the model accepts. HINT: {hint}."
        )

    def _train_error_at(
        self, pl_module: L.LightningModule, batch: Any, runs_full: Any, scale: float
    ) -> tuple[str, str, tuple[int, int]] | None:
        """(error, failing module, image size) of one training-mode forward at ``scale``, or ``None`` if it runs."""
        small = resize_batch(batch, scale, self.mode, self.size_increment, self.interpolation)
        same_form = [c for c in candidate_inputs(small) if type(c) is type(runs_full)][:1]
        failure = _train_forward_error(pl_module, same_form[0]) if same_form else None
        if failure is None:
            return None
        image = next(t for t in flat_tensors(small) if t.dim() == 4 and t.is_floating_point())
        return failure[0], failure[1], (int(image.shape[-2]), int(image.shape[-1]))

    def _lowest_working_scale(self, pl_module: L.LightningModule, batch: Any, runs_full: Any, side: int) -> str:
        """The smallest scale that runs, as a clause of the refusal: bisection over the sides (a few forwards)."""
        inc = self.size_increment
        lo = scaled_side(side, self.initial_scale, inc) // inc  # fails (in units of size_increment)
        hi = side // inc  # the largest rounded side: runs if the full size does, checked below
        verified = False
        for _ in range(8):
            if hi - lo <= 1:
                break
            mid = (lo + hi) // 2
            if self._train_error_at(pl_module, batch, runs_full, mid * inc / side) is None:
                hi = mid
                verified = True
            else:
                lo = mid
        if hi <= lo or hi * inc >= side:
            verified = False
        elif not verified:
            verified = self._train_error_at(pl_module, batch, runs_full, hi * inc / side) is None
        if not verified:
            return ", which for this model is only 1.0 (full size)"
        return f", here >= {hi * inc / side:.3g} (sides of {hi * inc} pixels run)"

    def _resize(self, trainer: L.Trainer, batch: Any) -> Any:
        if not trainer.training or self._total is None:
            return batch  # validation, test, predict and the sanity check: full size
        scale = self.scale_at(trainer.global_step)
        self.last_scale = scale
        generator = None
        if self.mode == "crop":
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + trainer.global_step)
        out = resize_batch(batch, scale, self.mode, self.size_increment, self.interpolation, generator)
        image = next((t for t in flat_tensors(out) if t.dim() == 4 and t.is_floating_point()), None)
        if image is not None:
            key = f"{image.shape[-2]}x{image.shape[-1]}"
            self.sizes[key] = self.sizes.get(key, 0) + 1
        return out

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        pl_module.log("resize_scale", self.last_scale, on_step=True, on_epoch=False, batch_size=1)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and self._strategy is not None:
            after_batch_to_device(self._strategy, self.state_key, None)
            self._strategy = None

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"total_steps": self._total, "sizes": dict(self.sizes), "last_scale": self.last_scale}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._saved_total = state_dict.get("total_steps")
        self.sizes = dict(state_dict.get("sizes", {}))
        self.last_scale = float(state_dict.get("last_scale", 1.0))


register_technique(
    TechniqueInfo(
        name="progressive_resizing",
        callback=ProgressiveResizing,
        functional=resize_batch,
        summary="progressive resizing: low-resolution training batches early, full resolution at the end",
        ways=(3, 6),
        bench="lightning_speedups.benchmarks.time_to_accuracy:run_progressive_resizing",
    )
)
