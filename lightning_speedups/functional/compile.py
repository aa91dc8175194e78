"""torch.compile applied in place, so parameter names (and checkpoints) stay those of the plain model.

``net = torch.compile(net)`` wraps the module in an ``OptimizedModule`` whose ``state_dict`` keys gain an
``_orig_mod.`` prefix, and checkpoints stop loading into uncompiled models (Lightning #17415, #20233). Here each
target module is compiled with ``nn.Module.compile`` semantics instead: only its ``__call__`` is swapped for the
compiled one, its parameters and names are untouched. :func:`strip_compile_prefix` / :func:`align_compiled_keys`
repair checkpoints written by the wrapping style.
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lightning_speedups._errors import SpeedupConfigError, check_bool, check_callable, check_choice, check_module_names
from lightning_speedups._structure import keep_metadata

__all__ = [
    "FIRST_COMPILE_PRIOR_S",
    "COMPILE_MODES",
    "CompileConfig",
    "CompileSummary",
    "align_compiled_keys",
    "compile_model",
    "compiled_modules",
    "is_compiled",
    "strip_compile_prefix",
    "uncompile_model",
]

COMPILE_MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_PREFIX = "_orig_mod."

#: What a first compile of a training step (forward and backward graphs) is assumed to cost before it is measured:
#: inductor's first compile takes tens of seconds on a small CPU (a 2-layer GPT-2 took 60 s on 2 cores). autotune
#: does not try compile in a smaller trial budget, and the advisor's automatic probe skips runs too short for it.
FIRST_COMPILE_PRIOR_S = 30.0


@dataclass
class CompileConfig:
    """Settings passed to ``torch.compile``.

    Args:
        mode: ``"default"``; ``"reduce-overhead"`` (CUDA graphs: less launch overhead for small batches, more
            memory); ``"max-autotune"`` (benchmarks kernel choices: much longer compile, plus CUDA graphs);
            ``"max-autotune-no-cudagraphs"``. Non-default modes only apply to the ``inductor`` backend.
        dynamic: ``None`` lets torch mark shapes dynamic after a second distinct shape (e.g. the smaller last
            batch); ``True`` compiles shape-generic kernels up front; ``False`` specialises on every shape.
        fullgraph: raise on any graph break instead of splitting the graph.
        backend: a name from ``torch._dynamo.list_backends()`` (``"inductor"`` generates kernels; ``"eager"``
            only traces, for debugging and fast tests) or a backend callable.
        fallback: if compiling (or running the compiled forward) raises, warn and run the module eagerly from then
            on. Off by default, so a broken compile is an error you see.

    Example::

        >>> CompileConfig(mode="max-autotune").mode
        'max-autotune'
    """

    mode: str = "default"
    dynamic: bool | None = None
    fullgraph: bool = False
    backend: str | Callable[..., Any] = "inductor"
    fallback: bool = False

    def __post_init__(self) -> None:
        check_choice(
            "mode", self.mode, COMPILE_MODES, hint="see torch._inductor.list_mode_options() for what each mode sets."
        )
        check_bool("dynamic", self.dynamic, optional=True)
        check_bool("fullgraph", self.fullgraph)
        check_bool("fallback", self.fallback)
        if isinstance(self.backend, str):
            import torch._dynamo

            backends = torch._dynamo.list_backends(exclude_tags=())
            check_choice("backend", self.backend, backends)
            if self.mode != "default" and self.backend != "inductor":
                raise SpeedupConfigError(
                    f"`mode`={self.mode!r} only applies to `backend`='inductor', got `backend`={self.backend!r}. "
                    "Allowed values: mode='default' with other backends."
                )
        else:
            check_callable("backend", self.backend, "a backend name (str) or a callable")

    def compile_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``torch.compile``."""
        kwargs: dict[str, Any] = {"fullgraph": self.fullgraph, "dynamic": self.dynamic, "backend": self.backend}
        if self.mode != "default":
            kwargs["mode"] = self.mode
        # each compiled module gets its own recompile budget; otherwise all in-place compiled modules share the one
        # cache of nn.Module._call_impl and the 9th distinct module silently runs eagerly
        if "isolate_recompiles" in inspect.signature(torch.compile).parameters:
            kwargs["isolate_recompiles"] = True
        return kwargs


