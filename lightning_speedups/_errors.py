"""The package's one error type and the small helpers that build its messages."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from lightning.pytorch.utilities.exceptions import MisconfigurationException

__all__ = ["SpeedupConfigError", "check_choice", "check_range", "require"]


class SpeedupConfigError(ValueError, MisconfigurationException):
    """Raised for every bad argument, setting or environment, before any training step runs.

    It subclasses both ``ValueError`` and Lightning's ``MisconfigurationException`` so existing ``except`` clauses
    for either keep working.
    """


def _fmt_allowed(allowed: Iterable[Any]) -> str:
    return ", ".join(repr(a) for a in allowed)


def check_choice(name: str, value: Any, allowed: Iterable[Any], hint: str | None = None) -> Any:
    """Return ``value`` if it is one of ``allowed``, else raise naming the argument, the value and the choices.

    Example::

        >>> check_choice("mode", "structured", ["structured", "unstructured"])
        'structured'
    """
    allowed = list(allowed)
    if value not in allowed:
        msg = f"`{name}`={value!r} is not supported. Allowed values: {_fmt_allowed(allowed)}."
        if hint:
            msg += f" HINT: {hint}"
        raise SpeedupConfigError(msg)
    return value


def check_range(
    name: str,
    value: float,
    low: float | None = None,
    high: float | None = None,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
    hint: str | None = None,
) -> float:
    """Raise unless ``low <= value <= high`` (bounds optional, inclusivity configurable)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and low is not None:
        ok = value >= low if low_inclusive else value > low
    if ok and high is not None:
        ok = value <= high if high_inclusive else value < high
    if not ok:
        lo = "-inf" if low is None else f"{low}"
        hi = "inf" if high is None else f"{high}"
        interval = (
            ("[" if low_inclusive and low is not None else "(")
            + f"{lo}, {hi}"
            + ("]" if high_inclusive and high is not None else ")")
        )
        msg = f"`{name}`={value!r} is out of range. Allowed values: a number in {interval}."
        if hint:
            msg += f" HINT: {hint}"
        raise SpeedupConfigError(msg)
    return value


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import an optional dependency lazily, or raise an ``ImportError`` naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{feature} needs the optional package `{module}`. "
            f"Install it with: pip install 'lightning-speedups[{extra}]'"
        ) from err
