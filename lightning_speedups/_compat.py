"""The one seam to the frameworks' internals: every private Lightning, torch-pruning or torchao name lives here.

Each touch is a small named function whose docstring says what it relies on. ``tests/test_compat.py`` checks each
of them against the installed versions, so an upgrade that moves a private name fails there with a clear message
instead of deep inside a callback.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

__all__ = [
    "GraphBudgetExceeded",
    "GraphLoop",
    "after_batch_to_device",
    "averaged_model",
    "before_batch_transfer",
    "before_model_weights_load",
    "collect_rng_states",
    "ddp_wrap_again",
    "fit_source_dataloader",
    "fit_source_instance",
    "fit_source_is_module",
    "fit_train_dataloader",
    "init_optimizers_and_schedulers",
    "inner_schedulers",
    "is_spawn_launcher",
    "is_weight_norm",
    "keyed_strategy_patch",
    "lr_finder_suggestion",
    "metric_state",
    "no_gradient_sync",
    "refresh_scheduler_last_lr",
    "reload_train_dataloader",
    "replace_training_results",
    "restore_metric_state",
    "restore_rng_states",
    "restore_training_results",
    "retarget_scheduler",
    "set_fit_train_loader",
    "set_results_batch",
    "spawn_drop_returned_weights",
    "strategy_training_step",
    "tp_allow_every_group",
    "tp_group_loop_guard",
    "tp_index_budget",
    "tp_on_param_slice",
    "tp_scope_channels",
    "train_dataloader_built",
    "tuner_exit",
    "undo_lr_find_debias",
]

_Hooks = dict[str, Callable[..., Any]]


def keyed_strategy_patch(
    strategy: Any,
    method: str,
    key: str,
    fn: Callable[..., Any] | None,
    wrap: Callable[[Callable[..., Any], _Hooks], Callable[..., Any]],
) -> None:
    """Keep ``fn`` under ``key`` among the hooks of ``strategy.<method>``, which ``wrap(original, hooks)`` runs.

    The one monkey-patch of a running strategy: the first hook replaces the method on the strategy *instance* with
    ``wrap(original, hooks)``, which runs the hooks it finds in ``hooks`` (in registration order) at every call.
    Hooks are keyed, so a callback that registers twice replaces its hook. ``fn=None`` removes the hook under
    ``key``; with none left the patch removes itself and the strategy's own method is back.

    Relies on: nothing private; the public methods it wraps are named by the functions below that call it.
    """
    attr = f"_lightning_speedups_{method}_hooks"
    hooks: _Hooks | None = strategy.__dict__.get(attr)
    if fn is None:
        if hooks is not None:
            hooks.pop(key, None)
            if not hooks:
                del strategy.__dict__[attr]
                strategy.__dict__.pop(method, None)
        return
    if hooks is None:
        hooks = {}
        strategy.__dict__[attr] = hooks
        strategy.__dict__[method] = wrap(getattr(strategy, method), hooks)
    hooks[key] = fn


def before_model_weights_load(strategy: Any, key: str, fn: Callable[[Mapping[str, Any]], None] | None) -> None:
    """Call ``fn(checkpoint)`` right before ``strategy`` loads a checkpoint's weights into the LightningModule.

    Relies on: Lightning's checkpoint connector restoring the weights through the *public*
    ``Strategy.load_model_state_dict(checkpoint, strict)`` (2.0 - 2.6). Wrapping that method on the strategy
    instance runs the hook whatever the order of ``setup`` / ``configure_model`` / ``trainer.ckpt_path``, which
    changed between Lightning releases. Keyed by :func:`keyed_strategy_patch`: ``fn=None`` removes the hook.
    """

    def wrap(original: Callable[..., Any], hooks: _Hooks) -> Callable[..., Any]:
        def load_model_state_dict(checkpoint: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
            for hook in list(hooks.values()):
                hook(checkpoint)
            return original(checkpoint, *args, **kwargs)

        return load_model_state_dict

    keyed_strategy_patch(strategy, "load_model_state_dict", key, fn, wrap)


def after_batch_to_device(strategy: Any, key: str, fn: Callable[[Any, int], Any] | None) -> None:
    """Pass every batch through ``fn(batch, dataloader_idx) -> batch`` after ``strategy.batch_to_device``.

    Relies on: Lightning's loops moving each batch with the public ``Strategy.batch_to_device(batch, device=None,
    dataloader_idx=0)`` (through ``call._call_strategy_hook(trainer, "batch_to_device", ...)``, 2.0 - 2.6) and
    handing its return value to ``training_step`` and to every batch hook. Wrapping it on the running strategy
    lets a callback replace the batch, which its own ``on_*_batch_start`` hooks cannot do, whatever the loader yields
    and whether or not a datamodule is attached. Loops whose ``training_step`` takes a ``dataloader_iter`` do not
    move batches, so the hook does not run there. Keyed by :func:`keyed_strategy_patch`: ``fn=None`` removes the
    hook, and with none left the strategy's own method is back.
    """

    def wrap(original: Callable[..., Any], hooks: _Hooks) -> Callable[..., Any]:
        def batch_to_device(batch: Any, device: Any = None, dataloader_idx: int = 0) -> Any:
            batch = original(batch, device, dataloader_idx)
            for hook in list(hooks.values()):
                batch = hook(batch, dataloader_idx)
            return batch

        return batch_to_device

    keyed_strategy_patch(strategy, "batch_to_device", key, fn, wrap)


def fit_train_dataloader(trainer: Any) -> Any:
    """The training dataloader(s) of the running ``fit``, available from ``setup()`` on, or ``None``.

    Relies on: ``trainer.fit_loop._data_source`` (a ``_DataLoaderSource``, 2.0 - 2.6) with ``is_defined()`` and
    ``dataloader()``; the latter calls ``train_dataloader()`` of the datamodule or module, or returns the loaders
    passed to ``fit``. ``trainer.train_dataloader`` itself is set only once the fit loop starts, after ``setup``.
    """
    source = getattr(trainer.fit_loop, "_data_source", None)
    if source is None or not source.is_defined():
        return None
    return source.dataloader()


def spawn_drop_returned_weights(trainer: Any) -> bool:
    """Under a spawn launcher, stop rank 0 from handing its weights back to the main process; True if done.

    Relies on: ``lightning.pytorch.strategies.launchers.multiprocessing._MultiProcessingLauncher`` and its
    ``_collect_rank_zero_results(trainer, results) -> _WorkerOutput | None`` whose ``weights_path`` the main process
    loads non-strictly (2.0 - 2.6). A structurally pruned model cannot be loaded into the main process's unpruned
    model (shapes differ even non-strictly), so the weights file is removed and the path cleared.
    """
    from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher

    launcher = getattr(trainer.strategy, "launcher", None)
    if not isinstance(launcher, _MultiProcessingLauncher):
        return False
    collect = launcher._collect_rank_zero_results

    def without_weights(trainer: Any, results: Any) -> Any:
        out = collect(trainer, results)
        if out is not None and out.weights_path is not None:
            trainer.strategy.checkpoint_io.remove_checkpoint(out.weights_path)
            out = out._replace(weights_path=None)
        return out

    launcher._collect_rank_zero_results = without_weights
    return True


def is_spawn_launcher(trainer: Any) -> bool:
    """True when the strategy's launcher spawns worker processes (``ddp_spawn``, ``ddp_notebook``...).

    Relies on: ``_MultiProcessingLauncher`` (2.0 - 2.6), the launcher class of every spawn/fork strategy."""
    from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher

    return isinstance(getattr(trainer.strategy, "launcher", None), _MultiProcessingLauncher)


def ddp_wrap_again(strategy: Any, module: Any) -> None:
    """Wrap ``module`` in a new ``DistributedDataParallel`` exactly as the DDP strategy does at the start of a fit.

    Relies on: ``DDPStrategy._setup_model(module) -> DistributedDataParallel`` and ``DDPStrategy._register_ddp_hooks()``
    (2.0 - 2.6), the two steps of ``DDPStrategy.configure_ddp``, which also re-runs model setup we must not repeat.
    """
    strategy.model = strategy._setup_model(module)
    strategy._register_ddp_hooks()


def init_optimizers_and_schedulers(pl_module: Any) -> tuple[list[Any], list[Any]]:
    """Run the module's ``configure_optimizers`` and parse it the way the strategy does at the start of a fit.

    Relies on: ``lightning.pytorch.core.optimizer._init_optimizers_and_lr_schedulers(model) -> (optimizers,
    lr_scheduler_configs)`` (2.0 - 2.6), which accepts every return form ``configure_optimizers`` may use.
    """
    from lightning.pytorch.core.optimizer import _init_optimizers_and_lr_schedulers

    return _init_optimizers_and_lr_schedulers(pl_module)


def averaged_model(callback: Any) -> Any:
    """The ``AveragedModel`` a Lightning ``WeightAveraging`` callback keeps (``None`` outside fit).

    Relies on: ``lightning.pytorch.callbacks.WeightAveraging._average_model`` (2.5 - 2.6), set in ``setup`` for the
    fit stage and read by its own ``on_load_checkpoint``.
    """
    return callback._average_model


# --- torch-pruning ---------------------------------------------------------------------------------------------


class GraphBudgetExceeded(RuntimeError):
    """torch-pruning's dependency analysis grew past the index budget (see :func:`tp_index_budget`)."""


