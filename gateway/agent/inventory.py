"""The node's devices: NVML's (through `nvidia-ml-py`, optional) or the configured sizes.

NVML's devices are named `gpuN` by index; a configured `[[devices]]` entry with the same name overrides
its size (e.g. to hand berth only part of a GPU); configured devices NVML does not list are added as
they are. Without `pynvml` installed, or without a driver, only configured devices exist and nothing is
measured: CPU machines and tests work the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gateway.agent.config import GIB, DeviceConfig


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    index: int
    total_bytes: int
    source: Literal["nvml", "config"]
    used_bytes: int | None  # NVML's measure of everything on it; None without NVML
    physical_free_bytes: int | None = None  # NVML: total - used of the physical device


class Nvml(Protocol):
    """What the agent asks of NVML (a fake in tests)."""

    def memory(self) -> list[tuple[int, int]]:
        """(total, used) bytes per device, by index."""
        ...

    def process_memory(self, index: int) -> Mapping[int, int]:
        """Used bytes per pid of the compute processes on device `index`."""
        ...


class PynvmlProbe:
    """NVML through `import pynvml` (package `nvidia-ml-py`, the `gpu` extra)."""

    def __init__(self, lib: Any) -> None:
        self._nv = lib

    @classmethod
    def open(cls) -> PynvmlProbe | None:
        """A probe, or None when pynvml is not installed or NVML cannot start (no driver, no GPU)."""
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
        except Exception:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: no usable NVML here
            return None
        return cls(pynvml)

    def memory(self) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for i in range(self._nv.nvmlDeviceGetCount()):
            info = self._nv.nvmlDeviceGetMemoryInfo(self._nv.nvmlDeviceGetHandleByIndex(i))
            out.append((int(info.total), int(info.used)))
        return out

    def process_memory(self, index: int) -> Mapping[int, int]:
        handle = self._nv.nvmlDeviceGetHandleByIndex(index)
        out: dict[int, int] = {}
        for p in self._nv.nvmlDeviceGetComputeRunningProcesses(handle):
            used = p.usedGpuMemory
            if used is not None:  # None: not available (e.g. under some virtualisation)
                out[int(p.pid)] = out.get(int(p.pid), 0) + int(used)
        return out


def devices(configured: Sequence[DeviceConfig], nvml: Nvml | None) -> list[Device]:
    """The node's devices by index: NVML's, with configured ones overriding by name and added."""
    out: dict[str, Device] = {}
    if nvml is not None:
        for i, (total, used) in enumerate(nvml.memory()):
            out[f"gpu{i}"] = Device(f"gpu{i}", i, total, "nvml", used, max(0, total - used))
    for d in configured:
        assert d.index is not None  # filled in by the config loader
        measured = out.get(d.name)
        same = measured is not None and measured.index == d.index
        seen = measured.used_bytes if same and measured is not None else None
        phys = measured.physical_free_bytes if same and measured is not None else None
        out[d.name] = Device(d.name, d.index, round(d.memory_gib * GIB), "config", seen, phys)
    return sorted(out.values(), key=lambda d: d.index)


def measured_bytes(nvml: Nvml | None, devs: Iterable[Device], pids: Iterable[int]) -> dict[str, int] | None:
    """NVML's measure of the processes `pids` per device name; None without NVML."""
    if nvml is None:
        return None
    wanted = set(pids)
    out: dict[str, int] = {}
    for d in devs:
        if d.used_bytes is None:
            continue
        used = sum(b for pid, b in nvml.process_memory(d.index).items() if pid in wanted)
        if used:
            out[d.name] = used
    return out
