"""A training process for the hard-fault tests: ``python -m tests.faults.worker TECHNIQUE OUT_DIR MODE``.

MODE ``kill``: train with a checkpoint every 2 steps; after the step-6 checkpoint is on disk (mid-epoch 1), write
``ready`` and wait to be killed with SIGKILL. MODE ``stop``: the same run stopped cleanly at step 6. MODE
``resume=CKPT``: resume from CKPT to the end (3 epochs) and save the final ``state_dict`` to ``OUT_DIR/final.pt``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
KILL_STEP = 6  # epoch 1 has steps 5-8: step 6 is mid-epoch


class Net(L.LightningModule):
    """A plain LightningModule with its own optimizer and a `batch_size` for the batch-size finder."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_size = 4
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 4, (16,), generator=g))
        return DataLoader(data, batch_size=self.batch_size)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def technique(name: str) -> L.Callback:
    import lightning_speedups as ls

    if name == "pruning":
        return ls.StructuredPruning(amount=0.5, start_epoch=1, end_epoch=2, steps=2)
    if name == "freezing":
        return ls.FineTuneFreezing(backbone="backbone", unfreeze_at_epoch=2, verbose=False)
    if name == "qat":
        return ls.QuantizationAwareTraining(start_epoch=1)
    if name == "batch_size":
        return ls.ThroughputBatchSizeFinder(mode="max_fit", init_val=2, max_val=4, progress_bar=False, verbose=False)
    raise SystemExit(f"unknown technique {name!r}")


class WaitForKill(L.Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == KILL_STEP:  # the step-6 checkpoint was written at the end of the last batch
            (self.out / "ready").write_text(str(trainer.global_step))
            time.sleep(600)


def main(name: str, out: Path, mode: str) -> None:
    L.seed_everything(0)
    callbacks = [technique(name)]
    kwargs = dict(
        accelerator="cpu",
        devices=1,
        max_epochs=3,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(out),
    )
    if mode.startswith("resume="):
        model = Net()
        trainer = L.Trainer(callbacks=callbacks, enable_checkpointing=False, **kwargs)
        trainer.fit(model, ckpt_path=mode.split("=", 1)[1])
        torch.save(model.state_dict(), out / "final.pt")
        return
    ckpt = ModelCheckpoint(dirpath=out / "ckpts", every_n_train_steps=2, save_top_k=-1, filename="{step}")
    if mode == "kill":
        callbacks.append(WaitForKill(out))
    else:
        kwargs["max_steps"] = KILL_STEP
    L.Trainer(callbacks=[*callbacks, ckpt], **kwargs).fit(Net())


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
