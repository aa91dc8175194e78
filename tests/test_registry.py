"""Generic tests that walk the technique registry: a new technique is covered the day it is registered.

The Trainer keeps its default model summary on (it runs a FLOP counter over `example_input_array`), as users have it.

Each registered callback is built from a LightningCLI YAML file (class_path + its kwargs in
``tests/technique_examples.py``) and trains the demo model of its example's task for two batches.
"""

from __future__ import annotations

import pytest
import torch
import yaml
from lightning.pytorch.cli import LightningCLI

import lightning_speedups  # noqa: F401  (registers every technique)
from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._registry import (
    WAYS,
    TechniqueInfo,
    get_technique,
    is_hardware_requirement,
    list_techniques,
    missing_requirements,
)
from lightning_speedups.demo import DemoClassifier, DigitsDataModule, StdlibCodeDataModule, TextClassifier
from tests.technique_examples import EXAMPLES

# the demo task each kind of technique trains on: (model class, data class, model args, data args)
TASKS = {
    "digits": (DemoClassifier, DigitsDataModule, {"width": 8}, {"batch_size": 32}),
    "text": (TextClassifier, StdlibCodeDataModule, {"d_model": 16, "layers": 1}, {"batch_size": 16, "limit": 256}),
}


CALLBACK_TECHNIQUES = [n for n in list_techniques() if get_technique(n).callback is not None]


def test_registry_lists_techniques_with_summaries():
    names = list_techniques()
    assert len(names) == len(set(names)) and "speed_flags" in names
    for name in names:
        info = get_technique(name)
        assert info.summary and (info.callback is not None or info.functional is not None)
        if info.bench is not None:
            assert callable(info.load_bench())


@pytest.mark.parametrize("ways", [(), (0,), (10,), (3, 2), (2, 2), "2, 3", (True,), [2, 3], (2.0,)])
def test_technique_ways_are_checked(ways):
    with pytest.raises(SpeedupConfigError, match=r"`ways`=.* is not a non-empty, ascending tuple .* Allowed values: "):
        TechniqueInfo(name="x", callback=None, functional=len, summary="s", ways=ways)


def test_technique_requires_format():
    info = TechniqueInfo(name="x", callback=None, functional=len, summary="s", ways=(9,), requires=("cuda>=8.9", "a.b"))
    assert [is_hardware_requirement(r) for r in info.requires] == [True, False]
    for bad in (("cuda for any effect",), ("torch-pruning",), ("cuda>=9",)):
        with pytest.raises(SpeedupConfigError, match=r"`requires`=.* neither hardware nor a module name. Allowed"):
            TechniqueInfo(name="x", callback=None, functional=len, summary="s", ways=(9,), requires=bad)
    with pytest.raises(SpeedupConfigError, match=r"`requires`='torchao' is not a tuple. Allowed values: a tuple of"):
        TechniqueInfo(name="x", callback=None, functional=len, summary="s", ways=(9,), requires="torchao")


def test_missing_requirements(monkeypatch):
    """Modules are missing when not importable; hardware by the CUDA device; ``hardware=False`` checks modules only."""
    needs = ("json", "no_such_module_here", "cuda", "cuda>=8.9")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert missing_requirements(needs) == ["no_such_module_here", "cuda", "cuda>=8.9"]
    assert missing_requirements(needs, hardware=False) == ["no_such_module_here"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (8, 6))
    assert missing_requirements(needs) == ["no_such_module_here", "cuda>=8.9"]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (9, 0))
    assert missing_requirements(needs) == ["no_such_module_here"]


def test_every_way_is_served():
    """Each of the nine ways has a technique of its own (not only the advisor and the recipes, which list all)."""
    served = {
        n for name in list_techniques() if len(get_technique(name).ways) < len(WAYS) for n in get_technique(name).ways
    }
    assert served == set(WAYS), f"ways no technique serves: {sorted(set(WAYS) - served)}"


def test_every_callback_technique_has_an_example():
    """A technique registered with a callback is trained by the walk below: it needs its entry in EXAMPLES."""
    missing = [n for n in CALLBACK_TECHNIQUES if n not in EXAMPLES]
    stale = sorted(set(EXAMPLES) - set(CALLBACK_TECHNIQUES))
    assert not missing, f"techniques without an entry in tests/technique_examples.py EXAMPLES: {missing}"
    assert not stale, f"EXAMPLES entries for no technique registered with a callback: {stale}"
    assert {e.task for e in EXAMPLES.values()} <= set(TASKS), f"an example's task is not one of {sorted(TASKS)}"


@pytest.mark.parametrize("name", CALLBACK_TECHNIQUES)
def test_registry_callback_from_yaml_trains_two_batches(name, tmp_path):
    info = get_technique(name)
    missing = missing_requirements(info.requires)
    if missing:
        pytest.skip(f"{name} needs {missing}")
    assert name in EXAMPLES, f"{name!r} has no entry in tests/technique_examples.py EXAMPLES"
    example = EXAMPLES[name]
    cls = info.callback
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": 2,
            "limit_val_batches": 1,
            "num_sanity_val_steps": 0,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "callbacks": [{"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": example.kwargs}],
        },
    }
    model_cls, data_cls, config["model"], config["data"] = TASKS[example.task]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = LightningCLI(model_cls, data_cls, args=["fit", "--config", str(path)], save_config_callback=None)
    assert cli.trainer.global_step == 2
    assert any(isinstance(cb, cls) for cb in cli.trainer.callbacks)
