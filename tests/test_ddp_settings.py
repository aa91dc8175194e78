"""A real 2-process DDP fit on CPU (gloo) of DemoClassifier using trainer_settings output."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lightning_speedups import trainer_settings
from lightning_speedups.demo import DemoClassifier, DigitsDataModule


class _Record(L.Callback):
    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_end(self, trainer, pl_module):
        flat = torch.cat([p.detach().flatten() for p in pl_module.parameters()])
        torch.save(
            {"rank": trainer.global_rank, "world": trainer.world_size, "params": flat},
            f"{self.path}/rank{trainer.global_rank}.pt",
        )


@pytest.mark.ddp
def test_ddp_fit_with_trainer_settings(tmp_path):
    kwargs = trainer_settings(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        precision="32-true",
        max_steps=3,
        limit_val_batches=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    assert kwargs["strategy"] == "ddp_spawn" and kwargs["devices"] == 2
    trainer = L.Trainer(callbacks=[_Record(str(tmp_path))], **kwargs)
    trainer.fit(DemoClassifier(width=8), DigitsDataModule(batch_size=16))
    r0 = torch.load(tmp_path / "rank0.pt")
    r1 = torch.load(tmp_path / "rank1.pt")
    assert (r0["world"], r1["world"]) == (2, 2)
    assert torch.equal(r0["params"], r1["params"])  # DDP kept both ranks' weights identical
