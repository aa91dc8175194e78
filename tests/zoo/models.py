"""The architectures of the conformance zoo: public models in tiny configs, built offline with random weights.

Each :class:`Arch` builds one LightningModule that owns its ``configure_optimizers`` (no mixin unless ``mixin``) and
its synthetic dataloaders (deterministic tensors, ``batch_size`` 8, 2 training batches per epoch, no shuffling, one
validation batch; Lightning's demo transformer keeps its training-only loop).
``example_input_array`` is *not* set: techniques that trace the model must derive an input from the first batch.

Image nets see 3x32x32 inputs and 10 classes; token models see 12 tokens from a 100-word vocabulary. Widths and depths
are the public builders' own unless the builder is too heavy for a 2-core CI run; those few keep their block types
and only shrink (the reduced config is spelled out next to the builder).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from lightning.pytorch.demos.transformer import LightningTransformer, Transformer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups import OptimizerConfig, SpeedupMixin
from lightning_speedups.optim import create_optimizer

__all__ = [
    "ARCHS",
    "Arch",
    "ZooModule",
    "ZooMixinModule",
    "ZooBoringModel",
    "ZooLightningTransformer",
    "ZooGPT2",
    "build",
]

BATCH = 8
SAMPLES = 16  # 2 batches per epoch
IMAGE = (3, 32, 32)
CLASSES = 10
VOCAB = 100
TOKENS = 12
LABELS = 2
DATA_SEED = 1234  # data never depends on the global RNG, so a resumed run sees the same batches


def _generator(offset: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(DATA_SEED + offset)


def image_data(n: int = SAMPLES, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = _generator(offset)
    return torch.randn(n, *IMAGE, generator=g), torch.randint(0, CLASSES, (n,), generator=g)


def token_data(n: int = SAMPLES, offset: int = 0) -> dict[str, torch.Tensor]:
    g = _generator(offset)
    ids = torch.randint(1, VOCAB, (n, TOKENS), generator=g)
    lengths = torch.randint(TOKENS // 2, TOKENS + 1, (n,), generator=g)
    mask = (torch.arange(TOKENS)[None, :] < lengths[:, None]).long()
    ids = ids * mask  # 0 = [PAD]
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, LABELS, (n,), generator=g)}


class _DictDataset(torch.utils.data.Dataset):
    """Map-style dataset of dict samples (collated into dict batches)."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.tensors.items()}


class _Counted:
    """Counts training steps that reached the module (a refusal must come before the first one)."""

    steps_run: int = 0

    def _count(self) -> None:
        self.steps_run = getattr(self, "steps_run", 0) + 1


# ---------------------------------------------------------------------------------------------------- net builders
def _tv(name: str, **kw: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision

        return torchvision.models.get_model(name, weights=None, num_classes=CLASSES, **kw)

    return build


def _tv_convnext_tiny() -> nn.Module:
    # convnext_tiny's blocks (CNBlock, LayerNorm2d, layer scale, stochastic depth) at 1/6 width and depth 1 per stage:
    # the real one has 28M parameters, whose checkpoints alone would take most of the CI budget
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    widths = [(16, 32), (32, 64), (64, 128), (128, None)]
    setting = [CNBlockConfig(cin, cout, 1) for cin, cout in widths]
    return ConvNeXt(setting, stochastic_depth_prob=0.1, num_classes=CLASSES)


def _tv_vit() -> nn.Module:
    from torchvision.models import VisionTransformer

    return VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=CLASSES
    )


def _tv_swin() -> nn.Module:
    from torchvision.models import SwinTransformer

    return SwinTransformer(
        patch_size=[4, 4], embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=[4, 4], num_classes=CLASSES
    )


