"""Config validation: one ``pytest.raises(match=...)`` per message, coercion from dicts, ``scale_lr``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.optim import (
    OptimizerConfig,
    SchedulerConfig,
    as_optimizer_config,
    as_scheduler_config,
    create_optimizer,
    create_scheduler,
    scale_lr,
)

BAD_OPTIMIZER = [
    ({"name": "adamx"}, r"`name`='adamx' is not a registered optimizer. Allowed values: 'sgd', 'adam'"),
    ({"lr": 0.0}, r"`lr`=0.0 is out of range.*\(0, inf\).*HINT: learning rates must be > 0"),
    ({"lr": -1e-3}, r"`lr`=-0.001 is out of range"),
    ({"weight_decay": -0.1}, r"`weight_decay`=-0.1 is out of range"),
    ({"name": "adam", "momentum": 0.9}, r"`momentum`=0.9 is not an argument of optimizer 'adam'.*HINT: .*betas"),
    ({"name": "sgd", "momentum": 1.0}, r"`momentum`=1.0 is out of range.*\[0, 1\)"),
    ({"name": "sgd", "betas": (0.9, 0.99)}, r"`betas`=\(0.9, 0.99\) is not an argument of optimizer 'sgd'"),
    ({"name": "adam", "betas": (0.9, 1.5)}, r"`betas`=\(0.9, 1.5\) is out of range.*two numbers in \[0, 1\)"),
    ({"name": "adam", "betas": (0.9,)}, r"`betas`=\(0.9,\) is out of range"),
    ({"name": "adam", "nesterov": True}, r"`nesterov`=True is only supported by 'sgd', not 'adam'"),
    ({"name": "sgd", "momentum": 0.0, "nesterov": True}, r"`nesterov`=True needs `momentum` > 0"),
    ({"eps": 0.0}, r"`eps`=0.0 is out of range"),
    ({"lr_multipliers": {"backbone": 0.0}}, r"`lr_multipliers\['backbone'\]`=0.0 is out of range.*requires_grad"),
    ({"lr_multipliers": {"": 0.5}}, r"`lr_multipliers` key '' is not supported.*a non-empty module-name prefix"),
    ({"lr_multipliers": [("backbone", 0.1)]}, r"`lr_multipliers`=\[\('backbone', 0.1\)\] is not supported.*a dict"),
    ({"lr_scaling": "quadratic"}, r"`lr_scaling`='quadratic' is not supported. Allowed values: 'linear', 'sqrt', None"),
    ({"lr_scaling": "linear"}, r"`lr_scaling`='linear' needs `base_batch_size`"),
    ({"lr_scaling": "sqrt", "base_batch_size": 0}, r"`base_batch_size`=0 is out of range.*an integer >= 1"),
    ({"implementation": "cuda"}, r"`implementation`='cuda' is not supported. Allowed values: 'auto', 'fused'"),
    ({"kwargs": 3}, r"`kwargs`=3 is not supported. Allowed values: a dict of optimizer keyword arguments"),
]

BAD_SCHEDULER = [
    ({"name": "cosin"}, r"`name`='cosin' is not a registered scheduler. Allowed values: 'constant', 'step'"),
    ({"name": "plateau"}, r"Scheduler 'plateau' needs `monitor`.*HINT: .*monitor='val_loss'"),
    ({"interval": "batch"}, r"`interval`='batch' is not supported. Allowed values: 'step', 'epoch', None"),
    ({"frequency": 0}, r"`frequency`=0 is out of range. Allowed values: an integer >= 1"),
    ({"name": "plateau", "monitor": "val_acc", "mode": "maximize"}, r"`mode`='maximize' is not supported"),
    ({"warmup": -1}, r"`warmup`=-1 is out of range.*an int >= 0 \(intervals\) or a float in \[0, 1\)"),
    ({"warmup": 1.5}, r"`warmup`=1.5 is out of range"),
    ({"min_lr": -1.0}, r"`min_lr`=-1.0 is out of range"),
    ({"gamma": 0.0}, r"`gamma`=0.0 is out of range.*\(0, 1\]"),
    ({"gamma": 1.5}, r"`gamma`=1.5 is out of range"),
    ({"step_size": 0}, r"`step_size`=0 is out of range. Allowed values: an integer >= 1"),
    ({"milestones": [5, 3]}, r"`milestones`=\[5, 3\] is not supported.*a non-empty, strictly increasing list"),
    ({"milestones": []}, r"`milestones`=\[\] is not supported"),
    ({"t_0": 0}, r"`t_0`=0 is out of range. Allowed values: an integer >= 1"),
    ({"t_mult": 0}, r"`t_mult`=0 is out of range. Allowed values: an integer >= 1"),
    ({"max_lr": -0.1}, r"`max_lr`=-0.1 is out of range"),
    ({"pct_start": 1.0}, r"`pct_start`=1.0 is out of range"),
    ({"factor": 1.0}, r"`factor`=1.0 is out of range"),
    ({"patience": -1}, r"`patience`=-1 is out of range. Allowed values: an integer >= 0"),
    ({"total_steps": 0}, r"`total_steps`=0 is out of range. Allowed values: an integer >= 1"),
    ({"warmup": 10, "total_steps": 10}, r"`warmup`=10 \(10 intervals\) is longer than training \(10 intervals\)"),
    ({"kwargs": "gamma=0.5"}, r"`kwargs`='gamma=0.5' is not supported.*a dict of scheduler keyword arguments"),
]


def test_optim_misconfiguration() -> None:
    for kwargs, match in BAD_OPTIMIZER:
        with pytest.raises(SpeedupConfigError, match=match):
            OptimizerConfig(**kwargs)
    for kwargs, match in BAD_SCHEDULER:
        with pytest.raises(SpeedupConfigError, match=match):
            SchedulerConfig(**kwargs)
    # coercion from YAML / hparams dicts
    with pytest.raises(SpeedupConfigError, match=r"`optimizer_config` has unknown keys \['learning_rate'\]"):
        as_optimizer_config({"name": "sgd", "learning_rate": 0.1})
    with pytest.raises(SpeedupConfigError, match=r"`scheduler_config` has unknown keys \['T_max'\]"):
        as_scheduler_config({"name": "cosine", "T_max": 10})
    with pytest.raises(SpeedupConfigError, match=r"`optimizer_config`=3 is not supported.*an OptimizerConfig"):
        as_optimizer_config(3)  # type: ignore[arg-type]
    with pytest.raises(SpeedupConfigError, match=r"`scheduler_config`=\[\] is not supported.*a SchedulerConfig"):
        as_scheduler_config([])  # type: ignore[arg-type]
    # the mixin validates at construction, before any Trainer exists
    with pytest.raises(SpeedupConfigError, match=r"`momentum`=0.9 is not an argument of optimizer 'adamw'"):
        DemoClassifier(width=4, optimizer_config={"name": "adamw", "momentum": 0.9})
    with pytest.raises(SpeedupConfigError, match=r"Scheduler 'plateau' needs `monitor`"):
        DemoClassifier(width=4, scheduler_config={"name": "plateau"})
    # things only known once the model / run exists
    model = DemoClassifier(width=4)
    with pytest.raises(SpeedupConfigError, match=r"`lr_multipliers` prefixes \['backbon'\] match no parameter.*'head'"):
        create_optimizer(model, OptimizerConfig(lr_multipliers={"backbon": 0.1}))
    with pytest.raises(SpeedupConfigError, match=r"`lr_scaling`='linear' needs the run's batch size"):
        create_optimizer(model, OptimizerConfig(lr_scaling="linear", base_batch_size=32))
    with pytest.raises(SpeedupConfigError, match=r"The module has no parameters to optimize"):
        create_optimizer(nn.ReLU(), OptimizerConfig())
    opt = torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1)
    with pytest.raises(SpeedupConfigError, match=r"Scheduler 'onecycle' needs the run length.*HINT: pass `trainer=`"):
        create_scheduler(opt, SchedulerConfig("onecycle"))
    with pytest.raises(SpeedupConfigError, match=r"Scheduler 'cosine' rejected its arguments"):
        create_scheduler(opt, SchedulerConfig("cosine", total_steps=5, kwargs={"T_min": 3}))
    with pytest.raises(SpeedupConfigError, match=r"`warmup`=0.99 \(5 intervals\) is longer than training \(5"):
        create_scheduler(opt, SchedulerConfig("linear_warmup_cosine", warmup=0.99, total_steps=5))
    with pytest.raises(SpeedupConfigError, match=r"`rule`='cubic' is not supported"):
        scale_lr(0.1, 64, 32, "cubic")
    with pytest.raises(SpeedupConfigError, match=r"`batch_size`=0 is out of range. Allowed values: an integer >= 1"):
        scale_lr(0.1, 0, 32, "linear")


def test_config_coercion_and_yaml_round_trip() -> None:
    import dataclasses

    import yaml

    cfg = OptimizerConfig("sgd", lr=0.1, betas=None, lr_multipliers={"backbone": 0.1})
    assert as_optimizer_config(dataclasses.asdict(cfg)) == cfg
    assert as_optimizer_config(yaml.safe_load(yaml.safe_dump(dataclasses.asdict(cfg)))) == cfg
    assert as_optimizer_config(None) == OptimizerConfig()
    assert as_optimizer_config("adamw").name == "adamw"
    scfg = SchedulerConfig("multistep", milestones=[2, 4], warmup=3.0)
    assert scfg.warmup == 3 and isinstance(scfg.warmup, int)  # YAML may give 3.0
    assert as_scheduler_config(yaml.safe_load(yaml.safe_dump(dataclasses.asdict(scfg)))) == scfg
    assert as_scheduler_config(None) is None
    assert OptimizerConfig("adam", betas=[0.8, 0.9]).betas == (0.8, 0.9)  # lists from YAML become tuples


def test_scale_lr() -> None:
    assert scale_lr(0.1, 256, 256, "linear") == 0.1
    assert scale_lr(0.1, 512, 256, "linear") == pytest.approx(0.2)
    assert scale_lr(0.1, 128, 256, "linear") == pytest.approx(0.05)
    assert scale_lr(0.1, 1024, 256, "sqrt") == pytest.approx(0.2)
    assert scale_lr(0.1, 1024, 256, None) == 0.1
