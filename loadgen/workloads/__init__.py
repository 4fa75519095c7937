"""Built-in workloads and trace replay. `get_workload("coding:pattern2")`, or a path to a JSONL trace."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from loadgen.workloads.base import CallSpec, Slo, TaskSpec, Workload
from loadgen.workloads.chat_batch import ChatBacklogWorkload, ChatBatchWorkload
from loadgen.workloads.coding import CodingWorkload
from loadgen.workloads.maaso import MaasoWorkload
from loadgen.workloads.multi_model import MultiModelWorkload
from loadgen.workloads.sharegpt import ALADDIN_SLOS, ShareGptWorkload
from loadgen.workloads.trace import TraceWorkload

_BUILTIN: dict[str, Callable[[str | None], Workload]] = {
    "coding": lambda v: CodingWorkload(v or "pattern1"),
    "multi-model": lambda v: MultiModelWorkload(v or "uniform"),
    "chat-batch": lambda v: ChatBatchWorkload(v or "mixed"),
    "chat-backlog": ChatBacklogWorkload,
    "sharegpt-like": ShareGptWorkload,
    "maaso": MaasoWorkload,
}
BUILTIN_NAMES: tuple[str, ...] = tuple(_BUILTIN)
VARIANTS: dict[str, tuple[str, ...]] = {
    "coding": ("pattern1", "pattern2", "ttft-heavy"),
    "multi-model": ("uniform", "ide-heavy", "popularity-skewed"),
    "chat-batch": ("mixed", "queue"),
    "chat-backlog": ("2000",),
    "sharegpt-like": tuple(ALADDIN_SLOS),
    "maaso": ("91.1",),
}


def get_workload(spec: str) -> Workload:
    """A built-in ``NAME[:VARIANT]`` or the path of a JSONL trace."""
    name, _, variant = spec.partition(":")
    if name in _BUILTIN:
        return _BUILTIN[name](variant or None)
    if Path(spec).is_file():
        return TraceWorkload(spec)
    raise ValueError(
        f"unknown workload {spec!r}: neither {', '.join(BUILTIN_NAMES)} nor an existing trace file"
    )


__all__ = ["BUILTIN_NAMES", "VARIANTS", "CallSpec", "Slo", "TaskSpec", "Workload", "get_workload"]
