"""One catalogue of techniques that the tests, the CLI and the docs read from.

Each technique is filed under the :data:`WAYS` it speeds training up by, and says what it needs beyond the base
install in one format (:func:`missing_requirements` reads it).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from lightning_speedups._errors import SpeedupConfigError

__all__ = [
    "WAYS",
    "TechniqueInfo",
    "get_technique",
    "is_hardware_requirement",
    "list_techniques",
    "missing_requirements",
    "register_technique",
]

# the nine ways to speed up training that the project's mission names, by number (docstrings cite them as "way 7")
WAYS: dict[int, str] = {
    1: "parallel devices (DDP)",
    2: "the optimizer",
    3: "the learning-rate schedule",
    4: "pruning and quantization",
    5: "pretrained models and fine-tuning",
    6: "data preprocessing",
    7: "the batch size",
    8: "code optimization",
    9: "hardware acceleration and precision",
}

# a hardware requirement: "cuda" (an NVIDIA GPU) or "cuda>=M.m" (at least that CUDA compute capability)
_HARDWARE = re.compile(r"cuda(?:>=(\d+)\.(\d+))?")
# any other entry is an optional python module, by the name it is imported as
_MODULE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


@dataclass(frozen=True)
class TechniqueInfo:
    """A record of one speedup technique.

    Args:
        name: short unique name, e.g. ``"pruning"``.
        callback: the Lightning ``Callback`` class (``None`` for techniques that are not callbacks).
        functional: the plain-PyTorch entry point (``None`` if there is none).
        summary: one line for tables and ``--help``.
        ways: the numbers of the :data:`WAYS` to speed up training it serves, distinct and ascending (``(4,)``,
            ``(3, 6)``); a technique that serves every way lists all nine. The words belong in ``summary``.
        requires: what it needs beyond the base install; empty when it runs anywhere. Each entry is either hardware,
            ``"cuda"`` (an NVIDIA GPU) or ``"cuda>=M.m"`` (at least that compute capability, e.g. ``"cuda>=8.9"``),
            or else an optional python module by its import name (``"torchao"``, ``"torch_pruning"``), e.g.
            ``("cuda>=8.9", "torchao")``. A technique that runs anywhere but helps only on some hardware says so in
            ``summary``.
        bench: ``"module:function"`` of its benchmark (imported lazily), or ``None``.

    Raises:
        SpeedupConfigError: ``ways`` or ``requires`` is not in the format above.
    """

    name: str
    callback: type | None
    functional: Callable[..., Any] | None
    summary: str
    ways: tuple[int, ...]
    requires: tuple[str, ...] = ()
    bench: str | None = None

    def __post_init__(self) -> None:
        _check_ways(self.ways)
        _check_requires(self.requires)

    def load_bench(self) -> Callable[..., Any] | None:
        """Import and return the benchmark function, if the technique has one."""
        if self.bench is None:
            return None
        module, func = self.bench.split(":")
        return getattr(importlib.import_module(module), func)


def _check_ways(ways: Any) -> None:
    ok = (
        isinstance(ways, tuple)
        and bool(ways)
        and all(type(n) is int and n in WAYS for n in ways)
        and list(ways) == sorted(set(ways))
    )
    if not ok:
        raise SpeedupConfigError(
            f"`ways`={ways!r} is not a non-empty, ascending tuple of distinct way numbers. Allowed values: integers "
            "from 1 to 9, e.g. (4,) or (3, 6), the numbers of the ways: "
            + "; ".join(f"{n} {words}" for n, words in WAYS.items())
            + ". HINT: the words go in `summary`."
        )


def _check_requires(requires: Any) -> None:
    if not isinstance(requires, tuple):
        problem = "is not a tuple"
    else:
        bad = [r for r in requires if not isinstance(r, str) or not (_MODULE.fullmatch(r) or _HARDWARE.fullmatch(r))]
        problem = f"holds {', '.join(map(repr, bad))}: neither hardware nor a module name" if bad else ""
    if problem:
        raise SpeedupConfigError(
            f"`requires`={requires!r} {problem}. Allowed values: a tuple of 'cuda', 'cuda>=M.m' (a CUDA compute "
            "capability, e.g. 'cuda>=8.9') or import names of optional python modules (e.g. 'torchao'). HINT: a "
            "technique that runs anywhere but helps only on some hardware says so in `summary`."
        )


def is_hardware_requirement(entry: str) -> bool:
    """Whether an entry of :attr:`TechniqueInfo.requires` is hardware (``"cuda"``, ``"cuda>=8.9"``), not a module."""
    return _HARDWARE.fullmatch(entry) is not None


def missing_requirements(requires: Iterable[str], *, hardware: bool = True) -> list[str]:
    """The entries of a :attr:`TechniqueInfo.requires` that this machine lacks, in order.

    A python module is missing when it cannot be imported; ``"cuda"`` when no CUDA device is available; ``"cuda>=M.m"``
    when the current device's compute capability is below ``M.m``. With ``hardware=False`` only the modules are
    checked (for runs that check a technique's refusal on the hardware at hand instead of skipping it).

    Example::

        >>> missing_requirements(("json", "no_such_module_here"))
        ['no_such_module_here']
    """
    missing = []
    for entry in requires:
        match = _HARDWARE.fullmatch(entry)
        if match is None:
            ok = importlib.util.find_spec(entry) is not None
        elif not hardware:
            continue
        else:
            ok = _has_cuda(None if match.group(1) is None else (int(match.group(1)), int(match.group(2))))
        if not ok:
            missing.append(entry)
    return missing


def _has_cuda(capability: tuple[int, int] | None) -> bool:
    if not torch.cuda.is_available():
        return False
    return capability is None or torch.cuda.get_device_capability() >= capability


_TECHNIQUES: dict[str, TechniqueInfo] = {}


def register_technique(info: TechniqueInfo) -> TechniqueInfo:
    """Add (or replace) a technique in the catalogue and return it (its fields were checked when it was built)."""
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
