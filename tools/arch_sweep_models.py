"""The rows of the architecture sweep (``tools/arch_sweep.py``): whole model families, built offline, random weights.

A :class:`Row` is one model: a builder, a task (what its batches and loss look like) and the image sizes to try,
smallest first. :func:`register` probes the smallest input the model accepts (a forward in train *and* eval mode, so
aux branches count) and adds it to the zoo's ``ARCHS`` as a :class:`SweepModule` row, so the zoo's ``fit_cell``,
``resume_check`` and ``reload_check`` (``tests/zoo/cells.py``) run it unchanged.

Families: every classification and segmentation builder of ``torchvision.models.list_models()``, the smallest model
of every timm family (name prefix), tiny configs of Hugging Face encoder-only / decoder-only / encoder-decoder /
speech / vision models, and plain recurrent and 1-D convolutional nets.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.zoo.cells import as_tensor
from tests.zoo.models import ARCHS, TOKENS, VOCAB, Arch, ZooModule, _DictDataset, _generator, token_data

__all__ = [
    "ROWS",
    "Row",
    "SweepKwargsModule",
    "SweepModule",
    "all_rows",
    "find_row",
    "register",
    "row_params",
    "sample_rows",
]

CLASSES = 4
SERIES = (16, 8)  # recurrent inputs: (time, features); 1-D convs see (features, time)
TARGET_TOKENS = 8  # decoder length of encoder-decoder rows
AUDIO_SAMPLES = 400  # wav2vec2: 400 samples -> 39 frames with the tiny feature extractor below
WHISPER_MELS = 8
WHISPER_FRAMES = 32  # 2 x max_source_positions


# ---------------------------------------------------------------------------------------------------- rows
@dataclass(frozen=True)
class Row:
    """One sweep row. ``build(size)`` returns the bare net for image side ``size`` (ignored by non-image tasks)."""

    name: str
    family: str  # "hf" | "seq" | "torchvision" | "timm"
    task: str  # image | segment | tokens | lm | seq2seq | audio | whisper | series | series_conv
    build: Callable[[int], nn.Module]
    source: str
    sizes: tuple[int, ...] = (32,)
    arg_names: tuple[str, ...] = ()  # positional forward arguments -> keyword names (Hugging Face rows)
    params: int | None = None

    @property
    def adamw(self) -> bool:  # transformers and recurrent nets train with AdamW 1e-3; CNNs with SGD 0.05
        return self.family in ("hf", "seq") or self.task in ("tokens", "lm", "seq2seq", "audio", "whisper")


# ---------------------------------------------------------------------------------------------------- data
def _images(n: int, offset: int, size: int, segment: bool) -> TensorDataset:
    g = _generator(offset)
    x = torch.randn(n, 3, size, size, generator=g)
    y = torch.randint(0, CLASSES, (n, size, size) if segment else (n,), generator=g)
    return TensorDataset(x, y)


def _lm(n: int, offset: int) -> dict[str, torch.Tensor]:
    d = token_data(n, offset)
    return {
        "input_ids": d["input_ids"],
        "attention_mask": d["attention_mask"],
        "labels": d["input_ids"].masked_fill(d["attention_mask"] == 0, -100),
    }


def _targets(n: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    labels = torch.randint(2, VOCAB, (n, TARGET_TOKENS), generator=g)
    start = torch.zeros(n, 1, dtype=torch.long)  # decoder_start_token_id 0 (T5's pad), shifted right
    return {"decoder_input_ids": torch.cat([start, labels[:, :-1]], 1), "labels": labels}


def _seq2seq(n: int, offset: int) -> dict[str, torch.Tensor]:
    d = token_data(n, offset)
    return {"input_ids": d["input_ids"], "attention_mask": d["attention_mask"], **_targets(n, _generator(offset + 7))}


def _audio(n: int, offset: int) -> dict[str, torch.Tensor]:
    g = _generator(offset)
    return {
        "input_values": torch.randn(n, AUDIO_SAMPLES, generator=g),
        "labels": torch.randint(0, CLASSES, (n,), generator=g),
    }


def _whisper(n: int, offset: int) -> dict[str, torch.Tensor]:
    g = _generator(offset)
    return {"input_features": torch.randn(n, WHISPER_MELS, WHISPER_FRAMES, generator=g), **_targets(n, g)}


def _series(n: int, offset: int, conv: bool) -> TensorDataset:
    g = _generator(offset)
    x = torch.randn(n, *SERIES, generator=g)
    return TensorDataset(x.transpose(1, 2).contiguous() if conv else x, torch.randint(0, CLASSES, (n,), generator=g))


def dataset(task: str, n: int, offset: int, size: int) -> torch.utils.data.Dataset:
    """Deterministic synthetic samples of ``task`` (tuples ``(x, y)`` or Hugging Face style dicts)."""
    if task in ("image", "segment"):
        return _images(n, offset, size, task == "segment")
    if task in ("series", "series_conv"):
        return _series(n, offset, task == "series_conv")
    makers: dict[str, Callable[[int, int], dict[str, torch.Tensor]]] = {
        "tokens": token_data,
        "lm": _lm,
        "seq2seq": _seq2seq,
        "audio": _audio,
        "whisper": _whisper,
    }
    return _DictDataset(makers[task](n, offset))


# ---------------------------------------------------------------------------------------------------- module
def _split(out: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(main logits, aux logits) of a model output: a tensor, GoogLeNet/Inception namedtuples, dicts, ModelOutputs."""
    if isinstance(out, torch.Tensor):
        return out, []
    if isinstance(out, dict):
        key = "logits" if "logits" in out else "out"
        return out[key], [v for k, v in out.items() if k == "aux" and isinstance(v, torch.Tensor)]
    if isinstance(out, (tuple, list)):
        main = out[0]
        return main, [t for t in out[1:] if isinstance(t, torch.Tensor) and t.shape == main.shape]
    raise TypeError(f"cannot find logits in a {type(out).__name__} output")


