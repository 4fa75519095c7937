"""Built-in workloads and trace replay: `get_workload("coding:pattern2")`, ``mooncake:PATH``, or the
path of a JSONL trace; `WorkloadOptions` carry the options a workload takes (``--sessions``, ...)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from loadgen.workloads.base import CallSpec, Slo, TaskSpec, Workload
from loadgen.workloads.chat import ChatWorkload
from loadgen.workloads.chat_batch import ChatBacklogWorkload, ChatBatchWorkload
from loadgen.workloads.coding import CodingWorkload
from loadgen.workloads.maaso import MaasoWorkload
from loadgen.workloads.mooncake import MooncakeWorkload
from loadgen.workloads.multi_model import MultiModelWorkload
from loadgen.workloads.options import FLAGS, WorkloadOptions
from loadgen.workloads.sharegpt import ALADDIN_SLOS, ShareGptWorkload
from loadgen.workloads.trace import TraceWorkload

_SLO_FLAGS: Final = frozenset({"slo_ttft_ms", "slo_itl_ms"})


@dataclass(frozen=True, slots=True)
class _Builtin:
    make: Callable[[str | None, WorkloadOptions], Workload]
    variants: tuple[str, ...]
    options: frozenset[str] = frozenset()  # what it takes besides the SLO flags (which every one takes)


_BUILTIN: Final[dict[str, _Builtin]] = {
    "coding": _Builtin(
        lambda v, o: CodingWorkload(v or "pattern1", o),
        ("pattern1", "pattern2", "ttft-heavy"),
        frozenset({"sessions", "context_tokens"}),
    ),
    "chat": _Builtin(
        lambda v, o: ChatWorkload(o, variant=v),
        (),
        frozenset({"sessions", "turns", "think_time_s", "apps", "system_tokens"}),
    ),
    "multi-model": _Builtin(
        lambda v, o: MultiModelWorkload(v or "uniform"), ("uniform", "ide-heavy", "popularity-skewed")
    ),
    "chat-batch": _Builtin(lambda v, o: ChatBatchWorkload(v or "mixed"), ("mixed", "queue")),
    "chat-backlog": _Builtin(lambda v, o: ChatBacklogWorkload(v), ("2000",)),
    "sharegpt-like": _Builtin(lambda v, o: ShareGptWorkload(v), tuple(ALADDIN_SLOS)),
    "maaso": _Builtin(lambda v, o: MaasoWorkload(v), ("91.1",)),
}
BUILTIN_NAMES: tuple[str, ...] = tuple(_BUILTIN)
VARIANTS: dict[str, tuple[str, ...]] = {name: b.variants for name, b in _BUILTIN.items()}
#: Trace formats named ``FORMAT:PATH``.
TRACE_FORMATS: Final = ("mooncake",)


def _refuse(name: str, given: frozenset[str], takes: frozenset[str]) -> None:
    extra = sorted(given - takes - _SLO_FLAGS)
    if extra:
        flags = ", ".join(FLAGS[e] for e in extra)
        raise ValueError(f"workload {name}: {flags} does not apply to it")


def get_workload(spec: str, options: WorkloadOptions | None = None) -> Workload:
    """A built-in ``NAME[:VARIANT]``, ``mooncake:PATH``, or the path of a JSONL trace, with its options."""
    opts = options or WorkloadOptions()
    opts.check()
    given = opts.given()
    name, _, variant = spec.partition(":")
    if name == "mooncake":
        _refuse(name, given, frozenset({"time_scale"}))
        if not variant:
            raise ValueError("mooncake: name the trace, mooncake:PATH")
        return MooncakeWorkload(variant, opts)  # takes the SLO flags itself: a line's own SLO wins
    workload: Workload
    if name in _BUILTIN:
        builtin = _BUILTIN[name]
        _refuse(name, given, builtin.options)
        workload = builtin.make(variant or None, opts)
    elif Path(spec).is_file():
        _refuse("trace", given, frozenset({"time_scale"}))
        workload = TraceWorkload(spec, time_scale=opts.time_scale or 1.0)
    else:
        raise ValueError(
            f"unknown workload {spec!r}: neither {', '.join(BUILTIN_NAMES)}, mooncake:PATH nor an existing "
            "trace file"
        )
    if given & _SLO_FLAGS:
        return SloOverride(workload, opts.slo_ttft_ms, opts.slo_itl_ms)
    return workload


class SloOverride:
    """A workload whose every request has the given TTFT / ATGT targets (the others kept), sent as
    ``x-berth-ttft-ms`` / ``x-berth-itl-ms``."""

    def __init__(self, inner: Workload, ttft_ms: float | None, atgt_ms: float | None) -> None:
        self.inner = inner
        self.ttft_ms = ttft_ms
        self.atgt_ms = atgt_ms
        self.name = inner.name

    def _call(self, call: CallSpec) -> CallSpec:
        slo = call.slo
        slo = Slo(
            self.ttft_ms if self.ttft_ms is not None else slo.ttft_ms,
            self.atgt_ms if self.atgt_ms is not None else slo.atgt_ms,
            slo.e2e_ms,
        )
        return dataclasses.replace(call, slo=slo, slo_headers=True)

    def schedule(
        self,
        rate: float,
        duration_s: float,
        arrivals: Callable[[float, float], list[float]],
        rng: random.Random,
    ) -> list[TaskSpec]:
        tasks = self.inner.schedule(rate, duration_s, arrivals, rng)
        return [dataclasses.replace(t, calls=tuple(self._call(c) for c in t.calls)) for t in tasks]


__all__ = [
    "BUILTIN_NAMES",
    "TRACE_FORMATS",
    "VARIANTS",
    "CallSpec",
    "Slo",
    "TaskSpec",
    "Workload",
    "WorkloadOptions",
    "get_workload",
]
