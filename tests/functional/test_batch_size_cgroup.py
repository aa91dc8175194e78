"""The CPU memory a batch-size search may use honours a cgroup's memory limit (containers, pods, Slurm jobs).

The cgroup files are written under ``tmp_path`` in the kernel's formats (v1 and v2), so the tests run anywhere.
"""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
import torch

from lightning_speedups.functional.batch_size import MemoryMeter
from lightning_speedups.functional.batch_size import state as state_module
from lightning_speedups.functional.batch_size.cgroup import (
    cgroup_memory,
    cgroup_memory_room,
    own_cgroup_paths,
    own_memory_cgroups,
)

GIB = 2**30


def _write(d: Path, **files: str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name.replace("_", ".", 1)).write_text(text + "\n")


def _proc(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "proc_cgroup"
    p.write_text(text)
    return p


def test_v2_limit_minus_usage_less_inactive_cache(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    _write(root, cgroup_controllers="cpu memory")
    _write(
        root / "job",
        memory_max=str(8 * GIB),
        memory_current=str(3 * GIB),
        memory_stat=f"anon {2 * GIB}\ninactive_file {GIB}\nactive_file 0",
    )
    room = cgroup_memory_room(root, _proc(tmp_path, "0::/job\n"))
    assert room == 8 * GIB - (3 * GIB - GIB)  # the reclaimable file cache does not count as used


def test_v2_tightest_limit_on_the_path_wins(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    _write(root, cgroup_controllers="memory")
    _write(root / "slurm", memory_max=str(4 * GIB), memory_current=str(3 * GIB))  # the job's parent: 1 GiB left
    _write(root / "slurm" / "step", memory_max="max", memory_current=str(GIB))
    assert cgroup_memory_room(root, _proc(tmp_path, "0::/slurm/step\n")) == GIB


def test_v1_hybrid_and_unlimited(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    proc = _proc(tmp_path, "4:memory:/docker/abc\n0::/\n")
    _write(
        root / "memory" / "docker" / "abc",
        memory_limit_in_bytes=str(6 * GIB),
        memory_usage_in_bytes=str(2 * GIB),
        memory_stat="total_inactive_file 0",
    )
    _write(root / "memory", memory_limit_in_bytes="9223372036854771712")  # v1's "no limit"
    assert cgroup_memory_room(root, proc) == 4 * GIB
    # no unified hierarchy with controllers under root: the v1 directory only (where the sweep makes its child group)
    assert own_memory_cgroups(root, proc) == [(root / "memory" / "docker" / "abc", "memory.limit_in_bytes")]
    (root / "memory" / "docker" / "abc" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_memory_room(root, proc) is None


def test_no_cgroup_files_means_no_limit(tmp_path: Path) -> None:
    assert cgroup_memory_room(tmp_path / "missing", tmp_path / "missing_proc") is None
    assert own_cgroup_paths(tmp_path / "missing_proc") == {}
    assert own_cgroup_paths(_proc(tmp_path, "4:memory,hugetlb:/a\n0::/b\ngarbage\n")) == {
        "memory": "/a",
        "hugetlb": "/a",
        "": "/b",
    }


def test_cpu_capacity_is_capped_by_the_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    meter = MemoryMeter(torch.device("cpu"))
    monkeypatch.setattr(state_module, "cgroup_memory_room", lambda: None)
    free = psutil.virtual_memory().available
    assert meter.capacity() >= free // 2  # no limit: the machine's available memory
    monkeypatch.setattr(state_module, "cgroup_memory_room", lambda: 256 * 2**20)
    held = meter.current()
    assert held <= meter.capacity() <= held + 256 * 2**20 + 64 * 2**20  # RSS moves a little between the two reads
    two = MemoryMeter(torch.device("cpu"), local_world_size=2)
    assert two.capacity() <= two.current() + 128 * 2**20 + 64 * 2**20  # each local rank gets its share


def test_limit_and_room_together(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    _write(root, cgroup_controllers="memory")
    _write(root / "pod", memory_max=str(16 * GIB), memory_current=str(2 * GIB))
    _write(root / "pod" / "ctr", memory_max=str(8 * GIB), memory_current=str(GIB))
    assert cgroup_memory(root, _proc(tmp_path, "0::/pod/ctr\n")) == (8 * GIB, 7 * GIB)
    assert cgroup_memory(root, _proc(tmp_path, "0::/pod\n")) == (16 * GIB, 14 * GIB)


def test_the_advisors_cpu_headroom_is_the_containers(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_speedups.callbacks.advisor import facts
    from lightning_speedups.functional.advisor import Measurements

    monkeypatch.setattr(facts, "cgroup_memory", lambda: (4 * GIB, GIB))
    m = Measurements()
    facts.fill_device_facts(m, torch.device("cpu"), cuda=False, rss_peak=0, notes=[])
    assert m.memory_total_bytes == min(psutil.virtual_memory().total, 4 * GIB)
    assert m.memory_available_bytes <= GIB and m.memory_headroom is not None and m.memory_headroom <= 0.25 + 1e-9
