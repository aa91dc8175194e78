"""A time-series workload: a 1-D CNN classifying generated multi-channel signals (sensor-like, no download).

Eight waveform classes (harmonic sums, square, sawtooth, chirps up and down, amplitude modulation, a burst) at a
random base frequency and phase, seen by three channels with their own delay, gain and baseline drift, under strong
noise. The ``Dataset`` crops a random window and rescales and re-noises every sample on access, as users augment
sensor data; the module is the image tasks' plain ``ImageClassifier`` (Adam) around a 1-D CNN.
"""

from __future__ import annotations

import math

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from benchmarks.workloads._registry import Workload, register_workload
from benchmarks.workloads.images import ImageClassifier

__all__ = ["SignalDataModule", "SignalWindows", "draw_signals", "signal_cnn"]

NUM_CLASSES = 8


def _waveforms(labels: torch.Tensor, t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """One clean waveform ``(n, length)`` per label at a random base frequency (3-9 cycles) and phase."""
    n = len(labels)
    f0 = 3.0 + 6.0 * torch.rand(n, 1, generator=g)
    phase = 2 * math.pi * torch.rand(n, 1, generator=g)
    theta = 2 * math.pi * f0 * t + phase
    up = 2 * math.pi * f0 * (t + t**2 / 2) + phase  # instantaneous frequency f0 -> 2 f0
    down = 2 * math.pi * f0 * (2 * t - t**2 / 2) + phase  # 2 f0 -> f0
    centre = 0.2 + 0.6 * torch.rand(n, 1, generator=g)
    waves = torch.stack(
        [
            torch.sin(theta) + 0.6 * torch.sin(2 * theta),  # 0: fundamental + 2nd harmonic
            torch.sin(theta) + 0.6 * torch.sin(3 * theta),  # 1: fundamental + 3rd harmonic
            torch.sign(torch.sin(theta)),  # 2: square
            2 * torch.remainder(theta / (2 * math.pi), 1.0) - 1,  # 3: sawtooth
            torch.sin(up),  # 4: chirp up
            torch.sin(down),  # 5: chirp down
            (1 + 0.8 * torch.sin(theta / 2)) * torch.sin(3 * theta) / 1.4,  # 6: amplitude-modulated
            2 * torch.exp(-(((t - centre) / 0.08) ** 2)) * torch.sin(3 * theta),  # 7: a burst
        ],
        dim=1,
    )
    return waves[torch.arange(n), labels]


def draw_signals(
    n: int, seed: int, length: int = 512, channels: int = 3, noise: float = 0.6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``n`` signals ``(n, channels, length)`` (float32) of :data:`NUM_CLASSES` classes and their labels.

    Every channel sees the class waveform shifted by up to 1/8 of the window, scaled by a random gain in
    [0.3, 1.2] (sign included), plus a slow random baseline drift and white noise of std ``noise``.
    Deterministic by ``seed``.
    """
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    pad = length // 8
    t = torch.arange(length + pad, dtype=torch.float32) / length
    wave = _waveforms(labels, t, g)
    shift = torch.randint(0, pad + 1, (n, channels, 1), generator=g)
    idx = shift + torch.arange(length)
    x = torch.gather(wave.unsqueeze(1).expand(n, channels, -1), 2, idx)
    gain = (0.3 + 0.9 * torch.rand(n, channels, 1, generator=g)) * torch.where(
        torch.rand(n, channels, 1, generator=g) < 0.5, -1.0, 1.0
    )
    drift_f = torch.rand(n, channels, 1, generator=g)
    drift_p = 2 * math.pi * torch.rand(n, channels, 1, generator=g)
    drift = 0.8 * torch.sin(2 * math.pi * drift_f * t[:length] + drift_p)
    x = gain * x + drift + noise * torch.randn(n, channels, length, generator=g)
    return x.float(), labels


class SignalWindows(Dataset):
    """Signals and labels; ``__getitem__`` crops a ``window`` (random when ``train``, centred otherwise).

    Training samples are also scaled by a random gain in [0.8, 1.25] and get fresh white noise of std ``jitter``.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, window: int, train: bool, jitter: float = 0.2) -> None:
        self.x = x
        self.y = y
        self.window = window
        self.train = train
        self.jitter = jitter

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[idx]
        slack = x.shape[-1] - self.window
        start = int(torch.randint(0, slack + 1, ())) if self.train else slack // 2
        x = x[:, start : start + self.window]
        if self.train:
            x = x * (0.8 + 0.45 * torch.rand(())) + self.jitter * torch.randn_like(x)
        return x, self.y[idx]


class SignalDataModule(L.LightningDataModule):
    """:func:`draw_signals` for training and validation (another seed), windows of ``window`` samples."""

    def __init__(
        self,
        n_train: int = 8000,
        n_val: int = 2000,
        batch_size: int = 64,
        window: int = 384,
        seed: int = 0,
        noise: float = 0.6,
    ) -> None:
        super().__init__()
        self.n_train = n_train
        self.n_val = n_val
        self.batch_size = batch_size
        self.window = window
        self.seed = seed
        self.noise = noise

    def setup(self, stage: str | None = None) -> None:
        x, y = draw_signals(self.n_train, self.seed, noise=self.noise)
        self.train_set = SignalWindows(x, y, self.window, train=True)
        x, y = draw_signals(self.n_val, self.seed + 10_000, noise=self.noise)
        self.val_set = SignalWindows(x, y, self.window, train=False)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)


