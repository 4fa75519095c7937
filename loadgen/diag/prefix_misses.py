"""Where a prefix benchmark run loses goodput, request by request: per class, how many calls were served on
time, refused, or served late, and, for the refused and the late, where their session's prefix was.

    berth-loadgen diag prefix-misses --workload coding --load 2 --seed 0 --config berth

It replays one run of `berth-loadgen bench prefix` (the same schedule, fleet, gateway and policy files)
on the fleet simulator and reads every call's result. A call's *session* is the first span of its
prompt's first message (on `coding`, the repository context; on `chat`, the application's system
prompt; on the trace, its first block), and its *holders* the endpoints that earlier calls of its
session were dispatched to before it was; it is

- `served on time`, `refused` (an error status: admission or a recheck refused it), or `late`;
- `no holder` (its session's first call, or every earlier call refused), `on holder` (dispatched to a
  holder), `off holder` (dispatched elsewhere while a holder existed: its prefill redone) or, refused,
  `held` (its session had a holder);

and a late call's time splits into berth's queue (arrival to dispatch), the engine's wait and prefill
(dispatch to first token) and decoding (first token to the end). The holders are what berth sent
where, not what the engines still hold (an engine may have evicted a block since).
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np

from loadgen.bench.scheduling.prefix import Config, sim_options
from loadgen.bench.scheduling.prefix_setup import CONFIGS, WORKLOADS, load_for, profile_for, trace_path
from loadgen.client import RequestResult
from loadgen.fleetsim import simulate
from loadgen.workloads.base import TaskSpec

PLACES: Final = ("no holder", "held", "on holder", "off holder")


@dataclass(slots=True)
class Cell:
    """The calls of one class in one outcome and place, and the mean of their times (ms)."""

    n: int = 0
    queue_ms: list[float] = field(default_factory=list)
    engine_ms: list[float] = field(default_factory=list)  # dispatch to first token
    decode_ms: list[float] = field(default_factory=list)
    ttft_late: int = 0  # of the late: those whose first token already missed a TTFT target


def session_of(task: TaskSpec, call: int) -> str:
    """A call's session: its prompt's first message's first span (a coding session's repository
    context), else its task."""
    prompt = task.calls[call].prompt
    if prompt is None or not prompt.messages or not prompt.messages[0].spans:
        return f"task/{task.index}"
    s = prompt.messages[0].spans[0]
    return f"{s.space}/{s.key}"


def outcome(r: RequestResult) -> str:
    if not r.ok:
        return "refused" if 400 <= r.status < 500 else "failed"
    return "on time" if r.slo_met else "late"


def classify(
    results: Sequence[RequestResult], tasks: Sequence[TaskSpec]
) -> dict[str, dict[tuple[str, str], Cell]]:
    """class -> (outcome, place) -> the calls there (module docstring)."""
    by_index = {t.index: t for t in tasks}

    def dispatched(r: RequestResult) -> float:
        return r.sent_at_s + (r.queue_ms or 0.0) / 1000.0

    holders: dict[str, set[str]] = {}
    out: dict[str, dict[tuple[str, str], Cell]] = {}
    # in dispatch order (a refused call at its arrival): a call's holders are its session's earlier dispatches
    for r in sorted(results, key=dispatched):
        session = session_of(by_index[r.task_index], r.call_index)
        held = holders.setdefault(session, set())
        what = outcome(r)
        if not held:
            place = "no holder"
        elif r.endpoint is None:  # refused: whether its session had a holder
            place = "held"
        else:
            place = "on holder" if r.endpoint in held else "off holder"
        if r.endpoint is not None:
            held.add(r.endpoint)
        cell = out.setdefault(r.cls, {}).setdefault((what, place), Cell())
        cell.n += 1
        if what == "late":
            q = r.queue_ms or 0.0
            cell.queue_ms.append(q)
            if r.ttft_s is not None:
                cell.engine_ms.append(r.ttft_s * 1000.0 - q)
                if r.e2e_s is not None:
                    cell.decode_ms.append((r.e2e_s - r.ttft_s) * 1000.0)
                if r.slo.ttft_ms is not None and r.ttft_s * 1000.0 > r.slo.ttft_ms:
                    cell.ttft_late += 1
    return out


def _mean(xs: list[float]) -> str:
    return "-" if not xs else f"{float(np.mean(xs)):.0f}"


def table(out: dict[str, dict[tuple[str, str], Cell]], total: int) -> str:
    """The breakdown as markdown: one row per class, outcome and place."""
    lines = [
        "| class | outcome | place | calls | share of all | queue ms | engine ms | decode ms | TTFT late |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for cls in sorted(out):
        cells = out[cls]
        for (what, place), c in sorted(cells.items(), key=lambda kv: (kv[0][0], PLACES.index(kv[0][1]))):
            lines.append(
                f"| {cls} | {what} | {place} | {c.n} | {c.n / total:.3f} | {_mean(c.queue_ms)} | "
                f"{_mean(c.engine_ms)} | {_mean(c.decode_ms)} | {c.ttft_late if what == 'late' else '-'} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="berth-loadgen diag prefix-misses", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="coding", choices=tuple(WORKLOADS))
    p.add_argument("--load", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config", default="berth", choices=tuple(CONFIGS))
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--endpoints", type=int, default=8)
    p.add_argument("--trace", help="a Mooncake-format trace (default: the one beside the repository)")
    a = p.parse_args(argv)
    trace = trace_path(a.trace)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Config(out=Path(tmp), duration_s=a.duration, endpoints=a.endpoints, trace=trace)
        profile = profile_for(a.workload, None)
        at = load_for(a.workload, trace, a.load, a.duration, a.endpoints, profile_name=profile)
        opts, tasks = sim_options(cfg, a.workload, at, a.seed, a.config, d=Path(tmp) / "run")
        report = simulate(opts)
    results = report.requests
    met = sum(1 for r in results if r.slo_met)
    head = f"{a.workload} load {a.load:g} seed {a.seed} {a.config}"
    print(f"{head}: {len(results)} calls, goodput {met / len(results):.4f}")
    print(table(classify(results, tasks), len(results)))
    return 0