@dataclass(frozen=True)
class CompileSummary:
    """What :func:`compile_model` did: the compiled module names (``""`` is the root), mode and backend."""

    compiled: tuple[str, ...]
    mode: str
    backend: str


class _CompiledCall:
    """Stands in for ``module._compiled_call_impl``: counts calls and, with ``fallback``, falls back to eager."""

    def __init__(self, module: nn.Module, compiled: Callable[..., Any], name: str, fallback: bool) -> None:
        self.module = module
        self.compiled = compiled
        self.name = name
        self.fallback = fallback
        self.calls = 0
        self.first_call_seconds: float | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        start = time.perf_counter() if self.first_call_seconds is None else None
        if not self.fallback:
            out = self.compiled(*args, **kwargs)
        else:
            try:
                out = self.compiled(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - any compile failure; a genuine bug re-raises from eager below
                out = self.module._call_impl(*args, **kwargs)
                first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
                warnings.warn(
                    f"torch.compile of `{self.name or type(self.module).__name__}` failed "
                    f"({type(err).__name__}: {first_line[:200]}); running it eagerly from now on (fallback=True).",
                    UserWarning,
                    stacklevel=2,
                )
                self.module._compiled_call_impl = None
        if start is not None:
            self.first_call_seconds = time.perf_counter() - start
        return out


def _resolve_targets(module: nn.Module, attrs: str | Sequence[str] | None) -> list[str]:
    names = [""] if attrs is None else [attrs] if isinstance(attrs, str) else list(attrs)
    if not names:
        raise SpeedupConfigError(
            "`attrs`=[] names no module to compile. Allowed values: None, a submodule name or a non-empty list of "
            "them. HINT: pass None to compile the whole module."
        )
    check_module_names("attrs", [n for n in names if n != ""], module)  # "" is the module itself
    for a in names:
        for b in names:
            if a != b and (a == "" or b.startswith(a + ".")):
                raise SpeedupConfigError(
                    f"`attrs` entries {a!r} and {b!r} overlap: one is inside the other. Allowed values: modules "
                    "that do not contain each other. HINT: compile the outer module only; it covers the inner one."
                )
    return names


def compile_model(
    module: nn.Module,
    attrs: str | Sequence[str] | None = None,
    config: CompileConfig | None = None,
    **kwargs: Any,
) -> CompileSummary:
    """Compile ``module`` (or the named submodules) in place with ``torch.compile``.

    Compilation itself is lazy: it happens at the first call (tens of seconds on a CPU for ``inductor``) and again
    for each new input shape or mode (``train()`` / ``eval()``, grad / no-grad). Parameter names are unchanged, so
    ``state_dict`` and checkpoints are interchangeable with the uncompiled model. Modules already compiled are left
    as they are.

    Args:
        module: the model; compiled in place.
        attrs: ``None`` compiles ``module`` itself; a dotted name or a list of them compiles those submodules
            (they must not contain each other).
        config: a :class:`CompileConfig`; or pass its fields as keyword arguments.
        **kwargs: fields of :class:`CompileConfig` when ``config`` is not given.

    Returns:
        A :class:`CompileSummary`.

    Raises:
        SpeedupConfigError: unknown mode or backend, unknown or overlapping ``attrs``, both ``config`` and kwargs.

    Example::

        >>> net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        >>> compile_model(net, backend="eager").compiled
        ('',)
        >>> is_compiled(net), list(net.state_dict())
        (True, ['0.weight', '0.bias'])
    """
    if config is None:
        config = CompileConfig(**kwargs)
    elif kwargs:
        raise SpeedupConfigError(
            f"`config`={config!r} and keyword arguments {sorted(kwargs)} were both given. Allowed values: either "
            "`config` or keyword arguments, not both."
        )
    names = _resolve_targets(module, attrs)
    compile_kwargs = config.compile_kwargs()
    for name in names:
        sub = module.get_submodule(name) if name else module
        if sub._compiled_call_impl is not None:
            continue
        compiled = torch.compile(sub._call_impl, **compile_kwargs)
        sub._compiled_call_impl = _CompiledCall(sub, compiled, name, config.fallback)  # type: ignore[assignment]
    backend = config.backend if isinstance(config.backend, str) else getattr(config.backend, "__name__", "custom")
    return CompileSummary(compiled=tuple(names), mode=config.mode, backend=backend)


def compiled_modules(module: nn.Module) -> dict[str, Any]:
    """``{name: compiled call}`` for every submodule of ``module`` compiled in place (``""`` is the root)."""
    return {name: m._compiled_call_impl for name, m in module.named_modules() if m._compiled_call_impl is not None}


def is_compiled(module: nn.Module) -> bool:
    """Whether ``module`` is an ``OptimizedModule`` or has a submodule compiled in place."""
    from torch._dynamo.eval_frame import OptimizedModule

    return isinstance(module, OptimizedModule) or bool(compiled_modules(module))


def uncompile_model(module: nn.Module) -> list[str]:
    """Undo in-place compilation of ``module`` and its submodules; returns the names that were compiled.

    Example::

        >>> net = nn.Linear(2, 2)
        >>> _ = compile_model(net, backend="eager")
        >>> uncompile_model(net), is_compiled(net)
        ([''], False)
    """
    names = list(compiled_modules(module))
    for name in names:
        (module.get_submodule(name) if name else module)._compiled_call_impl = None
    return names


def strip_compile_prefix(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Remove every ``_orig_mod.`` segment that ``torch.compile``-wrapped modules add to ``state_dict`` keys.

    Example::

        >>> list(strip_compile_prefix({"net._orig_mod.0.weight": 1, "head.bias": 2}))
        ['net.0.weight', 'head.bias']
    """
    out = keep_metadata({}, {key.replace(_PREFIX, ""): value for key, value in state_dict.items()})
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:  # module versions (BatchNorm reads them on load) follow their renamed modules
        out._metadata = OrderedDict(  # type: ignore[attr-defined]
            (_strip_prefix_name(prefix), dict(value)) for prefix, value in metadata.items()
        )
    return out


def _strip_prefix_name(prefix: str) -> str:
    """A ``_metadata`` module prefix without its ``_orig_mod`` segments (``"net._orig_mod"`` -> ``"net"``)."""
    name = (prefix + ".").replace(_PREFIX, "")
    return name[:-1]


def align_compiled_keys(state_dict: Mapping[str, Any], module: nn.Module) -> dict[str, Any]:
    """Rename ``state_dict`` keys so their ``_orig_mod.`` segments match ``module``'s, in both directions.

    A checkpoint from a wrapped-compiled model loads into a plain one and vice versa. Keys that already match, or
    whose stripped form is unknown to ``module``, are kept as they are (so strict loading still reports them).

    Example::

        >>> plain = nn.Sequential(nn.Linear(2, 2))
        >>> list(align_compiled_keys({"0._orig_mod.weight": 1, "0._orig_mod.bias": 2}, plain))
        ['0.weight', '0.bias']
    """
    own = list(module.state_dict().keys())
    canonical = {key.replace(_PREFIX, ""): key for key in own}
    own_set = set(own)
    out: dict[str, Any] = {}
    for key, value in state_dict.items():
        target = key
        if key not in own_set:
            target = canonical.get(key.replace(_PREFIX, ""), key)
        out[target] = value
    return out
