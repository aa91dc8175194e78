"""Benchmarks: each technique's ``run(quick)`` returns :class:`BenchRow` s measured interleaved in one process."""

from lightning_speedups.benchmarks._common import BenchRow
from lightning_speedups.measure import interleaved_timings, machine_info, make_train_step, median, speed_ratio

__all__ = ["BenchRow", "interleaved_timings", "machine_info", "make_train_step", "median", "speed_ratio"]
