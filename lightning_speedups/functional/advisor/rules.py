"""The advisor's rules: one small function per finding, ``rule(measurements, thresholds) -> Finding | None``.

:func:`~lightning_speedups.functional.advisor.diagnose` runs :data:`RULES` in order and ranks what they return by
score; a tie keeps this order. A new diagnosis is a new rule (``@advisor_rule``), not an edit of a long function.
Every rule of the library is defined, and so registered, in this module: importing :data:`RULES` registers them all.
Rules that exclude each other (the data-loading pair, the three precision rules) check the earlier rule's condition
themselves, so each can be read alone. ``optimizer_not_fused`` returns a list: one finding per non-fused optimizer.
The scores and evidence are shaped by :mod:`~lightning_speedups.functional.advisor.scoring`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from lightning_speedups.functional.advisor.records import AdvisorThresholds, Finding, Measurements
from lightning_speedups.functional.advisor.scoring import (
    measurement_evidence,
    ratio_note,
    rounded,
    severity_for,
    to_ms,
)

__all__ = ["MIN_COMPILE_S", "RULES", "Rule", "advisor_rule", "compile_may_pay_back"]

Rule = Callable[[Measurements, AdvisorThresholds], Finding | list[Finding] | None]

#: The rules :func:`~lightning_speedups.functional.advisor.diagnose` runs, in order.
RULES: list[Rule] = []


def advisor_rule(rule: Rule) -> Rule:
    """Append ``rule`` to :data:`RULES` (a decorator); rules run, and tie in ranking, in registration order."""
    RULES.append(rule)
    return rule


def _has_callback(m: Measurements, name: str) -> bool:
    return name in m.callbacks


def _plain_loader(m: Measurements) -> bool:
    return m.loader_kind in ("DataLoader", None)  # unknown loader: give the DataLoader advice


def _data_bound(m: Measurements, th: AdvisorThresholds) -> bool:
    return bool(m.compute_times) and m.data_wait_share >= th.data_wait


def _low_precision_on_slow_cpu(m: Measurements) -> bool:
    low_prec = "bf16" in m.precision or m.precision.startswith("16")
    s_bf16 = m.bf16_speedup  # fp32 time / bf16 time of this model's step (> 1: bf16 faster)
    slow_cpu = (s_bf16 is not None and s_bf16 < 0.9) or (s_bf16 is None and m.cpu_bf16_fast is False)
    return m.device_type == "cpu" and low_prec and slow_cpu


def _fp32_on_bf16_gpu(m: Measurements) -> bool:
    return "32" in m.precision and m.device_type == "cuda" and bool(m.cuda_bf16_supported)


# ---- data loading ----------------------------------------------------------------------------------------------
@advisor_rule
def data_bound(m: Measurements, th: AdvisorThresholds) -> Finding | None:
    """A large share of each step waits for the next batch."""
    if not _data_bound(m, th):
        return None
    wait_share = m.data_wait_share
    if _plain_loader(m):
        fix = (
            "Keep the decoded dataset on the device with `DeviceDataLoader` (augment whole batches with "
            "`BatchAugment`) when it fits in memory; otherwise "
            + (
                f"raise the DataLoader's `num_workers` (now {m.num_workers})"
                if m.num_workers
                else "give the DataLoader `num_workers` > 0"
            )
            + " with `persistent_workers=True`"
            + (" and `pin_memory=True`." if m.device_type == "cuda" else ".")
        )
    else:
        fix = (
            "Time is spent between steps outside the loader's control: log less often "
            "(`Trainer(log_every_n_steps=...)`) and check callbacks' per-batch hooks; with a DataLoader use "
            "`DeviceDataLoader` or more `num_workers`."
        )
    return Finding(
        key="data_bound",
        title=f"Data-bound: {wait_share:.0%} of each step waits for the next batch",
        severity=severity_for(wait_share),
        score=wait_share,
        evidence={
            "data_wait_ms": to_ms(m.data_wait_s),
            "compute_ms": to_ms(m.compute_s),
            "data_wait_share": rounded(wait_share),
            "loader": m.loader_kind,
            "num_workers": m.num_workers,
        },
        fix=fix,
        expected=f"up to {1 / max(1e-9, 1 - wait_share):.1f}x samples/s once loading is hidden or removed "
        "(Amdahl bound from the measured wait share)",
    )


@advisor_rule
def num_workers_zero(m: Measurements, th: AdvisorThresholds) -> Finding | None:
    """A smaller wait with a main-process DataLoader (only when the run is not data-bound already)."""
    wait_share = m.data_wait_share
    if _data_bound(m, th) or not (_plain_loader(m) and m.num_workers == 0 and wait_share >= th.data_wait_note):
        return None
    return Finding(
        key="num_workers_zero",
        title=f"DataLoader with num_workers=0: {wait_share:.0%} of each step loads data in the main process",
        severity="low",
        score=wait_share,
        evidence={"data_wait_ms": to_ms(m.data_wait_s), "data_wait_share": rounded(wait_share), "num_workers": 0},
        fix="`DeviceDataLoader` for in-memory data, or DataLoader `num_workers` > 0 with `persistent_workers=True`.",
        expected=f"up to {1 / max(1e-9, 1 - wait_share):.2f}x samples/s (Amdahl bound)",
    )


# ---- precision vs hardware -------------------------------------------------------------------------------------
@advisor_rule
def low_precision_on_slow_cpu(m: Measurements, th: AdvisorThresholds) -> Finding | None:
    """bf16/fp16 training on a CPU where it was measured (or is known to be) slower than fp32."""
    if not _low_precision_on_slow_cpu(m):
        return None
    s_bf16 = m.bf16_speedup
    slow = 1.0 / s_bf16 if s_bf16 else None
    frac = (1.0 - 1.0 / slow) if slow else 0.5
    score = m.compute_share * frac
    return Finding(
        key="low_precision_on_slow_cpu",
        title=f"Precision {m.precision} on a CPU without fast bf16/fp16 units",
        severity="high" if score >= 0.08 else severity_for(score),
        score=score,
        evidence={
            "precision": m.precision,
            "bf16_step_slowdown": rounded(slow, 2),
            "compute_ms": to_ms(m.compute_s),
            **measurement_evidence(s_bf16),
        },
        fix='`trainer_settings(precision="auto")` (picks 32-true on this CPU) or `Trainer(precision="32-true")`.',
        expected=f"about {slow:.1f}x faster compute (fp32 vs bf16 training step measured on this CPU)"
        + ratio_note(s_bf16)
        if slow
        else "fp32 is typically several times faster on CPUs without bf16 units (not measured)",
        measured=slow is not None,
    )


@advisor_rule
def fp32_on_bf16_gpu(m: Measurements, th: AdvisorThresholds) -> Finding | None:
    """fp32 training on a GPU with bf16 tensor cores."""
    if _low_precision_on_slow_cpu(m) or not _fp32_on_bf16_gpu(m):
        return None
    score = m.compute_share * 0.4
    return Finding(
        key="fp32_on_bf16_gpu",
        title=f"fp32 training on a GPU with bf16 tensor cores ({m.device_name})",
        severity=severity_for(score),
        score=score,
        evidence={"precision": m.precision, "utilisation": rounded(m.utilisation)},
        fix='`trainer_settings(precision="auto")` (bf16-mixed here) or `Trainer(precision="bf16-mixed")`.',
        expected="typically 1.5-3x faster compute and half the activation memory (rule of thumb, not measured)",
    )


@advisor_rule
def fp32_on_bf16_cpu(m: Measurements, th: AdvisorThresholds) -> Finding | None:
    """fp32 training on a CPU where bf16 autocast was measured clearly faster."""
    if _low_precision_on_slow_cpu(m) or _fp32_on_bf16_gpu(m):
        return None
    if not ("32" in m.precision and m.device_type == "cpu" and m.bf16_speedup):
        return None
    score = max(0.0, m.compute_share * (1.0 - 1.0 / m.bf16_speedup))
    if not m.bf16_speedup > 1.3:  # the margin `trainer_settings` uses too: above noise, worth the accuracy check
        return None
    return Finding(
        key="fp32_on_bf16_cpu",
        title=f"fp32 training although bf16 autocast ran {m.bf16_speedup:.2f}x faster on this CPU",
        severity=severity_for(score),
        score=score,
        evidence={
            "precision": m.precision,
            "bf16_step_speedup": rounded(m.bf16_speedup, 2),
            **measurement_evidence(m.bf16_speedup),
        },
        fix='`Trainer(precision="bf16-mixed")` (or `trainer_settings(precision="auto")`); check the accuracy.',
        expected=f"{m.bf16_speedup:.2f}x faster forward+backward under bf16 autocast, measured on this CPU"
        + ratio_note(m.bf16_speedup),
        measured=True,
    )


@advisor_rule
def tf32_off(m: Measurements, th: AdvisorThresholds) -> Finding | None:
    """fp32 matmuls at 'highest' precision on an Ampere+ GPU."""
    if not (m.tf32_off and "32" in m.precision and not _has_callback(m, "SpeedFlags")):
        return None
    score = m.compute_share * 0.3
    return Finding(
        key="tf32_off",
        title="fp32 matmuls run at 'highest' precision on an Ampere+ GPU (TF32 off)",
        severity=severity_for(score),
        score=score,
        evidence={"float32_matmul_precision": "highest"},
        fix='`SpeedFlags()` callback or `enable_speed_flags()` (sets `torch.set_float32_matmul_precision("high")`).',
        expected="typically up to 2-3x faster fp32 matmuls (rule of thumb, not measured)",
    )


# ---- memory layout ---------------------------------------------------------------------------------------------
@advisor_rule
def channels_last(m: Measurements, th: AdvisorThresholds) -> Finding | None:
    """A convolution model in the NCHW layout (ranked by the measured channels_last speedup when there is one)."""
    if not (m.has_conv and not m.conv_channels_last and not _has_callback(m, "ChannelsLast")):
        return None
    compute_share = m.compute_share
    s = m.channels_last_speedup
    if s is not None:
        score = max(0.0, compute_share * (1.0 - 1.0 / s))
        expected = (
            f"{s:.2f}x faster forward+backward measured on a copy of the model"
            + ("" if s > 1.02 else " (no gain on this machine: skip it)")
            + ratio_note(s)
        )
    else:
        score = compute_share * (0.15 if m.device_type == "cuda" else 0.02)
        expected = "typically 1.1-1.3x on GPUs with tensor cores (not measured)"
    return Finding(
        key="channels_last",
        title="Convolution model in the default NCHW memory layout",
        severity=severity_for(score) if s is None or s > 1.02 else "info",
        score=score if s is None or s > 1.02 else 0.0,
        evidence={"channels_last_speedup": rounded(s, 3), **measurement_evidence(s)},
        fix="`ChannelsLast()` callback (model and 4-D inputs to torch.channels_last).",
        expected=expected,
        measured=s is not None,
    )


# ---- optimizer -------------------------------------------------------------------------------------------------
@advisor_rule
def optimizer_not_fused(m: Measurements, th: AdvisorThresholds) -> list[Finding]:
    """Optimizers that have a fused kernel but run without it (one finding each)."""
    out: list[Finding] = []
    compute_share = m.compute_share
    opt_share = m.optimizer_share
    for opt in m.optimizers:
        if not opt.fused_supported or opt.fused:
            continue
        s = opt.fused_speedup
        share = opt_share if opt_share is not None else 0.0
        if s is not None:
            score = max(0.0, compute_share * share * (1.0 - 1.0 / s))
        else:
            score = compute_share * share * (0.3 if opt.foreach or m.device_type == "cuda" else 0.5)
        if share < th.optimizer_share and (s is None or s <= 1.05):
            continue
        no_gain = s is not None and s <= 1.05  # measured: fused is not faster here, say so and rank it last
        out.append(
            Finding(
                key="optimizer_not_fused",
                title=f"{opt.name} runs without fused=True ({share:.0%} of compute is the optimizer step)",
                severity="info" if no_gain else severity_for(score),
                score=0.0 if no_gain else score,
                evidence={
                    "optimizer": opt.name,
                    "optimizer_share": rounded(opt_share),
                    "foreach": opt.foreach,
                    "fused_step_speedup": rounded(s, 2),
                    **measurement_evidence(s),
                },
                fix='`OptimizerConfig(implementation="fused")` with `SpeedupMixin` ("auto" fuses on accelerators '
                "only; on CPU ask for it when measured faster) or `torch.optim.<Opt>(..., fused=True)`.",
                expected=f"{s:.2f}x faster optimizer step measured on copies of the parameters"
                + (" (no gain on this machine: skip it)" if no_gain else "")
                + ratio_note(s)
                if s is not None
                else "fused kernels: one launch per step instead of one per tensor (not measured)",
                measured=s is not None,
            )
        )
    return out


# ---- parameters ------------------------------------------------------------------------------------------------
@advisor_rule
def frozen_but_updated(m: Measurements, th: AdvisorThresholds) -> Finding | None:
    """Parameters with ``requires_grad=False`` that still changed during the window."""
    if not m.frozen_updated:
        return None
    return Finding(
        key="frozen_but_updated",
        title=f"{len(m.frozen_updated)} parameter(s) with requires_grad=False still changed during the window",
        severity="high",
        score=0.3,
        evidence={"count": len(m.frozen_updated), "examples": m.frozen_updated[:5]},
        fix="`FineTuneFreezing` (freezes properly: requires_grad=False, grad=None, BatchNorm in eval), or "
        "`optimizer.zero_grad(set_to_none=True)` so stale grads and momentum stop moving frozen weights.",
        expected="frozen weights stay frozen (a correctness fix; saves their optimizer work)",
    )


@advisor_rule
def unused_trainable_params(m: Measurements, th: AdvisorThresholds) -> Finding | None:
    """Trainable parameters that never received a gradient in the window."""
    if not m.never_grad:
        return None
    frac = len(m.never_grad) / max(1, m.trainable_params)
    score = min(0.2, 0.05 + 0.1 * frac)
    return Finding(
        key="unused_trainable_params",
        title=f"{len(m.never_grad)} trainable parameter(s) never received a gradient in the window",
        severity=severity_for(score),
        score=score,
        evidence={"count": len(m.never_grad), "share_of_trainable": rounded(frac), "examples": m.never_grad[:5]},
        fix="Freeze them (`FineTuneFreezing`, or requires_grad_(False)) or remove the unused modules; under DDP "
        "this also avoids `find_unused_parameters=True`.",
        expected="less optimizer and all-reduce work (not measured)",
    )


# ---- utilisation, batch size, memory ---------------------------------------------------------------------------
@advisor_rule
def small_batch(m: Measurements, th: AdvisorThresholds) -> Finding | None:
    """A small batch on an under-used device (or on a CPU whose peak is unknown) with memory to spare.

    Under an estimated (CPU) peak the score stays the unknown-peak one: the estimate is too rough to raise it."""
    util = m.utilisation
    head = m.memory_headroom
    under_used = util is not None and util < th.low_utilisation
    trusted = under_used and not m.peak_flops_estimated
    if not (
        m.batch_size is not None
        and m.batch_size < th.small_batch
        and (under_used or (util is None and m.device_type == "cpu"))
        and (head is None or head > 0.3)
        and not _has_callback(m, "ThroughputBatchSizeFinder")
    ):
        return None
    score = m.compute_share * (0.2 if trusted else 0.1)
    peak = "the estimated CPU peak" if m.peak_flops_estimated else "peak"
    title = (
        f"Small batch ({m.batch_size}) on an under-used device ({util:.1%} of {peak} FLOP/s)"
        if util is not None
        else f"Small batch ({m.batch_size}): per-step overhead may dominate (CPU peak FLOP/s unknown)"
    )
    return Finding(
        key="small_batch",
        title=title,
        severity=severity_for(score),
        score=score,
        evidence={
            "batch_size": m.batch_size,
            "utilisation": rounded(util),
            "memory_headroom": rounded(head),
            "compute_ms": to_ms(m.compute_s),
        },
        fix="Measure first: `ThroughputBatchSizeFinder()` measures samples/s per batch size (and scales the LR with "
        "it: sqrt for Adam-type, linear for SGD); keep a larger batch only where the run still reaches its accuracy "
        "sooner: it takes fewer optimizer steps per epoch, and a short or small-data run may need those steps.",
        expected="more samples/s per step overhead; whether the run reaches its accuracy sooner is not measured here",
    )


@advisor_rule
def memory_pressure(m: Measurements, th: AdvisorThresholds) -> Finding | None:
    """Peak GPU memory close to the device's total."""
    if not (m.peak_memory_bytes and m.memory_total_bytes and m.memory_kind == "cuda"):
        return None
    used = m.peak_memory_bytes / m.memory_total_bytes
    if not used >= th.memory_pressure:
        return None
    return Finding(
        key="memory_pressure",
        title=f"Peak memory at {used:.0%} of the device",
        severity="low",
        score=0.03,
        evidence={"peak_memory_bytes": m.peak_memory_bytes, "memory_total_bytes": m.memory_total_bytes},
        fix='`trainer_settings(precision="auto")` (bf16 halves activations) or a smaller batch.',
        expected="room for a larger batch or model; avoids allocator retries (not measured)",
    )