class SweepModule(ZooModule):
    """A zoo module for a sweep row: the row's data and loss; forward returns the net's own output (dicts,
    ModelOutputs and aux namedtuples included), so techniques meet the model as a user's module would show it."""

    def __init__(self, arch: str, lr: float | None = None) -> None:
        super().__init__(arch, lr)
        self.row = ROWS[arch]
        self.size = SIZES.get(arch, self.row.sizes[0])
        # SGD at 0.01, not the zoo's 0.05: full-size builders at 32 px with batches of 8 diverge to NaN at 0.05; a
        # row whose own (baseline) loss still blows up at 0.01 trains at the lower rate that register() probed
        self.lr = lr if lr is not None else LRS.get(arch, default_lr(self.row))

    def forward(self, x: torch.Tensor) -> Any:  # a plain signature: FX-based techniques trace it
        return self.net(x)

    def _loss(self, batch: Any, smoothing: float) -> tuple[torch.Tensor, int]:
        if isinstance(batch, dict):  # SweepKwargsModule: the batch's features are the forward's keyword arguments
            labels = batch["labels"]
            out = self(**{k: v for k, v in batch.items() if k != "labels"})
        else:
            x, labels = batch
            out = self(x)
        main, aux = _split(out)
        if self.row.task == "lm":  # next-token prediction
            main = main[:, :-1]
            labels = labels[:, 1:]
        if main.dim() == 3:  # (N, T, V) -> (N, V, T), as cross_entropy wants per-token logits
            main = main.transpose(1, 2)
        loss = F.cross_entropy(main, labels, label_smoothing=smoothing, ignore_index=-100)
        for a in aux:  # torchvision's reference scripts weight aux heads 0.3-0.5
            loss = loss + 0.4 * F.cross_entropy(a, labels, label_smoothing=smoothing)
        return loss, len(labels)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self._count()
        loss, n = self._loss(batch, self.label_smoothing)
        self.smoothing_seen.add(("train", self.label_smoothing))
        self.log("train_loss", loss, batch_size=n)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        loss, n = self._loss(batch, 0.0)
        self.smoothing_seen.add(("val", self.label_smoothing))
        self.log("val_loss", loss, batch_size=n)

    def configure_optimizers(self) -> Any:
        if self.row.adamw:
            opt: torch.optim.Optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)
        else:
            opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, weight_decay=1e-4)
        if not self.use_scheduler:
            return opt
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]

    def _loader(self, n: int, offset: int) -> DataLoader:
        return DataLoader(dataset(self.row.task, n, offset, self.size), batch_size=self.batch_size, shuffle=False)

    def fixed_inputs(self) -> tuple[torch.Tensor, ...]:
        sample = dataset(self.row.task, 4, 1, self.size)
        if isinstance(sample, TensorDataset):
            return (sample.tensors[0],)
        return tuple(sample.tensors[k] for k in self.row.arg_names)


