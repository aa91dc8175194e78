"""DeviceDataLoader: batches, len, determinism, sharding over ranks, Lightning integration, DDP."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.fabric.utilities.data import _set_sampler_epoch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._registry import get_technique
from lightning_speedups.data import BatchAugment, DeviceDataLoader
from lightning_speedups.demo import DemoClassifier, DigitsDataModule
from lightning_speedups.demo.data import DIGITS_MEAN, DIGITS_STD
from tests.helpers import quiet_trainer


def _data(n: int = 20) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, 4, 4), torch.randint(0, 10, (n,)), torch.arange(n)


def test_device_data_misconfiguration():
    x, y, _ = _data()
    with pytest.raises(SpeedupConfigError, match="`tensors` is empty"):
        DeviceDataLoader()
    with pytest.raises(SpeedupConfigError, match="must all be torch.Tensor"):
        DeviceDataLoader(x, [1, 2])
    with pytest.raises(SpeedupConfigError, match="same length"):
        DeviceDataLoader(x, y[:-1])
    with pytest.raises(SpeedupConfigError, match="length 0"):
        DeviceDataLoader(x[:0], y[:0])
    with pytest.raises(SpeedupConfigError, match="`batch_size`=0 is out of range. Allowed values: an integer >= 1"):
        DeviceDataLoader(x, y, batch_size=0)
    with pytest.raises(SpeedupConfigError, match="`batch_size`=-3 is out of range. Allowed values: an integer >= 1"):
        DeviceDataLoader(x, y, batch_size=-3)
    with pytest.raises(SpeedupConfigError, match="larger than the 20 samples"):
        DeviceDataLoader(x, y, batch_size=21, drop_last=True)
    with pytest.raises(SpeedupConfigError, match="larger than the 10 samples of each of the 2 shard"):
        DeviceDataLoader(x, y, batch_size=12, drop_last=True, rank=0, world_size=2)
    with pytest.raises(SpeedupConfigError, match="must be given together"):
        DeviceDataLoader(x, y, rank=0)
    with pytest.raises(SpeedupConfigError, match="0 <= rank < world_size"):
        DeviceDataLoader(x, y, rank=2, world_size=2)
    with pytest.raises(SpeedupConfigError, match="`transform_index`=5 is out of range"):
        DeviceDataLoader(x, y, transform_index=5)
    with pytest.raises(SpeedupConfigError, match="`transform`=.* is not callable"):
        DeviceDataLoader(x, y, transform="flip")
    with pytest.raises(SpeedupConfigError, match=r"needs image batches of shape \(B, C, H, W\)"):
        DeviceDataLoader(x, y, transform=BatchAugment(hflip=0.5), transform_index=1)
    with pytest.raises(SpeedupConfigError, match="not a valid torch device"):
        DeviceDataLoader(x, y, device="nonsense")
    with pytest.raises(SpeedupConfigError, match="not attached to a Trainer"):
        list(DeviceDataLoader(x, y, device=DigitsDataModule()))
    with pytest.raises(SpeedupConfigError, match="`device`=.* is not supported"):
        list(DeviceDataLoader(x, y, device=object()))
    # the batch fits a single process but not a shard of 3 ranks: found as soon as the world size is known
    loader = DeviceDataLoader(x, y, batch_size=8, drop_last=True)
    loader._rank = 0
    loader._world_size = 3
    with pytest.raises(SpeedupConfigError, match="larger than the 6 samples"):
        len(loader)


@pytest.mark.parametrize(
    ("n", "batch_size", "drop_last", "world_size", "expected"),
    [(20, 6, False, 1, 4), (20, 6, True, 1, 3), (20, 5, True, 1, 4), (21, 5, False, 2, 3), (21, 5, True, 2, 2)],
)
def test_device_data_len(n, batch_size, drop_last, world_size, expected):
    x, y, _ = _data(n)
    loaders = [
        DeviceDataLoader(x, y, batch_size=batch_size, drop_last=drop_last, rank=r, world_size=world_size)
        for r in range(world_size)
    ]
    for loader in loaders:
        batches = list(loader)
        assert len(loader) == expected == len(batches)
        assert all(b[0].shape[0] == batch_size for b in batches[:-1])
        if drop_last:
            assert all(b[0].shape[0] == batch_size for b in batches)


def test_device_data_batches_match_tensors():
    x, y, idx = _data(20)
    loader = DeviceDataLoader(x, y, idx, batch_size=6, seed=3)
    seen = []
    for bx, by, bi in loader:
        assert torch.equal(bx, x[bi]) and torch.equal(by, y[bi])
        seen.append(bi)
    assert sorted(torch.cat(seen).tolist()) == list(range(20))
    plain = DeviceDataLoader(x, idx, batch_size=6, shuffle=False)
    assert torch.cat([b[1] for b in plain]).tolist() == list(range(20))


def test_device_data_determinism():
    x, y, idx = _data(50)

    def orders(seed: int) -> list[list[int]]:
        loader = DeviceDataLoader(idx, batch_size=7, seed=seed)
        return [torch.cat([b[0] for b in loader]).tolist() for _ in range(3)]

    a = orders(1)
    b = orders(1)
    c = orders(2)
    assert a == b  # reproducible by seed
    assert a != c  # the seed matters
    assert len({tuple(o) for o in a}) == 3  # a new order each epoch
    loader = DeviceDataLoader(idx, batch_size=7, seed=1)
    loader.set_epoch(2)
    assert torch.cat([b[0] for b in loader]).tolist() == a[2]
    assert loader.epoch == 3


@pytest.mark.parametrize(("n", "world_size"), [(40, 2), (41, 2), (30, 4)])
def test_device_data_shards_cover_and_are_disjoint(n, world_size):
    _, _, idx = _data(n)
    for epoch in range(2):
        shards = []
        for rank in range(world_size):
            loader = DeviceDataLoader(idx, batch_size=4, seed=5, rank=rank, world_size=world_size)
            loader.set_epoch(epoch)
            shards.append(torch.cat([b[0] for b in loader]).tolist())
        assert len({len(s) for s in shards}) == 1  # equal steps on every rank (DDP would hang otherwise)
        flat = [i for s in shards for i in s]
        assert set(flat) == set(range(n))  # union covers the dataset
        assert len(flat) - len(set(flat)) == (-n) % world_size  # disjoint, up to the wrap-around padding
    # drop_last: strictly disjoint, the remainder is dropped
    loaders = [DeviceDataLoader(idx, batch_size=1, drop_last=True, rank=r, world_size=2) for r in range(2)]
    shards = [set(torch.cat([b[0] for b in loader]).tolist()) for loader in loaders]
    assert not shards[0] & shards[1] and len(shards[0] | shards[1]) == n - n % 2


def test_device_data_transform_and_lightning_hooks():
    x, y, _ = _data(16)
    loader = DeviceDataLoader(x, y, batch_size=4, transform=lambda t: t * 0 + 1, shuffle=False)
    bx, by = next(iter(loader))
    assert torch.all(bx == 1) and torch.equal(by, y[:4])
    _set_sampler_epoch(loader, 7)  # what Lightning's fit loop calls at every epoch start
    assert loader.epoch == 7
    iter(loader)  # Lightning calls iter() once to check iterability: it must not consume an epoch
    assert loader.epoch == 7


def test_device_data_lazy_device_from_module():
    x, y, _ = _data(8)
    model = DemoClassifier(width=4)
    loader = DeviceDataLoader(x.to(torch.float64), y, batch_size=4, device=model)
    assert loader.device == torch.device("cpu")
    assert next(iter(loader))[0].device == model.device
    assert loader.to("cpu") is loader


class _RecordingModel(DemoClassifier):
    """Records the sample indices of every training batch; trains on ``(x, y, idx)`` batches."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, out_dir: str | None = None, seed: int = 0) -> None:
        super().__init__(width=4)
        self.x = x
        self.y = y
        self.out_dir = out_dir
        self.data_seed = seed
        self.seen: dict[int, list[int]] = {}

    def train_dataloader(self) -> DeviceDataLoader:
        idx = torch.arange(len(self.y))
        return DeviceDataLoader(self.x, self.y, idx, batch_size=4, seed=self.data_seed, device=self)

    def training_step(self, batch, batch_idx):
        x, y, idx = batch
        self.seen.setdefault(self.current_epoch, []).extend(idx.tolist())
        return self._step((x, y), "train", self.train_acc)

    def on_train_end(self) -> None:
        if self.out_dir is not None:
            torch.save(self.seen, Path(self.out_dir) / f"rank{self.global_rank}.pt")


