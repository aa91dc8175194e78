"""FineTuneFreezing: train the head of a pretrained network first, then unfreeze its backbone all at once or gradually.

How it keeps optimizers, schedulers, checkpoints and DDP consistent (the places where Lightning's
``BackboneFinetuning`` breaks):

- **Every parameter group exists from the first step.** Frozen parameters sit in the optimizer from the start
  (``requires_grad=False``: no gradient, so the optimizer skips them); unfreezing only flips ``requires_grad``. No group
  is added mid-run, so OneCycle, cosine and ReduceLROnPlateau keep their state, and a checkpoint's optimizer state
  always matches the optimizer a fresh run builds. Discriminative learning rates (``lr_decay``) need one group per
  layer group: for :class:`~lightning_speedups.optim.SpeedupMixin` models the callback sets
  ``optimizer_config.lr_multipliers`` in ``setup()`` so ``configure_optimizers`` builds them natively; for any other
  LightningModule it splits the optimizer's groups in ``on_fit_start`` (before a checkpoint's optimizer state is
  loaded) and scales the schedulers' per-group lrs (``base_lrs``, OneCycle's ``max_lr``...) to match.
- **Resume.** The frozen set is a function of the epoch; it is also saved with the callback state and re-applied in
  ``load_state_dict``, which Lightning calls before it wraps the model in DDP and builds the optimizer.
- **DDP.** DDP only synchronises parameters that required a gradient when it was built, so frozen parameters cause no
  "unused parameters" error. When a phase unfreezes parameters the callback re-wraps the model in a fresh DDP (all
  ranks at once, at the start of the epoch) so the new parameters are synchronised too.
- **Fused SGD.** An unfrozen parameter joins a param group whose other parameters already have momentum buffers;
  torch's fused SGD kernel cannot step such a group, so the callback guards every optimizer with
  :func:`~lightning_speedups.optim._fused_momentum.guard_fused_momentum` (``create_optimizer`` already does).
- **BatchNorm.** With ``train_bn=False`` frozen norm layers are held in eval mode (re-applied before every training
  batch, since ``model.train()`` resets it) so their running statistics keep the pretrained values. Norm layers whose
  statistics are still those of a freshly built layer at fit start (mean 0, variance 1: a backbone that was never
  trained) have no values to keep; in eval mode they would not normalise at all and a deep backbone overflows (NaN
  weights), so they keep computing their statistics (their weights stay frozen), with a warning. The decision is
  saved with the callback state, so a resumed run makes the same one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn
from typing_extensions import override

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._rebuild import rewrap_ddp
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups.callbacks._finetune_plan import BackboneSpec, FineTuneConfig, _Group, _plan, plan_text
from lightning_speedups.functional._layer_groups import _under
from lightning_speedups.functional.finetuning import _has_initial_stats, freeze
from lightning_speedups.optim._fused_momentum import guard_fused_momentum

__all__ = ["FineTuneConfig", "FineTuneFreezing"]

# lr-valued entries that scale with a group's multiplier when a group is split (param-group keys / scheduler lists)
_LR_GROUP_KEYS = ("lr", "initial_lr", "max_lr", "min_lr")
_SCHED_LISTS = {
    "base_lrs": True,
    "_last_lr": True,
    "max_lrs": True,
    "min_lrs": False,
    "lr_lambdas": False,
    "base_momentums": False,
    "max_momentums": False,
}


def _expand_scheduler(sched: Any, sources: list[tuple[int, float]]) -> None:
    """Give a scheduler one entry per new param group (``sources[i]`` = (old group index, lr factor))."""
    for child in getattr(sched, "_schedulers", []) or []:
        _expand_scheduler(child, sources)
    for attr, scales in _SCHED_LISTS.items():
        values = getattr(sched, attr, None)
        if isinstance(values, list) and values and len(values) == 1 + max(i for i, _ in sources):
            setattr(sched, attr, [values[i] * f if scales else values[i] for i, f in sources])


def _with_multipliers(cfg: Any, lm: dict[str, float]) -> Any:
    """The optimizer config ``cfg`` (``None``, a mapping or a config dataclass) with ``lr_multipliers`` = ``lm``."""
    if cfg is None:
        return {"lr_multipliers": lm}
    if isinstance(cfg, Mapping):
        return {**cfg, "lr_multipliers": lm}
    return dataclasses.replace(cfg, lr_multipliers=lm)


class FineTuneFreezing(Callback):
    """Freeze a pretrained backbone, train the head, then unfreeze the backbone all at once or group by group.

    Args:
        backbone: what to freeze. ``None`` (default) finds the head, plus a ``pooler`` such as BERT's, and freezes
            everything else. The head is the shallowest submodule named one of
            :data:`~lightning_speedups._heads.HEAD_NAMES` (``lm_head``, ``fc``, ``classifier``, ``heads``, ``head``,
            ``score``, ...), else the linear layer tied to an input embedding, else the last linear layer that gives
            the output's width (one forward on two samples of the first batch); none is refused, naming the names
            tried. A head tied to the token embedding trains that shared tensor from the first epoch
            (:meth:`plan_text` says so). Or an attribute name (``"backbone"``), a list of module names, or a callable
            ``model -> module | names``. Parameters outside the backbone are left alone. The layer groups follow the
            backbone's blocks (a ResNet's stages, a ViT's encoder layers, BERT's ``encoder.layer[i]``; see
            :func:`~lightning_speedups.functional.finetuning.layer_groups`).
        unfreeze_at_epoch: first epoch that trains backbone layers (0 = from the start); ``None`` = never (head only).
        unfreeze_every: ``None`` unfreezes the whole backbone at ``unfreeze_at_epoch``; ``k`` unfreezes one layer
            group (see :func:`~lightning_speedups.functional.finetuning.layer_groups`) every ``k`` epochs, top first.
        schedule: explicit ``{epoch: [module names]}`` in increasing epochs, top modules first; backbone modules it
            does not list stay frozen. Replaces ``unfreeze_at_epoch`` / ``unfreeze_every``.
        lr_decay: discriminative learning rates: the head trains at the optimizer's lr, the top backbone group at
            ``lr * lr_decay``, the next at ``lr * lr_decay**2``, ... In (0, 1]; 1 means one lr for all.
        train_bn: keep BatchNorm layers of frozen groups trainable (parameters and statistics). ``False`` (default)
            freezes them and holds them in eval mode.
        verbose: log the trainable groups and parameter count when a phase starts.

    Raises:
        SpeedupConfigError: bad arguments (here), or in ``setup``: unknown module names (with close matches), a
            backbone that contains the head, nothing left to train; in ``on_fit_start``: an optimizer that lacks
            parameters the schedule will unfreeze.

    Example::

        >>> from lightning_speedups.demo import DemoClassifier
        >>> cb = FineTuneFreezing(unfreeze_at_epoch=2, unfreeze_every=1, lr_decay=0.5)
        >>> trainer = L.Trainer(max_epochs=4, callbacks=[cb], logger=False)
    """

    def __init__(
        self,
        backbone: BackboneSpec = None,
        unfreeze_at_epoch: int | None = 1,
        unfreeze_every: int | None = None,
        schedule: Mapping[int, Sequence[str] | str] | None = None,
        lr_decay: float = 1.0,
        train_bn: bool = False,
        verbose: bool = True,
    ) -> None:
        self.config = FineTuneConfig(
            backbone=backbone,
            unfreeze_at_epoch=unfreeze_at_epoch,
            unfreeze_every=unfreeze_every,
            schedule=dict(schedule) if isinstance(schedule, Mapping) else schedule,  # type: ignore[arg-type]
            lr_decay=lr_decay,
            train_bn=train_bn,
        )
        self.verbose = verbose
        self.groups: list[_Group] = []
        self.notes: list[str] = []  # how the head was found, what happens to a tensor it shares with the backbone
        self.unfrozen: list[str] = []  # names of the unfrozen groups
        self._trainable: list[str] = []
        self._module: L.LightningModule | None = None
        self._frozen_norms: list[str] = []  # names: sync_batchnorm swaps the modules after setup()
        self._fresh_norms: list[str] | None = None  # frozen norms with no statistics to keep (decided at fit start)
        self._written_prefixes: set[str] = set()
        self._saved_opt_cfg: tuple[Any, ...] | None = None
        self._announced = False

    # ----- planning and applying ---------------------------------------------------------------------------------
    def target(self, epoch: int) -> list[str]:
        """Names of the groups that train at ``epoch``."""
        return [g.name for g in self.groups if g.epoch is not None and g.epoch <= epoch]

    def _apply(self, module: nn.Module, unfrozen: Sequence[str]) -> None:
        params = dict(module.named_parameters())
        modules = dict(module.named_modules())
        train_bn = self.config.train_bn
        norm_params = {f"{n}.{p}" for g in self.groups for n in g.norms for p, _ in modules[n].named_parameters()}
        self._frozen_norms = []
        for g in self.groups:
            on = g.name in unfrozen
            for name in g.params:
                params[name].requires_grad_(on or (train_bn and name in norm_params))
            for n in g.norms:
                if on or train_bn:
                    modules[n].train(module.training)
                else:  # put in eval mode before each training batch (on_train_batch_start): stats stay untouched
                    self._frozen_norms.append(n)
        self.unfrozen = [g.name for g in self.groups if g.name in unfrozen]

    def plan_text(self) -> str:
        """The plan (set in ``setup``): how the head was found, a tensor it shares with the backbone, and when each
        layer group unfreezes."""
        return plan_text(self.groups, self.notes)

    def trainable_params(self, module: nn.Module) -> int:
        """Number of trainable parameter elements of ``module`` right now."""
        return sum(p.numel() for p in module.parameters() if p.requires_grad)

    # ----- Lightning hooks ---------------------------------------------------------------------------------------
    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._module = pl_module
        self.groups, self._trainable, self.notes = _plan(pl_module, self.config, trainer)
        if self.verbose or len(self.notes) > 1:  # a tensor shared by the head and the backbone is always said
            rank_zero_info(self.plan_text())
        self._apply(pl_module, self.target(0))  # a resumed run re-applies its saved set in load_state_dict
        if self.trainable_params(pl_module) == 0 and not self.target(0):
            raise SpeedupConfigError(
                f"Nothing to train: with `backbone`={self.config.backbone!r} every parameter is frozen at epoch 0. "
                "Allowed values: a backbone that leaves some parameter trainable, or `unfreeze_at_epoch`=0. HINT: "
                "leave the head (and any new layers) outside the backbone."
            )
        last = [g.epoch for g in self.groups if g.epoch is not None]
        if last and trainer.max_epochs not in (None, -1) and max(last) >= trainer.max_epochs:
            rank_zero_warn(
                f"FineTuneFreezing: some groups unfreeze at epoch {max(last)}, after the run ends "
                f"(`max_epochs`={trainer.max_epochs})."
            )
        self._set_mixin_multipliers(pl_module)

    def _set_mixin_multipliers(self, pl_module: L.LightningModule) -> None:
        """For SpeedupMixin models: one optimizer group per layer group, built by ``configure_optimizers`` itself."""
        self._written_prefixes = set()
        if self.config.lr_decay == 1.0 or not hasattr(pl_module, "optimizer_config"):
            return
        from lightning_speedups.optim.mixin import SpeedupMixin

        if not isinstance(pl_module, SpeedupMixin):
            return
        cfg: Any = pl_module.optimizer_config
        user: dict[str, float]
        if cfg is None:
            user = {}
        elif isinstance(cfg, Mapping):
            user = dict(cfg.get("lr_multipliers") or {})
        elif dataclasses.is_dataclass(cfg) and hasattr(cfg, "lr_multipliers"):
            user = dict(cfg.lr_multipliers)
        else:
            return

        def user_mult(name: str) -> float:
            best = max((u for u in user if _under(name, u)), key=len, default=None)
            return float(user[best]) if best is not None else 1.0

        lm = dict(user)
        for g in self.groups:
            if g.epoch is None:
                continue
            for pre in g.prefixes:
                lm[pre] = user_mult(pre) * g.lr_mult
                self._written_prefixes.add(pre)
            for u in user:  # a user prefix inside a group keeps its own factor, times the group's
                if any(_under(u, pre) and u != pre for pre in g.prefixes):
                    lm[u] = float(user[u]) * g.lr_mult
                    self._written_prefixes.add(u)
        self._saved_opt_cfg = (pl_module, cfg)
        pl_module.optimizer_config = _with_multipliers(cfg, lm)

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._fresh_norms is None:  # after the module's own setup / configure_model (pretrained weights loaded)
            self._fresh_norms = self._find_fresh_norms(pl_module)
        by_name = {n: g for g in self.groups for n in g.params}
        group_of = {id(p): by_name[n] for n, p in pl_module.named_parameters() if n in by_name}
        in_opt = {id(p) for opt in trainer.optimizers for pg in opt.param_groups for p in pg["params"]}
        missing = [
            n
            for g in self.groups
            if g.epoch is not None
            for n in g.params
            if id(pl_module.get_parameter(n)) not in in_opt
        ]
        if missing:
            raise SpeedupConfigError(
                f"FineTuneFreezing: {len(missing)} backbone parameters that will be unfrozen (e.g. {missing[0]!r}) are "
                "in no optimizer param group. Allowed values: an optimizer over all of `self.parameters()`. HINT: "
                "build it from the frozen parameters too (they get no gradient while frozen), as SpeedupMixin does; do "
                "not filter on requires_grad."
            )
        for opt in trainer.optimizers:  # unfrozen params join groups that already stepped: fused SGD needs buffers
            guard_fused_momentum(opt)
        if self.config.lr_decay == 1.0:
            return
        for opt in trainer.optimizers:
            configs = trainer.lr_scheduler_configs
            scheds = [c.scheduler for c in configs if getattr(c.scheduler, "optimizer", None) is opt]
            self._split_groups(opt, group_of, scheds)

    def _find_fresh_norms(self, pl_module: L.LightningModule) -> list[str]:
        """Frozen norm layers whose statistics were never computed: they keep training their statistics."""
        if self.config.train_bn:
            return []
        names = [n for g in self.groups for n in g.norms if _has_initial_stats(pl_module.get_submodule(n))]
        if names:
            first = pl_module.get_submodule(names[0])
            rank_zero_warn(
                f"FineTuneFreezing: {len(names)} norm layers of the frozen backbone (e.g. `{names[0]}` "
                f"({type(first).__name__})) hold the running statistics of a freshly built layer (mean 0, variance "
                "1): the backbone looks untrained. In eval mode they would not normalise at all (a deep backbone "
                "overflows), so they keep computing their statistics; their weights stay frozen. HINT: load the "
                "pretrained weights before fit (e.g. `lightning_speedups.functional.load_pretrained`), or pass "
                "`train_bn=True`."
            )
        return names

    def _split_groups(self, opt: torch.optim.Optimizer, group_of: dict[int, _Group], scheds: list[Any]) -> None:
        """Split param groups that mix layer groups (or lack their lr factor) into one group per layer group."""
        new_groups: list[dict[str, Any]] = []
        sources: list[tuple[int, float]] = []
        changed = False
        for i, pg in enumerate(opt.param_groups):
            buckets: dict[str, list[torch.Tensor]] = {}
            owners: dict[str, _Group | None] = {}
            for p in pg["params"]:
                g = group_of.get(id(p))
                key = "" if g is None or g.epoch is None else g.name  # head / never-trained params: no factor
                buckets.setdefault(key, []).append(p)
                owners[key] = g if key else None
            native = str(pg.get("name", "")).split("/")[0] in self._written_prefixes and "lr_mult" in pg
            if len(buckets) == 1 and (native or "" in buckets):
                new_groups.append(pg)
                sources.append((i, 1.0))
                continue
            changed = True
            for key, ps in buckets.items():
                owner = owners[key]
                factor = owner.lr_mult if owner is not None else 1.0
                ng = {k: v for k, v in pg.items() if k != "params"}
                ng["params"] = ps
                for k in _LR_GROUP_KEYS:
                    if isinstance(ng.get(k), float | int) and not isinstance(ng.get(k), bool):
                        ng[k] = ng[k] * factor
                ng["lr_mult"] = float(pg.get("lr_mult", 1.0)) * factor
                ng["name"] = f"{pg.get('name', f'group{i}')}/{key}" if key else pg.get("name", f"group{i}")
                new_groups.append(ng)
                sources.append((i, factor))
        if changed:
            opt.param_groups = new_groups
            for s in scheds:
                _expand_scheduler(s, sources)

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        target = self.target(trainer.current_epoch)
        changed = target != self.unfrozen
        if changed:
            self._apply(pl_module, target)
            rewrap_ddp(trainer)
        self._hold_frozen_norms()
        n = self.trainable_params(pl_module)
        if self.verbose and (changed or not self._announced):
            total = sum(p.numel() for p in pl_module.parameters())
            parts = ["head"] + [f"{g.name} (lr x{g.lr_mult:g})" for g in self.groups if g.name in self.unfrozen]
            rank_zero_info(
                f"FineTuneFreezing epoch {trainer.current_epoch}: training {', '.join(parts)}; "
                f"{n:,} / {total:,} parameters trainable ({100.0 * n / max(total, 1):.1f}%)."
            )
        self._announced = True
        log_kw: dict[str, Any] = dict(on_step=False, on_epoch=True, batch_size=1, sync_dist=True)
        pl_module.log("finetune/trainable_params", float(n), **log_kw)
        pl_module.log("finetune/unfrozen_groups", float(len(self.unfrozen)), **log_kw)

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._hold_frozen_norms()

    def _hold_frozen_norms(self) -> None:
        if self._module is None:
            return
        fresh = set(self._fresh_norms or ())  # no statistics to keep: they stay in train mode and compute them
        for name in self._frozen_norms:  # model.train() (fit start, after validation) puts them back in train mode
            if name in fresh:
                continue
            m = self._module.get_submodule(name)
            if m.training:
                freeze(m)  # eval mode + no grad: the running statistics keep their pretrained values

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._saved_opt_cfg is not None:  # give the model its own optimizer config back
            module, cfg = self._saved_opt_cfg
            module.optimizer_config = cfg
            self._saved_opt_cfg = None
        self._fresh_norms = None  # a next fit decides again, from the statistics it starts with

    # ----- checkpointing -----------------------------------------------------------------------------------------
    @override
    def state_dict(self) -> dict[str, Any]:
        fresh = None if self._fresh_norms is None else list(self._fresh_norms)
        return {"unfrozen": list(self.unfrozen), "groups": [g.name for g in self.groups], "fresh_norms": fresh}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # called after setup() and before DDP wraps the model: re-freeze exactly what the checkpoint had frozen
        if state_dict.get("fresh_norms") is not None:  # the statistics are trained by now: keep the run's decision
            self._fresh_norms = list(state_dict["fresh_norms"])
        if self._module is None or not self.groups:
            return
        if list(state_dict.get("groups", [])) != [g.name for g in self.groups]:
            rank_zero_warn(
                "FineTuneFreezing: the checkpoint's layer groups differ from this run's; the frozen set follows the "
                "current configuration and epoch instead."
            )
            return
        self._apply(self._module, list(state_dict.get("unfrozen", [])))


register_technique(
    TechniqueInfo(
        name="finetune",
        callback=FineTuneFreezing,
        functional=freeze,
        summary="Freeze a pretrained backbone, train the head, then unfreeze gradually with discriminative LRs.",
        ways=(5,),
        bench="lightning_speedups.benchmarks.finetuning:run",
    )
)
