"""``SpeedAdvisor``: measure a window of training steps, then report what slows the run down and how to fix it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_speedups import settings
from lightning_speedups._errors import SpeedupConfigError, SpeedupRuntimeError, check_bool, check_int
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups._tokens import TokenCounter
from lightning_speedups.callbacks.advisor.facts import (
    checksum,
    compile_graphs,
    compile_note,
    fill_device_facts,
    fill_loader_facts,
    first_float_tensor,
    measure_compile,
    measure_effects,
    memory_format_ok,
    optimizer_measurements,
    planned_steps,
    process_rss,
)
from lightning_speedups.functional import advisor as F
from lightning_speedups.functional.advisor import AdvisorReport, AdvisorThresholds, Measurements
from lightning_speedups.functional.channels_last import apply_channels_last
from lightning_speedups.functional.compile import FIRST_COMPILE_PRIOR_S, is_compiled

if TYPE_CHECKING:
    from torch.utils.flop_counter import FlopCounterMode

__all__ = ["SpeedAdvisor"]

_now = time.perf_counter  # module-level so tests can patch the clock


#: The automatic compile probe runs only when its expected cost is at most this share of the planned run's compute
#: (autotune's default trial budget is the same 5%).
COMPILE_PROBE_SHARE = 0.05


def _compile_probe_too_costly(m: Measurements) -> str | None:
    """Why the automatic probe skips a run: its expected compile is more than :data:`COMPILE_PROBE_SHARE` of the
    planned run's compute (``None``: probe; also when the run length or the step time is unknown)."""
    planned = m.planned_steps
    compute_s = m.compute_s
    if planned is None or not compute_s:
        return None
    run_s = planned * compute_s
    if FIRST_COMPILE_PRIOR_S <= COMPILE_PROBE_SHARE * run_s:
        return None
    return (
        f"probe skipped: the planned run computes for about {run_s:.0f} s, and a first compile often takes "
        f"{FIRST_COMPILE_PRIOR_S:.0f} s or more, over {COMPILE_PROBE_SHARE:.0%} of the run. HINT: "
        "SpeedAdvisor(probe_compile=True) measures it anyway"
    )


