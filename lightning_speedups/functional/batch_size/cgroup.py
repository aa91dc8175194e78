"""The memory a Linux control group leaves this process: the limit a container, a Kubernetes pod or a Slurm job sets.

``psutil.virtual_memory()`` reports the host's memory, not the cgroup's: in ``docker run --memory 8g`` on a 64 GiB
host it says tens of GiB are free, and a batch size chosen on that is killed by the kernel's OOM killer. This module
reads the tightest ``memory.max`` (cgroup v2) or ``memory.limit_in_bytes`` (v1) on the path from this process's
cgroup up to the root, and what that cgroup already uses (less the inactive file cache the kernel reclaims first).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["cgroup_memory", "cgroup_memory_room", "own_cgroup_paths", "own_memory_cgroups"]

_UNLIMITED = 1 << 60  # v1 writes "no limit" as a page-rounded 2**63 - 1
# each hierarchy's files: the limit, the usage, and the inactive file cache's key in memory.stat
_V2 = ("memory.max", "memory.current", "inactive_file")
_V1 = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value < _UNLIMITED else None


def _inactive_file(stat: Path, key: str) -> int:
    try:
        for line in stat.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def own_cgroup_paths(proc_cgroup: str | Path = "/proc/self/cgroup") -> dict[str, str]:
    """{controller: path} from ``/proc/self/cgroup``; the v2 (unified) path is under the key ``""``."""
    paths: dict[str, str] = {}
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(","):
            paths[controller] = parts[2]
    return paths


def _limits_on_path(
    mount: Path, own: str, limit_name: str, usage_name: str, inactive_key: str
) -> list[tuple[int, int]]:
    """(limit, limit - usage) of each limited cgroup from ``own`` up to ``mount``'s root."""
    rel = Path(own.lstrip("/"))
    found = []
    for part in [rel, *rel.parents]:
        d = mount / part
        limit = _read_int(d / limit_name)
        if limit is None:
            continue
        usage = _read_int(d / usage_name) or 0
        usage -= min(usage, _inactive_file(d / "memory.stat", inactive_key))
        found.append((limit, max(0, limit - usage)))
    return found


def _hierarchies(root: Path, paths: dict[str, str]) -> list[tuple[Path, str, tuple[str, str, str]]]:
    """(mount, this process's path in it, file names) of each memory hierarchy it is in: v2 (the unified hierarchy at
    the root, pure v2, or at <root>/unified, hybrid), then v1."""
    found = []
    if "" in paths:
        mounts = (root, root / "unified")
        found += [(mount, paths[""], _V2) for mount in mounts if (mount / "cgroup.controllers").exists()]
    if "memory" in paths:
        found.append((root / "memory", paths["memory"], _V1))
    return found


def own_memory_cgroups(
    root: str | Path = "/sys/fs/cgroup", proc_cgroup: str | Path = "/proc/self/cgroup"
) -> list[tuple[Path, str]]:
    """(directory, limit file name) of this process's own cgroup in each memory hierarchy it is in, v2 first."""
    return [
        (mount / own.lstrip("/"), names[0])
        for mount, own, names in _hierarchies(Path(root), own_cgroup_paths(proc_cgroup))
    ]


def cgroup_memory(
    root: str | Path = "/sys/fs/cgroup", proc_cgroup: str | Path = "/proc/self/cgroup"
) -> tuple[int, int] | None:
    """(limit, room) in bytes: the tightest memory limit on this process's cgroup path, and the least that any
    cgroup on the path can still grow by; ``None`` where no limit applies (no cgroup, not Linux, unreadable files,
    or every cgroup on the path unlimited)."""
    found: list[tuple[int, int]] = []
    for mount, own, names in _hierarchies(Path(root), own_cgroup_paths(proc_cgroup)):
        found += _limits_on_path(mount, own, *names)
    if not found:
        return None
    return min(limit for limit, _ in found), min(room for _, room in found)


def cgroup_memory_room(
    root: str | Path = "/sys/fs/cgroup", proc_cgroup: str | Path = "/proc/self/cgroup"
) -> int | None:
    """Bytes this process's cgroup can still grow by before its memory limit, or ``None`` where no limit applies
    (see :func:`cgroup_memory`)."""
    found = cgroup_memory(root, proc_cgroup)
    return None if found is None else found[1]
