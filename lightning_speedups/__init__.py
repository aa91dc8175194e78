"""lightning-speedups: Lightning callbacks and a LightningModule mixin that make training faster, measured."""

from lightning_speedups._errors import SpeedupConfigError, SpeedupRuntimeError
from lightning_speedups._peak import PeakEstimate, device_peak_flops, estimate_cpu_peak_flops
from lightning_speedups._registry import TechniqueInfo, get_technique, list_techniques, register_technique
from lightning_speedups._structure import load_checkpoint

# autotune: the plan measured on this model and machine
from lightning_speedups.autotune import TunePlan, autotune, list_candidates

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
from lightning_speedups.callbacks.pruning import MaskPruning, Pruning, StructuredPruning
from lightning_speedups.callbacks.quantization import Float8Training, QuantizationAwareTraining
from lightning_speedups.callbacks.schedule_free import ScheduleFreeSwitch
from lightning_speedups.callbacks.sequence_batching import SequenceBatching
from lightning_speedups.callbacks.speed_flags import SpeedFlags
from lightning_speedups.callbacks.token_throughput import TokenThroughput

# data: on the device (images), and token sequences (length-aware batches, dynamic padding, packing)
from lightning_speedups.data import (
    BatchAugment,
    DeviceDataLoader,
    LengthGroupedSampler,
    PackedBatchSampler,
    SequenceLoader,
    TokenBudgetBatchSampler,
    compute_mean_std,
    pack_collate,
    pack_sequences,
    packed_attention_mask,
    pad_collate,
    to_tensors,
)

# functional (plain PyTorch, no Lightning needed)
from lightning_speedups.functional.advisor import AdvisorReport, Finding, diagnose
from lightning_speedups.functional.batch_size import BatchSizeSearchResult
from lightning_speedups.functional.channels_last import apply_channels_last
from lightning_speedups.functional.compile import compile_model, uncompile_model
from lightning_speedups.functional.ema import create_ema_model
from lightning_speedups.functional.fast_schedule import create_fast_schedule
from lightning_speedups.functional.finetuning import (
    find_head,
    freeze,
    layer_groups,
    load_pretrained,
    replace_head,
    unfreeze,
)
from lightning_speedups.functional.label_smoothing import apply_label_smoothing, smooth_labels
from lightning_speedups.functional.progressive_resizing import progressive_scale, resize_batch
from lightning_speedups.functional.pruning import (
    load_pruned,
    prune_structured,
    prune_unstructured,
    save_pruned,
    sparsity_report,
)
from lightning_speedups.functional.quantization import load_quantized, quantize_for_inference, save_quantized

# mixin, optimizers, schedulers, LR finder
from lightning_speedups.optim import (
    OptimizerConfig,
    SchedulerConfig,
    SpeedupMixin,
    create_optimizer,
    create_scheduler,
    list_optimizers,
    list_schedulers,
    plot_lr_schedule,
    recompute_batchnorm,
    register_optimizer,
    register_scheduler,
    scale_lr,
    schedule_free_eval,
    schedule_free_train,
    suggest_lr,
)

# recipes
from lightning_speedups.recipes import Recipe, fast_finetune, fast_train, get_recipe, list_recipes

# settings (trainer arguments for this hardware)
from lightning_speedups.settings import (
    TrainerSettings,
    cpu_bf16_is_fast,
    enable_speed_flags,
    explain_trainer_settings,
    trainer_settings,
)

# tuner (searches that drive a callback, then stop)
from lightning_speedups.tuner import find_batch_size

__version__ = "0.1.0"

__all__ = [
    # errors
    "SpeedupConfigError",
    "SpeedupRuntimeError",
    # reload any checkpoint of a modified model (pruned, quantized) into a fresh one
    "load_checkpoint",
    # peak FLOP/s of the device (utilisation = achieved / peak; an estimate on CPUs)
    "PeakEstimate",
    "device_peak_flops",
    "estimate_cpu_peak_flops",
    # technique registry
    "TechniqueInfo",
    "get_technique",
    "list_techniques",
    "register_technique",
    # callbacks
    "ChannelsLast",
    "ChannelsLastTrial",
    "FineTuneConfig",
    "FineTuneFreezing",
    "Float8Training",
    "LRFinder",
    "PrecisionTrial",
    "Pruning",
    "StructuredPruning",
    "MaskPruning",
    "QuantizationAwareTraining",
    "SpeedAdvisor",
    "SpeedFlags",
    "ThroughputBatchSizeFinder",
    "TorchCompile",
    "EMA",
    "FastSchedule",
    "Muon",
    "OptimizerRace",
    "LabelSmoothing",
    "ProgressiveResizing",
    "ScheduleFreeSwitch",
    "SequenceBatching",
    "TokenThroughput",
    # data on the device
    "BatchAugment",
    "DeviceDataLoader",
    "compute_mean_std",
    "to_tensors",
    # token sequences
    "LengthGroupedSampler",
    "PackedBatchSampler",
    "SequenceLoader",
    "TokenBudgetBatchSampler",
    "pack_collate",
    "pack_sequences",
    "packed_attention_mask",
    "pad_collate",
    # functional
    "AdvisorReport",
    "BatchSizeSearchResult",
    "Finding",
    "apply_channels_last",
    "apply_label_smoothing",
    "create_ema_model",
    "create_fast_schedule",
    "progressive_scale",
    "resize_batch",
    "smooth_labels",
    "compile_model",
    "diagnose",
    "find_head",
    "freeze",
    "layer_groups",
    "load_pretrained",
    "load_pruned",
    "load_quantized",
    "prune_structured",
    "prune_unstructured",
    "quantize_for_inference",
    "replace_head",
    "save_pruned",
    "save_quantized",
    "sparsity_report",
    "uncompile_model",
    "unfreeze",
    # mixin, optimizers, schedulers, LR finder
    "OptimizerConfig",
    "SchedulerConfig",
    "SpeedupMixin",
    "create_optimizer",
    "create_scheduler",
    "list_optimizers",
    "list_schedulers",
    "plot_lr_schedule",
    "register_optimizer",
    "recompute_batchnorm",
    "register_scheduler",
    "scale_lr",
    "schedule_free_eval",
    "schedule_free_train",
    "suggest_lr",
    # autotune
    "TunePlan",
    "autotune",
    "list_candidates",
    # recipes
    "Recipe",
    "fast_finetune",
    "fast_train",
    "get_recipe",
    "list_recipes",
    # tuner
    "find_batch_size",
    # settings
    "TrainerSettings",
    "cpu_bf16_is_fast",
    "enable_speed_flags",
    "explain_trainer_settings",
    "trainer_settings",
]