class SweepKwargsModule(SweepModule):
    """A sweep module whose net takes keyword arguments (Hugging Face style): positional ones are named by the row."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        kwargs.update(zip(self.row.arg_names, args))
        return self.net(**kwargs)


ROWS: dict[str, Row] = {}
SIZES: dict[str, int] = {}  # probed input side of image rows
LRS: dict[str, float] = {}  # probed learning rate of rows whose baseline diverges at the default one
# a baseline diverges when its loss turns non-finite or ends above BLOWUP x its first, or when its eval-mode outputs
# after the steps are not finite (efficientnet_b6 at 32 px: loss 11 -> 50 -> 26, then NaN outputs from its BN stats)
PROBE_STEPS = 4
BLOWUP = 3.0


def default_lr(row: Row) -> float:
    return 1e-3 if row.adamw else 0.01


def _diverges(arch: str, lr: float) -> bool:
    """Whether the row's baseline (its module, optimizer and data, no technique) diverges in its first steps at ``lr``.

    Techniques are judged by whether they keep training finite; a recipe that blows up without any technique would
    fail them for the row's sake (torchvision efficientnet_b5 at 32 px: loss 8.8 -> 47 in 4 SGD steps at 0.01). The
    check is the sweep's own: the loss, and the trained model's eval-mode outputs on its fixed inputs."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        module = ARCHS[arch].module_cls(arch, lr=lr)  # the class register() chose for the row
        opt = module.configure_optimizers()
        opt, scheds = (opt[0][0], opt[1]) if isinstance(opt, tuple | list) else (opt, [])
        module.train()
        losses: list[float] = []
        while len(losses) < PROBE_STEPS:  # the trainer's epochs: the loader's batches, then the per-epoch schedulers
            for batch in module.train_dataloader():
                loss, _ = module._loss(batch, 0.0)
                losses.append(float(loss.detach()))
                if not math.isfinite(losses[-1]):
                    return True
                opt.zero_grad()
                loss.backward()
                opt.step()
            for sched in scheds:
                sched.step()
        module.eval()  # what the sweep's check reads: the trained model's outputs in eval mode (BatchNorm's stats)
        with torch.no_grad():
            outputs = as_tensor(module(*module.fixed_inputs()))
    return losses[-1] > BLOWUP * losses[0] or not bool(outputs.isfinite().all())


def _short_run(net: nn.Module) -> nn.Module:
    """Batch norms with a very slow running average (MNASNet: momentum 3e-4) follow 4 training steps at momentum 0.1:
    otherwise eval-mode outputs, which reload and resume compare, overflow to inf after the sweep's short runs."""
    for m in net.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.momentum is not None and m.momentum < 0.01:
            m.momentum = 0.1
    return net


def _probe_inputs(row: Row, size: int) -> Any:
    data = dataset(row.task, 2, 3, size)
    if isinstance(data, TensorDataset):
        return (data.tensors[0],), {}
    return (), {k: data.tensors[k] for k in row.arg_names}


def register(row: Row) -> int:
    """Add ``row`` to the zoo's ``ARCHS`` at the smallest of its sizes that runs in train and eval mode; return it.

    Raises:
        RuntimeError: the model runs at none of its sizes (the last error attached).
    """
    last: BaseException | None = None
    for size in row.sizes:
        try:
            with torch.random.fork_rng():
                torch.manual_seed(0)
                net = _short_run(row.build(size))
            args, kwargs = _probe_inputs(row, size)
            for train in (True, False):
                net.train(train)
                with torch.no_grad():
                    _split(net(*args, **kwargs))
        except Exception as err:  # noqa: BLE001 - try the next size
            last = err
            continue
        ROWS[row.name] = row
        SIZES[row.name] = size
        kind = "image" if row.task in ("image", "segment") else "tokens"
        module = SweepKwargsModule if row.arg_names else SweepModule
        ARCHS[row.name] = Arch(row.name, kind, lambda r=row, s=size: _short_run(r.build(s)), module, source=row.source)
        LRS.pop(row.name, None)
        lr = default_lr(row)
        for _ in range(2):  # at most 100x lower
            if not _diverges(row.name, lr):
                break
            lr /= 10
        if lr != default_lr(row):
            LRS[row.name] = lr
        return size
    raise RuntimeError(f"{row.name} runs at none of the sizes {list(row.sizes)}: {type(last).__name__}: {last}")


