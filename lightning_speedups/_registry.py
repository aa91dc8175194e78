"""One catalogue of techniques that the tests, the CLI and the README table read from."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lightning_speedups._errors import SpeedupConfigError

__all__ = ["TechniqueInfo", "register_technique", "list_techniques", "get_technique"]


@dataclass(frozen=True)
class TechniqueInfo:
    """A record of one speedup technique.

    Args:
        name: short unique name, e.g. ``"pruning"``.
        callback: the Lightning ``Callback`` class (``None`` for techniques that are not callbacks).
        functional: the plain-PyTorch entry point (``None`` if there is none).
        summary: one line for tables and ``--help``.
        requires: hardware or extras needed, e.g. ``("cuda>=8.9", "torchao")``; empty when it runs anywhere.
        mission_tip: the numbers of the nine mission tips it covers, ascending and separated by ``", "`` (``"4"``,
            ``"3, 6"``); the words belong in ``summary``. A technique that serves every tip lists all nine.
        bench: ``"module:function"`` of its benchmark (imported lazily), or ``None``.
        example_kwargs: constructor kwargs that make the callback train for two batches on the demo task.
        needs: names of optional python modules needed to build the callback.
        example_task: the demo task its callback trains on in the registry walk: ``"digits"`` (images) or
            ``"text"`` (token sequences, :class:`~lightning_speedups.demo.StdlibCodeDataModule`).
    """

    name: str
    callback: type | None
    functional: Callable[..., Any] | None
    summary: str
    requires: tuple[str, ...] = ()
    mission_tip: str = ""
    bench: str | None = None
    example_kwargs: dict[str, Any] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    example_task: str = "digits"

    def load_bench(self) -> Callable[..., Any] | None:
        """Import and return the benchmark function, if the technique has one."""
        if self.bench is None:
            return None
        module, func = self.bench.split(":")
        return getattr(importlib.import_module(module), func)


_TECHNIQUES: dict[str, TechniqueInfo] = {}


def register_technique(info: TechniqueInfo) -> TechniqueInfo:
    """Add (or replace) a technique in the catalogue and return it."""
    _TECHNIQUES[info.name] = info
    return info


def list_techniques() -> list[str]:
    """Names of all registered techniques, in registration order."""
    return list(_TECHNIQUES)


def get_technique(name: str) -> TechniqueInfo:
    """Look a technique up by name; unknown names raise and list the valid ones."""
    if name not in _TECHNIQUES:
        raise SpeedupConfigError(
            f"`technique`={name!r} is not registered. Allowed values: {', '.join(map(repr, _TECHNIQUES))}."
        )
    return _TECHNIQUES[name]