@contextlib.contextmanager
def tp_index_budget(limit: int) -> Iterator[dict[str, int]]:
    """Raise :class:`GraphBudgetExceeded` once torch-pruning creates more than ``limit`` channel-index records.

    Relies on: ``torch_pruning._helpers._HybridIndex`` (1.4 - 1.6), the namedtuple that the dependency graph
    creates for every (channel, root channel) pair it propagates through a group. Its count is what grows without
    bound on models such as Swin (window reshapes multiply the index lists), so it bounds the memory of the analysis
    (about 64 bytes each) before the machine runs out. The counter is yielded as ``{"count": n}``.
    """
    helpers = importlib.import_module("torch_pruning._helpers")
    original = helpers._HybridIndex
    counter = {"count": 0}

    class _Counted(original):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            counter["count"] += 1
            if counter["count"] > limit:
                raise GraphBudgetExceeded(f"more than {limit:,} channel-index records")
            return original.__new__(cls, *args, **kwargs)

    helpers._HybridIndex = _Counted
    try:
        yield counter
    finally:
        helpers._HybridIndex = original


class GraphLoop(RuntimeError):
    """torch-pruning's dependency propagation went round a loop (see :func:`tp_group_loop_guard`)."""


@contextlib.contextmanager
def tp_group_loop_guard(max_repeats: int = 256) -> Iterator[None]:
    """Raise :class:`GraphLoop` once one group adds the same (layer, pruning op) ``max_repeats`` times.

    Relies on: ``torch_pruning.dependency.group.Group.add_dep(dep, idxs)`` (1.4 - 1.6), which the dependency graph
    calls for every op it propagates into a group. On models whose index mappings never settle (rotary position
    embeddings that split and re-concatenate halves, as in Llama) the propagation re-adds the same ops with new
    indices forever, while creating no new index records; counting repeats per op ends it. A legitimate group adds
    one op once per path into it (a DenseNet block's concatenation: one per layer), far below the bound.
    """
    group_module = importlib.import_module("torch_pruning.dependency.group")
    original = group_module.Group.add_dep

    def add_dep(self: Any, dep: Any, idxs: Any) -> Any:
        counts = self.__dict__.setdefault("_ls_repeats", {})
        key = (id(dep.target), dep.handler)
        counts[key] = counts.get(key, 0) + 1
        if counts[key] > max_repeats:
            raise GraphLoop(
                f"a dependency loop: one group reached {dep.target} with {getattr(dep.handler, '__name__', 'an op')} "
                f"more than {max_repeats} times"
            )
        return original(self, dep, idxs)

    group_module.Group.add_dep = add_dep
    try:
        yield
    finally:
        group_module.Group.add_dep = original