def row_params(row: Row) -> int | None:
    """Parameter count of ``row`` built on the meta device (no memory, no init), or None when that fails."""
    try:
        with torch.device("meta"):
            net = row.build(row.sizes[-1])
        return sum(p.numel() for p in net.parameters())
    except Exception:  # noqa: BLE001 - RegNet's builder reads tensor values (.item()), which meta tensors lack
        pass
    if row.family == "torchvision":  # the weights' metadata (offline; 1000 classes, close enough to order rows)
        import torchvision.models as tvm

        try:
            return int(tvm.get_model_weights(row.name.removeprefix("tv_")).DEFAULT.meta["num_params"])
        except Exception:  # noqa: BLE001 - a builder without registered weights
            return None
    return None


# ---------------------------------------------------------------------------------------------------- Hugging Face
_TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def _hf(model_cls: str, config_cls: str, **config: Any) -> Callable[[int], nn.Module]:
    def build(size: int) -> nn.Module:
        import transformers

        cfg = getattr(transformers, config_cls)(**config)
        return getattr(transformers, model_cls)(cfg)

    return build


def hf_rows() -> list[Row]:
    ids = ("input_ids", "attention_mask")
    s2s = (*ids, "decoder_input_ids")
    return [
        Row(
            "hf_bert",
            "hf",
            "tokens",
            _hf(
                "BertForSequenceClassification",
                "BertConfig",
                vocab_size=VOCAB,
                **_TINY,
                max_position_embeddings=TOKENS + 4,
                num_labels=CLASSES,
            ),
            "BERT (encoder-only), hidden 32, 2 layers",
            arg_names=ids,
        ),
        Row(
            "hf_gpt2",
            "hf",
            "lm",
            _hf(
                "GPT2LMHeadModel",
                "GPT2Config",
                vocab_size=VOCAB,
                n_positions=32,
                n_embd=32,
                n_layer=2,
                n_head=2,
                bos_token_id=1,
                eos_token_id=2,
            ),
            "GPT-2 (decoder-only, tied embeddings), dim 32, 2 layers",
            arg_names=ids,
        ),
        Row(
            "hf_llama",
            "hf",
            "lm",
            _hf(
                "LlamaForCausalLM",
                "LlamaConfig",
                vocab_size=VOCAB,
                **_TINY,
                num_key_value_heads=1,
                max_position_embeddings=32,
            ),
            "Llama (decoder-only, GQA, RMSNorm), dim 32",
            arg_names=ids,
        ),
        Row(
            "hf_t5",
            "hf",
            "seq2seq",
            _hf(
                "T5ForConditionalGeneration",
                "T5Config",
                vocab_size=VOCAB,
                d_model=32,
                d_kv=16,
                d_ff=64,
                num_layers=2,
                num_heads=2,
                decoder_start_token_id=0,
                pad_token_id=0,
            ),
            "T5 (encoder-decoder, tied embeddings), d_model 32, 2+2 layers",
            arg_names=s2s,
        ),
        Row(
            "hf_whisper",
            "hf",
            "whisper",
            _hf(
                "WhisperForConditionalGeneration",
                "WhisperConfig",
                vocab_size=VOCAB,
                num_mel_bins=WHISPER_MELS,
                encoder_layers=1,
                decoder_layers=1,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                d_model=32,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
                max_source_positions=WHISPER_FRAMES // 2,
                max_target_positions=32,
                decoder_start_token_id=0,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=1,
            ),
            "Whisper (speech encoder-decoder), d_model 32, 1+1 layers",
            arg_names=("input_features", "decoder_input_ids"),
        ),
        Row(
            "hf_wav2vec2",
            "hf",
            "audio",
            _hf(
                "Wav2Vec2ForSequenceClassification",
                "Wav2Vec2Config",
                **_TINY,
                conv_dim=(16, 16),
                conv_stride=(5, 2),
                conv_kernel=(10, 3),
                num_conv_pos_embeddings=8,
                num_conv_pos_embedding_groups=2,
                classifier_proj_size=16,
                num_labels=CLASSES,
                mask_time_prob=0.0,
            ),
            "Wav2Vec2 (speech, weight-norm positional conv), hidden 32, 2 layers",
            arg_names=("input_values",),
        ),
        Row(
            "hf_vit",
            "hf",
            "image",
            _hf("ViTForImageClassification", "ViTConfig", **_TINY, image_size=32, patch_size=8, num_labels=CLASSES),
            "ViT (vision, ModelOutput logits), 32px, patch 8, dim 32",
        ),
        Row(
            "hf_distilbert",
            "hf",
            "tokens",
            _hf(
                "DistilBertForSequenceClassification",
                "DistilBertConfig",
                vocab_size=VOCAB,
                dim=32,
                n_layers=2,
                n_heads=2,
                hidden_dim=64,
                max_position_embeddings=32,
                num_labels=CLASSES,
            ),
            "DistilBERT (encoder-only), dim 32, 2 layers",
            arg_names=ids,
        ),
        Row(
            "hf_bart",
            "hf",
            "seq2seq",
            _hf(
                "BartForConditionalGeneration",
                "BartConfig",
                vocab_size=VOCAB,
                d_model=32,
                encoder_layers=1,
                decoder_layers=1,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
                max_position_embeddings=32,
                decoder_start_token_id=0,
                pad_token_id=1,
                bos_token_id=0,
                eos_token_id=2,
            ),
            "BART (encoder-decoder), d_model 32, 1+1 layers",
            arg_names=s2s,
        ),
    ]


