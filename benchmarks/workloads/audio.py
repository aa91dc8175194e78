"""An audio workload: a 2-D CNN spotting generated keywords in log-mel spectrograms computed per sample.

Eight "keywords", each a sequence of three vowels (a harmonic voice whose harmonics are shaped by the vowel's two
formants), said at a random pitch and tempo, at a random place in the clip, under background noise. Several keywords
share two of their three vowels, so the order matters. As in a user's speech pipeline, the ``Dataset`` holds raw
waveforms and does the work on access: a random time shift, gain and fresh noise (training only), then the short-time
Fourier transform and a mel filterbank, giving a ``(1, mels, frames)`` log-mel image. The module is the image tasks'
plain ``ImageClassifier`` around a small CNN, with its own ``configure_optimizers`` as speech recipes write it (AdamW
and a cosine decay over the run).
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from benchmarks.workloads._registry import Workload, register_workload
from benchmarks.workloads.images import ImageClassifier, conv_bn_relu

__all__ = [
    "KEYWORDS",
    "KeywordClips",
    "KeywordDataModule",
    "KeywordSpotter",
    "draw_keywords",
    "keyword_cnn",
    "log_mel",
    "mel_filterbank",
]

SAMPLE_RATE = 4000
CLIP = 3000  # samples: 0.75 s
VOWELS = {"a": (700.0, 1200.0), "e": (450.0, 1800.0), "i": (300.0, 1900.0), "o": (500.0, 900.0)}  # formants, Hz
KEYWORDS = ("aei", "aie", "eai", "eia", "iae", "oai", "aoe", "eoi")  # every pair of keywords shares vowels
N_FFT = 256
HOP = 64
MELS = 40


def _formant_tracks(
    labels: torch.Tensor, g: torch.Generator, t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample and time step: the two formant frequencies (scaled by the speaker's vocal tract, 0.8-1.2) and the
    voice's envelope (0 outside the word)."""
    n = len(labels)
    table = torch.tensor([[VOWELS[v] for v in word] for word in KEYWORDS])  # (words, 3, 2)
    length = 0.25 + 0.2 * torch.rand(n, 1, generator=g)  # seconds: the tempo
    onset = (CLIP / SAMPLE_RATE - length) * torch.rand(n, 1, generator=g)
    pos = (t - onset) / length  # 0..1 inside the word
    seg = (pos * 3).clamp(0, 2.999).long()  # which vowel
    formants = table[labels].gather(1, seg.unsqueeze(-1).expand(-1, -1, 2))  # (n, T, 2)
    formants = formants * (0.8 + 0.4 * torch.rand(n, 1, 1, generator=g))
    inside = (pos >= 0) & (pos <= 1)
    envelope = torch.where(inside, torch.sin(math.pi * pos.clamp(0, 1)).clamp_min(0) ** 0.5, torch.zeros(()))
    return formants[..., 0], formants[..., 1], envelope


def _voices(labels: torch.Tensor, g: torch.Generator, t: torch.Tensor) -> torch.Tensor:
    """One voiced word ``(n, CLIP)`` per label, peak 1: pitch 90-220 Hz, harmonics shaped by the formant tracks."""
    n = len(labels)
    f1, f2, envelope = _formant_tracks(labels, g, t.expand(n, -1))
    f0 = 90.0 + 130.0 * torch.rand(n, 1, generator=g)
    phase = 2 * math.pi * torch.rand(n, 1, generator=g)
    wave = torch.zeros(n, CLIP)
    for h in range(1, int(0.95 * SAMPLE_RATE / 2 / 90.0) + 1):  # harmonics below Nyquist at the lowest pitch
        freq = h * f0
        amp = torch.exp(-(((freq - f1) / 120.0) ** 2)) + 0.7 * torch.exp(-(((freq - f2) / 150.0) ** 2))
        amp = amp * (freq < 0.95 * SAMPLE_RATE / 2)
        wave += amp * torch.sin(2 * math.pi * freq * t + h * phase)
    return envelope * wave / wave.abs().amax(dim=1, keepdim=True).clamp_min(1e-6)


def draw_keywords(n: int, seed: int, noise: float = 0.6, babble: float = 0.6) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``n`` clips ``(n, CLIP)`` (float32, 4 kHz) of the :data:`KEYWORDS` and their labels, deterministic by
    ``seed``: a word of 0.25-0.45 s at a random onset, another speaker saying a random keyword behind it at up to
    ``babble`` of its level, and white noise of std ``noise``."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, len(KEYWORDS), (n,), generator=g)
    t = torch.arange(CLIP, dtype=torch.float32) / SAMPLE_RATE
    wave = _voices(labels, g, t)
    other = _voices(torch.randint(0, len(KEYWORDS), (n,), generator=g), g, t)
    wave = wave + babble * torch.rand(n, 1, generator=g) * other
    return (wave + noise * torch.randn(n, CLIP, generator=g)).float(), labels