#: A lower bound on what compiling a training step (forward and backward graphs) costs on any device, in seconds:
#: a planned run whose whole eager compute is shorter cannot pay a compile back, whatever the compiled step saves.
MIN_COMPILE_S = 1.0


def compile_may_pay_back(m: Measurements) -> bool:
    """Whether ``not_compiled`` can fire: a compute-bound eager model whose planned run (when known) computes for at
    least :data:`MIN_COMPILE_S` in all. ``SpeedAdvisor`` runs its compile probe only then."""
    compute_s = m.compute_s
    planned = m.planned_steps
    if m.compiled or _has_callback(m, "TorchCompile") or not compute_s or m.compute_share < 0.5:
        return False
    return planned is None or planned * compute_s >= MIN_COMPILE_S


def _compile_evidence(m: Measurements, payback: float | None) -> dict:
    s = m.compile_speedup
    return {
        "compute_share": rounded(m.compute_share),
        "compile_s": rounded(m.compile_s, 2),
        "compile_graphs": list(m.compile_graphs),
        "compiled_step_speedup": rounded(s, 3),
        "payback_steps": None if payback is None else math.ceil(payback),
        "planned_steps": m.planned_steps,
        "compile_probe": m.compile_note or None,
        **measurement_evidence(s),
    }


@advisor_rule
def not_compiled(m: Measurements, th: AdvisorThresholds) -> Finding | None:
    """A compute-bound model running eagerly, where the measured compile pays back within the planned run.

    Measured (``compile_s`` / ``compile_speedup``): no finding when the compiled step is not faster or the compile
    is not paid back within ``planned_steps``; else the score is the run's net saving (compile included) as a share of
    the step. Run length unknown: the asymptotic saving, and the finding says after how many steps it pays back. Not
    measured: a low score, below measured findings, and how to measure it."""
    if not compile_may_pay_back(m):
        return None
    payback = m.compile_payback_steps
    s = m.compile_speedup
    if payback is None or s is None:
        return _compile_not_measured(m)
    planned = m.planned_steps
    if not math.isfinite(payback) or (planned is not None and payback > planned):
        return None  # compiling would slow this run down: applying the top finding must never do that
    steps = math.ceil(payback)
    after = f"pays back after {steps} step{'' if steps == 1 else 's'}"
    if planned is not None:
        score = m.compute_share * max(0.0, m.compile_net_share or 0.0)
        when = f"{after} (of the {planned} planned)"
        net = f", a net {score:.0%} of the run's time saved"
    else:
        score = m.compute_share * (1.0 - 1.0 / s)
        when = f"{after}; the run length is unknown"
        net = ": worth it only for a run longer than that (no `max_steps`, or `max_epochs` x batches unknown)"
    return Finding(
        key="not_compiled",
        title=f"Model runs eagerly: compiling {when}",
        severity=severity_for(score),
        score=score,
        evidence=_compile_evidence(m, payback),
        fix="`TorchCompile()` callback (compile time is paid once at the start; validation compiles its own graph).",
        expected=f"{s:.2f}x faster training step measured on a compiled copy of the model after a {m.compile_s:.1f} s "
        f"compile; the run compiles {_graphs_text(m)}, which {when}{net}" + ratio_note(s),
        measured=True,
    )