# ---------------------------------------------------------------------------------------------------- recurrent, 1-D
class RecurrentNet(nn.Module):
    """``rnn`` (batch first) over (N, T, F) series, or over embedded tokens, classified from the last step."""

    def __init__(self, kind: str, tokens: bool = False, bidirectional: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, SERIES[1], padding_idx=0) if tokens else None
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[kind]
        self.rnn = rnn(SERIES[1], 32, num_layers=2, batch_first=True, bidirectional=bidirectional)
        self.fc = nn.Linear(64 if bidirectional else 32, CLASSES)

    def forward(
        self,
        x: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = input_ids if x is None else x
        h, _ = self.rnn(self.embed(x) if self.embed is not None else x)
        return self.fc(h[:, -1])


def _conv1d() -> nn.Module:
    c = SERIES[1]
    return nn.Sequential(
        nn.Conv1d(c, 32, 5, padding=2),
        nn.BatchNorm1d(32),
        nn.ReLU(),
        nn.Conv1d(32, 64, 3, padding=2, dilation=2),
        nn.BatchNorm1d(64),
        nn.ReLU(),
        nn.Conv1d(64, 64, 3, padding=1, groups=4),
        nn.BatchNorm1d(64),
        nn.ReLU(),
        nn.AdaptiveAvgPool1d(1),
        nn.Flatten(),
        nn.Linear(64, CLASSES),
    )


def seq_rows() -> list[Row]:
    return [
        Row("lstm", "seq", "series", lambda s: RecurrentNet("lstm"), "nn.LSTM x2 (hidden 32) + Linear on (N, 16, 8)"),
        Row("gru", "seq", "series", lambda s: RecurrentNet("gru"), "nn.GRU x2 (hidden 32) + Linear"),
        Row("rnn_tanh", "seq", "series", lambda s: RecurrentNet("rnn"), "nn.RNN x2 (hidden 32) + Linear"),
        Row(
            "bilstm_tokens",
            "seq",
            "tokens",
            lambda s: RecurrentNet("lstm", tokens=True, bidirectional=True),
            "Embedding + bidirectional nn.LSTM x2 + Linear on tokens",
            arg_names=("input_ids", "attention_mask"),
        ),
        Row("conv1d", "seq", "series_conv", lambda s: _conv1d(), "Conv1d/BatchNorm1d x3 (dilated, grouped) + Linear"),
    ]


# ---------------------------------------------------------------------------------------------------- torchvision
def _tv(name: str, segment: bool) -> Callable[[int], nn.Module]:
    def build(size: int) -> nn.Module:
        import torchvision

        kw: dict[str, Any] = {"weights": None, "num_classes": CLASSES}
        if segment:
            kw["weights_backbone"] = None
            if not name.startswith("lraspp"):
                kw["aux_loss"] = True  # the {'out', 'aux'} dict output of the reference training scripts
        if name in ("googlenet", "inception_v3"):
            kw["aux_logits"] = True
            kw["init_weights"] = True
        if name.startswith("vit_"):  # learned positions for `image_size`: built at the sweep's small sizes too
            kw["image_size"] = size
        return torchvision.models.get_model(name, **kw)

    return build


def torchvision_rows() -> list[Row]:
    import torchvision.models as tvm

    sizes = (32, 64, 96, 128, 160, 224, 299)
    rows = [
        Row(f"tv_{n}", "torchvision", "image", _tv(n, False), f"torchvision {n}", sizes)
        for n in tvm.list_models(module=tvm)
    ]
    rows += [
        Row(f"tv_{n}", "torchvision", "segment", _tv(n, True), f"torchvision {n} (segmentation)", sizes[:4])
        for n in tvm.list_models(module=tvm.segmentation)
    ]
    return rows


# ---------------------------------------------------------------------------------------------------- timm
# timm's encoder-only variants (``gemma4_vit_167m_enc``): token features for a language model, no classifier head;
# a family's smallest classifier is swept instead where it has one
_ENCODER_ONLY = "_enc"


def timm_family(name: str) -> str:
    """The family of a timm model: its name up to the first digit or underscore (``resnet18`` -> ``resnet``)."""
    return re.split(r"[_\d]", name)[0] or name


def _timm(name: str) -> Callable[[int], nn.Module]:
    def build(size: int) -> nn.Module:
        import timm

        try:  # fixed-size models (ViTs, Swin, ...) take their input size as an argument
            return timm.create_model(name, pretrained=False, num_classes=CLASSES, img_size=size)
        except TypeError:
            return timm.create_model(name, pretrained=False, num_classes=CLASSES)

    return build


def timm_rows(cache: Path | None = None) -> list[Row]:
    """The smallest model of every timm family: every name of the family counted on the meta device, the smallest
    parameter count kept (a classifier before an encoder-only ``_enc`` variant). Cached in ``cache`` (JSON).

    Every name is counted, not the smallest-sounding ones: names do not order sizes (``aimv2_large`` is a quarter of
    ``aimv2_1b``, ``convnext_zepto`` smaller than ``convnext_atto``)."""
    import timm

    sizes = (32, 64, 96, 128, 160, 224, 240, 256)  # crossvit: multiples of 240
    chosen: dict[str, list[Any]] = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    if not chosen:
        families: dict[str, list[str]] = {}
        for name in timm.list_models():
            families.setdefault(timm_family(name), []).append(name)
        for fam, names in sorted(families.items()):
            counted = [(row_params(Row(n, "timm", "image", _timm(n), "", (224,))), n) for n in names]
            ok = sorted((p, n) for p, n in counted if p is not None)
            classifiers = [c for c in ok if not c[1].endswith(_ENCODER_ONLY)] or ok
            chosen[fam] = list(classifiers[0]) if ok else [None, min(names, key=lambda n: (len(n), n))]
        if cache is not None:
            cache.write_text(json.dumps(chosen, indent=1, sort_keys=True))
    return [
        Row(
            f"timm_{fam}",
            "timm",
            "image",
            _timm(name),
            f"timm {name} (smallest of family {fam!r})",
            sizes,
            params=params,
        )
        for fam, (params, name) in sorted(chosen.items())
    ]


def all_rows(families: tuple[str, ...], timm_cache: Path | None = None) -> list[Row]:
    """The rows of ``families`` in sweep order: Hugging Face, recurrent / 1-D, torchvision (smallest first), timm."""
    rows: list[Row] = []
    if "hf" in families:
        rows += hf_rows()
    if "seq" in families:
        rows += seq_rows()
    if "torchvision" in families:
        tv = [
            Row(r.name, r.family, r.task, r.build, r.source, r.sizes, params=row_params(r)) for r in torchvision_rows()
        ]
        rows += sorted(tv, key=lambda r: (r.params is None, r.params or 0, r.name))
    if "timm" in families:
        rows += timm_rows(timm_cache)
    return rows


# ---------------------------------------------------------------------------------------------------- the CI sample
def _seg_tiny(size: int) -> nn.Module:
    """torchvision's FCN (``{'out', 'aux'}`` dict output, bilinear upsampling to the input) on a 2-stage tiny CNN."""
    from collections import OrderedDict

    from torchvision.models._utils import IntermediateLayerGetter
    from torchvision.models.segmentation.fcn import FCN, FCNHead

    def stage(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, 2, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    body = nn.Sequential(OrderedDict(layer1=stage(3, 16), layer2=stage(16, 32)))
    backbone = IntermediateLayerGetter(body, {"layer2": "out", "layer1": "aux"})
    return FCN(backbone, FCNHead(32, CLASSES), FCNHead(16, CLASSES))


def _mixer_tiny(size: int) -> nn.Module:
    from timm.models.mlp_mixer import MlpMixer

    return MlpMixer(num_classes=CLASSES, img_size=size, patch_size=8, num_blocks=2, embed_dim=32)


def _bn_cnn(size: int) -> nn.Module:
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(
        *block(3, 16), nn.MaxPool2d(2), *block(16, 32), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, CLASSES)
    )


class ClippedLinear(nn.Linear):
    """Gemma 4's clipped linear in little: clip bounds kept as buffers, starting at -inf / +inf (no clipping)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__(n_in, n_out)
        for name, value in (("input_min", -math.inf), ("input_max", math.inf)):
            self.register_buffer(name, torch.tensor(value))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.clamp(self.input_min, self.input_max))


def _clipped_cnn(size: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), ClippedLinear(16, CLASSES)
    )


class AuxNet(nn.Module):
    """Inception's aux-logit pattern in little: in train mode a second head (avg-pool 5/3, then a 5x5 conv) returns
    ``(logits, aux_logits)``; eval mode returns the logits only. Below 34 px the aux branch cannot run."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.aux = nn.Sequential(
            nn.AvgPool2d(5, stride=3),
            nn.Conv2d(16, 8, 1),
            nn.ReLU(),
            nn.Conv2d(8, 16, 5),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(16, CLASSES),
        )
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, CLASSES))

    def forward(self, x: torch.Tensor) -> Any:
        x = self.stem(x)
        out = self.head(self.body(x))
        return (out, self.aux(x)) if self.training else out


