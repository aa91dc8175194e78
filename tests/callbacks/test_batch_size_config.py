"""ThroughputBatchSizeFinder takes its search settings as one `BatchSizeSearchConfig` or as keywords."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import yaml

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.batch_size import ThroughputBatchSizeFinder
from lightning_speedups.functional.batch_size import BatchSizeSearchConfig


def test_batch_size_config_or_keywords_build_the_same_search():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the keywords are a supported shorthand: no deprecation warning
        by_keywords = ThroughputBatchSizeFinder(mode="max_fit", init_val=8, max_val=64, verbose=False)
    by_config = ThroughputBatchSizeFinder(BatchSizeSearchConfig(mode="max_fit", init_val=8, max_val=64), verbose=False)
    assert by_keywords.config == by_config.config
    assert ThroughputBatchSizeFinder().config == BatchSizeSearchConfig()
    # a keyword at its default adds nothing to a config
    assert ThroughputBatchSizeFinder(BatchSizeSearchConfig(init_val=8), init_val=16).config.init_val == 8


def test_batch_size_config_misconfiguration():
    with pytest.raises(SpeedupConfigError, match="`config`='max_fit' is invalid. Allowed values: a BatchSizeSearch"):
        ThroughputBatchSizeFinder("max_fit")  # type: ignore[arg-type]
    with pytest.raises(SpeedupConfigError, match="`config` was given together with `init_val`=8. Allowed values"):
        ThroughputBatchSizeFinder(BatchSizeSearchConfig(), init_val=8)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['init_vall'\]. Allowed values"):
        ThroughputBatchSizeFinder(init_vall=8)
    with pytest.raises(SpeedupConfigError, match="`init_val`=0 is invalid"):  # the config checks the keywords
        ThroughputBatchSizeFinder(init_val=0)


@pytest.mark.parametrize(
    "init_args, expected",
    [
        ({"init_val": 32, "max_val": 64, "verbose": False}, {"init_val": 32, "max_val": 64}),
        ({"config": {"init_val": 32, "mode": "max_fit"}, "verbose": False}, {"init_val": 32, "mode": "max_fit"}),
    ],
)
def test_batch_size_config_from_yaml(init_args, expected):
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_argument("--callback", type=ThroughputBatchSizeFinder)
    cls = ThroughputBatchSizeFinder
    spec = {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": init_args}
    finder = parser.instantiate(parser.parse_args(["--callback", yaml.safe_dump(spec)])).callback
    assert isinstance(finder, ThroughputBatchSizeFinder) and finder.verbose is False
    assert finder.config == dataclasses.replace(BatchSizeSearchConfig(), **expected)