def test_device_data_fit_resume_keeps_epoch_order(tmp_path):
    x = torch.randn(16, 3, 32, 32)
    y = torch.randint(0, 10, (16,))
    full = _RecordingModel(x, y, seed=4)
    quiet_trainer(max_epochs=2, limit_val_batches=0).fit(full)
    expected = DeviceDataLoader(torch.arange(16), batch_size=4, seed=4)
    for epoch in range(2):
        assert full.seen[epoch] == expected.shard_indices(epoch).tolist()
    assert full.seen[0] != full.seen[1]

    first = _RecordingModel(x, y, seed=4)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    quiet_trainer(max_epochs=1, limit_val_batches=0, enable_checkpointing=True, callbacks=[ckpt]).fit(first)
    resumed = _RecordingModel(x, y, seed=4)
    quiet_trainer(max_epochs=2, limit_val_batches=0).fit(resumed, ckpt_path=str(tmp_path / "last.ckpt"))
    assert resumed.seen[1] == full.seen[1]  # Lightning's set_epoch reached the fresh loader


class _DeviceDigits(DigitsDataModule):
    """The digits demo, but training batches come from a DeviceDataLoader with on-device augmentation."""

    def train_dataloader(self) -> DeviceDataLoader:
        aug = BatchAugment(padding=2, mean=[DIGITS_MEAN] * 3, std=[DIGITS_STD] * 3, seed=self.seed)
        return DeviceDataLoader(
            self.train_images, self.train_labels, batch_size=self.batch_size, device=self, transform=aug, seed=self.seed
        )