def signal_cnn(in_channels: int = 3, num_classes: int = NUM_CLASSES, width: int = 32) -> nn.Sequential:
    """Four Conv1d-BN-ReLU blocks (kernel 7, max-pool 2 between them), global average pool, linear head."""

    def block(c_in: int, c_out: int) -> list[nn.Module]:
        return [nn.Conv1d(c_in, c_out, 7, padding=3, bias=False), nn.BatchNorm1d(c_out), nn.ReLU(inplace=True)]

    w = width
    return nn.Sequential(
        *block(in_channels, w),
        nn.MaxPool1d(2),
        *block(w, w),
        nn.MaxPool1d(2),
        *block(w, 2 * w),
        nn.MaxPool1d(2),
        *block(2 * w, 2 * w),
        nn.AdaptiveAvgPool1d(1),
        nn.Flatten(),
        nn.Linear(2 * w, num_classes),
    )


def _build_signal(seed: int, small: bool = False) -> tuple[L.LightningModule, L.LightningDataModule]:
    torch.manual_seed(seed)
    n_train, n_val = (256, 128) if small else (8000, 2000)
    dm = SignalDataModule(n_train=n_train, n_val=n_val, batch_size=64, seed=seed)
    # the same plain module as the image tasks (cross-entropy, Adam 1e-3, val_acc): only the network differs
    return ImageClassifier(signal_cnn(width=8 if small else 32), num_classes=NUM_CLASSES), dm


register_workload(
    Workload(
        name="signal_cnn1d",
        kind="signal_cnn",
        split="held_out",
        metric="val_acc",
        mode="max",
        target=0.8,
        description="Which of 8 generated waveform classes a 3-channel series is (harmonic sums, square, sawtooth, "
        "chirps, amplitude modulation, a burst, at a random frequency and phase under strong noise and drift; the "
        "Dataset crops a random 384-sample window of 512 and re-noises it per access): a 1-D CNN (width 32), Adam "
        "1e-3, batch 64, 8000 training and 2000 validation series. "
        "Measured on the AMD EPYC (2 cores, shared) over the planned 1250 steps: val_acc 0.60/0.78/0.84/0.80 "
        "(seed 0) and 0.59/0.78/0.75/0.87 (seed 1) at 25/50/75/100% of the run, up to +-0.06 between checks (seed 1 "
        "went 0.84/0.71/0.74/0.82/0.87 over its last five); the target "
        "0.8 is first reached at step 937 (seed 0, 75%) and 749 (seed 1, 60%). About 3-4 minutes of training on an "
        "idle 2-core CPU, the longest of the suite.",
        build=_build_signal,
        max_epochs=10,
        val_check_interval=0.5,
    )
)
