"""PrecisionTrial: the fit's own first training steps timed in fp32 and under bf16 autocast, the faster kept.

An offline trial times copies of the model on one batch before the fit, and that time is lost to training. Here the
trial *is* training: the first steps of the fit alternate between fp32 and bf16 autocast, each a real optimizer step
on a real batch, timed from ``on_train_batch_start`` to ``on_train_batch_end`` (forward, backward, optimizer step;
data loading is outside). When the rounds settle (:func:`~lightning_speedups.measure.settle`, the rule of
:func:`~lightning_speedups.measure.compare`), the rest of the fit runs the winner. What the trial costs is only the
extra time of the slower option's steps, never the steps themselves, and a slower option is dropped once its extra
time passes ``max_cost`` of the planned fit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_speedups._errors import SpeedupConfigError, check_int, check_range
from lightning_speedups._peak import NO_BF16_UNITS, cpu_bf16_units
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups.measure import NoLossError, look_rounds, median, model_copy, settle, training_step_loss

__all__ = ["PrecisionTrial"]

FP32, BF16 = "32-true", "bf16-mixed"
MIN_ROUNDS = 3  # as autotune's comparisons: below 8 rounds the interval is the range, so all 3 must clear


class PrecisionTrial(Callback):
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

    def __init__(
        self,
        margin: float = 0.05,
        max_rounds: int = 12,
        max_cost: float = 0.02,
        *,
        clock: Callable[[], float] = time.perf_counter,
        on_decision: Callable[[PrecisionTrial], None] | None = None,
    ) -> None:
        check_range("margin", margin, 0.0, 1.0, hint="0.05 keeps bf16 only when at least 5% faster")
        check_int("max_rounds", max_rounds, MIN_ROUNDS, 1000)
        check_range("max_cost", max_cost, 0.0, 1.0, low_inclusive=False, hint="0.02: 2% of the planned fit")
        self.margin, self.max_rounds, self.max_cost, self.clock = float(margin), int(max_rounds), float(max_cost), clock
        self.on_decision = on_decision
        self.kept: str | None = None  # FP32 or BF16 once decided
        self.times: dict[str, list[float]] = {FP32: [], BF16: []}  # complete rounds only
        self.ratio: tuple[float, float, float] = (1.0, 1.0, 1.0)
        self.note = ""
        self.arm: str | None = None  # the option of the step running now (None: no autocast, untimed)
        self._slot = 0  # optimizer steps since the fit (or the resume) started, while the rounds run
        self._accumulate = 1  # batches per optimizer step: one step of an option is that many batches, timed together
        self._group: tuple[int, float] = (0, 0.0)  # batches of the current step so far, and their seconds
        self._pending: float | None = None  # the first half of a round
        self._t0: float | None = None
        self._autocast: torch.autocast | None = None
        self._device_type = "cpu"
        self._planned_steps = math.inf

    @property
    def rounds(self) -> int:
        return len(self.times[FP32])

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
        why = self._unsupported()
        if why is not None and self.kept is None:
            self.kept, self.note = FP32, f"bf16 not tried: {why}"
            rank_zero_info(f"PrecisionTrial: {self.note}; the fit runs in fp32.")

    def _unsupported(self) -> str | None:
        if self._device_type == "cpu":
            return NO_BF16_UNITS if cpu_bf16_units() is None else None
        if self._device_type == "cuda":
            return None if torch.cuda.is_bf16_supported() else "this GPU has no bf16 support"
        return f"no bf16 autocast trial on {self._device_type!r} devices"

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._slot, self._pending, self._group = 0, None, (0, 0.0)  # a resumed trial warms both options up again
        self._accumulate = max(1, int(trainer.accumulate_grad_batches))
        self._planned_steps = float(trainer.estimated_stepping_batches)

    def _arm_now(self) -> str | None:
        if self.kept is not None:
            return BF16 if self.kept == BF16 else None
        if self._slot < 2:  # untimed first step of each option
            return (FP32, BF16)[self._slot]
        first = (FP32, BF16) if self.rounds % 2 == 0 else (BF16, FP32)  # alternate the order: no position bias
        return first[(self._slot - 2) % 2]

    def _enter(self) -> None:
        if self._autocast is None:
            self._autocast = torch.autocast(self._device_type, dtype=torch.bfloat16)
            self._autocast.__enter__()

    def _exit(self) -> None:
        if self._autocast is not None:
            ctx, self._autocast = self._autocast, None
            ctx.__exit__(None, None, None)

    def _now(self) -> float:
        if self._device_type == "cuda":
            torch.cuda.synchronize()
        return self.clock()

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.kept is None and self._slot == 1 and self._group[0] == 0:  # before the first bf16 step: one on a copy
            why = _bf16_failure(pl_module, batch, batch_idx, self._device_type) if trainer.is_global_zero else None
            why = trainer.strategy.broadcast(why, src=0)
            if why is not None:
                self.kept, self.note, self._t0 = FP32, f"kept fp32: {why}", None
                self._decided(trainer)
        self.arm = self._arm_now()
        if self.arm == BF16:
            self._enter()
        self._t0 = self._now() if self.kept is None else None

    @override
    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        self._exit()  # autocast covers the forward only; backward runs in the dtypes the forward chose

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._exit()
        if self._t0 is None:
            return
        seconds, self._t0 = self._now() - self._t0, None
        batches, seconds = self._group[0] + 1, self._group[1] + seconds
        if batches < self._accumulate:  # the option holds until the optimizer steps (gradient accumulation)
            self._group = (batches, seconds)
            return
        self._group = (0, 0.0)
        slot, self._slot = self._slot, self._slot + 1
        if slot < 2:
            return
        if (slot - 2) % 2 == 0:
            self._pending = seconds
            return
        first = (FP32, BF16) if self.rounds % 2 == 0 else (BF16, FP32)
        self.times[first[0]].append(float(self._pending or 0.0))
        self.times[first[1]].append(seconds)
        self._pending = None
        self._decide(trainer)

    def _decide(self, trainer: L.Trainer) -> None:
        """After each round: rank 0's decision (at the looks, or on cost), the same on every rank."""
        decision = self._decision() if trainer.is_global_zero else None
        decision = trainer.strategy.broadcast(decision, src=0)
        if decision is None:
            return
        self.kept, self.ratio, self.note = decision[0], tuple(decision[1]), decision[2]
        self._decided(trainer)

    def _decided(self, trainer: L.Trainer) -> None:
        rank_zero_info(f"PrecisionTrial: {self.note}")
        if self.on_decision is not None and trainer.is_global_zero:
            self.on_decision(self)

    def _decision(self) -> tuple[str, tuple[float, float, float], str] | None:
        """The option to keep, its ratio and the note, or ``None`` while the rounds go on."""
        rounds, ratio = self.rounds, (1.0, 1.0, 1.0)
        if rounds >= MIN_ROUNDS:
            result = settle(self.times, FP32, min_gain=self.margin)
            ratio = result.ratios[BF16]
            if rounds >= self.max_rounds or (result.settled and rounds in look_rounds(MIN_ROUNDS, self.max_rounds)):
                return self._verdict(result.winner, ratio)
        extra = sum(self.times[BF16]) - sum(self.times[FP32])
        allowed = self.max_cost * median(self.times[FP32]) * self._planned_steps
        if extra > allowed:  # a slower bf16: more rounds only cost more
            return (
                FP32,
                ratio,
                (
                    f"kept fp32: the bf16 steps took {extra:.2f}s more than the fp32 ones in {rounds} round(s), above "
                    f"`max_cost`={self.max_cost:g} of the planned fit ({allowed:.2f}s)"
                ),
            )
        return None

    def _verdict(self, winner: str, ratio: tuple[float, float, float]) -> tuple[str, tuple[float, float, float], str]:
        lo, mid, hi = ratio
        if winner == BF16:
            return (
                BF16,
                ratio,
                f"kept bf16-mixed: {mid:.2f}x faster per step [{lo:.2f}, {hi:.2f}] in {self.rounds} rounds",
            )
        return (
            FP32,
            ratio,
            (
                f"kept fp32: bf16 ran at {mid:.2f}x [{lo:.2f}, {hi:.2f}] the fp32 speed in {self.rounds} rounds, not "
                f"{1 + self.margin:.2f}x beyond noise"
            ),
        )

    @override
    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.kept == BF16:
            self._enter()

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
        self._exit()

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._exit()

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._exit()

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"kept": self.kept, "times": {k: list(v) for k, v in self.times.items()}, "ratio": list(self.ratio),
                "note": self.note}  # fmt: skip

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.kept = state_dict["kept"]
        self.times = {k: [float(x) for x in v] for k, v in state_dict["times"].items()}
        self.ratio = tuple(state_dict["ratio"])  # type: ignore[assignment]
        self.note = str(state_dict["note"])


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
        mission_tip="9",
        example_kwargs={},
    )
)
