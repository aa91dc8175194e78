"""Measuring speed, the one way the whole package does it.

Low in the stack (torch only): the functional measurements, the callbacks, the recipes, autotune and the benchmarks
all time through here, so a fix to the timing loop (synchronisation, warm-up, a time budget) reaches every number at
once. Two entry points:

- :func:`compare` for decisions: candidates timed in shuffled rounds until the choice holds under noise;
- :func:`measured_ratio` for reports: one A/B ratio through :func:`compare`, conservative within noise, with its
  interval and rounds.

They time what :func:`make_train_step` builds (the one step factory) on a :func:`model_copy` (the one model-copy
helper). :func:`interleaved_timings` gives a benchmark table its raw times (A B A B ... after warm-up), and
:func:`machine_info` names the machine above it, :func:`device_peak_flops` its peak FLOP/s. Measured plans and
verdicts are kept by :class:`PlanCache`.

Ratios, not absolute times: candidates run interleaved so machine noise (other processes, thermal state) spreads
evenly over them, and ratios compare medians (the loop and its example: ``measure/timing.py``).
"""

from lightning_speedups._peak import PeakEstimate, device_peak_flops, estimate_cpu_peak_flops
from lightning_speedups.measure.cache import PlanCache, default_cache_dir, plan_key
from lightning_speedups.measure.decide import Comparison, Settled, compare, look_rounds, median_interval, settle
from lightning_speedups.measure.machine import cpu_model, machine_info
from lightning_speedups.measure.models import (
    NoLossError,
    make_train_step,
    model_copy,
    training_step_loss,
    validation_step_metrics,
)
from lightning_speedups.measure.ratio import (
    MeasuredRatio,
    conservative_ratio,
    describe_ratio,
    measured_ratio,
    ratio_evidence,
)
from lightning_speedups.measure.timing import interleaved_ratio, interleaved_timings, median, speed_ratio, torch_threads

__all__ = [
    # decisions and reports
    "Comparison",
    "MeasuredRatio",
    "Settled",
    "compare",
    "conservative_ratio",
    "look_rounds",
    "describe_ratio",
    "measured_ratio",
    "median_interval",
    "ratio_evidence",
    "settle",
    # what is timed
    "NoLossError",
    "make_train_step",
    "model_copy",
    "training_step_loss",
    "validation_step_metrics",
    # raw times, medians, the machine
    "cpu_model",
    "interleaved_ratio",
    "interleaved_timings",
    "machine_info",
    "median",
    "speed_ratio",
    "torch_threads",
    # peak FLOP/s of the device (utilisation = achieved / peak; an estimate on CPUs)
    "PeakEstimate",
    "device_peak_flops",
    "estimate_cpu_peak_flops",
    # the cache of measured plans
    "PlanCache",
    "default_cache_dir",
    "plan_key",
]
