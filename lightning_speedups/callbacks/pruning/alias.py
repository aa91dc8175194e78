"""``Pruning(mode=...)``: the deprecated single class; it builds a ``StructuredPruning`` or a ``MaskPruning``."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import lightning as L

from lightning_speedups._errors import check_choice
from lightning_speedups.callbacks.pruning.masks import MaskPruning
from lightning_speedups.callbacks.pruning.structured import StructuredPruning

__all__ = ["MODES", "Pruning"]

MODES = ("structured", "unstructured")


class Pruning(L.Callback):
    """Deprecated: use :class:`StructuredPruning` (``mode="structured"``) or :class:`MaskPruning`
    (``mode="unstructured"``); ``Pruning(...)`` builds that callback and warns.

    The arguments are those of the two classes; ``round_to`` (structured) and ``make_permanent`` (masks) are ignored
    by the other mode, as before. Checkpoints are interchangeable: the new classes keep ``Pruning``'s state key and
    state.

    Raises:
        SpeedupConfigError: ``mode`` not one of ``"structured"``, ``"unstructured"``, or what the class it builds
            raises.

    Example::

        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", DeprecationWarning)
        ...     type(Pruning(mode="unstructured", amount=0.5)).__name__
        'MaskPruning'
    """

    def __new__(  # type: ignore[misc]
        cls,
        mode: str = "structured",
        amount: float = 0.5,
        start_epoch: int = 0,
        end_epoch: int | None = None,
        steps: int = 1,
        importance: str = "l1",
        ignored_layers: Sequence[str] | None = None,
        global_pruning: bool = False,
        make_permanent: bool = True,
        example_inputs: Any = None,
        round_to: int | None = None,
    ) -> StructuredPruning | MaskPruning:
        check_choice("mode", mode, MODES)
        new = "StructuredPruning" if mode == "structured" else "MaskPruning"
        warnings.warn(
            f"`Pruning(mode={mode!r})` is deprecated and will be removed in a future release: use `{new}(...)`, "
            "which takes the same arguments without `mode` (checkpoints load into either).",
            DeprecationWarning,
            stacklevel=2,
        )
        schedule = {
            "amount": amount,
            "start_epoch": start_epoch,
            "end_epoch": end_epoch,
            "steps": steps,
            "importance": importance,
            "ignored_layers": ignored_layers,
            "global_pruning": global_pruning,
            "example_inputs": example_inputs,
        }
        if mode == "structured":
            return StructuredPruning(**schedule, round_to=round_to)
        return MaskPruning(**schedule, make_permanent=make_permanent)