@contextlib.contextmanager
def tp_on_param_slice(callback: Callable[[Any, Any, Sequence[int], int], None]) -> Iterator[None]:
    """Call ``callback(old_param, new_param, keep_idxs, dim)`` for every parameter torch-pruning slices.

    Relies on: ``torch_pruning.pruner.function.BasePruningFunc._prune_parameter_and_grad(weight, keep_idxs,
    pruning_dim) -> new Parameter`` (1.4 - 1.6), the one place every pruning function slices a parameter.
    """
    base = importlib.import_module("torch_pruning.pruner.function").BasePruningFunc
    original = base._prune_parameter_and_grad

    def patched(self: Any, weight: Any, keep_idxs: Sequence[int], pruning_dim: int) -> Any:
        new = original(self, weight, keep_idxs, pruning_dim)
        callback(weight, new, keep_idxs, pruning_dim)
        return new

    base._prune_parameter_and_grad = patched
    try:
        yield
    finally:
        base._prune_parameter_and_grad = original


@contextlib.contextmanager
def tp_allow_every_group(dg: Any) -> Iterator[None]:
    """Let a pruner's ``step(interactive=True)`` yield every group, one that would empty a layer included.

    Relies on: ``torch_pruning.DependencyGraph.check_pruning_group(group) -> bool`` (1.4 - 1.6), which the pruner
    asks before it yields a group and which is False for a group that would remove every channel of a layer: the
    pruner skips that group silently. Answering True on the graph *instance* lets the caller see the group and
    refuse it by name; the instance's own method is back afterwards.
    """
    dg.check_pruning_group = lambda group: True
    try:
        yield
    finally:
        del dg.check_pruning_group


