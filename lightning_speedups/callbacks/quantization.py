"""Quantization callbacks: QAT that survives checkpoints, and float8 training on Ada/Hopper GPUs.

QAT makes training *slower* (every Linear/Conv2d fake-quantizes its weight and input); it buys an int8 model that keeps
its accuracy after :func:`~lightning_speedups.functional.quantization.quantize_for_inference`. Real training speedups
from low precision come from float8 matmuls on GPUs with compute capability >= 8.9 (:class:`Float8Training`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn
from typing_extensions import override

from lightning_speedups._compat import before_model_weights_load
from lightning_speedups._errors import SpeedupConfigError, check_callable, check_choice, check_int, require
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups._strategies import refuse_sharded
from lightning_speedups._structure import apply_structure_records, store_structure_record
from lightning_speedups.functional.quantization import (
    FLOAT8_RECIPES,
    INFERENCE_BACKENDS,
    QAT_RECORD_KEY,
    FakeQuantConfig,
    Float8Summary,
    QATSummary,
    QuantizationReport,
    convert_to_float8,
    float8_supported,
    prepare_qat,
    qat_record,
    quantize_for_inference,
)

__all__ = ["QuantizationAwareTraining", "Float8Training"]


class QuantizationAwareTraining(Callback):
    """Fake-quantize ``nn.Linear`` / ``nn.Conv2d`` layers (torchao) from ``start_epoch`` on, so the model learns to
    tolerate int8.

    Unlike Lightning 1.x's removed callback, the model is *not* converted at the end unless asked: it stays a float
    model with fake quantizers, so ``trainer.test(ckpt_path="best")``, a second ``fit()`` and
    ``Model.load_from_checkpoint`` (for :class:`SpeedupMixin` models) keep working. Checkpoints carry a structure
    record; on resume the fake quantizers are re-inserted right before the weights load. A plain LightningModule's
    own ``load_from_checkpoint`` cannot know about them: reload it with
    ``lightning_speedups.load_checkpoint(MyModel(), path)``. torchao's fake quantizers
    are dynamic (scales come from each tensor, like the int8 dynamic kernels), so there are no observers to freeze;
    ``freeze_bn_epoch`` freezes BatchNorm running statistics, the other standard late-QAT step.

    Args:
        start_epoch: first epoch trained with fake quantization (0 = from the start; later = fine-tune a float model).
        freeze_bn_epoch: from this epoch on, BatchNorm layers use and keep their running statistics (``None``: never).
        weight_dtype: ``"int8"`` or ``"int4"`` (per-channel symmetric).
        activation_dtype: ``"int8"`` (per-token dynamic) or ``None`` (weight-only).
        layers: layer kinds, any of ``"linear"``, ``"conv2d"``.
        exclude: module names or prefixes kept in float (e.g. ``("head",)``).
        convert_on_fit_end: after fit, build ``self.quantized_model`` / ``self.report`` with
            :func:`quantize_for_inference` (the LightningModule itself stays unchanged).
        backend: inference backend for ``convert_on_fit_end`` (``"auto"`` measures them).
        example_inputs: input for the conversion's latency measurement (default: ``pl_module.example_input_array``).

    Example::

        >>> from lightning_speedups.demo import DemoClassifier
        >>> qat = QuantizationAwareTraining(start_epoch=1, freeze_bn_epoch=2)
        >>> qat.config.weight_dtype
        'int8'
    """

    def __init__(
        self,
        start_epoch: int = 0,
        freeze_bn_epoch: int | None = None,
        weight_dtype: str = "int8",
        activation_dtype: str | None = "int8",
        layers: Sequence[str] = ("linear", "conv2d"),
        exclude: Sequence[str] = (),
        convert_on_fit_end: bool = False,
        backend: str = "auto",
        example_inputs: Any = None,
    ) -> None:
        check_int("start_epoch", start_epoch, 0)
        check_int(
            "freeze_bn_epoch",
            freeze_bn_epoch,
            start_epoch,
            optional=True,
            hint=f"freeze BatchNorm statistics late in QAT, not before `start_epoch`={start_epoch}.",
        )
        check_choice("backend", backend, ("auto", *INFERENCE_BACKENDS))
        self.config = FakeQuantConfig(weight_dtype, activation_dtype, tuple(layers), tuple(exclude))
        self.start_epoch = start_epoch
        self.freeze_bn_epoch = freeze_bn_epoch
        self.convert_on_fit_end = convert_on_fit_end
        self.backend = backend
        self.example_inputs = example_inputs
        self.summary: QATSummary | None = None
        self.quantized_model: nn.Module | None = None
        self.report: QuantizationReport | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        require("torchao.quantization.qat", "quantization", "QuantizationAwareTraining")
        if stage == "fit":
            refuse_sharded(
                trainer,
                "QuantizationAwareTraining",
                "fake quantizers are swapped in after the strategy "
                "has flattened and sharded the weights (a rank can hold an empty shard); train with QAT "
                "on one device or under 'ddp'.",
            )
        max_epochs = trainer.max_epochs
        if stage == "fit" and max_epochs is not None and max_epochs >= 0 and self.start_epoch >= max_epochs:
            raise SpeedupConfigError(
                f"`start_epoch`={self.start_epoch} is not before `max_epochs`={max_epochs}: QAT would never start. "
                f"Allowed values: 0..{max_epochs - 1}."
            )
        example = self.example_inputs if self.example_inputs is not None else pl_module.example_input_array
        if self.convert_on_fit_end and isinstance(example, torch.Tensor) and example.dim() > 0 and len(example) < 2:
            raise SpeedupConfigError(
                f"`example_inputs` has {len(example)} sample(s), but `convert_on_fit_end`=True validates the int8 "
                "model on inputs it was not calibrated on. Allowed values: a batch of at least 2 samples (half "
                "calibrates, half validates). HINT: pass example_inputs=<a training batch>."
            )
        if self.convert_on_fit_end and self.example_inputs is None and pl_module.example_input_array is None:
            raise SpeedupConfigError(
                "`convert_on_fit_end`=True needs `example_inputs` (or `pl_module.example_input_array`) to measure "
                "the int8 model. Allowed values: convert_on_fit_end=False, or pass `example_inputs`. HINT: pass a "
                "batch with a realistic batch size."
            )
        prepare_qat(pl_module, self.config, dry_run=True)  # raises now if no layer is eligible
        # resume: rebuild the fake quantizers right before the strategy restores the weights
        before_model_weights_load(trainer.strategy, "qat", lambda ckpt: apply_structure_records(pl_module, ckpt))

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch >= self.start_epoch and qat_record(pl_module) is None:
            # fake-quantized layers share the original Parameters: optimizer and DDP need no rebuild
            self.summary = prepare_qat(pl_module, self.config)
            rank_zero_info(
                f"QAT: fake quantization inserted at epoch {trainer.current_epoch} into "
                f"{len(self.summary.converted)} layers; left in float: {self.summary.skipped or 'none'}"
            )

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.freeze_bn_epoch is not None and trainer.current_epoch >= self.freeze_bn_epoch:
            for module in pl_module.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()  # running stats frozen and used for normalisation, as the int8 model will

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        record = qat_record(pl_module)
        if record is not None:
            store_structure_record(checkpoint, QAT_RECORD_KEY, record)

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.convert_on_fit_end:
            return
        example = self.example_inputs if self.example_inputs is not None else pl_module.example_input_array
        self.quantized_model, self.report = quantize_for_inference(pl_module, example, self.backend)
        rank_zero_info(
            f"QAT: int8 model via {self.report.backend} ({self.report.quantized_layers} layers in int8): "
            f"{self.report.speedup:.2f}x faster, {self.report.size_ratio:.2f}x smaller, max abs diff "
            f"{self.report.max_abs_diff:.3g}"
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"converted": list(self.summary.converted) if self.summary else []}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("converted"):
            self.summary = QATSummary(converted=list(state_dict["converted"]))


class Float8Training(Callback):
    """Train eligible ``nn.Linear`` layers with torchao float8 matmuls (CUDA compute capability >= 8.9).

    Eligible layers have in/out features divisible by 16 and at least ``min_features`` wide; ``filter_fn(module,
    fqn)`` can veto more. Small GEMMs get *slower* in float8 (the casts cost more than the matmul saves), hence the
    threshold. On CPU or older GPUs ``setup()`` raises with the reason, or logs it and does nothing when
    ``skip_if_unsupported=True``.

    Args:
        recipe: torchao recipe, one of ``"tensorwise"`` (fastest), ``"rowwise"``, ``"rowwise_with_gw_hp"``.
        min_features: smallest in/out features converted.
        exclude: module names or prefixes kept in high precision (the output head usually is).
        filter_fn: extra ``(module, fqn) -> bool`` filter.
        skip_if_unsupported: log and skip instead of raising on hardware without float8.

    Example::

        >>> cb = Float8Training(min_features=2048, skip_if_unsupported=True)
        >>> cb.recipe
        'tensorwise'
    """

    def __init__(
        self,
        recipe: str = "tensorwise",
        min_features: int = 1024,
        exclude: Sequence[str] = (),
        filter_fn: Callable[[nn.Module, str], bool] | None = None,
        skip_if_unsupported: bool = False,
    ) -> None:
        check_choice("recipe", recipe, FLOAT8_RECIPES)
        check_int("min_features", min_features, 16, hint="float8 GEMMs need dims divisible by 16.")
        check_callable("filter_fn", filter_fn, "a callable(module, fqn) -> bool", optional=True)
        self.recipe = recipe
        self.min_features = int(min_features)
        self.exclude = tuple(exclude)
        self.filter_fn = filter_fn
        self.skip_if_unsupported = skip_if_unsupported
        self.summary: Float8Summary | None = None
        self.skipped_reason: str | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or self.summary is not None:
            return
        ok, reason = float8_supported()
        if not ok:
            if self.skip_if_unsupported:
                self.skipped_reason = reason
                rank_zero_warn(f"Float8Training skipped: {reason}.")
                return
            raise SpeedupConfigError(
                f"`Float8Training`: {reason}. Allowed values: a CUDA GPU with compute capability >= 8.9. HINT: pass "
                "`skip_if_unsupported`=True to train in the usual precision."
            )
        # before configure_optimizers: Float8Linear keeps the same Parameters
        self.summary = convert_to_float8(
            pl_module,
            recipe=self.recipe,
            min_features=self.min_features,
            exclude=self.exclude,
            filter_fn=self.filter_fn,
            check_hardware=False,
        )
        rank_zero_info(f"Float8Training: {len(self.summary.converted)} Linear layers in float8 ({self.recipe}).")


register_technique(
    TechniqueInfo(
        name="qat",
        callback=QuantizationAwareTraining,
        functional=prepare_qat,
        summary="Quantization-aware training (torchao fake quant) + int8 inference export picked by measurement",
        requires=("torchao",),
        ways=(4,),
        bench="lightning_speedups.benchmarks.quantization:run",
    )
)
register_technique(
    TechniqueInfo(
        name="float8",
        callback=Float8Training,
        functional=convert_to_float8,
        summary="float8 matmuls for large nn.Linear layers (torchao), CUDA compute capability >= 8.9",
        requires=("cuda>=8.9", "torchao"),
        ways=(9,),
        bench=None,
    )
)
