"""FSDP on CPU processes, for tests: Lightning's ``FSDPStrategy`` sharding a model over 2 gloo ranks.

Lightning refuses ``Trainer(strategy="fsdp")`` without a GPU (a check on the strategy *name* and on
``type(strategy) is FSDPStrategy``), but torch's ``FullyShardedDataParallel`` runs on CPU with gloo when it is given
``device_id=torch.device("cpu")``. :class:`CPUFSDPStrategy` is the strategy with the three things a CPU needs:

- the model wrapped with ``device_id=cpu`` (Lightning passes the root device's index, ``None`` on a CPU, and torch
  then asks for an accelerator);
- a spawn launcher whose rank 0 hands the *full* state dict back to the main process (Lightning's spawn launcher
  sends ``lightning_module.state_dict()``, which under FSDP holds each rank's shard: flat 1-D pieces, some empty);
- no ``device_ids`` for gloo barriers.

With 2 ranks the default ``FULL_SHARD`` really shards: each rank holds half of every flat parameter, so callbacks
meet the flattened, sharded parameters they would meet on GPUs. Tests only: it relies on Lightning's private
launcher classes (2.6), and ``tests/test_fsdp_cpu.py`` fails first if they move.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher, _WorkerOutput
from lightning.pytorch.trainer.states import TrainerFn

__all__ = ["CPUFSDPStrategy"]


class _FullStateLauncher(_MultiProcessingLauncher):
    """Spawn launcher that returns the gathered full state dict (a collective: every rank takes part)."""

    def _collect_rank_zero_results(self, trainer: Any, results: Any) -> _WorkerOutput | None:
        ckpt = trainer.checkpoint_callback
        best = getattr(ckpt, "best_model_path", None) if ckpt is not None else None
        state_dict = trainer.strategy.lightning_module_state_dict()  # FULL_STATE_DICT, rank 0 only
        if self._strategy.local_rank != 0:
            return None
        weights_path = None
        if trainer.state.fn == TrainerFn.FITTING:
            weights_path = os.path.join(tempfile.mkdtemp(), ".temp.ckpt")
            self._strategy.checkpoint_io.save_checkpoint(state_dict, weights_path)
        return _WorkerOutput(best, weights_path, trainer.state, results, self.get_extra_results(trainer))


class CPUFSDPStrategy(FSDPStrategy):
    """``FSDPStrategy`` over CPU processes (gloo, spawn). ``Trainer(accelerator="cpu", devices=2, strategy=...)``."""

    strategy_name = "fsdp_cpu_test"

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("process_group_backend", "gloo")
        super().__init__(**kwargs)

    def _configure_launcher(self) -> None:
        if self.num_processes > 1:
            self._launcher = _FullStateLauncher(self, start_method="spawn")

    def _determine_device_ids(self) -> list[int] | None:  # type: ignore[override]
        return None

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel

        if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            return model
        return FullyShardedDataParallel(
            module=model,
            cpu_offload=self.cpu_offload,
            mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy,
            device_id=torch.device("cpu"),
            **self.kwargs,
        )
