"""TorchCompile callback: torch.compile the LightningModule's network in place at ``setup``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.hooks import RemovableHandle
from typing_extensions import override

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups.functional.compile import (
    CompileConfig,
    CompileSummary,
    _CompiledCall,
    align_compiled_keys,
    compile_model,
    compiled_modules,
    strip_compile_prefix,
)

__all__ = ["TorchCompile"]


class TorchCompile(Callback):
    """Compile the model's network with ``torch.compile`` at ``setup``, keeping checkpoints plain.

    Which modules are compiled:

    * ``compile_attr`` given: those (dotted) submodules, e.g. ``"backbone"`` or ``["backbone", "head"]``;
    * else, if the LightningModule defines ``forward``: the LightningModule's own call (``self(x)``), compiled in
      place. ``training_step``, the loss, metrics and ``self.log`` stay eager: tracing them would only add graph
      breaks, and Lightning's step machinery (closures, hooks) cannot be compiled;
    * else: each direct child that holds parameters (metrics and losses are skipped).

    Compilation is in place (``nn.Module.compile`` semantics), so parameter names never gain the ``_orig_mod.``
    prefix of ``torch.compile(module)`` (Lightning #17415, #20233): checkpoints written while compiled load into an
    uncompiled model and vice versa. As a safety net, ``_orig_mod.`` segments from modules the user wrapped
    themselves are stripped from saved checkpoints, and keys are aligned when a checkpoint is loaded into the model.

    The first training step pays the compile (tens of seconds on CPU with ``inductor``), and so do the first
    validation step (eval mode, no grad: another graph) and new input shapes. A model summary that runs
    ``example_input_array`` also triggers a compile.

    Args:
        mode: one of ``"default"``, ``"reduce-overhead"``, ``"max-autotune"``, ``"max-autotune-no-cudagraphs"``.
        dynamic: see :class:`~lightning_speedups.functional.compile.CompileConfig`.
        fullgraph: raise on graph breaks.
        backend: ``"inductor"`` (default), ``"eager"`` (trace only, to debug), or another dynamo backend.
        compile_attr: submodule name(s) to compile instead of the default choice above.
        fallback: on a compile error, warn and train eagerly instead of failing. It covers tracing and the forward
            graph; the backward graph is compiled lazily inside ``loss.backward()``, where errors still raise.

    Example::

        >>> trainer = L.Trainer(callbacks=[TorchCompile(mode="max-autotune")], logger=False)
    """

    def __init__(
        self,
        mode: str = "default",
        dynamic: bool | None = None,
        fullgraph: bool = False,
        backend: str | Callable[..., Any] = "inductor",
        compile_attr: str | Sequence[str] | None = None,
        fallback: bool = False,
    ) -> None:
        self.config = CompileConfig(mode=mode, dynamic=dynamic, fullgraph=fullgraph, backend=backend, fallback=fallback)
        if compile_attr is not None:
            names = [compile_attr] if isinstance(compile_attr, str) else compile_attr
            if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) and n for n in names):
                raise SpeedupConfigError(
                    f"`compile_attr`={compile_attr!r} must be a submodule name or a non-empty list of them. "
                    "Allowed values: None, 'backbone', ['backbone', 'head'], ..."
                )
            compile_attr = list(names)
        self.compile_attr: list[str] | None = compile_attr
        self.summary: CompileSummary | None = None
        self._calls: list[_CompiledCall] = []
        self._checked = False
        self._load_hook: RemovableHandle | None = None

    @property
    def compiled_calls(self) -> int:
        """How many calls went through the compiled modules so far (0 means nothing was compiled)."""
        return sum(c.calls for c in self._calls)

    def targets(self, pl_module: L.LightningModule) -> list[str]:
        """The attribute names it compiles on ``pl_module`` (``[""]``: the whole module, through its ``forward``).

        Raises:
            SpeedupConfigError: no ``forward`` and no child module with parameters, and no ``compile_attr``.
        """
        if self.compile_attr is not None:
            return self.compile_attr
        if type(pl_module).forward is not L.LightningModule.forward:
            return [""]
        import torchmetrics

        names = [
            name
            for name, child in pl_module.named_children()
            if not isinstance(child, torchmetrics.Metric) and any(True for _ in child.parameters())
        ]
        if not names:
            raise SpeedupConfigError(
                f"`compile_attr`=None: TorchCompile found nothing to compile in `{type(pl_module).__name__}`: no "
                "`forward` and no child module with parameters. Allowed values: the submodule name(s) your "
                "training_step calls. HINT: pass `compile_attr`, e.g. compile_attr='backbone'."
            )
        return names

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._load_hook is None:
            self._load_hook = pl_module.register_load_state_dict_pre_hook(_align_keys_hook)
        if self.summary is not None and compiled_modules(pl_module):
            return  # a second stage (fit, then test) with the same callback: already compiled
        if getattr(pl_module, "_compiler_ctx", None) is not None:
            rank_zero_warn(
                "TorchCompile: the model was passed as `torch.compile(model)`, so Lightning already compiles its "
                "steps; TorchCompile leaves it as it is. HINT: pass the plain model and let TorchCompile compile it."
            )
            return
        self.summary = compile_model(pl_module, attrs=self.targets(pl_module), config=self.config)
        calls = compiled_modules(pl_module)
        self._calls = [c for c in calls.values() if isinstance(c, _CompiledCall)]
        names = ", ".join(repr(n) if n else f"{type(pl_module).__name__}.forward" for n in self.summary.compiled)
        rank_zero_info(
            f"TorchCompile: compiling {names} (mode={self.summary.mode}, backend={self.summary.backend}); "
            "the first step of each stage includes the compile time."
        )

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._checked:
            return
        self._checked = True
        if self._calls and self.compiled_calls == 0:
            rank_zero_warn(
                "TorchCompile: none of the compiled modules was called in the first training step, so nothing is "
                "compiled. HINT: `training_step` probably calls submodules directly instead of `self(x)`; pass "
                "`compile_attr` with their names."
            )

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._load_hook is not None:
            self._load_hook.remove()
            self._load_hook = None

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("state_dict")
        if isinstance(state, dict) and any("_orig_mod." in k for k in state):
            checkpoint["state_dict"] = strip_compile_prefix(state)


def _align_keys_hook(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """load_state_dict pre-hook: match ``_orig_mod.`` segments of incoming keys to the module's own keys."""
    if prefix:
        return
    from torch._dynamo.eval_frame import OptimizedModule

    wrapped = any(isinstance(m, OptimizedModule) for m in module.modules())
    if not wrapped and not any("_orig_mod." in k for k in state_dict):
        return
    aligned = align_compiled_keys(state_dict, module)
    if list(aligned) != list(state_dict):
        state_dict.clear()
        state_dict.update(aligned)


register_technique(
    TechniqueInfo(
        name="compile",
        callback=TorchCompile,
        functional=compile_model,
        summary="torch.compile the network in place (checkpoints stay loadable into plain models)",
        ways=(8,),
        bench="lightning_speedups.benchmarks.code:run_compile",
    )
)