def test_device_data_fit_digits():
    dm = _DeviceDigits(batch_size=64)
    model = DemoClassifier(width=8, optimizer_config={"name": "adam", "lr": 3e-3})
    trainer = quiet_trainer(max_epochs=2, limit_val_batches=2)
    trainer.fit(model, datamodule=dm)
    assert trainer.num_training_batches == len(dm.train_labels) // 64 + 1
    assert trainer.global_step == 2 * trainer.num_training_batches
    assert float(trainer.callback_metrics["val_acc"]) > 0.3  # 10 classes: chance is 0.1 (images/labels misaligned)


def test_device_data_registered():
    info = get_technique("device_data")
    assert info.callback is None and info.functional is DeviceDataLoader
    assert info.load_bench() is not None


@pytest.mark.ddp
def test_device_data_ddp(tmp_path):
    n = 40
    x = torch.randn(n, 3, 32, 32)
    y = torch.randint(0, 10, (n,))
    model = _RecordingModel(x, y, out_dir=str(tmp_path), seed=11)
    trainer = quiet_trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=2, limit_val_batches=0)
    trainer.fit(model)
    seen = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for epoch in range(2):
        a = seen[0][epoch]
        b = seen[1][epoch]
        assert len(a) == len(b) == n // 2
        assert not set(a) & set(b)  # disjoint shards
        assert set(a) | set(b) == set(range(n))  # union covers the dataset
        for rank in range(2):  # reproducible by seed: the same order a single process computes for that rank
            ref = DeviceDataLoader(torch.arange(n), batch_size=4, seed=11, rank=rank, world_size=2)
            assert seen[rank][epoch] == ref.shard_indices(epoch).tolist()
    assert seen[0][0] != seen[0][1]  # shuffling differs per epoch


def test_device_data_reads_rank_from_torch_distributed(monkeypatch):
    idx = torch.arange(30)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 3)
    loader = DeviceDataLoader(idx, batch_size=4, seed=2)
    assert (loader.rank, loader.world_size, len(loader)) == (1, 3, 3)
    explicit = DeviceDataLoader(idx, batch_size=4, seed=2, rank=1, world_size=3)
    assert torch.cat([b[0] for b in loader]).tolist() == explicit.shard_indices(0).tolist()
