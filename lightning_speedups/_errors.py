"""The package's error types and the small helpers that check user input and build its messages.

Every message has one shape: the argument in backticks, the value given, what is wrong, ``Allowed values: ...`` and,
when a common mistake is likely, a ``HINT:``. The same argument gets the same wording wherever it is checked, so check
a user-facing argument with one of the ``check_*`` helpers rather than a hand-written ``raise``.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable
from numbers import Integral
from types import ModuleType
from typing import TYPE_CHECKING, Any

from lightning.pytorch.utilities.exceptions import MisconfigurationException

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "SpeedupConfigError",
    "SpeedupRuntimeError",
    "check_bool",
    "check_callable",
    "check_choice",
    "check_int",
    "check_module_names",
    "check_range",
    "require",
]


class SpeedupConfigError(ValueError, MisconfigurationException):
    """Raised for every bad argument, setting or environment, before any training step runs.

    It subclasses both ``ValueError`` and Lightning's ``MisconfigurationException`` so existing ``except`` clauses
    for either keep working.
    """


class SpeedupRuntimeError(RuntimeError):
    """Raised when the run itself reaches a state a technique cannot work with (not a bad argument or setting).

    For example an LR range test that produced too few usable points, or a method called before the state it reads
    exists. The arguments were fine; the message says what happened and what to do about it.
    """


def _fmt_allowed(allowed: Iterable[Any]) -> str:
    return ", ".join(repr(a) for a in allowed)


def _fail(name: str, value: Any, problem: str, allowed: str, hint: str | None) -> SpeedupConfigError:
    msg = f"`{name}`={value!r} {problem}. Allowed values: {allowed}."
    if hint:
        msg += f" HINT: {hint}"
    return SpeedupConfigError(msg)


def check_choice(name: str, value: Any, allowed: Iterable[Any], hint: str | None = None) -> Any:
    """Return ``value`` if it is one of ``allowed``, else raise naming the argument, the value and the choices.

    Example::

        >>> check_choice("mode", "structured", ["structured", "unstructured"])
        'structured'
        >>> check_choice("mode", "channels", ["structured", "unstructured"])
        Traceback (most recent call last):
        ...
        lightning_speedups._errors.SpeedupConfigError: `mode`='channels' is not supported. Allowed values: \
'structured', 'unstructured'.
    """
    allowed = list(allowed)
    if value not in allowed:
        raise _fail(name, value, "is not supported", _fmt_allowed(allowed), hint)
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
    """Raise unless ``value`` is a number with ``low <= value <= high`` (bounds optional, inclusivity configurable).

    Example::

        >>> check_range("amount", 0.5, 0.0, 1.0, high_inclusive=False)
        0.5
        >>> check_range("amount", 1.0, 0.0, 1.0, high_inclusive=False)
        Traceback (most recent call last):
        ...
        lightning_speedups._errors.SpeedupConfigError: `amount`=1.0 is out of range. Allowed values: a number in \
[0.0, 1.0).
    """
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
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        what = "is out of range" if number else f"is not a number{_type_words(value)}"
        raise _fail(name, value, what, f"a number in {interval}", hint)
    return value


def _type_words(value: Any) -> str:
    """`` (a str)`` after "is not a number", so a wrong type does not read as a number out of range."""
    return "" if value is None else f" (a {type(value).__name__})"


def _int_bounds(low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f"an integer in [{low}, {high}]"
    if low is not None:
        return f"an integer >= {low}"
    if high is not None:
        return f"an integer <= {high}"
    return "an integer"


def check_int(
    name: str,
    value: Any,
    low: int | None = None,
    high: int | None = None,
    *,
    optional: bool = False,
    hint: str | None = None,
) -> Any:
    """Return ``value`` if it is an integer (not a bool) in ``[low, high]`` (bounds optional), else raise.

    Args:
        name: the argument's name, as the user spells it.
        value: what the user passed.
        low, high: inclusive bounds; ``None`` leaves that side open.
        optional: also accept ``None``.
        hint: a ``HINT:`` appended to the message.

    Returns:
        ``value`` unchanged.

    Raises:
        SpeedupConfigError: naming the argument, the value and the allowed integers.

    Example::

        >>> check_int("start_epoch", 2, 0)
        2
        >>> check_int("start_epoch", -1, 0)
        Traceback (most recent call last):
        ...
        lightning_speedups._errors.SpeedupConfigError: `start_epoch`=-1 is out of range. Allowed values: an integer \