def tp_scope_channels(pruner: Any) -> dict[str, int]:
    """The pruner's per-scope initial channel counts, which its targets ``initial * (1 - ratio)`` refer to.

    Relies on: ``torch_pruning.pruner.BasePruner._scope_initial_channels`` (1.5 - 1.6), a dict keyed by root layer
    name (per-layer pruning) or ``"DEFAULT_SCOPE"`` (global pruning), filled in the pruner's constructor. Writing it
    makes a gradual schedule's targets relative to the dense model instead of compounding per step.
    """
    scopes = getattr(pruner, "_scope_initial_channels", None)
    if not isinstance(scopes, dict):
        raise RuntimeError(
            "torch_pruning.BasePruner has no `_scope_initial_channels` dict: this torch-pruning version is not "
            "supported by gradual structured pruning. HINT: pip install 'torch-pruning>=1.5,<1.7'."
        )
    return scopes


# --- batch size finder / LR finder ---------------------------------------------------------------------------------
# Used by callbacks/batch_size/, functional/batch_size/ and optim/lr_curve.py.
# Each is checked by tests/test_compat.py against the installed versions. The version in each docstring is the one
# it was checked on (Lightning 2.6.6); the older releases pyproject.toml allows were not at hand to try.


def fit_source_instance(trainer: Any) -> Any:
    """What ``fit`` was given for training data: the datamodule / module, or the loader(s) passed to ``fit``.

    Relies on: ``trainer.fit_loop._data_source`` (a ``_DataLoaderSource``, 2.6) and its ``instance`` attribute."""
    return trainer.fit_loop._data_source.instance


def fit_source_is_module(trainer: Any) -> bool:
    """True when the training data comes from a ``train_dataloader()`` hook (datamodule or module), not from loaders.

    Relies on: ``trainer.fit_loop._data_source.is_module()`` (2.6)."""
    return bool(trainer.fit_loop._data_source.is_module())


def set_fit_train_loader(trainer: Any, loader: Any) -> None:
    """Make ``loader`` the training data of the running ``fit`` (in place of the loader passed to ``fit``).

    Relies on: ``trainer.fit_loop._data_source.instance`` being read again by ``dataloader()`` and by
    ``fit_loop.setup_data()`` (2.6).
    """
    trainer.fit_loop._data_source.instance = loader


