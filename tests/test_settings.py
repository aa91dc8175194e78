"""trainer_settings decisions with mocked hardware, and every bad input."""

from __future__ import annotations

import pytest
import torch

import lightning_speedups.settings as S
from lightning_speedups import SpeedupConfigError
from lightning_speedups.settings import enable_speed_flags, explain_trainer_settings, trainer_settings


@pytest.fixture
def hw(monkeypatch):
    """Mock the hardware probes; returns a setter."""

    def set_hw(
        cuda: int = 0,
        bf16: bool = True,
        xla: bool = False,
        tpu: int = 0,
        mps: bool = False,
        jupyter: bool = False,
        cpu_bf16: float = 0.1,
    ) -> None:
        monkeypatch.setattr(S, "_cuda_device_count", lambda: cuda)
        monkeypatch.setattr(S, "_cuda_bf16_supported", lambda: bool(cuda) and bf16)
        monkeypatch.setattr(S, "_torch_xla_installed", lambda: xla)
        monkeypatch.setattr(S, "_tpu_device_count", lambda: tpu if xla else 0)
        monkeypatch.setattr(S, "_mps_available", lambda: mps)
        monkeypatch.setattr(S, "_in_jupyter", lambda: jupyter)
        monkeypatch.setattr(S, "cpu_bf16_speed_ratio", lambda: cpu_bf16)

    set_hw()
    return set_hw


@pytest.mark.parametrize(
    ("cuda", "bf16", "devices", "strategy", "precision"),
    [
        (0, False, 1, "auto", "32-true"),
        (1, True, 1, "auto", "bf16-mixed"),
        (1, False, 1, "auto", "16-mixed"),
        (2, True, 2, "ddp", "bf16-mixed"),
        (8, False, 8, "ddp", "16-mixed"),
    ],
)
def test_settings_auto_cuda_counts(hw, cuda, bf16, devices, strategy, precision):
    hw(cuda=cuda, bf16=bf16)
    s = explain_trainer_settings()
    assert s.kwargs["accelerator"] == ("cuda" if cuda else "cpu")
    assert s.kwargs["devices"] == devices
    assert s.kwargs["strategy"] == strategy
    assert s.kwargs["precision"] == precision
    assert set(s.reasons) >= {"accelerator", "devices", "strategy", "precision"}
    assert "precision" in s.explain()


def test_settings_cpu_bf16_measured(hw):
    hw(cpu_bf16=2.0)
    assert trainer_settings()["precision"] == "bf16-mixed"
    hw(cpu_bf16=0.1)
    s = explain_trainer_settings()
    assert s.kwargs["precision"] == "32-true"
    assert "0.10x" in s.reasons["precision"]


def test_settings_cpu_bf16_explicit_warns_when_slow(hw):
    hw(cpu_bf16=0.1)
    with pytest.warns(UserWarning, match="slower, not faster"):
        assert trainer_settings(accelerator="cpu", precision="bf16-mixed")["precision"] == "bf16-mixed"


def test_settings_jupyter_and_tpu(hw):
    hw(cuda=4, jupyter=True)
    assert trainer_settings()["strategy"] == "ddp_notebook"
    hw(xla=True, tpu=8)
    kw = trainer_settings()
    assert (kw["accelerator"], kw["devices"], kw["strategy"], kw["precision"]) == ("tpu", 8, "xla", "bf16-mixed")
    hw(mps=True)
    assert trainer_settings()["accelerator"] == "mps"


def test_settings_multi_node(hw):
    hw(cuda=8)
    s = explain_trainer_settings(num_nodes=4)
    assert s.kwargs["strategy"] == "ddp" and s.kwargs["num_nodes"] == 4
    assert "torchrun" in s.reasons["num_nodes"]
    hw(cuda=0)
    kw = trainer_settings(accelerator="cpu", devices=2, num_nodes=2)
    assert kw["strategy"] == "ddp" and kw["num_nodes"] == 2


def test_settings_overrides_and_aliases(hw):
    kw = trainer_settings(precision=32, max_epochs=3, strategy="ddp_spawn", devices=2)
    assert kw["precision"] == "32-true" and kw["max_epochs"] == 3 and kw["strategy"] == "ddp_spawn"
    hw(cuda=2)
    assert trainer_settings(precision="bf16")["precision"] == "bf16-mixed"
    assert trainer_settings(devices=[1])["devices"] == [1]