>= 0.
    """
    if optional and value is None:
        return value
    ok = isinstance(value, Integral) and not isinstance(value, bool)
    ok = ok and (low is None or value >= low) and (high is None or value <= high)
    if not ok:
        allowed = _int_bounds(low, high)
        integer = isinstance(value, Integral) and not isinstance(value, bool)
        what = "is out of range" if integer else f"is not an integer{_type_words(value)}"
        raise _fail(name, value, what, f"{allowed} or None" if optional else allowed, hint)
    return value


def check_bool(name: str, value: Any, hint: str | None = None, *, optional: bool = False) -> Any:
    """Return ``value`` if it is ``True`` or ``False`` (or ``None`` when ``optional``), else raise.

    ``0``, ``1`` and strings are refused, unlike ``check_choice(name, value, (True, False))`` (``1 == True``).

    Example::

        >>> check_bool("verbose", True)
        True
        >>> check_bool("verbose", "yes")
        Traceback (most recent call last):
        ...
        lightning_speedups._errors.SpeedupConfigError: `verbose`='yes' is not supported. Allowed values: True, \
False.
    """
    if not (isinstance(value, bool) or (optional and value is None)):
        raise _fail(name, value, "is not supported", "True, False, None" if optional else "True, False", hint)
    return value


def check_callable(
    name: str, value: Any, signature: str = "a callable", *, optional: bool = False, hint: str | None = None
) -> Any:
    """Return ``value`` if it is callable (or ``None`` when ``optional``), else raise.

    Args:
        name: the argument's name.
        value: what the user passed.
        signature: how the allowed callable looks, e.g. ``"a callable(module, fqn) -> bool"``.
        optional: also accept ``None``.
        hint: a ``HINT:`` appended to the message.

    Example::

        >>> check_callable("filter_fn", print, "a callable(module, fqn) -> bool", optional=True)
        <built-in function print>
        >>> check_callable("filter_fn", 3, "a callable(module, fqn) -> bool", optional=True)
        Traceback (most recent call last):
        ...
        lightning_speedups._errors.SpeedupConfigError: `filter_fn`=3 is not callable. Allowed values: a \
callable(module, fqn) -> bool or None.
    """
    if (optional and value is None) or callable(value):
        return value
    raise _fail(name, value, "is not callable", f"{signature} or None" if optional else signature, hint)


def check_module_names(
    name: str, names: str | Iterable[str], model: nn.Module, *, hint: str | None = None
) -> list[str]:
    """Return ``names`` as a list if each is a submodule of ``model`` (a name from ``named_modules()``), else raise.

    The message names the unknown modules, close matches and the model's top-level modules.

    Args:
        name: the argument's name, e.g. ``"ignored_layers"``.
        names: one module name or several.
        model: the network whose ``named_modules()`` the names must come from.
        hint: a ``HINT:`` appended to the message.

    Returns:
        The names, in the order given.

    Raises:
        SpeedupConfigError: for a name that is not a submodule (the model itself, ``""``, is not accepted).

    Example::

        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        >>> check_module_names("ignored_layers", ["0"], net)
        ['0']
        >>> check_module_names("ignored_layers", ["2"], net)
        Traceback (most recent call last):
        ...
        lightning_speedups._errors.SpeedupConfigError: `ignored_layers` names '2', which is not a submodule of \
Sequential. Allowed values: names from model.named_modules(), such as the top-level '0', '1'.
    """
    out = [names] if isinstance(names, str) else list(names)
    known = dict(model.named_modules(remove_duplicate=False))  # a shared module is reachable under each name
    unknown = [n for n in out if not isinstance(n, str) or not n or n not in known]
    if unknown:
        candidates = [n for n in known if n]
        close: list[str] = []
        for bad in unknown:
            close += [c for c in difflib.get_close_matches(str(bad), candidates, n=5, cutoff=0.5) if c not in close]
        top = [n for n, _ in model.named_children()]
        what = "which is not a submodule" if len(unknown) == 1 else "which are not submodules"
        msg = (
            f"`{name}` names {', '.join(map(repr, unknown))}, {what} of {type(model).__name__}. Allowed values: names "
            f"from model.named_modules(), such as the top-level {', '.join(map(repr, top)) or '(none)'}."
        )
        if close:
            msg += f" Close matches: {', '.join(map(repr, close))}."
        if hint:
            msg += f" HINT: {hint}"
        raise SpeedupConfigError(msg)
    return out


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import an optional dependency lazily, or raise an ``ImportError`` naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{feature} needs the optional package `{module}`. "
            f"Install it with: pip install 'lightning-speedups[{extra}]'"
        ) from err
