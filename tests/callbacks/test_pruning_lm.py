"""MaskPruning on decoder LMs (issue 51): a minimal GPT (tied ``lm_head``, loss in ``forward``) and a
tiny Hugging Face GPT-2 (``Conv1D`` layers) fit, resume to the uninterrupted run's weights and reload."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_speedups import load_checkpoint
from lightning_speedups.callbacks.pruning import MaskPruning
from lightning_speedups.functional.pruning import masked_modules
from tests.helpers import quiet_trainer
from tests.lm_models import IDX_SEED, LMModule


def _fit(net: str, root, ckpt_path=None, seed: int = 0) -> tuple[LMModule, L.Trainer, MaskPruning]:
    L.seed_everything(seed)
    model = LMModule(net, n=16)
    cb = MaskPruning(amount=0.5, start_epoch=0, end_epoch=1, steps=2)
    ckpt = ModelCheckpoint(dirpath=root, filename="{epoch}", save_top_k=-1, every_n_epochs=1)
    trainer = quiet_trainer(max_epochs=2, callbacks=[cb, ckpt], enable_checkpointing=True, default_root_dir=root)
    trainer.fit(model, ckpt_path=ckpt_path)
    return model, trainer, cb


def _zeros(model: torch.nn.Module, layers: list[str]) -> int:
    return sum(int((model.get_submodule(n).weight == 0).sum()) for n in layers)


@pytest.mark.parametrize("net", ["mini", "gpt2"])
def test_pruning_fit_resume_reload_lm(net, tmp_path):
    if net == "gpt2":
        pytest.importorskip("transformers")
    model, trainer, cb = _fit(net, tmp_path / "run")
    layers = list(cb.last_summary.layers)
    kind = "Conv1D" if net == "gpt2" else "Linear"
    assert len(layers) == 8 and all(type(model.get_submodule(n)).__name__ == kind for n in layers)
    assert "model.lm_head" not in layers and not masked_modules(model)  # the tied head dense; masks folded in
    total = sum(model.get_submodule(n).weight.numel() for n in layers)
    assert _zeros(model, layers) == round(0.5 * total)
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(IDX_SEED))
    with torch.no_grad():
        expected = model.eval()(idx)[0]
    final = {k: v.clone() for k, v in model.state_dict().items()}

    resumed, _, _ = _fit(net, tmp_path / "resume", ckpt_path=tmp_path / "run" / "epoch=0.ckpt", seed=1)
    for k, v in resumed.state_dict().items():
        torch.testing.assert_close(v, final[k], msg=f"{k} differs from the uninterrupted run")

    fresh = load_checkpoint(LMModule(net, n=16), tmp_path / "run" / "epoch=1.ckpt").eval()
    with torch.no_grad():
        torch.testing.assert_close(fresh(idx)[0], expected)
    assert _zeros(fresh, layers) == round(0.5 * total)
