"""PrecisionTrial: the fit's own first training steps timed in fp32 and under bf16 autocast, the faster kept.

The rounds, the decision and their cost are :class:`~lightning_speedups.callbacks._in_fit_trial.InFitTrial`'s: the
trial trains while it measures, and costs only the extra time of the slower option's steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from typing_extensions import override

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._peak import NO_BF16_UNITS, cpu_bf16_units
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups.callbacks._in_fit_trial import MIN_ROUNDS, InFitTrial
from lightning_speedups.measure import NoLossError, model_copy, training_step_loss

__all__ = ["BF16", "FP32", "MIN_ROUNDS", "PrecisionTrial"]

FP32 = "32-true"
BF16 = "bf16-mixed"


class PrecisionTrial(InFitTrial):
    """Time the fit's first steps in fp32 and under bf16 autocast, alternating, and train the rest in the faster.

    The Trainer runs in fp32 (``precision="32-true"``); the callback enters ``torch.autocast(dtype=bfloat16)`` around
    ``training_step`` (it leaves before ``backward``, as Lightning's ``bf16-mixed`` does) on the steps it gives to
    bf16. The first step of each option is untimed (first-call costs), then rounds of one step of each run in
    alternating order. From 3 rounds on, at the looks :func:`~lightning_speedups.measure.compare` makes, bf16 is kept
    when its per-round speed ratio clears ``1 + margin`` beyond noise; fp32 is kept when bf16 cannot, or after
    ``max_rounds``. When bf16 is kept, validation runs under bf16 autocast too, as with ``precision="bf16-mixed"``.
    With gradient accumulation a step is one optimizer step: its ``accumulate_grad_batches`` batches run in one option
    and are timed together, so the optimizer's step never lands on one option only.

    bf16 is not tried (no step is spent) on a CPU without bf16 units (no ``amx_bf16``, ``avx512_bf16`` or ARM
    ``bf16`` flag), where it is emulated and about 10x slower, nor on a GPU without bf16. Under DDP rank 0's timings
    decide, and every rank keeps the same option. The decision and the rounds are in the checkpoint: a resumed fit
    keeps the decision, or continues the rounds after one untimed step of each option. ``kept``, ``ratio`` (low,
    median, high of the bf16 / fp32 speed ratio), ``rounds`` and ``note`` say what was decided.

    Where it does not help: a model whose step is no faster in bf16 (small or memory-bound models, most CPUs without
    AMX) gains nothing, and pays the extra time of the bf16 steps of its rounds (at most ``max_cost`` of the fit,
    plus one step). Quality: bf16 autocast trains to the same loss on most models; check yours once.

    Args:
        margin: bf16 must be this much faster per step (0.05: 5%) beyond noise to be kept.
        max_rounds: rounds at most (one step of each option per round); at least 3.
        max_cost: the largest share of the planned fit (its steps times the fp32 step) that the slower option's extra
            time may take before the trial stops and keeps fp32.
        clock: seconds as a float (tests inject a fake one).
        on_decision: called with the callback on rank 0 once the fit decides (``kept``, ``ratio``, ``rounds`` and
            ``note`` set), not again for a decision a checkpoint restored; autotune's plan uses it to cache the
            decision, so a later run of the plan starts in the kept precision. It must not raise, and under
            ``ddp_spawn`` it must pickle.

    Raises:
        SpeedupConfigError: at construction for an argument out of range; at ``setup`` when the Trainer's
            ``precision`` is not ``"32-true"``.

    Example::

        >>> trainer = L.Trainer(callbacks=[PrecisionTrial()], logger=False)
    """

    BASELINE = FP32
    CANDIDATE = BF16
    LABELS = {FP32: "fp32", BF16: "bf16"}

    def __init__(
        self,
        margin: float = 0.05,
        max_rounds: int = 12,
        max_cost: float = 0.02,
        *,
        clock: Callable[[], float] = time.perf_counter,
        on_decision: Callable[[PrecisionTrial], None] | None = None,
    ) -> None:
        super().__init__(margin, max_rounds, max_cost, clock=clock, on_decision=on_decision)
        self._autocast: torch.autocast | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if trainer.precision != FP32:
            raise SpeedupConfigError(
                f"`PrecisionTrial` times bf16 autocast against the Trainer's own fp32 steps, but the Trainer has "
                f"`precision`={trainer.precision!r}. Allowed values: '32-true'. HINT: drop `precision` from the "
                "Trainer to let the trial choose, or drop PrecisionTrial to keep your precision."
            )
        self._device_type = trainer.strategy.root_device.type
        self._decide_unsupported(self._unsupported())

    def _unsupported(self) -> str | None:
        if self._device_type == "cpu":
            return NO_BF16_UNITS if cpu_bf16_units() is None else None
        if self._device_type == "cuda":
            return None if torch.cuda.is_bf16_supported() else "this GPU has no bf16 support"
        return f"no bf16 autocast trial on {self._device_type!r} devices"

    @override
    def _check(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> str | None:
        return _bf16_failure(pl_module, batch, batch_idx, self._device_type)  # one bf16 step on a copy first

    @override
    def _enter(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, option: str) -> None:
        if option == BF16 and self._autocast is None:
            self._autocast = torch.autocast(self._device_type, dtype=torch.bfloat16)
            self._autocast.__enter__()

    @override
    def _leave(self) -> None:
        if self._autocast is not None:
            ctx = self._autocast
            self._autocast = None
            ctx.__exit__(None, None, None)

    @override
    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        self._leave()  # autocast covers the forward only; backward runs in the dtypes the forward chose

    @override
    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.kept == BF16:
            self._enter(trainer, pl_module, batch, BF16)

    @override
    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._leave()


def _bf16_failure(pl_module: L.LightningModule, batch: Any, batch_idx: int, device_type: str) -> str | None:
    """Why a training step of ``pl_module`` fails under bf16 autocast (forward and backward, on a copy, the RNG
    state kept), or ``None`` when it runs: an op without a bf16 kernel must not stop the user's fit."""
    if device_type == "cuda" and not _fits_twice(pl_module):
        return None  # no room for a copy: the first bf16 step runs unchecked (a failure then stops the fit, as usual)
    copy = model_copy(pl_module, train=True)
    try:
        with torch.random.fork_rng(devices=[]):
            with torch.autocast(device_type, dtype=torch.bfloat16):
                loss = training_step_loss(copy, batch, batch_idx, quiet=True)
            if loss.requires_grad:
                loss.backward()
    except NoLossError:
        return None  # a step that returns no loss (a skipped batch) has nothing to check
    except Exception as err:  # any failure of the user's step under bf16 keeps fp32, with the reason
        return f"`{type(pl_module).__name__}.training_step` fails under bf16 autocast ({type(err).__name__}: {err})"
    if not bool(torch.isfinite(loss.detach().float()).all()):
        return f"bf16 autocast gives `{type(pl_module).__name__}` a non-finite loss ({float(loss):.3g})"
    bad = [n for n, p in copy.named_parameters() if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
    if bad:  # an overflow in bf16's range: one optimizer step on these gradients would ruin the weights
        return f"bf16 autocast gives `{type(pl_module).__name__}` non-finite gradients (first: `{bad[0]}`)"
    return None


def _fits_twice(module: L.LightningModule) -> bool:
    """Whether a copy of ``module``'s parameters and buffers fits in half the GPU memory free now."""
    size = sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])
    free, _total = torch.cuda.mem_get_info()
    return 2 * size <= free


register_technique(
    TechniqueInfo(
        name="precision_trial",
        callback=PrecisionTrial,
        functional=None,
        summary="bf16 autocast timed against fp32 on the fit's own first steps; the faster kept for the rest",
        ways=(9,),
    )
)
