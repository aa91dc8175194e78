"""LabelSmoothing callback: smoothed targets for the training loss only, validation loss unchanged."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_speedups._errors import SpeedupConfigError, check_range
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups.functional.label_smoothing import (
    LabelSmoothingSummary,
    apply_label_smoothing,
    find_label_smoothing_targets,
    restore_label_smoothing,
)

__all__ = ["LabelSmoothing"]


class LabelSmoothing(Callback):
    """Train with label smoothing ``smoothing`` without editing the LightningModule's loss code.

    Torch's cross-entropy already implements it (``label_smoothing=``), so the callback only sets the value where the
    module's loss reads it, with :func:`~lightning_speedups.functional.label_smoothing.apply_label_smoothing`:

    * every ``nn.CrossEntropyLoss`` submodule (``self.loss_fn = nn.CrossEntropyLoss()``), and
    * the float attribute ``attribute`` (default ``label_smoothing``) of the module or its ``hparams``, for steps that
      call ``F.cross_entropy(logits, y, label_smoothing=self.label_smoothing)``.

    A module with neither is refused in ``setup()`` with a hint (the callback does not patch
    ``torch.nn.functional.cross_entropy``: a global patch would also change metrics, other models and other threads).

    Smoothing is on for training steps only. Around every validation loop (the sanity check included) the module's
    own values are put back, so ``val_loss`` stays the plain cross-entropy, comparable with a run without the callback
    and safe to monitor; at the end of fit the module is left as it was. A checkpoint stores the module's own value
    in ``hyper_parameters``, so ``load_from_checkpoint`` gives the unsmoothed model.

    Args:
        smoothing: the label smoothing, in ``[0, 1)``; 0.1 is the common choice for 10-1000 classes.
        attribute: the module attribute its ``F.cross_entropy`` call reads, or ``None`` to use loss submodules only.

    Example::

        >>> trainer = L.Trainer(callbacks=[LabelSmoothing(0.1)])  # doctest: +SKIP
    """

    def __init__(self, smoothing: float = 0.1, attribute: str | None = "label_smoothing") -> None:
        check_range("smoothing", smoothing, 0.0, 1.0, high_inclusive=False, hint="0.1 is the usual value.")
        if attribute is not None and (not isinstance(attribute, str) or not attribute.isidentifier()):
            raise SpeedupConfigError(
                f"`attribute`={attribute!r} is not supported. Allowed values: an attribute name (str) or None."
            )
        self.smoothing = float(smoothing)
        self.attribute = attribute
        self.summary: LabelSmoothingSummary | None = None
        self._in_hparams = False

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        names, has_attr = find_label_smoothing_targets(pl_module, self.attribute)
        if not names and not has_attr:
            apply_label_smoothing(pl_module, self.smoothing, self.attribute)  # raises, saying how to fix the module
        self._in_hparams = bool(
            has_attr
            and self.attribute
            and self.attribute not in vars(pl_module)
            and not hasattr(type(pl_module), self.attribute)
        )

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.summary = apply_label_smoothing(pl_module, self.smoothing, self.attribute)
        own = {k: v for k, v in self.summary.previous.items() if v not in (None, 0, 0.0, self.smoothing)}
        if own:
            rank_zero_warn(f"LabelSmoothing: replaces the module's own label smoothing {own} by {self.smoothing}.")
        where = [*self.summary.loss_modules, *([f".{self.summary.attribute}"] if self.summary.attribute else [])]
        rank_zero_info(f"LabelSmoothing: {self.smoothing} on {', '.join(where)} for training steps.")

    def _restore(self, pl_module: L.LightningModule) -> None:
        if self.summary is not None:
            restore_label_smoothing(pl_module, self.summary)

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore(pl_module)  # val_loss: the plain cross-entropy

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.summary is not None and trainer.state.fn == "fit":
            apply_label_smoothing(pl_module, self.smoothing, self.attribute)

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        hparams = checkpoint.get("hyper_parameters")
        if self._in_hparams and self.summary is not None and isinstance(hparams, dict) and self.attribute in hparams:
            hparams[self.attribute] = self.summary.previous.get(f"attr:{self.attribute}")

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._restore(pl_module)
            self.summary = None


register_technique(
    TechniqueInfo(
        name="label_smoothing",
        callback=LabelSmoothing,
        functional=apply_label_smoothing,
        summary="label smoothing of the training loss (CrossEntropyLoss submodules or a `label_smoothing` attribute)",
        ways=(3, 6),
        bench="lightning_speedups.benchmarks.time_to_accuracy:run_label_smoothing",
    )
)
