"""Decoder language models as people write them, for the tests of issue 51 (import from ``tests.lm_models``).

- :class:`MiniGPT`: a minimal GPT in the style of nanoGPT: ``transformer.wte`` / ``wpe`` / ``h`` / ``ln_f``, a head
  named ``lm_head`` tied to the token embedding, and the loss computed inside ``forward(idx, targets)``;
- :func:`tiny_gpt2`: Hugging Face ``GPT2LMHeadModel`` in a tiny config (``Conv1D`` layers, tied ``lm_head``), offline;
- :class:`LMModule`: a LightningModule training either one on random fixed-length windows of a token stream;
- :func:`exec_gpt`: a GPT whose classes are built by ``exec`` (no source to read, no attention in any name).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

VOCAB = 64
BLOCK = 16
EMBD = 32
IDX_SEED = 7  # held-out token ids for comparing two models' outputs


class _SelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class _Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = _SelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class MiniGPT(nn.Module):
    """nanoGPT's layout: ``lm_head`` tied to ``transformer.wte``; ``forward(idx, targets=None) -> (logits, loss)``."""

    def __init__(self, vocab: int = VOCAB, block: int = BLOCK, n_embd: int = EMBD, n_layer: int = 2) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(vocab, n_embd),
                "wpe": nn.Embedding(block, n_embd),
                "h": nn.ModuleList([_Block(n_embd, 2) for _ in range(n_layer)]),
                "ln_f": nn.LayerNorm(n_embd),
            }
        )
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT does

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, Any]:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def tiny_gpt2(vocab: int = VOCAB) -> nn.Module:
    """Hugging Face GPT-2, 2 layers of width 32, no dropout, built offline with random weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    # no dropout: a resumed run draws no random numbers the uninterrupted one drew differently
    cfg = GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=vocab,
        n_positions=BLOCK,
        bos_token_id=1,
        eos_token_id=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(cfg)


class Windows(Dataset):
    """Random windows of ``block + 1`` tokens of a fixed byte-like stream, as ``(x, y)`` shifted by one."""

    def __init__(self, n: int = 32, block: int = BLOCK, vocab: int = VOCAB, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.stream = torch.randint(0, vocab, (n * block + block + 1,), generator=g)
        self.starts = torch.randint(0, len(self.stream) - block - 1, (n,), generator=g).tolist()
        self.block = block

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.starts[i]
        return self.stream[s : s + self.block], self.stream[s + 1 : s + self.block + 1]


class LMModule(L.LightningModule):
    """Trains ``net`` (``"mini"``: :class:`MiniGPT`, ``"gpt2"``: :func:`tiny_gpt2`) on :class:`Windows`."""

    def __init__(self, net: str = "mini", n: int = 32, batch_size: int = 8) -> None:
        super().__init__()
        self.kind = net
        self.model = MiniGPT() if net == "mini" else tiny_gpt2()
        self.n = n
        self.batch_size = batch_size

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> Any:
        if self.kind == "mini":
            return self.model(idx, targets)
        out = self.model(input_ids=idx, labels=targets)
        return out.logits, out.loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        _, loss = self(*batch)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Windows(self.n), batch_size=self.batch_size, shuffle=False)


_EXEC_SOURCE = """
class Mixer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        return self.proj(w @ v)


class ExecGPT(nn.Module):
    def __init__(self, vocab=64, d=32):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.mix = nn.ModuleList([Mixer(d), Mixer(d)])
        self.out = nn.Linear(d, vocab)

    def forward(self, idx, targets=None):
        x = self.tok(idx)
        for m in self.mix:
            x = x + m(x)
        logits = self.out(x)
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class ExecMLP(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, 2)

    def forward(self, x):
        return torch.softmax(self.b(torch.relu(self.a(x))), dim=-1)
"""


def exec_classes() -> dict[str, type]:
    """``ExecGPT`` (attention by matmul and softmax, in a module named ``mix``) and ``ExecMLP``, built by ``exec``:
    ``inspect.getsource`` cannot read their ``forward``."""
    import math

    namespace: dict[str, Any] = {"nn": nn, "torch": torch, "F": F, "math": math}
    exec(compile(_EXEC_SOURCE, "<generated>", "exec"), namespace)  # noqa: S102 - the point: no source file
    return {name: namespace[name] for name in ("ExecGPT", "ExecMLP")}
