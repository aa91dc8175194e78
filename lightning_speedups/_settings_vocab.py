"""The vocabulary of :mod:`lightning_speedups.settings`: allowed values, the result record, argument checks.

No hardware probes here (those stay in ``settings.py``, where the tests patch them); re-exported by ``settings``.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass, field
from typing import Any

from lightning_speedups._errors import SpeedupConfigError, check_choice

__all__ = ["ACCELERATORS", "PRECISIONS", "STRATEGIES", "TrainerSettings"]

ACCELERATORS = ("auto", "cpu", "cuda", "gpu", "tpu", "mps")
PRECISIONS = ("auto", "32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true", "transformer-engine")
_PRECISION_ALIASES = {
    32: "32-true",
    "32": "32-true",
    16: "16-mixed",
    "16": "16-mixed",
    "bf16": "bf16-mixed",
    64: "64-true",
    "64": "64-true",
}
STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_fork", "ddp_notebook", "fsdp", "deepspeed", "xla", "single_device")
_REMOVED_STRATEGIES = {
    "dp": "Lightning 2 removed DataParallel (`strategy='dp'`). Use strategy='ddp': one process per device is also "
    "faster, since DataParallel re-copies the model to every GPU on each step and is bound by one Python thread.",
    "ddp2": "Lightning 2 removed `ddp2`. Use strategy='ddp'.",
    "horovod": "Lightning 2 removed Horovod support. Use strategy='ddp' (torchrun / SLURM launch multi-node jobs).",
}


@dataclass
class TrainerSettings:
    """``lightning.Trainer`` keyword arguments plus the human-readable reason for each choice.

    Example::

        >>> from lightning_speedups.settings import explain_trainer_settings
        >>> s = explain_trainer_settings(accelerator="cpu", precision="32-true")
        >>> s.kwargs["accelerator"], s.kwargs["precision"]
        ('cpu', '32-true')
    """

    kwargs: dict[str, Any]
    reasons: dict[str, str] = field(default_factory=dict)

    def explain(self) -> str:
        """One line per setting: ``name = value  # reason``."""
        width = max((len(k) for k in self.kwargs), default=0)
        lines = []
        for key, value in self.kwargs.items():
            reason = self.reasons.get(key, "")
            lines.append(f"{key:<{width}} = {value!r}" + (f"  # {reason}" if reason else ""))
        return "\n".join(lines)


def _normalise_precision(precision: Any) -> str:
    precision = _PRECISION_ALIASES.get(precision, precision)
    return check_choice("precision", precision, PRECISIONS, hint="`16` means '16-mixed', `'bf16'` means 'bf16-mixed'.")


def _check_overrides(overrides: dict[str, Any]) -> None:
    import lightning

    valid = set(inspect.signature(lightning.Trainer.__init__).parameters) - {"self"}
    for key in overrides:
        if key not in valid:
            close = difflib.get_close_matches(key, sorted(valid), n=3)
            hint = f" HINT: did you mean {', '.join(map(repr, close))}?" if close else ""
            raise SpeedupConfigError(
                f"`{key}` is not a lightning.Trainer argument. Allowed values: the arguments of lightning.Trainer."
                f"{hint}"
            )
