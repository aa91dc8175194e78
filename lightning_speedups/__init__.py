"""lightning-speedups: Lightning callbacks and a LightningModule mixin that make training faster, measured.

The top level holds what a Lightning user adds to a run: the callbacks, :func:`autotune` and its plan, the Trainer
settings, the mixin and its configs, :func:`load_checkpoint` and the error types. The rest lives in its subpackage:

- ``lightning_speedups.functional``: one plain-PyTorch function per technique (no Lightning needed);
- ``lightning_speedups.data``: data on the device and token-sequence batching;
- ``lightning_speedups.measure``: timing, ratios, the machine and its peak FLOP/s;
- ``lightning_speedups.optim``: optimizer and scheduler registries, the LR finder rules;
- ``lightning_speedups.recipes``, ``lightning_speedups.settings``, ``lightning_speedups.tuner``.

A name that moved from the top level still imports from there for one release, with a ``DeprecationWarning`` that
names its new import path.
"""

import importlib as _importlib
import warnings as _warnings
from types import ModuleType as _ModuleType
from typing import Any as _Any

# the public subpackages: `lightning_speedups.functional.freeze` works after a plain `import lightning_speedups`
from lightning_speedups import data, functional, measure, optim, recipes, settings, tuner  # noqa: F401
from lightning_speedups._errors import SpeedupConfigError, SpeedupRuntimeError
from lightning_speedups._structure import load_checkpoint

# autotune: the plan measured on this model and machine
from lightning_speedups.autotune import TunePlan, autotune

# callbacks (importing them registers their techniques)
from lightning_speedups.callbacks.advisor import SpeedAdvisor
from lightning_speedups.callbacks.batch_size import ThroughputBatchSizeFinder
from lightning_speedups.callbacks.channels_last import ChannelsLast
from lightning_speedups.callbacks.channels_last_trial import ChannelsLastTrial
from lightning_speedups.callbacks.compile import TorchCompile
from lightning_speedups.callbacks.ema import EMA
from lightning_speedups.callbacks.fast_schedule import FastSchedule
from lightning_speedups.callbacks.finetuning import FineTuneConfig, FineTuneFreezing
from lightning_speedups.callbacks.label_smoothing import LabelSmoothing
from lightning_speedups.callbacks.lr_finder import LRFinder
from lightning_speedups.callbacks.muon import Muon
from lightning_speedups.callbacks.optimizer_race import OptimizerRace
from lightning_speedups.callbacks.precision_trial import PrecisionTrial
from lightning_speedups.callbacks.progressive_resizing import ProgressiveResizing
from lightning_speedups.callbacks.pruning import MaskPruning, StructuredPruning
from lightning_speedups.callbacks.quantization import Float8Training, QuantizationAwareTraining
from lightning_speedups.callbacks.schedule_free import ScheduleFreeSwitch
from lightning_speedups.callbacks.sequence_batching import SequenceBatching
from lightning_speedups.callbacks.speed_flags import SpeedFlags
from lightning_speedups.callbacks.token_throughput import TokenThroughput

# the mixin and its configs
from lightning_speedups.optim import OptimizerConfig, SchedulerConfig, SpeedupMixin

# settings (Trainer arguments for this machine)
from lightning_speedups.settings import explain_trainer_settings, trainer_settings

__version__ = "0.1.0"

__all__ = [
    # errors
    "SpeedupConfigError",
    "SpeedupRuntimeError",
    # reload any checkpoint of a modified model (pruned, quantized) into a fresh one
    "load_checkpoint",
    # callbacks
    "ChannelsLast",
    "ChannelsLastTrial",
    "EMA",
    "FastSchedule",
    "FineTuneFreezing",
    "Float8Training",
    "LRFinder",
    "LabelSmoothing",
    "MaskPruning",
    "Muon",
    "OptimizerRace",
    "PrecisionTrial",
    "ProgressiveResizing",
    "QuantizationAwareTraining",
    "ScheduleFreeSwitch",
    "SequenceBatching",
    "SpeedAdvisor",
    "SpeedFlags",
    "StructuredPruning",
    "ThroughputBatchSizeFinder",
    "TokenThroughput",
    "TorchCompile",
    # the mixin and configs
    "FineTuneConfig",
    "OptimizerConfig",
    "SchedulerConfig",
    "SpeedupMixin",
    # autotune
    "TunePlan",
    "autotune",
    # settings
    "explain_trainer_settings",
    "trainer_settings",
]

