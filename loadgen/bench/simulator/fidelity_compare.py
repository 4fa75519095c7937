"""The fidelity benchmark's figures and verdicts, apart from any run: one side's figures (`SideFigures`,
from a loadgen report and its per-call observations, in simulated units), the checks of the simulator
against the live path (`compare`), and the markdown report.

Targets (the issue): on the same fleet, trace and policy, the simulator's overall goodput within
±GOODPUT_TOLERANCE of the live run's, and its P95 TTFT within ±TTFT_TOLERANCE (relative) of the live
run's. "Overall goodput" is task goodput (tasks that met their task SLA / all tasks, the scheduling
benchmark's headline figure); "P95 TTFT" is request level (the time to a call's first token), over every
successful call. The verdict judges those two; each task type's P95 TTFT is checked against the same
band and reported beside it ("every type"), and judged too with `Tolerances(per_type_ttft=True)`: at
the benchmark's sample sizes (117-170 summarization and translation calls, so a P95 rests on 6-9 calls)
the simulator's own per-type P95 moves by 10-30 % when each call reaches berth up to 2 ms later, so a
per-type miss alone does not show that the simulator is wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np

GOODPUT_TOLERANCE: Final = 0.03  # absolute, on task goodput
TTFT_TOLERANCE: Final = 0.15  # relative to the live run's P95 TTFT
#: The task type whose calls show the per-call cost of the live path best: one call, a short prompt and
#: a few output tokens, so its TTFT minus its queue time is an engine prefill plus the path's overheads.
PROBE_TYPE: Final = "completion"


@dataclass(frozen=True, slots=True)
class CallFigures:
    """One call as the client saw it (simulated ms)."""

    cls: str  # the report class (the coding workload: the task type)
    ok: bool
    status: int
    ttft_ms: float | None
    queue_ms: float | None  # berth's queue time (x-berth-queue-ms live; the simulator's dispatch time)
    e2e_ms: float | None = None


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    return round(float(np.percentile(np.asarray(values, dtype=np.float64), q)), 3)


@dataclass(frozen=True, slots=True)
class TypeFigures:
    """One task type's figures."""

    tasks: int
    goodput: float | None  # task goodput
    calls: int
    ttft_p95_ms: float | None
    queue_p50_ms: float | None
    queue_p95_ms: float | None
    service_p50_ms: float | None  # median TTFT - queue time: what a call spends past berth's queue
    refused: int  # calls answered with a non-200 status (berth's refusals, mostly)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tasks": self.tasks,
            "goodput": self.goodput,
            "calls": self.calls,
            "ttft_p95_ms": self.ttft_p95_ms,
            "queue_p50_ms": self.queue_p50_ms,
            "queue_p95_ms": self.queue_p95_ms,
            "service_p50_ms": self.service_p50_ms,
            "refused": self.refused,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TypeFigures:
        return cls(**{k: d[k] for k in cls.__slots__})