def mel_filterbank(n_fft: int = N_FFT, mels: int = MELS, sample_rate: int = SAMPLE_RATE) -> torch.Tensor:
    """Triangular mel filters ``(n_fft // 2 + 1, mels)`` (HTK mel scale), to multiply a power spectrum by."""

    def mel(f: torch.Tensor) -> torch.Tensor:
        return 2595.0 * torch.log10(1.0 + f / 700.0)

    edges = 700.0 * (10 ** (torch.linspace(0.0, float(mel(torch.tensor(sample_rate / 2))), mels + 2) / 2595.0) - 1)
    freqs = torch.linspace(0, sample_rate / 2, n_fft // 2 + 1).unsqueeze(1)
    lo = edges[:-2]
    mid = edges[1:-1]
    hi = edges[2:]
    return ((freqs - lo) / (mid - lo)).clamp(0, 1).minimum(((hi - freqs) / (hi - mid)).clamp(0, 1))


def log_mel(wave: torch.Tensor, bank: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """The ``(mels, frames)`` log-mel spectrogram of a 1-D waveform (``window``: a Hann window of :data:`N_FFT`,
    hop :data:`HOP`)."""
    spec = torch.stft(wave, N_FFT, HOP, window=window, return_complex=True).abs() ** 2
    return torch.log(bank.T @ spec + 1e-6)


class KeywordClips(Dataset):
    """Waveforms and labels; ``__getitem__`` returns the ``(1, mels, frames)`` log-mel image of the clip, normalised.

    Training clips are first rolled by up to 0.1 s, scaled by a random gain in [0.5, 1.5] and given fresh white noise
    of std ``jitter``, as speech pipelines augment."""

    def __init__(self, waves: torch.Tensor, labels: torch.Tensor, train: bool, jitter: float = 0.1) -> None:
        self.waves = waves
        self.labels = labels
        self.train = train
        self.jitter = jitter
        self.bank = mel_filterbank()
        self.window = torch.hann_window(N_FFT)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        wave = self.waves[idx]
        if self.train:
            shift = int(torch.randint(-SAMPLE_RATE // 10, SAMPLE_RATE // 10 + 1, ()))
            wave = torch.roll(wave, shift) * (0.5 + torch.rand(())) + self.jitter * torch.randn_like(wave)
        image = log_mel(wave, self.bank, self.window)
        return ((image - image.mean()) / image.std().clamp_min(1e-6)).unsqueeze(0), self.labels[idx]


class KeywordDataModule(L.LightningDataModule):
    """:func:`draw_keywords` for training and validation (another seed)."""

    def __init__(
        self,
        n_train: int = 5000,
        n_val: int = 1000,
        batch_size: int = 64,
        seed: int = 0,
        noise: float = 0.6,
        babble: float = 0.6,
    ) -> None:
        super().__init__()
        self.n_train = n_train
        self.n_val = n_val
        self.batch_size = batch_size
        self.seed = seed
        self.noise = noise
        self.babble = babble

    def setup(self, stage: str | None = None) -> None:
        train = draw_keywords(self.n_train, self.seed + 70_000, self.noise, self.babble)
        val = draw_keywords(self.n_val, self.seed + 80_000, self.noise, self.babble)
        self.train_set = KeywordClips(*train, train=True)
        self.val_set = KeywordClips(*val, train=False)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)


class KeywordSpotter(ImageClassifier):
    """The image tasks' plain classifier with the schedule speech recipes use: AdamW 1e-3 (weight decay 0.01) with a
    cosine decay over the planned run, sized by ``self.trainer.estimated_stepping_batches``."""

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)
        steps = max(1, int(self.trainer.estimated_stepping_batches))
        return {
            "optimizer": optimizer,
            "lr_scheduler": {
                "scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps),
                "interval": "step",
            },
        }


def keyword_cnn(num_classes: int = len(KEYWORDS), width: int = 24) -> nn.Sequential:
    """Four Conv2d-BN-ReLU blocks (3x3, max-pool 2 between them), global average pool, linear head."""
    block = conv_bn_relu
    w = width
    return nn.Sequential(
        *block(1, w),
        nn.MaxPool2d(2),
        *block(w, 2 * w),
        nn.MaxPool2d(2),
        *block(2 * w, 4 * w),
        nn.MaxPool2d(2),
        *block(4 * w, 4 * w),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * w, num_classes),
    )


def _build_keywords(seed: int, small: bool = False) -> tuple[L.LightningModule, L.LightningDataModule]:
    torch.manual_seed(seed)
    n_train, n_val = (256, 128) if small else (5000, 1000)
    dm = KeywordDataModule(n_train=n_train, n_val=n_val, batch_size=64, seed=seed)
    return KeywordSpotter(keyword_cnn(width=4 if small else 24), num_classes=len(KEYWORDS)), dm


register_workload(
    Workload(
        name="keyword_audio",
        kind="audio_cnn",
        split="dev",
        metric="val_acc",
        mode="max",
        target=0.88,
        description="Which of 8 generated three-vowel keywords a 0.75 s clip holds (a harmonic voice at a random "
        "pitch, tempo, onset and vocal-tract scale, another speaker's keyword behind it at up to 0.6 of its level, "
        "white noise; the Dataset rolls, rescales and re-noises the raw waveform and computes its 40-band log-mel "
        "spectrogram per access): a 2-D CNN (width 24), AdamW 1e-3 with a cosine decay over the run, batch 64, 5000 "
        "training and 1000 validation clips. Added held out after every rule it is judged on was set, and "
        "calibrated on the baseline alone (seeds 0 and 1, AMD EPYC, 2 cores, quiet): val_acc climbs with swings of "
        "up to 0.2 between checks to 0.91 / 0.90 at the end; 0.88 is first reached at 54% (seed 0) and 63% (seed 1) "
        "of the 936 planned steps, about 45 s of training. Dev since its runs without bf16 kept the in-fit layout "
        "trial out of autotune's default plan (convnext_shapes was added held out with that change).",
        build=_build_keywords,
        max_epochs=12,
        val_check_interval=0.5,
    )
)