def fit_source_dataloader(trainer: Any) -> Any:
    """Build the training dataloader now, as the fit loop would (calls ``train_dataloader()`` when it is a hook).

    Relies on: ``trainer.fit_loop._data_source.dataloader()`` (2.6)."""
    return trainer.fit_loop._data_source.dataloader()


def reload_train_dataloader(trainer: Any) -> None:
    """Rebuild the current epoch's training dataloader (after its batch size changed at the start of an epoch).

    Relies on: ``fit_loop._data_fetcher`` (``teardown()``), ``fit_loop._combined_loader`` (reset to ``None`` so
    ``fit_loop.setup_data()`` builds it again, then ``.flattened``) and
    ``lightning.fabric.utilities.data._set_sampler_epoch(dataloader, epoch)`` (2.6), which the fit loop calls
    at every epoch start so a ``DistributedSampler`` shuffles per epoch.
    """
    from lightning.fabric.utilities.data import _set_sampler_epoch

    loop = trainer.fit_loop
    if loop._data_fetcher is not None:
        loop._data_fetcher.teardown()
    loop._combined_loader = None
    loop.setup_data()
    for dl in loop._combined_loader.flattened if loop._combined_loader is not None else []:
        _set_sampler_epoch(dl, loop.epoch_progress.current.processed)


def train_dataloader_built(trainer: Any) -> bool:
    """Whether the fit loop holds a built train loader already (e.g. an LR finder's trial loop in ``on_fit_start``).

    Relies on: ``fit_loop._combined_loader`` (2.6), ``None`` until ``fit_loop.setup_data()`` builds it."""
    return getattr(trainer.fit_loop, "_combined_loader", None) is not None


def no_gradient_sync(strategy: Any) -> Any:
    """A context manager in which backward passes do not all-reduce gradients across ranks (DDP ``no_sync``).

    Relies on: ``lightning.pytorch.loops.utilities._block_parallel_sync_behavior(strategy, block=True)`` (2.6),
    what Lightning itself uses for gradient accumulation; a no-op for single-device strategies.
    """
    from lightning.pytorch.loops.utilities import _block_parallel_sync_behavior

    return _block_parallel_sync_behavior(strategy, block=True)


def replace_training_results(trainer: Any) -> Any:
    """Send ``self.log`` calls of training steps to a fresh, throw-away collection; return the one in use.

    Relies on: ``trainer.fit_loop.epoch_loop._results``, a ``_ResultCollection(training=True)`` from
    ``lightning.pytorch.trainer.connectors.logger_connector.result`` (2.6). Put it back with
    :func:`restore_training_results`.
    """
    from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultCollection

    loop = trainer.fit_loop.epoch_loop
    previous = loop._results
    loop._results = _ResultCollection(training=True)
    return previous


def restore_training_results(trainer: Any, previous: Any) -> None:
    """Put back the collection :func:`replace_training_results` returned.

    Relies on: ``trainer.fit_loop.epoch_loop._results`` (2.6)."""
    trainer.fit_loop.epoch_loop._results = previous


def set_results_batch(trainer: Any, batch: Any) -> None:
    """Tell the training results which batch is running (``self.log`` infers ``batch_size`` from it).

    Relies on: ``trainer.fit_loop.epoch_loop._results.batch`` (2.6), set by the training loop before each step."""
    trainer.fit_loop.epoch_loop._results.batch = batch


def before_batch_transfer(pl_module: Any, batch: Any, dataloader_idx: int = 0) -> Any:
    """Run the ``on_before_batch_transfer`` hooks (datamodule, then module) on ``batch``, as the fit loop does.

    Relies on: ``LightningModule._on_before_batch_transfer(batch, dataloader_idx)`` (2.6)."""
    return pl_module._on_before_batch_transfer(batch, dataloader_idx=dataloader_idx)


def strategy_training_step(trainer: Any, batch: Any, batch_idx: int) -> Any:
    """Call ``training_step`` through the strategy (DDP wrapper, precision context), as the fit loop does.

    Relies on: ``lightning.pytorch.trainer.call._call_strategy_hook(trainer, "training_step", *args)`` (2.6)."""
    from lightning.pytorch.trainer import call

    return call._call_strategy_hook(trainer, "training_step", batch, batch_idx)