def _graphs_text(m: Measurements) -> str:
    """``"2 graphs (training, validation), about 9.0 s"``: what the run compiles, each graph at the measured cost."""
    n = len(m.compile_graphs)
    total = m.compile_total_s or 0.0
    return f"{n} graph{'' if n == 1 else 's'} ({', '.join(m.compile_graphs)}), about {total:.1f} s"


def _compile_not_measured(m: Measurements) -> Finding:
    score = m.compute_share * 0.01  # unknown effect: ranks below any measured finding of a useful size
    return Finding(
        key="not_compiled",
        title="Model runs eagerly (not compiled); the compile cost was not measured",
        severity=severity_for(score),
        score=score,
        evidence=_compile_evidence(m, None),
        fix="Measure first: `SpeedAdvisor(measure_effects=True, probe_compile=True)` times the compile and a compiled "
        "step on a copy of the model and says after how many steps compiling pays back; apply `TorchCompile()` only "
        "when that is within the planned run.",
        expected="unknown: the compile is paid once at the start and a short run may never pay it back (not measured)",
    )


# ---- token sequences -------------------------------------------------------------------------------------------
@advisor_rule
def padding_waste(m: Measurements, th: AdvisorThresholds) -> Finding | None:
    """More than ``th.pad_fraction`` of the training batches' token positions are padding."""
    pad = m.pad_fraction
    if pad is None or pad <= th.pad_fraction:
        return None
    # the model computes on every position: removing the padding saves up to that share of the step (Amdahl)
    score = m.compute_share * pad
    if _has_callback(m, "SequenceBatching"):
        fix = (
            '`SequenceBatching` is on and this much padding is left: give it `strategy="token_budget"`, or '
            '`strategy="packed"` with `block_size=` when the model keeps packed documents apart (it checks).'
        )
    else:
        fix = (
            'Batch similar lengths together: `SequenceBatching(strategy="length_grouped")` (or '
            '`strategy="auto"`, which measures), or in your own DataLoader `collate_fn=pad_collate()` with '
            "`batch_sampler=LengthGroupedSampler(lengths, batch_size)`, both from `lightning_speedups`."
        )
    return Finding(
        key="padding",
        title=f"{pad:.0%} of the training batches' token positions are padding (measured over the timed batches)",
        severity=severity_for(score),
        score=score,
        evidence={
            "pad_fraction": rounded(pad),
            "tokens": m.tokens,
            "padded_tokens": m.padded_tokens,
            "batch_size": m.batch_size,
        },
        fix=fix,
        expected=f"up to {1 / max(1e-9, 1 - pad):.2f}x real tokens/s if all padding is removed "
        "(length grouping leaves a few percent; not measured)",
    )


