"""ChannelsLast callback: the model's weights and every 4-D input batch in channels_last (NHWC) memory format."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.hooks import RemovableHandle
from typing_extensions import override

from lightning_speedups._errors import check_bool
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups.functional.channels_last import (
    apply_channels_last,
    match_optimizer_layout,
    to_channels_last,
    to_channels_last_,
)

__all__ = ["ChannelsLast", "contiguous_checkpoint"]


class ChannelsLast(Callback):
    """Convert the LightningModule and its 4-D input batches to channels_last.

    At ``setup`` (before the optimizer is built and before DDP wraps the model) the 4-D weights are converted with
    :func:`~lightning_speedups.functional.channels_last.apply_channels_last` (layers built later, in
    ``configure_model``, are not). Batches are converted at two points, so every common batch shape is covered:

    * in ``on_{train,validation,test,predict}_batch_start`` the 4-D tensors of list / dict batches are replaced in
      place (Lightning hands the same batch object to ``training_step``), which also covers steps that call a
      submodule directly (``self.backbone(x)``);
    * a forward pre-hook on the LightningModule converts 4-D positional and keyword arguments of ``self(...)``,
      which covers tuple batches and bare-tensor batches (already-converted tensors pass through at no cost).

    Models without a 2-D convolution are left unchanged with a warning: NHWC only speeds up convolutions.

    The layout is not part of a checkpoint: 4-D tensors in ``checkpoint["state_dict"]`` of a full checkpoint are saved
    contiguous (NCHW), so the file also suits ``safetensors``, which requires contiguous tensors. Either way the
    weights load into a plain model (``load_state_dict`` copies values, not layouts) with the same outputs.

    Args:
        convert_batch: also convert input batches (the model conversion alone leaves an implicit layout
            conversion of the input inside the first convolution).

    Example::

        >>> trainer = L.Trainer(callbacks=[ChannelsLast()], logger=False)
    """

    def __init__(self, convert_batch: bool = True) -> None:
        check_bool("convert_batch", convert_batch)
        self.convert_batch = convert_batch
        self.active = False
        self.converted_batches = 0
        self._hook: RemovableHandle | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        summary = apply_channels_last(pl_module, warn=False)
        if not summary.converted:
            self.active = False
            rank_zero_warn(
                f"ChannelsLast: `{type(pl_module).__name__}` has no 2-D convolution; channels_last only speeds up "
                "convolutions, so the model and its batches are left unchanged."
            )
            return
        self.active = True
        if summary.num_tensors:
            rank_zero_info(
                f"ChannelsLast: {summary.num_conv} convs run channels_last (NHWC); {summary.num_tensors} 4-D weight or "
                "buffer tensors changed layout (1x1 and depthwise kernels already are NHWC in memory)."
            )
        if self.convert_batch and self._hook is None:
            self._hook = pl_module.register_forward_pre_hook(_forward_pre_hook, with_kwargs=True)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _convert(self, batch: Any) -> None:
        if self.active and self.convert_batch:
            self.converted_batches += 1
            to_channels_last_(batch)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after the checkpoint's optimizer state is restored: it keeps the strides it was saved with (an NCHW run's,
        # say), and fused AdamW on CPU reads a state whose strides differ from its parameter's wrongly
        if self.active:
            for optimizer in trainer.optimizers:
                match_optimizer_layout(optimizer)

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._convert(batch)

    @override
    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._convert(batch)

    @override
    def on_test_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._convert(batch)

    @override
    def on_predict_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._convert(batch)

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        contiguous_checkpoint(checkpoint)


def contiguous_checkpoint(checkpoint: dict[str, Any]) -> None:
    """Save the 4-D tensors of ``checkpoint["state_dict"]`` in plain NCHW, in place: the layout is a runtime choice,
    and any loader (safetensors, other frameworks) accepts contiguous tensors."""
    state = checkpoint.get("state_dict")
    if isinstance(state, dict):
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() == 4 and not value.is_contiguous():
                state[key] = value.contiguous()


def _forward_pre_hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return to_channels_last(args), to_channels_last(kwargs)


register_technique(
    TechniqueInfo(
        name="channels_last",
        callback=ChannelsLast,
        functional=apply_channels_last,
        summary="channels_last (NHWC) weights and input batches for conv nets",
        ways=(8,),
        bench="lightning_speedups.benchmarks.code:run_channels_last",
    )
)