def tuner_exit() -> BaseException:
    """The exception that ends ``trainer.fit`` quietly after a tuning search (raise it from a hook).

    Relies on: ``lightning.pytorch.utilities.exceptions._TunerExitException`` (2.6), which the trainer catches
    and turns into a normal teardown, as Lightning's own ``BatchSizeFinder`` and ``LearningRateFinder`` do.
    """
    from lightning.pytorch.utilities.exceptions import _TunerExitException

    return _TunerExitException()


def collect_rng_states(include_cuda: bool) -> dict[str, Any]:
    """The state of every random generator Lightning seeds (torch, CUDA, numpy, python).

    Relies on: ``lightning.fabric.utilities.seed._collect_rng_states(include_cuda)`` (2.6); undo with
    :func:`restore_rng_states`.
    """
    from lightning.fabric.utilities.seed import _collect_rng_states

    return _collect_rng_states(include_cuda=include_cuda)


def restore_rng_states(states: dict[str, Any]) -> None:
    """Put back states from :func:`collect_rng_states`.

    Relies on: ``lightning.fabric.utilities.seed._set_rng_states(rng_state_dict)`` (2.6).
    """
    from lightning.fabric.utilities.seed import _set_rng_states

    _set_rng_states(states)


def metric_state(metric: Any) -> tuple[dict[str, Any], Any, Any]:
    """A torchmetrics ``Metric``'s accumulated state: ``({state name: value}, update count, cached compute)``.

    Relies on: torchmetrics ``Metric._defaults`` (the names given to ``add_state``), ``_update_count`` and
    ``_computed`` (torchmetrics 1.9). The values are the live objects: copy them before changing the metric.
    """
    names = list(getattr(metric, "_defaults", {}))
    return (
        {name: getattr(metric, name) for name in names},
        getattr(metric, "_update_count", None),
        getattr(metric, "_computed", None),
    )


def restore_metric_state(metric: Any, states: dict[str, Any], update_count: Any, computed: Any) -> None:
    """Put back what :func:`metric_state` returned (values already on the right device).

    Relies on: torchmetrics ``Metric._update_count`` and ``_computed`` (torchmetrics 1.9); states are plain attributes.
    """
    for name, value in states.items():
        setattr(metric, name, value)
    if update_count is not None:
        metric._update_count = update_count
    metric._computed = computed


def refresh_scheduler_last_lr(scheduler: Any) -> None:
    """Make ``scheduler.get_last_lr()`` report the optimizer's current learning rates (after rescaling them).

    Relies on: torch ``LRScheduler._last_lr`` (torch 2.14), the list ``get_last_lr()`` returns; schedulers without it
    (``ReduceLROnPlateau`` before torch 2.2) are left alone.
    """
    if hasattr(scheduler, "_last_lr"):
        scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]


def lr_finder_suggestion(xs: list[float], losses: list[float], skip_begin: int, skip_end: int) -> float | None:
    """Lightning's steepest-descent LR suggestion on a curve ``(xs, losses)``: the ``xs`` point, or ``None``.

    Relies on: ``lightning.pytorch.tuner.lr_finder._LRFinder(mode, lr_min, lr_max, num_training)``, its ``results``
    dict (``"lr"``, ``"loss"``) and ``suggestion(skip_begin, skip_end)`` (2.6), which returns the ``"lr"`` entry
    at the most negative gradient of the loss. ``xs`` need not be learning rates (log(lr) works, as fastai does).
    """
    from lightning.pytorch.tuner.lr_finder import _LRFinder

    finder = _LRFinder("exponential", xs[0], xs[-1], len(xs))
    finder.results = {"lr": list(xs), "loss": list(losses)}
    return finder.suggestion(skip_begin=skip_begin, skip_end=skip_end)