def _timm(name: str, **kw: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm

        return timm.create_model(name, pretrained=False, num_classes=CLASSES, **kw)

    return build


class _Bert(nn.Module):
    """``BertForSequenceClassification`` returning plain logits (so every technique sees a tensor output)."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertForSequenceClassification

        config = BertConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=TOKENS + 4,
            num_labels=LABELS,
        )
        self.model = BertForSequenceClassification(config)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


# ---------------------------------------------------------------------------------------------------- LightningModules
class ZooModule(_Counted, L.LightningModule):
    """A plain LightningModule around one zoo net: its own SGD/AdamW + StepLR, cross-entropy, synthetic data."""

    def __init__(self, arch: str, lr: float | None = None) -> None:
        super().__init__()
        info = ARCHS[arch]
        self.save_hyperparameters()  # plain python only: `arch` and `lr`
        self.kind = info.kind
        self.lr = lr if lr is not None else (1e-3 if info.kind == "tokens" else 0.05)
        self.use_scheduler = True  # False: configure_optimizers returns the optimizer alone
        self.optimizer_name: str | None = None  # a registry name instead of SGD / AdamW (see `build(schedule_free=)`)
        self.label_smoothing = 0.0  # read by the loss, as timm / torchvision training scripts do
        self.smoothing_seen: set[tuple[str, float]] = set()  # (stage, label_smoothing) the losses saw
        self.batch_size = BATCH
        self.net = info.net()

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.net(*args, **kwargs)

    def _logits_and_labels(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kind == "tokens":
            return self(batch["input_ids"], batch["attention_mask"]), batch["labels"]
        x, y = batch
        return self(x), y

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self._count()
        logits, y = self._logits_and_labels(batch)
        loss = F.cross_entropy(logits, y, label_smoothing=self.label_smoothing)
        self.smoothing_seen.add(("train", self.label_smoothing))
        self.log("train_loss", loss, batch_size=len(y))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        logits, y = self._logits_and_labels(batch)
        self.smoothing_seen.add(("val", self.label_smoothing))
        self.log("val_loss", F.cross_entropy(logits, y), batch_size=len(y))

    def configure_optimizers(self) -> Any:
        # every parameter goes in (frozen ones too), as FineTuneFreezing asks; a per-epoch scheduler to keep in sync
        if self.optimizer_name is not None:
            opt = create_optimizer(self.parameters(), OptimizerConfig(self.optimizer_name, lr=self.lr))
        elif self.kind == "tokens":
            opt: torch.optim.Optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)
        else:
            opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, weight_decay=1e-4)
        if not self.use_scheduler:
            return opt
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]

    def _loader(self, n: int, offset: int) -> DataLoader:
        tokens = self.kind == "tokens"
        dataset = _DictDataset(token_data(n, offset)) if tokens else TensorDataset(*image_data(n, offset))
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=False)

    def train_dataloader(self) -> DataLoader:
        return self._loader(SAMPLES, 0)

    def val_dataloader(self) -> DataLoader:
        return self._loader(BATCH, 2)  # one batch: every technique also meets an eval-mode, no-grad step

    def fixed_inputs(self) -> tuple[torch.Tensor, ...]:
        """Held-out forward arguments for comparing two models' outputs."""
        if self.kind == "tokens":
            d = token_data(4, offset=1)
            return d["input_ids"], d["attention_mask"]
        return (image_data(4, offset=1)[0],)


class ZooMixinModule(SpeedupMixin, ZooModule):
    """The same module with ``configure_optimizers`` from :class:`lightning_speedups.SpeedupMixin` configs."""

    def __init__(self, arch: str, lr: float | None = None) -> None:
        kind = ARCHS[arch].kind
        opt = {"name": "adamw", "lr": 1e-3} if kind == "tokens" else {"name": "sgd", "lr": 0.05, "momentum": 0.9}
        super().__init__(
            arch, lr, optimizer_config=opt, scheduler_config={"name": "step", "step_size": 1, "gamma": 0.5}
        )


class ZooBoringModel(_Counted, BoringModel):
    """Lightning's ``BoringModel`` (its own SGD + StepLR, MSE loss and validation step) on fixed random vectors."""

    def __init__(self, arch: str = "boring") -> None:
        super().__init__()
        self.batch_size = BATCH

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self._count()
        return super().training_step(batch, batch_idx)

    def _loader(self, n: int, seed: int) -> DataLoader:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            dataset = RandomDataset(32, n)
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=False)

    def train_dataloader(self) -> DataLoader:
        return self._loader(SAMPLES, DATA_SEED)

    def val_dataloader(self) -> DataLoader:  # BoringModel's own: 64 batches of 1 from the global RNG
        return self._loader(BATCH, DATA_SEED + 2)

    def fixed_inputs(self) -> tuple[torch.Tensor, ...]:
        return (torch.randn(4, 32, generator=_generator(1)),)