# Names that left the top level, and where they live now. They keep importing from here for one release.
_MOVED: dict[str, str] = {
    # the deprecated pruning alias: StructuredPruning / MaskPruning replace it
    "Pruning": "lightning_speedups.callbacks.pruning",
    # technique registry (internal)
    "TechniqueInfo": "lightning_speedups._registry",
    "get_technique": "lightning_speedups._registry",
    "list_techniques": "lightning_speedups._registry",
    "register_technique": "lightning_speedups._registry",
    # measuring: peak FLOP/s of the device
    "PeakEstimate": "lightning_speedups.measure",
    "device_peak_flops": "lightning_speedups.measure",
    "estimate_cpu_peak_flops": "lightning_speedups.measure",
    # data on the device, token sequences
    "BatchAugment": "lightning_speedups.data",
    "DeviceDataLoader": "lightning_speedups.data",
    "LengthGroupedSampler": "lightning_speedups.data",
    "PackedBatchSampler": "lightning_speedups.data",
    "SequenceLoader": "lightning_speedups.data",
    "TokenBudgetBatchSampler": "lightning_speedups.data",
    "compute_mean_std": "lightning_speedups.data",
    "pack_collate": "lightning_speedups.data",
    "pack_sequences": "lightning_speedups.data",
    "packed_attention_mask": "lightning_speedups.data",
    "pad_collate": "lightning_speedups.data",
    "to_tensors": "lightning_speedups.data",
    # functional (plain PyTorch)
    "AdvisorReport": "lightning_speedups.functional",
    "BatchSizeSearchResult": "lightning_speedups.functional",
    "Finding": "lightning_speedups.functional",
    "apply_channels_last": "lightning_speedups.functional",
    "apply_label_smoothing": "lightning_speedups.functional",
    "compile_model": "lightning_speedups.functional",
    "create_ema_model": "lightning_speedups.functional",
    "create_fast_schedule": "lightning_speedups.functional",
    "diagnose": "lightning_speedups.functional",
    "find_head": "lightning_speedups.functional",
    "freeze": "lightning_speedups.functional",
    "layer_groups": "lightning_speedups.functional",
    "load_pretrained": "lightning_speedups.functional",
    "load_pruned": "lightning_speedups.functional",
    "load_quantized": "lightning_speedups.functional",
    "progressive_scale": "lightning_speedups.functional",
    "prune_structured": "lightning_speedups.functional",
    "prune_unstructured": "lightning_speedups.functional",
    "quantize_for_inference": "lightning_speedups.functional",
    "replace_head": "lightning_speedups.functional",
    "resize_batch": "lightning_speedups.functional",
    "save_pruned": "lightning_speedups.functional",
    "save_quantized": "lightning_speedups.functional",
    "smooth_labels": "lightning_speedups.functional",
    "sparsity_report": "lightning_speedups.functional",
    "uncompile_model": "lightning_speedups.functional",
    "unfreeze": "lightning_speedups.functional",
    # optimizers, schedulers, LR finder
    "create_optimizer": "lightning_speedups.optim",
    "create_scheduler": "lightning_speedups.optim",
    "list_optimizers": "lightning_speedups.optim",
    "list_schedulers": "lightning_speedups.optim",
    "plot_lr_schedule": "lightning_speedups.optim",
    "recompute_batchnorm": "lightning_speedups.optim",
    "register_optimizer": "lightning_speedups.optim",
    "register_scheduler": "lightning_speedups.optim",
    "scale_lr": "lightning_speedups.optim",
    "schedule_free_eval": "lightning_speedups.optim",
    "schedule_free_train": "lightning_speedups.optim",
    "suggest_lr": "lightning_speedups.optim",
    # autotune's candidates
    "list_candidates": "lightning_speedups.autotune",
    # recipes
    "Recipe": "lightning_speedups.recipes",
    "fast_finetune": "lightning_speedups.recipes",
    "fast_train": "lightning_speedups.recipes",
    "get_recipe": "lightning_speedups.recipes",
    "list_recipes": "lightning_speedups.recipes",
    # searches that drive a callback
    "find_batch_size": "lightning_speedups.tuner",
    # settings
    "TrainerSettings": "lightning_speedups.settings",
    "cpu_bf16_is_fast": "lightning_speedups.settings",
    "enable_speed_flags": "lightning_speedups.settings",
}


def __getattr__(name: str) -> _Any:
    """A name that moved off the top level: warn, naming its new import path, and return it (for one release)."""
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_speedups' has no attribute {name!r}")
    _warnings.warn(
        f"lightning_speedups.{name} is deprecated; import it from {module}", DeprecationWarning, stacklevel=2
    )
    return getattr(_importlib.import_module(module), name)


def __dir__() -> list[str]:
    """The public names and the subpackages (what tab completion offers); the deprecated names are left out."""
    modules = {n for n, v in globals().items() if isinstance(v, _ModuleType) and v.__name__ == f"{__name__}.{n}"}
    return sorted({*__all__, "__version__", *(n for n in modules if not n.startswith("_"))})
