"""TokenThroughput callback: training speed in real (non-pad) tokens per second, the padding share and the MFU."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_speedups._errors import SpeedupConfigError, check_bool, check_callable, check_int
from lightning_speedups._peak import PeakEstimate, device_peak_flops
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups._tokens import IGNORE_INDEX, TokenCount, TokenCounter, count_tokens
from lightning_speedups.callbacks.advisor.facts import train_dtype

__all__ = ["TokenThroughput"]

_now = time.perf_counter  # module-level so tests can patch the clock


class TokenThroughput(Callback):
    """Log how fast training goes in tokens: real tokens/s, padded tokens/s, the pad fraction and the MFU.

    Samples/s hides what sequence models are paid in: a batch of short sequences padded to one long one costs as
    much as a full batch and trains on far fewer tokens. After every training batch this callback counts the batch's
    tokens (:func:`~lightning_speedups._tokens.count_tokens`: an ``attention_mask``'s non-zeros when the batch has one,
    else ``tokens != pad_value`` when ``pad_value`` is set, else ``labels != -100``, else every position; or your
    ``batch_to_tokens``) and logs, through ``pl_module.log`` (so ``Trainer(log_every_n_steps=...)`` decides how
    often they reach the logger), over a rolling window of the last ``window_size`` batches:

    - ``train/tokens_per_sec``: real (non-pad) tokens per second;
    - ``train/padded_tokens_per_sec``: every position the model computed on, padding included;
    - ``train/pad_fraction``: the share of those positions that are padding (``1 - tokens / padded``);
    - ``train/mfu``: model FLOPs utilisation, ``6 x trainable parameters x real tokens per second`` (the standard
      estimate of a transformer's forward + backward FLOPs: 2 per parameter per token forward, 4 backward; it leaves
      out attention's ``O(length^2)`` part and counts an embedding lookup as a matmul) divided by the device's peak
      FLOP/s for the run's precision (:func:`~lightning_speedups._peak.device_peak_flops`). Padding counts as wasted
      compute, so padding lowers the MFU. On GPUs the peak is the datasheet's; **on CPUs it is an estimate** (vector
      ISA x cores x clock, an upper bound only large matmuls approach), so read a CPU MFU as a number to compare runs
      with, not as a grade. On a device in no table the MFU is not logged (said once).

    The clock runs from batch end to batch end, so data loading is included and validation is left out; the rates
    appear from the second training batch on. The numbers are per device (each rank counts its own batches; the
    logger shows rank 0's). Batches that hold no integer ``(batch, length)`` token tensor (image data) make it warn
    once and stop; it never interrupts training.

    Args:
        pad_value: the padding token id, for batches without an attention mask (``None``: not used).
        ignore_index: the label value that marks padding in ``labels``.
        batch_to_tokens: ``batch -> real tokens`` (an int), ``(real, padded)`` or ``None`` (not token data), used
            instead of the counting rules above.
        window_size: batches in the rolling window (>= 2).
        flops_per_token: training FLOPs per real token, instead of ``6 x trainable parameters`` (for example
            ``6 * n_params + 12 * n_layers * d_model * seq_len`` with attention).
        log_mfu: also log ``train/mfu``.
        prog_bar: show ``train/tokens_per_sec`` in the progress bar.

    Attributes:
        metrics: the values last logged, without the ``train/`` prefix (empty until the second batch).
        last_count: the last batch's :class:`~lightning_speedups._tokens.TokenCount`.
        peak: the device's :class:`~lightning_speedups._peak.PeakEstimate` the MFU divides by.

    Raises:
        SpeedupConfigError: bad arguments (in ``__init__``).

    Example::

        >>> trainer = L.Trainer(callbacks=[TokenThroughput(window_size=10)], logger=False)
    """

    def __init__(
        self,
        pad_value: int | None = None,
        ignore_index: int = IGNORE_INDEX,
        batch_to_tokens: Callable[[Any], Any] | None = None,
        window_size: int = 20,
        flops_per_token: float | None = None,
        log_mfu: bool = True,
        prog_bar: bool = False,
    ) -> None:
        self.pad_value = check_int("pad_value", pad_value, optional=True)
        self.ignore_index = check_int("ignore_index", ignore_index)
        signature = "a callable(batch) returning real tokens or (real, padded)"
        self.batch_to_tokens = check_callable("batch_to_tokens", batch_to_tokens, signature, optional=True)
        self.window_size = check_int("window_size", window_size, 2, hint="a rate needs two batch ends, e.g. 20.")
        if flops_per_token is not None and (
            isinstance(flops_per_token, bool) or not isinstance(flops_per_token, (int, float)) or flops_per_token <= 0
        ):
            raise SpeedupConfigError(
                f"`flops_per_token`={flops_per_token!r} is out of range. Allowed values: a positive number or None "
                "(6 x trainable parameters)."
            )
        self.flops_per_token = flops_per_token
        self.log_mfu = check_bool("log_mfu", log_mfu)
        self.prog_bar = check_bool("prog_bar", prog_bar)
        self.counter = TokenCounter(pad_value, ignore_index, batch_to_tokens)
        self.peak: PeakEstimate | None = None
        self.active = True
        self.last_count: TokenCount | None = None
        self.metrics: dict[str, float] = {}
        self._reset()

    def _reset(self) -> None:
        self._window: deque[tuple[float, int, int, float]] = deque(maxlen=self.window_size)
        self._totals = (0, 0, 0.0)  # real tokens, padded tokens, FLOPs since the fit started
        self._paused = 0.0
        self._pause_start: float | None = None
        self._model_flops_per_token = 0.0
        self._cuda = False

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._reset()
        self.active = True
        self.metrics = {}
        self.last_count = None
        device = trainer.strategy.root_device
        self._cuda = device.type == "cuda"
        self.peak = device_peak_flops(device, train_dtype(str(trainer.precision))) if self.log_mfu else None
        if self.peak is not None and not self.peak.known:
            rank_zero_info(f"TokenThroughput: `train/mfu` is not logged: {self.peak.describe()}.")
        elif self.peak is not None and self.peak.estimate:
            rank_zero_info(f"TokenThroughput: `train/mfu` is against the {self.peak.describe()}.")

    # ---- the clock, paused during validation ---------------------------------------------------------------------
    def _clock(self) -> float:
        if self._cuda:
            torch.cuda.synchronize()  # the kernels of the step must be done before its end is read
        return _now() - self._paused

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pause_start = _now()

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pause_start is not None:
            self._paused += _now() - self._pause_start
            self._pause_start = None

    # ---- counting --------------------------------------------------------------------------------------------------
    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # recounted every epoch: a fine-tuning schedule may unfreeze layers
        trainable = sum(p.numel() for p in pl_module.parameters() if p.requires_grad)
        self._model_flops_per_token = float(self.flops_per_token or 6 * trainable)

    def _count(self, batch: Any) -> TokenCount | None:
        try:
            count = self.counter(batch)
        except Exception as err:  # noqa: BLE001 - measuring must never break training
            self._stop(f"counting the batch's tokens failed ({type(err).__name__}: {err})")
            return None
        if count is None:
            what = (
                "`batch_to_tokens` returned None"
                if self.batch_to_tokens is not None
                else ("the training batch holds no integer (batch, length) token tensor (an image batch?)")
            )
            self._stop(what)
        return count

    def _stop(self, why: str) -> None:
        self.active = False
        rank_zero_warn(
            f"TokenThroughput: {why}; it logs nothing for the rest of this fit. HINT: it is meant for token "
            "sequences; pass `batch_to_tokens=` for another batch layout."
        )

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.active:
            return
        t = self._clock()  # before counting: a count's device sync is not the step's time
        count = self._count(batch)
        if count is None:
            return
        self.last_count = count
        real, padded, flops = self._totals
        self._totals = (real + count.tokens, padded + count.padded, flops + self._model_flops_per_token * count.tokens)
        self._window.append((t, *self._totals))
        if len(self._window) < 2:
            return
        self.metrics = self._rates()
        for name, value in self.metrics.items():
            pl_module.log(
                f"train/{name}",
                value,
                on_step=True,
                on_epoch=False,
                batch_size=count.sequences or 1,
                prog_bar=self.prog_bar and name == "tokens_per_sec",
            )

    def _rates(self) -> dict[str, float]:
        t0, real0, padded0, flops0 = self._window[0]
        t1, real1, padded1, flops1 = self._window[-1]
        dt = max(t1 - t0, 1e-12)
        real = real1 - real0
        padded = padded1 - padded0
        out = {
            "tokens_per_sec": real / dt,
            "padded_tokens_per_sec": padded / dt,
            "pad_fraction": 1.0 - real / padded if padded else 0.0,
        }
        if self.peak is not None and self.peak.flops:
            out["mfu"] = (flops1 - flops0) / dt / self.peak.flops
        return out


register_technique(
    TechniqueInfo(
        name="token_throughput",
        callback=TokenThroughput,
        functional=count_tokens,
        summary="Logs real (non-pad) tokens/s, padded tokens/s, the pad fraction and the MFU (6 x parameters x "
        "tokens against the device's peak, estimated on CPUs).",
        ways=(6, 7),
    )
)
