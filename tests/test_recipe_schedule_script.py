"""The schedule comparison that chose ``fast_train``'s schedule: its default entry is the recipe's, and it runs."""

from __future__ import annotations

import pytest

from lightning_speedups.recipes import fast_train
from tests.helpers import load_benchmark_script


def _load():
    return load_benchmark_script("recipe_schedule")


def test_recipe_schedule_default_entry_is_fast_trains_schedule():
    # the script's "warmup_cosine" row is what fast_train ships: if the recipe changes, the script must follow
    lr, config = _load().SCHEDULES["warmup_cosine"]
    recipe = fast_train(precision="32-true", channels_last=False)
    assert recipe.optimizer_config.lr == lr
    assert recipe.scheduler_config.name == config["name"] and recipe.scheduler_config.warmup == config["warmup"]


def test_recipe_schedule_rejects_unknown_names(capsys):
    with pytest.raises(SystemExit):
        _load().main(["digits", "--only", "warmup_cosine,nope"])
    assert "--only ['nope'] unknown. Allowed values: warmup_cosine" in capsys.readouterr().err