@dataclass(frozen=True, slots=True)
class SideFigures:
    """What one side (live or simulated) measured on a run, in simulated units."""

    goodput: float | None  # task goodput over every task
    request_goodput: float | None
    tasks: int
    calls: int
    ttft_p95_ms: float | None  # every successful call
    queue_p50_ms: float | None
    queue_p95_ms: float | None
    refused: int
    types: dict[str, TypeFigures]

    def to_dict(self) -> dict[str, Any]:
        return {
            "goodput": self.goodput,
            "request_goodput": self.request_goodput,
            "tasks": self.tasks,
            "calls": self.calls,
            "ttft_p95_ms": self.ttft_p95_ms,
            "queue_p50_ms": self.queue_p50_ms,
            "queue_p95_ms": self.queue_p95_ms,
            "refused": self.refused,
            "types": {k: v.to_dict() for k, v in self.types.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SideFigures:
        return cls(
            goodput=d["goodput"],
            request_goodput=d["request_goodput"],
            tasks=d["tasks"],
            calls=d["calls"],
            ttft_p95_ms=d["ttft_p95_ms"],
            queue_p50_ms=d["queue_p50_ms"],
            queue_p95_ms=d["queue_p95_ms"],
            refused=d["refused"],
            types={k: TypeFigures.from_dict(v) for k, v in d["types"].items()},
        )


def side_figures(data: Mapping[str, Any], calls: Iterable[CallFigures]) -> SideFigures:
    """One side's figures from its loadgen report (`data`: task goodputs and counts, unit-free) and its
    calls (already in simulated ms)."""
    by_cls: dict[str, list[CallFigures]] = {}
    every: list[CallFigures] = []
    for c in calls:
        by_cls.setdefault(c.cls, []).append(c)
        every.append(c)
    task_stats: Mapping[str, Any] = data.get("tasks", {})
    types: dict[str, TypeFigures] = {}
    met_total = 0
    tasks_total = 0
    for name in sorted(set(task_stats) | set(by_cls)):
        st = task_stats.get(name, {})
        n = int(st.get("count", 0))
        g = st.get("goodput")
        if g is not None:
            met_total += round(g * n)
        tasks_total += n
        mine = by_cls.get(name, [])
        ok = [c for c in mine if c.ok]
        types[name] = TypeFigures(
            tasks=n,
            goodput=g,
            calls=len(mine),
            ttft_p95_ms=_pct([c.ttft_ms for c in ok if c.ttft_ms is not None], 95),
            queue_p50_ms=_pct(_queues(mine), 50),
            queue_p95_ms=_pct(_queues(mine), 95),
            service_p50_ms=_pct(_service(ok), 50),
            refused=sum(1 for c in mine if c.status not in (0, 200)),
        )
    ok_all = [c for c in every if c.ok]
    return SideFigures(
        goodput=round(met_total / tasks_total, 4) if tasks_total else None,
        request_goodput=data.get("overall", {}).get("goodput"),
        tasks=tasks_total,
        calls=len(every),
        ttft_p95_ms=_pct([c.ttft_ms for c in ok_all if c.ttft_ms is not None], 95),
        queue_p50_ms=_pct(_queues(every), 50),
        queue_p95_ms=_pct(_queues(every), 95),
        refused=sum(1 for c in every if c.status not in (0, 200)),
        types=types,
    )


def _queues(calls: Iterable[CallFigures]) -> list[float]:
    return [c.queue_ms for c in calls if c.queue_ms is not None]


def _service(calls: Iterable[CallFigures]) -> list[float]:
    return [c.ttft_ms - c.queue_ms for c in calls if c.ttft_ms is not None and c.queue_ms is not None]


# --------------------------------------------------------------------- the checks
@dataclass(frozen=True, slots=True)
class Check:
    """One figure of the simulator against the live run's."""

    name: str  # "goodput", "p95 TTFT", "p95 TTFT completion", ...
    live: float | None
    sim: float | None
    kind: Literal["abs", "rel"]  # the difference: sim - live, or (sim - live) / live
    limit: float
    gate: bool = True  # part of the verdict (False: shown for information)

    @property
    def diff(self) -> float | None:
        if self.live is None or self.sim is None:
            return None
        if self.kind == "abs":
            return self.sim - self.live
        if self.live == 0:
            return None if self.sim != 0 else 0.0
        return (self.sim - self.live) / self.live

    @property
    def ok(self) -> bool:
        """Within the limit; a figure missing on either side fails (nothing was compared)."""
        d = self.diff
        return d is not None and abs(d) <= self.limit + 1e-12

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "live": self.live,
            "sim": self.sim,
            "kind": self.kind,
            "limit": self.limit,
            "diff": None if self.diff is None else round(self.diff, 4),
            "ok": self.ok,
            "gate": self.gate,
        }


@dataclass(frozen=True, slots=True)
class Tolerances:
    goodput: float = GOODPUT_TOLERANCE
    ttft: float = TTFT_TOLERANCE
    # Whether each task type's P95 TTFT is part of the verdict (else it is reported beside it).
    per_type_ttft: bool = False


def compare(live: SideFigures, sim: SideFigures, tol: Tolerances = Tolerances()) -> list[Check]:
    """The simulator's figures against the live run's: overall goodput (absolute), P95 TTFT overall and
    per task type (relative); per-type goodputs are shown, not judged."""
    out = [
        Check("goodput", live.goodput, sim.goodput, "abs", tol.goodput),
        Check("p95 TTFT", live.ttft_p95_ms, sim.ttft_p95_ms, "rel", tol.ttft),
    ]
    for name in sorted(set(live.types) | set(sim.types)):
        lt, st = live.types.get(name), sim.types.get(name)
        out.append(
            Check(
                f"p95 TTFT {name}",
                None if lt is None else lt.ttft_p95_ms,
                None if st is None else st.ttft_p95_ms,
                "rel",
                tol.ttft,
                gate=tol.per_type_ttft,
            )
        )
        out.append(
            Check(
                f"goodput {name}",
                None if lt is None else lt.goodput,
                None if st is None else st.goodput,
                "abs",
                tol.goodput,
                gate=False,
            )
        )
    return out


def verdict(checks: Sequence[Check]) -> bool:
    """PASS when every gating check holds."""
    return all(c.ok for c in checks if c.gate)


def failed(checks: Sequence[Check]) -> list[Check]:
    return [c for c in checks if c.gate and not c.ok]


def types_outside(checks: Sequence[Check]) -> list[Check]:
    """The per-type P95 TTFT checks that miss the band (gating or not)."""
    return [c for c in checks if c.name.startswith("p95 TTFT ") and not c.ok]


@dataclass(slots=True)
class Pair:
    """One policy at one rate, both sides."""

    policy: str
    rate: float
    live: SideFigures
    sim: SideFigures
    checks: list[Check]
    # Evidence about the live run: CPU shares, validity, wall time (the scheduling benchmark's RunResult).
    live_run: dict[str, Any] = field(default_factory=dict)
    sim_run: dict[str, Any] = field(default_factory=dict)  # events, wall time, left out

    @property
    def passed(self) -> bool:
        return verdict(self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "rate": self.rate,
            "passed": self.passed,
            "live": self.live.to_dict(),
            "sim": self.sim.to_dict(),
            "checks": [c.to_dict() for c in self.checks],
            "live_run": self.live_run,
            "sim_run": self.sim_run,
        }


def pair(
    policy: str,
    rate: float,
    live: SideFigures,
    sim: SideFigures,
    *,
    tol: Tolerances = Tolerances(),
    live_run: dict[str, Any] | None = None,
    sim_run: dict[str, Any] | None = None,
) -> Pair:
    return Pair(policy, rate, live, sim, compare(live, sim, tol), live_run or {}, sim_run or {})


# --------------------------------------------------------------------- what the live path adds
def path_cost(p: Pair) -> dict[str, float | None]:
    """The live path's extra time per call, from the probe task type: the live run's median TTFT past
    berth's queue minus the simulator's (HTTP hops, berth's relay, the engines' timers at speed, all in
    simulated ms), and the two sides' median and P95 queue times."""
    lt, st = p.live.types.get(PROBE_TYPE), p.sim.types.get(PROBE_TYPE)
    service = None
    if lt is not None and st is not None and lt.service_p50_ms is not None and st.service_p50_ms is not None:
        service = round(lt.service_p50_ms - st.service_p50_ms, 3)
    return {
        "service_p50_extra_ms": service,
        "queue_p50_live_ms": p.live.queue_p50_ms,
        "queue_p50_sim_ms": p.sim.queue_p50_ms,
        "queue_p95_live_ms": p.live.queue_p95_ms,
        "queue_p95_sim_ms": p.sim.queue_p95_ms,
    }
