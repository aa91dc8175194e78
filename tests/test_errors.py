"""The check_* helpers: one message shape (argument, value, allowed values, optional hint) for every user input."""

from __future__ import annotations

import numpy as np
import pytest
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn

import lightning_speedups
from lightning_speedups._errors import (
    SpeedupConfigError,
    SpeedupRuntimeError,
    check_bool,
    check_callable,
    check_choice,
    check_int,
    check_module_names,
    check_range,
)


def test_error_types():
    assert issubclass(SpeedupConfigError, ValueError) and issubclass(SpeedupConfigError, MisconfigurationException)
    assert issubclass(SpeedupRuntimeError, RuntimeError) and not issubclass(SpeedupRuntimeError, ValueError)
    assert lightning_speedups.SpeedupRuntimeError is SpeedupRuntimeError
    assert "SpeedupRuntimeError" in lightning_speedups.__all__


def test_check_choice_and_range():
    assert check_choice("mode", "a", ("a", "b")) == "a"
    with pytest.raises(SpeedupConfigError, match=r"^`mode`='c' is not supported. Allowed values: 'a', 'b'. HINT: x$"):
        check_choice("mode", "c", ("a", "b"), hint="x")
    assert check_range("amount", 0.5, 0, 1) == 0.5
    with pytest.raises(
        SpeedupConfigError, match=r"^`amount`=1.5 is out of range. Allowed values: a number in \[0, 1\]\."
    ):
        check_range("amount", 1.5, 0, 1)
    # a wrong type is named as one, not as a number out of range
    for bad, kind in ((True, "bool"), ("0.5", "str")):
        with pytest.raises(
            SpeedupConfigError, match=rf"is not a number \(a {kind}\)\. Allowed values: a number in \[0, 1\]"
        ):
            check_range("amount", bad, 0, 1)
    with pytest.raises(
        SpeedupConfigError, match=r"`steps`='2' is not an integer \(a str\)\. Allowed values: an integer >= 1"
    ):
        check_int("steps", "2", 1)


def test_check_int():
    assert check_int("steps", 3, 1) == 3
    assert check_int("steps", np.int64(3), 1) == 3
    assert check_int("seed", None, 0, optional=True) is None
    for bad in (0, 1.0, True, "2"):
        with pytest.raises(
            SpeedupConfigError, match=r"is (out of range|not an integer \(a \w+\))\. Allowed values: an integer >= 1\.$"
        ):
            check_int("steps", bad, 1)
    with pytest.raises(SpeedupConfigError, match=r"^`k`=5 is out of range. Allowed values: an integer in \[1, 4\]\."):
        check_int("k", 5, 1, 4)
    with pytest.raises(SpeedupConfigError, match=r"`k`=5 .* an integer <= 4\. HINT: fewer$"):
        check_int("k", 5, high=4, hint="fewer")
    with pytest.raises(SpeedupConfigError, match=r"`seed`=-1 .* an integer >= 0 or None\.$"):
        check_int("seed", -1, 0, optional=True)
    with pytest.raises(SpeedupConfigError, match=r"`k`=None is not an integer. Allowed values: an integer\.$"):
        check_int("k", None)


def test_check_bool():
    assert check_bool("flag", False) is False
    for bad in (1, 0, "yes", None):
        with pytest.raises(SpeedupConfigError, match=r"is not supported. Allowed values: True, False\."):
            check_bool("flag", bad)
    assert check_bool("flag", None, optional=True) is None
    with pytest.raises(SpeedupConfigError, match=r"^`flag`=1 is not supported. Allowed values: True, False, None\.$"):
        check_bool("flag", 1, optional=True)


def test_check_callable():
    assert check_callable("fn", len) is len
    assert check_callable("fn", None, optional=True) is None
    with pytest.raises(SpeedupConfigError, match=r"^`fn`=3 is not callable. Allowed values: a callable\(x\) or None\."):
        check_callable("fn", 3, "a callable(x)", optional=True)
    with pytest.raises(SpeedupConfigError, match=r"^`fn`=None is not callable. Allowed values: a callable\.$"):
        check_callable("fn", None)


def test_check_module_names():
    net = nn.Sequential()
    net.add_module("backbone", nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    net.add_module("head", nn.Linear(2, 1))
    assert check_module_names("ignored_layers", ["head", "backbone.0"], net) == ["head", "backbone.0"]
    assert check_module_names("attr", "head", net) == ["head"]
    with pytest.raises(
        SpeedupConfigError,
        match=r"^`backbone` names 'backbon', which is not a submodule of Sequential. Allowed values: names from "
        r"model.named_modules\(\), such as the top-level 'backbone', 'head'. Close matches: 'backbone'",
    ):
        check_module_names("backbone", ["backbon"], net)
    with pytest.raises(SpeedupConfigError, match=r"names 'x', '', which are not submodules.* HINT: h$"):
        check_module_names("layers", ["head", "x", ""], net, hint="h")
