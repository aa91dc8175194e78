"""Optimizer registry and factory: parameter groups (no decay on biases/norms, lr multipliers), fused kernels.

Every parameter of the module, also those with ``requires_grad=False``, is placed in a group when the optimizer is
built. torch optimizers skip parameters whose ``.grad`` is ``None``, so frozen parameters cost nothing; a fine-tuning
callback unfreezes them by setting ``requires_grad=True`` and they start training in their group (with its lr,
weight decay and ``lr_mult``) without ``add_param_group``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.optim._fused_momentum import guard_fused_momentum
from lightning_speedups.optim.config import OptimizerConfig, as_optimizer_config, scale_lr, set_registry_check
from lightning_speedups.optim.muon import create_muon
from lightning_speedups.optim.schedule_free import create_schedule_free_adamw, create_schedule_free_sgd

__all__ = [
    "OptimizerInfo",
    "register_optimizer",
    "list_optimizers",
    "get_optimizer_info",
    "create_optimizer",
    "build_param_groups",
    "choose_implementation",
    "check_optimizer_config",
]

_NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
)


@dataclass(frozen=True)
class OptimizerInfo:
    """A registry entry: how to build one optimizer and which config fields it accepts.

    Args:
        name: registry key.
        factory: ``factory(param_groups, **kwargs) -> Optimizer`` (usually the optimizer class).
        defaults: keyword defaults applied unless the config sets them (e.g. ``{"momentum": 0.9}`` for SGD).
        momentum: accepts ``momentum``.
        betas: accepts ``betas``.
        nesterov: accepts ``nesterov``.
        summary: one line for tables.
        needs_module: the factory also takes ``module=`` (the model), to split the groups by layer (``muon``).
        shardable: works when a strategy shards the parameters (FSDP, DeepSpeed). ``False`` for optimizers that need
            whole matrices (``muon`` orthogonalises each one): the mixin refuses them under a sharded strategy.
        schedule_free: switches its weights with ``train()`` / ``eval()`` and takes no LR scheduler; the mixin switches
            it at the right hooks (see :mod:`lightning_speedups.optim.schedule_free`).
    """

    name: str
    factory: Callable[..., torch.optim.Optimizer]
    defaults: dict[str, Any] = field(default_factory=dict)
    momentum: bool = False
    betas: bool = False
    nesterov: bool = False
    summary: str = ""
    needs_module: bool = False
    shardable: bool = True
    schedule_free: bool = False

    def accepts(self, kwarg: str) -> bool:
        """Whether the factory takes keyword ``kwarg`` (e.g. ``fused``, ``foreach``)."""
        try:
            return kwarg in inspect.signature(self.factory).parameters
        except (TypeError, ValueError):
            return False


_OPTIMIZERS: dict[str, OptimizerInfo] = {}


def register_optimizer(info: OptimizerInfo) -> OptimizerInfo:
    """Add (or replace) an optimizer in the registry.

    Example::

        >>> _ = register_optimizer(OptimizerInfo("asgd", torch.optim.ASGD, summary="averaged SGD"))
        >>> "asgd" in list_optimizers()
        True
    """
    _OPTIMIZERS[info.name] = info
    return info


def list_optimizers() -> list[str]:
    """Names of the registered optimizers."""
    return list(_OPTIMIZERS)


def get_optimizer_info(name: str) -> OptimizerInfo:
    """Look an optimizer up by name; unknown names raise and list the valid ones."""
    if name not in _OPTIMIZERS:
        raise SpeedupConfigError(
            f"`name`={name!r} is not a registered optimizer. Allowed values: {', '.join(map(repr, _OPTIMIZERS))}."
            " HINT: add your own with register_optimizer(OptimizerInfo(...))."
        )
    return _OPTIMIZERS[name]


def check_optimizer_config(config: OptimizerConfig) -> OptimizerInfo:
    """Check ``config`` against the registry: a registered name, and only the fields its optimizer takes.

    Runs at the end of ``OptimizerConfig.__post_init__`` and again in :func:`create_optimizer`.

    Returns:
        The registry entry of ``config.name``.

    Raises:
        SpeedupConfigError: unknown name, or ``momentum`` / ``betas`` / ``nesterov`` the optimizer does not take.
    """
    info = get_optimizer_info(config.name)
    if config.momentum is not None and not info.momentum:
        raise SpeedupConfigError(
            f"`momentum`={config.momentum!r} is not an argument of optimizer {config.name!r}. Allowed values: None. "
            "HINT: Adam-type optimizers take `betas=(beta1, beta2)` instead of momentum."
        )
    if config.betas is not None and not info.betas:
        raise SpeedupConfigError(
            f"`betas`={config.betas!r} is not an argument of optimizer {config.name!r}. Allowed values: None. "
            "HINT: SGD and RMSprop take `momentum` instead."
        )
    if config.nesterov:
        if not info.nesterov:
            raise SpeedupConfigError(
                f"`nesterov`=True is only supported by 'sgd', not {config.name!r}. Allowed values: False."
            )
        momentum = config.momentum if config.momentum is not None else info.defaults.get("momentum", 0.0)
        if not momentum:
            raise SpeedupConfigError(
                "`nesterov`=True needs `momentum` > 0. Allowed values: nesterov=False, or a momentum > 0. HINT: e.g. "
                "momentum=0.9."
            )
    return info


set_registry_check(OptimizerConfig, check_optimizer_config)

register_optimizer(
    OptimizerInfo("sgd", torch.optim.SGD, {"momentum": 0.9}, momentum=True, nesterov=True, summary="SGD + momentum")
)
register_optimizer(OptimizerInfo("adam", torch.optim.Adam, betas=True, summary="Adam"))
register_optimizer(OptimizerInfo("adamw", torch.optim.AdamW, betas=True, summary="Adam, decoupled weight decay"))
register_optimizer(OptimizerInfo("adagrad", torch.optim.Adagrad, summary="AdaGrad"))
register_optimizer(OptimizerInfo("rmsprop", torch.optim.RMSprop, momentum=True, summary="RMSprop"))
register_optimizer(OptimizerInfo("nadam", torch.optim.NAdam, betas=True, summary="Adam + Nesterov momentum"))
register_optimizer(OptimizerInfo("radam", torch.optim.RAdam, betas=True, summary="rectified Adam"))
register_optimizer(
    OptimizerInfo(
        "muon",
        create_muon,
        momentum=True,
        betas=True,
        summary="Muon for hidden matrices, AdamW for embeddings, head and vectors (one lr)",
        needs_module=True,
        shardable=False,
    )
)
register_optimizer(
    OptimizerInfo(
        "schedule_free_adamw",
        create_schedule_free_adamw,
        betas=True,
        summary="schedule-free AdamW: no LR schedule, evaluates the average (extra `schedulefree`)",
        shardable=False,
        schedule_free=True,
    )
)
register_optimizer(
    OptimizerInfo(
        "schedule_free_sgd",
        create_schedule_free_sgd,
        momentum=True,
        summary="schedule-free SGD: no LR schedule, evaluates the average (extra `schedulefree`)",
        shardable=False,
        schedule_free=True,
    )
)


def _fused_devices() -> list[str]:
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return list(_get_fused_kernels_supported_devices())
    except ImportError:  # pragma: no cover - very old torch
        return ["cuda"]


def choose_implementation(
    info: OptimizerInfo, params: Iterable[torch.Tensor], requested: str = "auto", avoid_fused: bool = False
) -> dict[str, Any]:
    """Pick the optimizer kernel: the constructor kwargs (``{"fused": True}``, ``{"foreach": True}``, ...).

    ``"auto"`` uses the fused kernel when the optimizer has one (sgd, adam, adamw, adagrad) and every parameter is a
    floating-point tensor on one device type that torch has fused kernels for (CUDA, CPU, XPU, MPS, ...); otherwise
    torch's own default. On CPU the fused step is faster than the default (``docs/evidence.md``, section "Optimizers").
    ``avoid_fused`` keeps ``"auto"`` off the fused kernel (Lightning cannot clip gradients of fused optimizers under
    ``precision="16-mixed"``, whose GradScaler they unscale internally).

    Raises:
        SpeedupConfigError: ``"fused"`` or ``"foreach"`` requested where it is not available.
    """
    params = list(params)
    device_types = {p.device.type for p in params}
    fusable = (
        info.accepts("fused")
        and len(device_types) == 1
        and next(iter(device_types)) in _fused_devices()
        and all(torch.is_floating_point(p) for p in params)
    )
    if requested == "auto":
        return {"fused": True} if fusable and not avoid_fused else {}
    if requested == "fused":
        if not fusable:
            raise SpeedupConfigError(
                f"`implementation`='fused' is not available for optimizer {info.name!r} on device(s) "
                f"{sorted(device_types)}. Fused kernels exist for devices {_fused_devices()} and optimizers whose "
                "constructor takes `fused`. Allowed values: 'auto' or 'for_loop' here. HINT: use "
                "implementation='auto'."
            )
        return {"fused": True}
    if not info.accepts("foreach"):
        if requested == "foreach":
            raise SpeedupConfigError(
                f"`implementation`='foreach' is not available for optimizer {info.name!r}. Allowed values: 'auto', "
                "'for_loop'."
            )
        return {}
    return {"foreach": requested == "foreach"}


def _named_params(module: nn.Module) -> list[tuple[str, nn.Parameter, bool]]:
    """``(name, param, is_norm_param)`` for every unique parameter, frozen ones included."""
    seen: set[int] = set()
    out = []
    for mod_name, mod in module.named_modules():
        for p_name, p in mod.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            out.append((f"{mod_name}.{p_name}" if mod_name else p_name, p, isinstance(mod, _NORM_TYPES)))
    return out


def _match(name: str, prefixes: Iterable[str]) -> str | None:
    best = None
    for prefix in prefixes:
        if (name == prefix or name.startswith(prefix + ".")) and (best is None or len(prefix) > len(best)):
            best = prefix
    return best


def build_param_groups(
    module_or_params: nn.Module | Iterable[torch.Tensor], config: OptimizerConfig, lr: float | None = None
) -> list[dict[str, Any]]:
    """Split parameters into named groups by lr multiplier and weight decay.

    Each group has ``params``, ``lr`` (= base lr x ``lr_mult``), ``weight_decay``, ``name`` (the matched
    ``lr_multipliers`` prefix or ``"default"``, suffixed ``"/no_decay"``) and ``lr_mult``. Frozen parameters are
    included (see the module docstring).

    Raises:
        SpeedupConfigError: no parameters, or an ``lr_multipliers`` prefix that matches no parameter.
    """
    base_lr = config.lr if lr is None else lr
    if isinstance(module_or_params, nn.Module):
        named = _named_params(module_or_params)
    else:
        named = [(f"param{i}", p, False) for i, p in enumerate(module_or_params)]
    if not named:
        raise SpeedupConfigError(
            "The module has no parameters to optimize. Allowed values: a module or parameter list with at least one "
            "parameter."
        )
    prefixes = list(config.lr_multipliers)
    used: set[str] = set()
    split = config.no_decay_norm_and_bias and config.weight_decay > 0
    groups: dict[str, dict[str, Any]] = {}
    for name, p, is_norm in named:
        prefix = _match(name, prefixes)
        if prefix is not None:
            used.add(prefix)
        no_decay = split and (is_norm or p.ndim <= 1)
        key = (prefix or "default") + ("/no_decay" if no_decay else "")
        if key not in groups:
            mult = float(config.lr_multipliers[prefix]) if prefix is not None else 1.0
            groups[key] = {
                "params": [],
                "name": key,
                "lr_mult": mult,
                "lr": base_lr * mult,
                "weight_decay": 0.0 if no_decay else config.weight_decay,
            }
        groups[key]["params"].append(p)
    unused = [p for p in prefixes if p not in used]
    if unused and isinstance(module_or_params, nn.Module):
        top = sorted({n.split(".")[0] for n, _, _ in named})
        raise SpeedupConfigError(
            f"`lr_multipliers` prefixes {unused} match no parameter. Allowed values: module-name prefixes such as "
            f"{', '.join(map(repr, top))}."
        )
    return list(groups.values())


def create_optimizer(
    module_or_params: nn.Module | Iterable[torch.Tensor],
    config: OptimizerConfig | Mapping[str, Any] | str | None = None,
    batch_size: int | None = None,
    avoid_fused: bool = False,
) -> torch.optim.Optimizer:
    """Build the optimizer described by ``config`` for a module (or an iterable of parameters).

    Args:
        module_or_params: an ``nn.Module`` (parameter names drive ``lr_multipliers``) or parameters.
        config: an :class:`OptimizerConfig`, a dict of its fields, a registry name, or ``None`` (Adam, lr 1e-3).
        batch_size: the effective global batch size, needed when ``config.lr_scaling`` is set.
        avoid_fused: keep ``implementation="auto"`` off fused kernels (see :func:`choose_implementation`).

    Returns:
        The optimizer; every param group carries ``"name"`` and ``"lr_mult"``.

    Raises:
        SpeedupConfigError: bad config, ``lr_scaling`` without ``batch_size``, unavailable implementation.

    Example::

        >>> model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
        >>> opt = create_optimizer(model, OptimizerConfig("sgd", lr=0.1, weight_decay=1e-4, lr_multipliers={"0": 0.1}))
        >>> [(g["name"], g["lr"], g["weight_decay"]) for g in opt.param_groups]  # doctest: +NORMALIZE_WHITESPACE
        [('0', 0.010000000000000002, 0.0001), ('0/no_decay', 0.010000000000000002, 0.0),
         ('default/no_decay', 0.1, 0.0), ('default', 0.1, 0.0001)]
    """
    cfg = as_optimizer_config(config)
    info = check_optimizer_config(cfg)
    lr = cfg.lr
    if cfg.lr_scaling is not None:
        if batch_size is None:
            raise SpeedupConfigError(
                f"`lr_scaling`={cfg.lr_scaling!r} needs the run's batch size. Allowed values: lr_scaling=None, or a "
                "known batch size. HINT: pass `batch_size=` to create_optimizer, or give the model or datamodule a "
                "`batch_size` attribute."
            )
        lr = scale_lr(cfg.lr, batch_size, cfg.base_batch_size or batch_size, cfg.lr_scaling)
    groups = build_param_groups(module_or_params, cfg, lr)
    kwargs: dict[str, Any] = dict(info.defaults)
    if cfg.momentum is not None:
        kwargs["momentum"] = cfg.momentum
    if cfg.betas is not None:
        kwargs["betas"] = tuple(cfg.betas)
    if cfg.nesterov:
        kwargs["nesterov"] = True
    if cfg.eps is not None:
        kwargs["eps"] = cfg.eps
    kwargs.update(cfg.kwargs)
    if "fused" not in kwargs and "foreach" not in kwargs:
        kwargs.update(
            choose_implementation(info, [p for g in groups for p in g["params"]], cfg.implementation, avoid_fused)
        )
    if info.needs_module:
        kwargs["module"] = module_or_params if isinstance(module_or_params, nn.Module) else None
    try:
        optimizer = info.factory(groups, lr=lr, **kwargs)
    except SpeedupConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise SpeedupConfigError(
            f"Optimizer {cfg.name!r} rejected its arguments {kwargs}: {err}. Allowed values: the keyword arguments "
            f"that {getattr(info.factory, '__name__', info.factory)!r} takes."
        ) from err
    return guard_fused_momentum(optimizer)  # fused SGD: params that start stepping later (unfrozen) get a buffer