class ZooLightningTransformer(_Counted, LightningTransformer):
    """Lightning's demo ``LightningTransformer`` (nn.Transformer LM, its own SGD) on synthetic tokens, no WikiText2."""

    def __init__(self, arch: str = "lightning_transformer") -> None:
        super().__init__(vocab_size=VOCAB)
        self.model = Transformer(vocab_size=VOCAB, ninp=32, nhead=2, nhid=64, nlayers=1)  # demo default: 200 wide
        self.batch_size = BATCH

    def prepare_data(self) -> None:  # the demo downloads WikiText2 here
        pass

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self._count()
        return super().training_step(batch, batch_idx)

    def _tokens(self, n: int, offset: int) -> TensorDataset:
        g = _generator(offset)
        seq = torch.randint(0, VOCAB, (n, TOKENS + 1), generator=g)
        return TensorDataset(seq[:, :-1], seq[:, 1:])  # (inputs, target): what its training_step unpacks

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self._tokens(SAMPLES, 0), batch_size=self.batch_size, shuffle=False)

    def fixed_inputs(self) -> tuple[torch.Tensor, ...]:
        return self._tokens(4, 1).tensors


class ZooGPT2(_Counted, L.LightningModule):
    """Hugging Face ``GPT2LMHeadModel`` (``lm_head`` tied to the token embedding, ``Conv1D`` layers) in a tiny config,
    its loss computed inside ``forward`` (``labels=``), AdamW + StepLR, on fixed-length windows of a token stream."""

    def __init__(self, arch: str = "gpt2") -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=TOKENS, bos_token_id=1, eos_token_id=2
        )
        self.net = GPT2LMHeadModel(config)
        self.batch_size = BATCH
        self.use_scheduler = True

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids=input_ids).logits

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self._count()
        loss = self.net(input_ids=batch[0], labels=batch[0]).loss  # HF shifts the labels itself
        self.log("train_loss", loss, batch_size=len(batch[0]))
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=0.01)  # frozen parameters in too
        if not self.use_scheduler:
            return opt
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]

    def _windows(self, n: int, offset: int) -> TensorDataset:
        g = _generator(offset)
        stream = torch.randint(1, VOCAB, (n * TOKENS,), generator=g)
        starts = torch.randint(0, len(stream) - TOKENS, (n,), generator=g)
        return TensorDataset(torch.stack([stream[s : s + TOKENS] for s in starts.tolist()]))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self._windows(SAMPLES, 0), batch_size=self.batch_size, shuffle=False)

    def fixed_inputs(self) -> tuple[torch.Tensor, ...]:
        return self._windows(4, 1).tensors


# ---------------------------------------------------------------------------------------------------- the catalogue
@dataclass(frozen=True)
class Arch:
    """One zoo row: ``net`` builds the bare network (ZooModule rows); ``module`` builds the LightningModule."""

    name: str
    kind: str  # "image" | "tokens" | "boring" | "lm"
    net: Callable[[], nn.Module] | None = None
    module_cls: type[L.LightningModule] = ZooModule
    base: str | None = None  # mixin rows: the arch whose net they reuse
    source: str = ""
    techniques: tuple[str, ...] | None = None  # only these columns (a row added for a few techniques); None = all

    def module(self) -> L.LightningModule:
        return self.module_cls(self.base or self.name)


