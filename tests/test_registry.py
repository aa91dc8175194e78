"""Generic tests that walk the technique registry: a new technique is covered the day it is registered.

The Trainer keeps its default model summary on (it runs a FLOP counter over `example_input_array`), as users have it.

Each registered callback is built from a LightningCLI YAML file (class_path + its ``example_kwargs``) and trains the
demo model for two batches.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import yaml
from lightning.pytorch.cli import LightningCLI

import lightning_speedups  # noqa: F401  (registers every technique)
from lightning_speedups._registry import get_technique, list_techniques
from lightning_speedups.demo import DemoClassifier, DigitsDataModule, StdlibCodeDataModule, TextClassifier

# the demo task each kind of technique trains on: (model class, data class, model args, data args)
TASKS = {
    "digits": (DemoClassifier, DigitsDataModule, {"width": 8}, {"batch_size": 32}),
    "text": (TextClassifier, StdlibCodeDataModule, {"d_model": 16, "layers": 1}, {"batch_size": 16, "limit": 256}),
}


def _missing(needs: tuple[str, ...]) -> list[str]:
    missing = []
    for need in needs:
        if need == "cuda":
            ok = torch.cuda.is_available()
        elif need == "cuda_sm89":
            ok = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
        else:
            ok = importlib.util.find_spec(need) is not None
        if not ok:
            missing.append(need)
    return missing


CALLBACK_TECHNIQUES = [n for n in list_techniques() if get_technique(n).callback is not None]


def test_registry_lists_techniques_with_summaries():
    names = list_techniques()
    assert len(names) == len(set(names)) and "speed_flags" in names
    for name in names:
        info = get_technique(name)
        assert info.summary and (info.callback is not None or info.functional is not None)
        if info.bench is not None:
            assert callable(info.load_bench())


@pytest.mark.parametrize("name", CALLBACK_TECHNIQUES)
def test_registry_callback_from_yaml_trains_two_batches(name, tmp_path):
    info = get_technique(name)
    missing = _missing(info.needs)
    if missing:
        pytest.skip(f"{name} needs {missing}")
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
            "callbacks": [{"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": info.example_kwargs}],
        },
    }
    model_cls, data_cls, config["model"], config["data"] = TASKS[info.example_task]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = LightningCLI(model_cls, data_cls, args=["fit", "--config", str(path)], save_config_callback=None)
    assert cli.trainer.global_step == 2
    assert any(isinstance(cb, cls) for cb in cli.trainer.callbacks)