def sample_rows() -> list[Row]:
    """The rows of the CI sample that are not full-size family rows (tiny stand-ins of a class), then those that are."""
    named = {r.name: r for r in hf_rows() + seq_rows()}
    sizes = (32, 64, 96)
    return [
        Row("seg_tiny", "sample", "segment", _seg_tiny, "torchvision FCN ({'out', 'aux'} dict) on a 2-stage tiny CNN"),
        Row("mixer_tiny", "sample", "image", _mixer_tiny, "timm MlpMixer, 32px, patch 8, 2 blocks, dim 32"),
        Row("bn_cnn", "sample", "image", _bn_cnn, "Conv2d/BatchNorm2d x2 + Linear"),
        Row("clipped_cnn", "sample", "image", _clipped_cnn, "Conv2d + a Linear with -inf/+inf clip-bound buffers"),
        Row(
            "aux_tiny",
            "sample",
            "image",
            lambda s: AuxNet(),
            "Inception-style aux head (train mode only), tiny",
            (32, 48, 64),
        ),
        Row(
            "tv_googlenet", "torchvision", "image", _tv("googlenet", False), "torchvision googlenet (aux_logits)", sizes
        ),
        Row(
            "tv_mnasnet0_5",
            "torchvision",
            "image",
            _tv("mnasnet0_5", False),
            "torchvision mnasnet0_5 (versioned _load_from_state_dict)",
            sizes,
        ),
        Row(
            "tv_shufflenet_v2_x0_5",
            "torchvision",
            "image",
            _tv("shufflenet_v2_x0_5", False),
            "torchvision shufflenet_v2_x0_5 (channel shuffle)",
            sizes,
        ),
        named["hf_t5"],
        named["hf_whisper"],
        named["hf_wav2vec2"],
        named["hf_gpt2"],
        named["hf_llama"],
        named["lstm"],
    ]


def find_row(name: str, timm_cache: Path | None = None) -> Row:
    """The row called ``name`` (sample rows, then its family's rows, without counting parameters)."""
    for row in sample_rows() + hf_rows() + seq_rows():
        if row.name == name:
            return row
    rows = torchvision_rows() if name.startswith("tv_") else timm_rows(timm_cache) if name.startswith("timm_") else []
    for row in rows:
        if row.name == name:
            return row
    raise KeyError(f"no sweep row {name!r}")