def _arch_list() -> list[Arch]:
    tv = "torchvision"
    tm = "timm"
    return [
        Arch("resnet18", "image", _tv("resnet18"), source=f"{tv} resnet18"),
        Arch("mobilenet_v3_small", "image", _tv("mobilenet_v3_small"), source=f"{tv} mobilenet_v3_small"),
        Arch("efficientnet_b0", "image", _tv("efficientnet_b0"), source=f"{tv} efficientnet_b0"),
        Arch("convnext_tiny", "image", _tv_convnext_tiny, source=f"{tv} ConvNeXt, convnext_tiny blocks, 1/6 width"),
        Arch("regnet_y_400mf", "image", _tv("regnet_y_400mf"), source=f"{tv} regnet_y_400mf"),
        Arch("vit", "image", _tv_vit, source=f"{tv} VisionTransformer, 32px, patch 8, 2 layers, dim 32"),
        Arch("swin", "image", _tv_swin, source=f"{tv} SwinTransformer, patch 4, dim 16, depths [1, 1]"),
        Arch("timm_resnet18", "image", _timm("resnet18"), source=f"{tm} resnet18"),
        Arch(
            "timm_vit_tiny",
            "image",
            _timm("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2),
            source=f"{tm} vit_tiny_patch16_224, 32px, patch 8, depth 2",
        ),
        Arch("timm_efficientnet_b0", "image", _timm("efficientnet_b0"), source=f"{tm} efficientnet_b0"),
        Arch("bert", "tokens", _Bert, source="transformers BertForSequenceClassification, hidden 32, 2 layers"),
        Arch("boring", "boring", module_cls=ZooBoringModel, source="lightning BoringModel"),
        Arch(
            "lightning_transformer",
            "lm",
            module_cls=ZooLightningTransformer,
            source="lightning demos LightningTransformer, dim 32, 1+1 layers",
        ),
        Arch(
            "resnet18_mixin",
            "image",
            _tv("resnet18"),
            ZooMixinModule,
            base="resnet18",
            source=f"{tv} resnet18 + SpeedupMixin",
        ),
        Arch(
            "vit_mixin", "image", _tv_vit, ZooMixinModule, base="vit", source=f"{tv} VisionTransformer + SpeedupMixin"
        ),
        Arch("bert_mixin", "tokens", _Bert, ZooMixinModule, base="bert", source="BERT as above + SpeedupMixin"),
        Arch(
            "gpt2",
            "lm",
            module_cls=ZooGPT2,
            source="transformers GPT2LMHeadModel (tied lm_head, Conv1D), n_embd 32, 2 layers",
            techniques=("baseline", "finetune", "finetune_gradual", "pruning_mask"),
        ),
    ]


ARCHS: dict[str, Arch] = {a.name: a for a in _arch_list()}


def build(name: str, seed: int = 0, scheduler: bool = True, schedule_free: bool = False) -> L.LightningModule:
    """A fresh LightningModule for zoo row ``name``, its weights drawn from ``seed``.

    ``scheduler=False`` makes ``configure_optimizers`` return the optimizer alone (for techniques that own the LR
    schedule); Lightning's demo modules keep their own ``configure_optimizers``. ``schedule_free=True`` (zoo and mixin
    modules) builds ``schedule_free_adamw`` (tokens) or ``schedule_free_sgd`` (images) instead, without a scheduler.
    """
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        module = ARCHS[name].module()
    if not scheduler:
        if isinstance(module, SpeedupMixin):
            module.scheduler_config = None
        elif isinstance(module, (ZooModule, ZooGPT2)):
            module.use_scheduler = False
    if schedule_free:
        optimizer = "schedule_free_adamw" if ARCHS[name].kind == "tokens" else "schedule_free_sgd"
        if isinstance(module, SpeedupMixin):
            module.scheduler_config = None
            module.optimizer_config = OptimizerConfig(optimizer, lr=module.optimizer_config.lr)
        elif isinstance(module, ZooModule):
            module.use_scheduler = False
            module.optimizer_name = optimizer
    return module
