"""``SpeedAdvisor``: measure a window of training steps, then report what slows the run down and how to fix it.

- :mod:`~lightning_speedups.callbacks.advisor.callback`: the callback (its hooks, the window's timing, the report);
- :mod:`~lightning_speedups.callbacks.advisor.facts`: what it reads off the run at the end of the window (device,
  memory, loader, optimizers, layout) and the probes it runs on copies.

The rules, probes and report are the pure part, :mod:`lightning_speedups.functional.advisor`.
"""

from __future__ import annotations

from lightning_speedups.callbacks.advisor.callback import SpeedAdvisor

__all__ = ["SpeedAdvisor"]