class SpeedAdvisor(Callback):
    """Measure ``window_steps`` training batches after ``warmup_steps``, then emit a ranked speed report.

    Measures step time, the share of time waiting for data (previous ``on_train_batch_end`` -> next
    ``on_train_batch_start``) vs compute, samples/s, peak memory and headroom, precision vs hardware, FLOPs per
    batch (``FlopCounterMode`` on the last warm-up batch, so its overhead stays out of the timings) and utilisation
    against the device's peak (a datasheet peak on GPUs, an estimate from ISA x cores x clock on CPUs), plus
    model/optimizer checks (channels_last, fused optimizer, frozen-but-updated and never-updated parameters, loader
    workers, batch size). On token sequences it also counts the padding of the timed batches (an attention mask's
    zeros, or ``pad_value``). Outside the window every hook returns after one comparison.

    The report is printed on rank zero, kept as :attr:`report` (``to_dict()`` / ``to_json(path)``) and its headline
    numbers go to the trainer's loggers as ``advisor/*`` metrics.

    Args:
        warmup_steps: untimed batches first (lazy init, allocator, caches); at least 1.
        window_steps: timed batches; must be >= ``warmup_steps``.
        apply: ``False`` (default) never changes the run. ``True`` applies the findings that are safe to change
            mid-run: converts a conv model to channels_last when that was measured faster, turns TF32 matmuls on
            for fp32 on Ampere+ GPUs, and lowers torch's CPU threads when fewer were measured faster (another process
            competes for the cores; process-wide, like TF32). Everything else (loader, precision, optimizer, batch
            size) stays a suggestion.
        measure_effects: run cheap micro-measurements at the end of the window (bf16 vs fp32 matmul, channels_last
            and half the CPU threads on a model copy, fused optimizer step on parameter copies) so findings carry a
            measured expected effect.
        thresholds: :class:`AdvisorThresholds` or a dict of its fields.
        verbose: print the text report via ``rank_zero_info``.
        pad_value: the padding token id, for token batches without an attention mask (``None``: not used).
        probe_compile: with ``measure_effects``, time ``torch.compile`` on a copy of the model (one compile, then a
            few interleaved eager / compiled steps), only when the model is compute-bound, eager, and the planned run
            is long enough to pay a compile back at all. ``None`` (default): only when the probe's expected cost
            (``lightning_speedups.functional.compile.FIRST_COMPILE_PRIOR_S``, 30 s) is at most
            ``COMPILE_PROBE_SHARE`` (5%) of the planned run's compute, or the run length is unknown; ``True``: always;
            ``False``: never. The ``not_compiled`` finding then says after how many steps
            compiling pays back (every graph the run compiles counted at the measured cost: the validation forward,
            a smaller last batch), and is left out where it does not pay back within the planned run. The compile
            itself takes seconds to tens of seconds on a CPU, so a short run is not probed by default.

    Example::

        >>> from lightning_speedups.demo import DemoClassifier, DigitsDataModule
        >>> advisor = SpeedAdvisor(warmup_steps=2, window_steps=4)
        >>> trainer = L.Trainer(max_steps=6, callbacks=[advisor], logger=False, enable_progress_bar=False,
        ...                     enable_checkpointing=False, enable_model_summary=False, accelerator="cpu")
        >>> trainer.fit(DemoClassifier(width=8), DigitsDataModule())  # a real timed fit  # doctest: +SKIP
        >>> advisor.report.findings[0].key  # depends on this machine  # doctest: +SKIP
        'data_bound'
    """

    def __init__(
        self,
        warmup_steps: int = 5,
        window_steps: int = 20,
        apply: bool = False,
        measure_effects: bool = True,
        thresholds: AdvisorThresholds | dict[str, Any] | None = None,
        verbose: bool = True,
        pad_value: int | None = None,
        probe_compile: bool | None = None,
    ) -> None:
        check_int("warmup_steps", warmup_steps, 1)
        self.probe_compile = check_bool(
            "probe_compile",
            probe_compile,
            hint="None probes when the run is long enough, True always, False never (it costs one torch.compile).",
            optional=True,
        )
        self.pad_value = check_int("pad_value", pad_value, optional=True)
        self._counter = TokenCounter(pad_value)
        check_int("window_steps", window_steps, 1)
        hint = "not smaller than `warmup_steps`: time at least as many batches as you warm up, e.g. 5 and 20."
        check_int("window_steps", window_steps, warmup_steps, hint=hint)
        if isinstance(thresholds, dict):
            thresholds = AdvisorThresholds(**thresholds)
        elif thresholds is not None and not isinstance(thresholds, AdvisorThresholds):
            raise SpeedupConfigError(
                f"`thresholds`={thresholds!r} is not supported. Allowed values: AdvisorThresholds, dict or None."
            )
        self.warmup_steps = warmup_steps
        self.window_steps = window_steps
        self.apply = bool(apply)
        self.measure_effects = bool(measure_effects)
        self.verbose = bool(verbose)
        self.thresholds = thresholds or AdvisorThresholds()
        self.report: AdvisorReport | None = None
        self.hook_calls = 0  # every training-batch hook call (cheap counter)
        self.work_calls = 0  # hook calls that did measuring work (only inside the window)
        self._reset()

    # ---- state ---------------------------------------------------------------------------------------------------
    def _reset(self) -> None:
        self._batches = 0
        self._active = False
        self._done = self.report is not None
        self._m = Measurements()
        self._t_start: float | None = None
        self._t_last_end: float | None = None
        self._t_backward: float | None = None
        self._t_opt: float | None = None
        self._flop_counter: FlopCounterMode | None = None
        self._frozen_sums: dict[str, tuple[float, float]] = {}
        self._got_grad: set[str] = set()
        self._rss_peak = 0
        self._example: torch.Tensor | None = None
        self._batch: Any = None
        self._cuda = False

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"report": self.report.to_dict() if self.report is not None else None}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        rep = state_dict.get("report")
        if rep is not None:  # a resumed run does not measure again
            self.report = AdvisorReport(
                summary=rep["summary"],
                findings=[F.Finding(**f) for f in rep["findings"]],
                notes=rep.get("notes", []),
                applied=rep.get("applied", []),
            )
            self._done = True

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._reset()

    # ---- timing helpers ------------------------------------------------------------------------------------------
    def _clock(self) -> float:
        if self._cuda:
            torch.cuda.synchronize()
        return _now()

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._t_last_end = None  # the gap across epochs/validation is not data waiting

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._t_last_end = None

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.hook_calls += 1
        if self._done or self._batches < self.warmup_steps - 1:
            return
        self.work_calls += 1
        self._cuda = pl_module.device.type == "cuda"
        if self._batches == self.warmup_steps - 1:  # last warm-up batch: count FLOPs (untimed)
            self._start_flop_count()
            return
        if not self._active:
            self._begin_window(trainer, pl_module, batch)
        t = self._clock()
        if self._t_last_end is not None:
            self._m.data_waits.append(t - self._t_last_end)
        self._t_start = t
        self._t_backward = self._t_opt = None
        self._example = first_float_tensor(batch)
        self._batch = batch

    @override
    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        if self._active:
            self.work_calls += 1
            self._t_backward = self._clock()

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if not self._active:
            return
        self.work_calls += 1
        self._t_opt = self._clock()
        for name, p in pl_module.named_parameters():
            if p.requires_grad and p.grad is not None:
                self._got_grad.add(name)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.hook_calls += 1
        self._batches += 1
        if self._done or self._batches < self.warmup_steps:
            return
        self.work_calls += 1
        if self._batches == self.warmup_steps:  # end of the FLOP-counted warm-up batch
            self._stop_flop_count()
            self._t_last_end = self._clock()
            return
        t = self._clock()
        m = self._m
        if self._t_start is not None:
            m.compute_times.append(t - self._t_start)
            if self._t_backward is not None:
                m.forward_times.append(self._t_backward - self._t_start)
                if self._t_opt is not None:
                    m.backward_times.append(self._t_opt - self._t_backward)
            if self._t_opt is not None:
                m.optimizer_times.append(t - self._t_opt)
        self._count_tokens(batch)  # after the step's clock reading: its device sync is not step time
        if not self._cuda:
            self._rss_peak = max(self._rss_peak, process_rss())
        if self._batches >= self.warmup_steps + self.window_steps:
            self._finish(trainer, pl_module, note=None)
            return
        self._t_last_end = self._clock()

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._flop_counter is not None:
            self._stop_flop_count()
        if not self._done and self._m.compute_times:
            done = len(self._m.compute_times)
            self._finish(trainer, pl_module, note=f"training ended after {done} of {self.window_steps} timed batches")
        elif not self._done:
            rank_zero_warn(
                f"SpeedAdvisor: training ended after {self._batches} batch(es), before its window "
                f"({self.warmup_steps} warm-up + {self.window_steps} timed): no report. HINT: lower `warmup_steps`."
            )

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if self._flop_counter is not None:  # never leave the FLOP-counting dispatch mode pushed
            self._stop_flop_count()

    def _count_tokens(self, batch: Any) -> None:
        try:
            count = self._counter(batch)
        except Exception:  # noqa: BLE001 - a measurement, never a reason to stop training
            count = None
        if count is not None:
            self._m.tokens += count.tokens
            self._m.padded_tokens += count.padded

    # ---- window start / end --------------------------------------------------------------------------------------
    def _start_flop_count(self) -> None:
        try:
            from torch.utils.flop_counter import FlopCounterMode

            self._flop_counter = FlopCounterMode(display=False)
            self._flop_counter.__enter__()
        except Exception:  # noqa: BLE001 - FLOP counting is best effort
            self._flop_counter = None

    def _stop_flop_count(self) -> None:
        fc = self._flop_counter
        self._flop_counter = None
        if fc is None:
            return
        try:
            fc.__exit__(None, None, None)
            self._m.flops_per_batch = int(fc.get_total_flops()) or None
        except Exception:  # noqa: BLE001
            self._m.flops_per_batch = None

    def _begin_window(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any) -> None:
        self._active = True
        if self._cuda:
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        self._frozen_sums = {n: checksum(p) for n, p in pl_module.named_parameters() if not p.requires_grad}
        try:
            from lightning.pytorch.utilities.data import extract_batch_size

            self._m.batch_size = int(extract_batch_size(batch))
        except Exception:  # noqa: BLE001
            self._m.batch_size = None

    def _collect(self, trainer: L.Trainer, pl_module: L.LightningModule, notes: list[str]) -> Measurements:
        m = self._m
        m.device_type = pl_module.device.type
        m.precision = str(trainer.precision)
        m.callbacks = [type(c).__name__ for c in trainer.callbacks]
        m.compiled = is_compiled(pl_module) or any(  # compiled in place, or a submodule wrapped by torch.compile
            type(x).__name__ == "OptimizedModule" for x in pl_module.modules()
        )
        m.planned_steps = planned_steps(trainer)
        m.compile_graphs = compile_graphs(trainer, pl_module)
        m.has_conv, m.conv_channels_last = memory_format_ok(pl_module)
        fill_device_facts(m, pl_module.device, self._cuda, self._rss_peak, notes)
        fill_loader_facts(m, trainer.train_dataloader)
        m.optimizers = optimizer_measurements(trainer.optimizers)
        params = dict(pl_module.named_parameters())
        m.frozen_updated = sorted(n for n, s in self._frozen_sums.items() if n in params and checksum(params[n]) != s)
        trainable = [n for n, p in params.items() if p.requires_grad]
        m.trainable_params = len(trainable)
        if m.optimizer_times:  # grads were inspected only when an optimizer step ran
            m.never_grad = sorted(set(trainable) - self._got_grad)
        if self.measure_effects:
            measure_effects(m, pl_module, trainer.optimizers, self._example)
        too_short = _compile_probe_too_costly(m) if self.measure_effects and self.probe_compile is None else None
        if self.measure_effects and self.probe_compile is not False and too_short is None:
            measure_compile(m, pl_module, self._batch)
        else:
            m.compile_note = too_short or "probe off (`measure_effects` or `probe_compile` is False)"
        if m.device_type == "cpu" and ("bf16" in m.precision or m.precision.startswith("16")) and not m.bf16_speedup:
            m.cpu_bf16_fast = settings.cpu_bf16_is_fast()  # library-wide cached probe: the model copy was not timed
        return m

    def _finish(self, trainer: L.Trainer, pl_module: L.LightningModule, note: str | None) -> None:
        self._active = False
        self._done = True
        notes = [note] if note else []
        m = self._collect(trainer, pl_module, notes)
        findings = F.diagnose(m, self.thresholds)
        notes += [n for n in [compile_note(m, findings)] if n]
        self.report = AdvisorReport(summary=m.summary(), findings=findings, notes=notes)
        if self.apply:
            self.report.applied = self._apply(pl_module, m)
        self._example = self._batch = None
        if self.verbose:
            rank_zero_info(self.report.to_text())
        metrics = {f"advisor/{k}": float(v) for k, v in m.summary().items() if isinstance(v, (int, float))}
        metrics["advisor/findings"] = float(len(findings))
        metrics.update({f"advisor/score/{f.key}": float(f.score) for f in findings})
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    def _apply(self, pl_module: L.LightningModule, m: Measurements) -> list[str]:
        applied: list[str] = []
        keys = {f.key for f in self.report.findings} if self.report else set()
        if "channels_last" in keys and (m.channels_last_speedup or 0) > 1.02:
            # in place: parameters keep their identity, so the optimizer and its state stay valid
            apply_channels_last(pl_module, warn=False)  # 4-D tensors only: a Conv3d's 5-D weight stays
            applied.append(f"model converted to channels_last (measured {m.channels_last_speedup:.2f}x)")
        if "tf32_off" in keys:
            torch.set_float32_matmul_precision("high")
            applied.append('torch.set_float32_matmul_precision("high")')
        if "cpu_threads" in keys and m.fewer_threads and (m.fewer_threads_speedup or 0) > 1.05:
            torch.set_num_threads(m.fewer_threads)  # process-wide, like the TF32 setting
            applied.append(f"torch.set_num_threads({m.fewer_threads}) (measured {m.fewer_threads_speedup:.2f}x)")
        return applied

    # ---- report access -------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The report as a dict (empty when the window has not completed)."""
        return self.report.to_dict() if self.report is not None else {}

    def to_json(self, path: str | Path | None = None) -> str:
        """The report as JSON, written to ``path`` when given."""
        if self.report is None:
            raise SpeedupRuntimeError(
                "`SpeedAdvisor.report` is None: no timed batch has run yet. HINT: call to_json after fit has timed "
                "its window (warmup_steps + window_steps batches)."
            )
        return self.report.to_json(path)


register_technique(
    TechniqueInfo(
        name="advisor",
        callback=SpeedAdvisor,
        functional=F.diagnose,
        summary="Measures a window of steps and ranks what slows training down, naming this library's fix.",
        ways=(1, 2, 3, 4, 5, 6, 7, 8, 9),
        bench="lightning_speedups.benchmarks.advise:run",
    )
)