# ---- CPU threads -----------------------------------------------------------------------------------------------
@advisor_rule
def cpu_threads_contended(m: Measurements, th: AdvisorThresholds) -> Finding | None:
    """Fewer CPU threads measured faster than torch's current count: another process shares the cores, or each op is
    too small to be worth splitting."""
    s = m.fewer_threads_speedup
    fewer = m.fewer_threads
    if m.device_type != "cpu" or s is None or fewer is None or s <= 1.05:
        return None
    score = max(0.0, m.compute_share * (1.0 - 1.0 / s))
    return Finding(
        key="cpu_threads",
        title=f"torch uses {m.torch_threads} CPU threads, but {fewer} ran faster: its threads wait on each other "
        "(another process competes for the cores, or the ops are too small to split)",
        severity=severity_for(score),
        score=score,
        evidence={
            "torch_threads": m.torch_threads,
            "fewer_threads": fewer,
            "fewer_threads_speedup": rounded(s, 3),
            **measurement_evidence(s),
        },
        fix=f"`torch.set_num_threads({fewer})` while the other work runs (or stop it); `SpeedAdvisor(apply=True)` sets "
        "it mid-run. Timing-based choices made under this contention (batch size, layout) are noisier too.",
        expected=f"{s:.2f}x faster forward+backward with {fewer} thread(s), measured on a copy of the model"
        + ratio_note(s),
        measured=True,
    )