def undo_lr_find_debias(losses: list[float], beta: float = 0.98) -> list[float]:
    """Undo an off-by-one in the smoothed losses of Lightning's LR range test.

    Relies on: ``lightning.pytorch.tuner.lr_finder._LRCallback.on_train_batch_end`` (2.6), which divides the
    running average by ``1 - beta ** (global_step + 1)`` after the optimizer step has already incremented
    ``global_step``, so point ``k`` is scaled by ``(1 - b**(k+1)) / (1 - b**(k+2))``: the first point reads half the
    true loss, which fools the ``minimum`` rule. Valid for a test that starts at step 0 (as ``suggest_lr`` and the
    ``LRFinder`` callback ensure); the factor tends to 1 after ~50 points. ``tests/test_compat.py`` checks that
    Lightning still smooths this way.
    """
    return [x * (1 - beta ** (k + 2)) / (1 - beta ** (k + 1)) for k, x in enumerate(losses)]


def is_weight_norm(parametrization: Any) -> bool:
    """True for the parametrization that ``torch.nn.utils.parametrizations.weight_norm`` registers.

    Relies on: ``torch.nn.utils.parametrizations._WeightNorm`` (torch 2.1 - 2.14), whose ``forward(weight_g,
    weight_v)`` computes ``torch._weight_norm(weight_v, weight_g, dim)``; its ``right_inverse`` stores ``g`` and ``v``
    as ``original0`` and ``original1``. Masks fold into that pair when cleaned or made permanent.
    """
    from torch.nn.utils.parametrizations import _WeightNorm

    return isinstance(parametrization, _WeightNorm)


# the per-param-group lists torch's LR schedulers keep (LRScheduler, LambdaLR, ReduceLROnPlateau)
_PER_GROUP_SCHEDULER_LISTS = ("base_lrs", "_last_lr", "lr_lambdas", "min_lrs")


def retarget_scheduler(scheduler: Any, optimizer: Any, sources: Sequence[int]) -> None:
    """Make ``scheduler`` drive ``optimizer``, whose param group ``i`` was made from group ``sources[i]`` of the
    optimizer the scheduler was built for (a group split in two repeats its index).

    Relies on: torch's schedulers (2.14) keeping the optimizer in ``.optimizer`` and one entry per param group in
    ``base_lrs``, ``_last_lr``, ``lr_lambdas`` (``LambdaLR``, ``MultiplicativeLR``) and ``min_lrs``
    (``ReduceLROnPlateau``); ``SequentialLR`` / ``ChainedScheduler`` holding theirs in ``_schedulers``; and
    ``LRScheduler.__init__`` wrapping ``optimizer.step`` to check the call order (marked ``_wrapped_by_lr_sched``),
    which a throwaway ``LambdaLR`` installs on the new optimizer (its learning rates are put back). Per-group values
    kept in the param groups themselves (``initial_lr``, OneCycle's ``max_lr`` / ``min_lr``) travel with the groups.
    """
    for inner in inner_schedulers(scheduler):
        retarget_scheduler(inner, optimizer, sources)
    old_count = len(scheduler.optimizer.param_groups)
    for name in _PER_GROUP_SCHEDULER_LISTS:
        values = getattr(scheduler, name, None)
        if isinstance(values, list) and len(values) == old_count:
            setattr(scheduler, name, [values[i] for i in sources])
    scheduler.optimizer = optimizer
    if not hasattr(optimizer.step, "_wrapped_by_lr_sched"):
        saved = [(group["lr"], group.get("initial_lr")) for group in optimizer.param_groups]
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        for group, (lr, initial) in zip(optimizer.param_groups, saved):
            group["lr"] = lr
            if initial is None:
                group.pop("initial_lr", None)
            else:
                group["initial_lr"] = initial


def inner_schedulers(scheduler: Any) -> list[Any]:
    """The schedulers a ``SequentialLR`` or ``ChainedScheduler`` runs (empty for any other scheduler).

    Relies on: torch's ``SequentialLR`` and ``ChainedScheduler`` (2.14) keeping them in the list ``_schedulers``; each
    computes its learning rates from its own ``base_lrs``, so a rescaled lr must reach them too.
    """
    inner = getattr(scheduler, "_schedulers", None)
    return list(inner) if isinstance(inner, (list, tuple)) else []
