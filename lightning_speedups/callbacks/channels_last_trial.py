"""ChannelsLastTrial: the fit's own first training steps timed in NCHW and in channels_last, the faster kept.

The rounds, the decision and their cost are :class:`~lightning_speedups.callbacks._in_fit_trial.InFitTrial`'s: the
trial trains while it measures, and costs only the extra time of the slower layout's steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.hooks import RemovableHandle
from typing_extensions import override

from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups.callbacks._in_fit_trial import InFitTrial
from lightning_speedups.callbacks.channels_last import contiguous_checkpoint
from lightning_speedups.functional.channels_last import (
    apply_channels_last,
    count_conv2d,
    is_channels_last,
    match_optimizer_layout,
    restore_contiguous,
    to_channels_last,
    to_channels_last_,
)

__all__ = ["NCHW", "NHWC", "ChannelsLastTrial"]

NCHW = "contiguous"
NHWC = "channels_last"


class ChannelsLastTrial(InFitTrial):
    """Time the fit's first steps in the default (NCHW) layout and in channels_last, alternating, and train the rest
    in the faster.

    Before a step the callback gives the model's 4-D weights and buffers, the optimizer's 4-D state and the 4-D
    tensors of the batch the step's layout (the weights keep their Parameter objects, so the optimizer and DDP still
    hold them; a forward pre-hook converts tuple and bare-tensor batches, as :class:`ChannelsLast` does). The rounds
    are :class:`PrecisionTrial`'s: one untimed step of each layout, then rounds of one step of each in alternating
    order, decided at :func:`~lightning_speedups.measure.compare`'s looks from 3 rounds on; channels_last is kept when
    its per-round speed ratio clears ``1 + margin`` beyond noise, NCHW when it cannot, after ``max_rounds``, or once
    the slower layout's extra time passes ``max_cost`` of the planned fit. The layout changes no value, so both
    layouts' steps train the one model. Validation and later steps run in the kept layout.

    A model without a 2-D convolution keeps NCHW without a step spent on the trial. With a
    :class:`PrecisionTrial` before it in the Trainer's callbacks, this trial waits until that one has decided, so
    its steps are timed in the kept precision. Under DDP rank 0's timings decide and every rank keeps the same
    layout. The decision and the rounds are in the checkpoint, whose 4-D tensors are saved in NCHW (as
    :class:`ChannelsLast` saves them), so it loads into a plain model; a resumed fit keeps the decision, or continues
    the rounds after one untimed step of each layout.

    Where it does not help: a model whose convolutions are a small part of its step (a transformer with a patch
    embedding), or a CPU / GPU whose NCHW kernels are as fast, keeps NCHW and pays the extra time of the slower
    layout's steps in its rounds (at most ``max_cost`` of the fit, plus one step). Switching layouts mid-fit costs a
    copy of the 4-D weights and optimizer state per switch (untimed; small beside a step), and with ``TorchCompile``
    a compile of the other layout. Its alternating steps change the run's rounding like any change of layout does:
    on a task whose target lies on a noisy plateau the time to reach it moves by whole validation checks (see the
    channels_last docs page).

    Args:
        margin: channels_last must be this much faster per step (0.05: 5%) beyond noise to be kept.
        max_rounds: rounds at most (one step of each layout per round); at least 3.
        max_cost: the largest share of the planned fit (its steps times the NCHW step) that the slower layout's
            extra time may take before the trial stops and keeps NCHW.
        clock: seconds as a float (tests inject a fake one).
        on_decision: called with the callback on rank 0 once the fit decides, not again for a restored decision. It
            must not raise, and under ``ddp_spawn`` it must pickle.

    Raises:
        SpeedupConfigError: at construction for an argument out of range.

    Example::

        >>> trainer = L.Trainer(callbacks=[ChannelsLastTrial()], logger=False)
    """

    BASELINE = NCHW
    CANDIDATE = NHWC
    LABELS = {NCHW: "NCHW", NHWC: "channels_last"}

    def __init__(
        self,
        margin: float = 0.05,
        max_rounds: int = 12,
        max_cost: float = 0.02,
        *,
        clock: Callable[[], float] = time.perf_counter,
        on_decision: Callable[[ChannelsLastTrial], None] | None = None,
    ) -> None:
        super().__init__(margin, max_rounds, max_cost, clock=clock, on_decision=on_decision)
        self.layout = NCHW  # the layout the model is in now
        self._hook: RemovableHandle | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._device_type = trainer.strategy.root_device.type
        self.layout = _layout_of(pl_module)  # a kept channels_last returns at fit start, once the optimizer exists
        if count_conv2d(pl_module) == 0:
            self._decide_unsupported(f"`{type(pl_module).__name__}` has no 2-D convolution")
        if self._hook is None:
            self._hook = pl_module.register_forward_pre_hook(self._forward_pre_hook, with_kwargs=True)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after the checkpoint's optimizer state is restored (on_fit_start comes before it): a restored decision
        # returns, and a restored state, which keeps the strides it was saved with, follows the weights' layout
        if self.kept == NHWC:
            self._set_layout(trainer, pl_module, NHWC)
            rank_zero_info(f"ChannelsLastTrial: {self.note} (restored); the fit runs in channels_last.")
        _match_states(trainer)

    def _set_layout(self, trainer: L.Trainer, pl_module: L.LightningModule, layout: str) -> None:
        if layout == self.layout:
            return
        if layout == NHWC:
            apply_channels_last(pl_module, warn=False)
        else:
            restore_contiguous(pl_module)
        _match_states(trainer)
        self.layout = layout

    @override
    def _enter(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, option: str) -> None:
        self._set_layout(trainer, pl_module, option)
        if option == NHWC:
            to_channels_last_(batch)

    @override
    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.layout == NHWC:
            to_channels_last_(batch)

    def _forward_pre_hook(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.layout != NHWC:
            return None
        return to_channels_last(args), to_channels_last(kwargs)

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        contiguous_checkpoint(checkpoint)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def __getstate__(self) -> dict[str, Any]:  # ddp_spawn pickles callbacks: the hook's handle stays here
        return {**self.__dict__, "_hook": None}


def _match_states(trainer: L.Trainer) -> None:
    """Give every optimizer's 4-D state its parameter's layout: fused AdamW on CPU reads mismatched strides wrongly."""
    for optimizer in trainer.optimizers:
        match_optimizer_layout(optimizer)


def _layout_of(module: L.LightningModule) -> str:
    """The layout ``module``'s 4-D weights are in now: channels_last when any is (and is not also NCHW, as 1x1 and
    depthwise kernels are), else NCHW."""
    for param in module.parameters():
        if param.dim() == 4 and is_channels_last(param) and not param.is_contiguous():
            return NHWC
    return NCHW


register_technique(
    TechniqueInfo(
        name="channels_last_trial",
        callback=ChannelsLastTrial,
        functional=None,
        summary="channels_last timed against NCHW on the fit's own first steps; the faster kept for the rest",
        ways=(8,),
    )
)