def test_settings_misconfiguration(hw):
    with pytest.raises(SpeedupConfigError, match="removed DataParallel"):
        trainer_settings(strategy="dp")
    with pytest.raises(SpeedupConfigError, match="removed DataParallel"):
        trainer_settings(strategy="DataParallel")
    with pytest.raises(SpeedupConfigError, match=r"`strategy`='ddp3' is not supported. Allowed values: 'auto', 'ddp'"):
        trainer_settings(strategy="ddp3")
    with pytest.raises(SpeedupConfigError, match=r"`accelerator`='tpu' needs `torch_xla`.*pip install torch_xla"):
        trainer_settings(accelerator="tpu")
    with pytest.raises(SpeedupConfigError, match=r"`accelerator`='gpu' but no CUDA GPU is available"):
        trainer_settings(accelerator="gpu")
    with pytest.raises(SpeedupConfigError, match=r"`accelerator`='cuda' but no CUDA GPU"):
        trainer_settings(accelerator="cuda")
    with pytest.raises(SpeedupConfigError, match=r"`accelerator`='npu' is not supported. Allowed values: 'auto'"):
        trainer_settings(accelerator="npu")
    with pytest.raises(SpeedupConfigError, match=r"`precision`='8-mixed' is not supported. Allowed values"):
        trainer_settings(precision="8-mixed")
    with pytest.raises(SpeedupConfigError, match=r"`precision`='16-mixed' on CPU"):
        trainer_settings(accelerator="cpu", precision=16)
    with pytest.raises(SpeedupConfigError, match=r"`devices`=0 is invalid"):
        trainer_settings(devices=0)
    with pytest.raises(SpeedupConfigError, match=r"`num_nodes`=0 is invalid"):
        trainer_settings(num_nodes=0)
    with pytest.raises(SpeedupConfigError, match=r"`max_epoch` is not a lightning.Trainer argument.*max_epochs"):
        trainer_settings(max_epoch=3)
    with pytest.raises(SpeedupConfigError, match=r"`strategy`='fsdp' shards a model across CUDA GPUs"):
        trainer_settings(strategy="fsdp")
    with pytest.raises(SpeedupConfigError, match=r"`strategy`='xla' needs accelerator='tpu'"):
        trainer_settings(strategy="xla")
    hw(cuda=2, bf16=False)
    with pytest.raises(SpeedupConfigError, match=r"`devices`=4 but only 2 cuda device\(s\) are present"):
        trainer_settings(devices=4)
    with pytest.raises(SpeedupConfigError, match=r"`devices`=\[0, 5\] names device indices that do not exist"):
        trainer_settings(devices=[0, 5])
    with pytest.raises(SpeedupConfigError, match=r"`precision`='bf16-mixed' but this GPU has no bf16 support"):
        trainer_settings(precision="bf16-mixed")
    hw(xla=True, tpu=0)
    with pytest.raises(SpeedupConfigError, match=r"torch_xla finds no TPU"):
        trainer_settings(accelerator="tpu")
    hw(cuda=2, jupyter=True)
    with pytest.raises(SpeedupConfigError, match=r"'ddp_notebook' cannot span several nodes"):
        trainer_settings(strategy="ddp_notebook", num_nodes=2)


def test_settings_error_is_lightning_and_value_error():
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    assert issubclass(SpeedupConfigError, ValueError) and issubclass(SpeedupConfigError, MisconfigurationException)


def test_speed_flags_cpu_noop_and_cuda(monkeypatch):
    before = torch.get_float32_matmul_precision()
    flags = enable_speed_flags("cpu")
    assert all(v.startswith("unchanged") for v in flags.values())
    assert torch.get_float32_matmul_precision() == before
    calls = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda p: calls.append(p))
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    flags = enable_speed_flags("cuda")
    assert calls == ["high"] and torch.backends.cudnn.benchmark is True
    assert "TF32" in flags["float32_matmul_precision"]


def test_cpu_bf16_probe_is_cached_and_finite():
    S.cpu_bf16_speed_ratio.cache_clear()
    ratio = S.cpu_bf16_speed_ratio()
    assert ratio > 0 and ratio == S.cpu_bf16_speed_ratio()
    assert S.cpu_bf16_speed_ratio.cache_info().hits >= 1
