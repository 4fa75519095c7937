"""Chiron's global autoscaler (papers/ALGORITHMS.md §5), per model.

**Interactive backpressure.** IBP = the interactive work over the interactive seats: (interactive
requests running on the ready interactive and mixed instances + interactive requests queued) / the sum
of those instances' concurrency caps (Chiron's share of interactive+mixed capacity busy with
interactive work, measured in seats, so one long stream on a large instance does not count the whole
instance busy). Kept inside [Θ − δ, Θ + δ]:
- above it: interactive/mixed instances are added until the work would fill Θ of the seats
  (`ceil(work / (Θ · seats per instance))`, starting ones counted);
- below it: ready ones are retired (idle first, at most `max_retire` per round) down to that count, never
  below `min_interactive`.

**Batch backpressure.** The queued batch requests are clustered into request groups by TTFT deadline
(sorted; a group spans at most `group_span_s` from its earliest deadline), served FCFS, earliest group
first. Group g misses when the output tokens of it and every group ahead (mean and variance summed over
the requests' predicted lengths) cannot be produced by its earliest deadline at the batch instances'
measured throughput (`tokens_per_s`, mean over the ready batch instances; `default_tokens_per_s` until
one is measured): the wait is `gateway.sched.waiting.wait_normal` at `quantile`, a starting instance
counting from when its load ends, a new one from `load_s` on. A measured rate counts once its
instance has been ready for `warmup_s` (telemetry's rate is over the last minute). Batch instances are
added one at a time (in the estimate) until no group misses, then all started at once; a group that no
number of instances could save (its deadline before a new instance could help) does not drive the
count. When no batch request is queued and no batch instance runs one, every batch instance is retired.

**Re-class.** A re-class is free (no load); so before starting instances the scaler re-classes what
the other side can spare: batch instances not needed by any group (re-checked with one fewer) to mixed
when interactive needs more, and mixed instances above the interactive count to batch when batch needs
more (mixed ones with the least interactive work first).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from gateway.core.slo import SloKind
from gateway.core.types import InstanceClass
from gateway.sched.plugins.autoscale.common import ready, retire_order, seats
from gateway.sched.plugins.autoscale.interface import (
    InstanceView,
    ModelScaleView,
    QueuedRequest,
    Reclass,
    ScaleDecision,
    ScaleIn,
    ScaleOut,
    ScaleState,
    ScaleView,
)
from gateway.sched.registry import PluginKind, PluginSpec
from gateway.sched.waiting import wait_normal

_INTERACTIVE = (InstanceClass.INTERACTIVE, InstanceClass.MIXED)


class ChironScalerParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    theta: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.5  # the IBP target (1/3 for 3× spikes)
    delta: Annotated[float, Meta(ge=0.0, lt=1.0)] = 0.15  # half-width of the band
    seats: Annotated[int, Meta(ge=1, le=100_000)] = 16  # seats per instance until one reports its cap
    interactive_class: Literal["interactive", "mixed"] = "mixed"  # class of added interactive capacity
    min_interactive: Annotated[int, Meta(ge=0, le=100_000)] = 1  # interactive+mixed instances kept
    max_retire: Annotated[int, Meta(ge=1, le=100_000)] = 4  # interactive instances retired per round
    group_span_s: Annotated[float, Meta(gt=0.0)] = 120.0  # deadlines within this form one group
    quantile: Annotated[float, Meta(gt=0.0, lt=1.0)] = 0.9  # of the groups' waiting times
    default_tokens_per_s: Annotated[float, Meta(gt=0.0)] = 300.0  # per batch instance, until measured
    # A batch instance's measured rate counts once it has been ready this long (telemetry's rate is over
    # the last minute: a new instance's first readings understate it).
    warmup_s: Annotated[float, Meta(ge=0.0)] = 90.0
    max_batch_step: Annotated[int, Meta(ge=1, le=100_000)] = 64  # batch instances added per round at most
    reclass: bool = True


@dataclass(frozen=True, slots=True)
class Group:
    deadline: float  # the earliest TTFT deadline in the group
    tokens_mean: float  # of this group and every group ahead of it
    tokens_var: float


def request_groups(queued: Sequence[QueuedRequest], span_s: float) -> list[Group]:
    """Queued batch requests with a TTFT deadline, grouped by deadline (earliest first); each group's
    tokens are cumulative (what must be produced before its last request starts)."""
    reqs = sorted(
        (q for q in queued if q.kind is SloKind.BATCH and q.ttft_deadline is not None),
        key=lambda q: q.ttft_deadline or 0.0,
    )
    out: list[Group] = []
    mean = var = 0.0
    start: float | None = None
    for q in reqs:
        d = q.ttft_deadline
        assert d is not None
        if start is not None and d - start > span_s:
            out.append(Group(start, mean, var))
            start = None
        if start is None:
            start = d
        mean += q.output_mean
        var += q.output_var
    if start is not None:
        out.append(Group(start, mean, var))
    return out


class ChironScaler:
    name = "chiron"

    def __init__(self, params: ChironScalerParams) -> None:
        self.p = params

    def decide(self, view: ScaleView) -> list[ScaleDecision]:
        out: list[ScaleDecision] = []
        for mv in view.models.values():
            out += self._model(mv, view.now)
        return out

    # ----------------------------------------------------------------- one model
    def _model(self, mv: ModelScaleView, now: float) -> list[ScaleDecision]:
        p = self.p
        serving = mv.serving()
        inter = [i for i in serving if i.instance_class in _INTERACTIVE]
        batch = [i for i in serving if i.instance_class is InstanceClass.BATCH]
        want_i, ibp = self._interactive_target(mv, inter)
        plan = BatchPlan(
            request_groups(mv.queued, p.group_span_s),
            self._batch_tokens_per_s(batch, now),
            mv.load_s,
            now,
            p.quantile,
        )
        room = max(0, mv.max_instances - len(serving))
        need_b = plan.needed(batch, min(room, p.max_batch_step))
        out: list[ScaleDecision] = []
        add_i = want_i - len(inter)
        busy_batch = sum(i.running_batch for i in batch) + sum(
            1 for q in mv.queued if q.kind is SloKind.BATCH
        )
        # interactive side
        if add_i > 0 and (ibp is None or ibp > p.theta + p.delta or not inter):
            if p.reclass and need_b == 0:
                spare = plan.spare(batch) if busy_batch else ready(batch)
                for inst in sorted(spare, key=lambda i: (i.running_batch, i.id))[:add_i]:
                    out.append(
                        Reclass(
                            inst.id, InstanceClass(p.interactive_class), f"ibp {_f(ibp)} > band; spare batch"
                        )
                    )
                    add_i -= 1
            if add_i > 0:
                out.append(
                    ScaleOut(
                        mv.model,
                        InstanceClass(p.interactive_class),
                        add_i,
                        None,
                        f"interactive backpressure {_f(ibp)} above {p.theta + p.delta:.2f}",
                    )
                )
        elif ibp is not None and ibp < p.theta - p.delta and add_i < 0:
            surplus = min(-add_i, len(ready(inter)))
            if need_b > 0 and p.reclass:
                movable = sorted(ready(inter), key=lambda i: (i.running_interactive, i.id))[
                    : min(surplus, need_b)
                ]
                for inst in movable:
                    out.append(
                        Reclass(inst.id, InstanceClass.BATCH, f"ibp {_f(ibp)} below band; batch needs it")
                    )
                need_b -= len(movable)
            else:
                for inst in retire_order(inter)[: min(surplus, p.max_retire)]:
                    out.append(
                        ScaleIn(inst.id, f"interactive backpressure {_f(ibp)} below {p.theta - p.delta:.2f}")
                    )
        # batch side
        if need_b > 0:
            out.append(
                ScaleOut(
                    mv.model,
                    InstanceClass.BATCH,
                    need_b,
                    None,
                    f"batch groups would miss their TTFT deadline: {need_b} more instance(s)",
                )
            )
        elif busy_batch == 0:
            for inst in ready(batch):
                out.append(ScaleIn(inst.id, "no batch work left"))
        return out

    def _interactive_target(
        self, mv: ModelScaleView, inter: Sequence[InstanceView]
    ) -> tuple[int, float | None]:
        """(interactive+mixed instances wanted, IBP now; None when no ready instance has seats)."""
        p = self.p
        rdy = ready(inter)
        work = sum(i.running_interactive for i in rdy) + sum(
            1 for q in mv.queued if q.kind is SloKind.INTERACTIVE
        )
        per = seats(rdy, p.seats)
        capacity = sum(i.cap if i.cap is not None else p.seats for i in rdy)
        ibp = work / capacity if capacity else None
        want = max(p.min_interactive, math.ceil(work / (p.theta * per)) if work else 0)
        return want, ibp

    def _batch_tokens_per_s(self, batch: Sequence[InstanceView], now: float) -> float:
        measured = [
            i.tokens_per_s
            for i in ready(batch)
            if i.tokens_per_s and i.ready_at is not None and now - i.ready_at >= self.p.warmup_s
        ]
        return sum(measured) / len(measured) if measured else self.p.default_tokens_per_s


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """The batch queue's groups and what serves them: how many batch instances they need."""

    groups: Sequence[Group]
    tokens_per_s: float  # per batch instance
    load_s: float  # a new instance's load time
    now: float
    quantile: float

    def misses(self, batch: Sequence[InstanceView], extra: int, *, every: bool = False) -> bool:
        """Whether a group misses its deadline with `extra` more batch instances: among the groups a new
        instance could still help (deadline past its load), or with `every`, among all not yet late."""
        for g in self.groups:
            t = g.deadline - self.now
            if t <= 0 or (t <= self.load_s and not every):
                continue
            rate = self.tokens_per_s * self.served_s(batch, extra, t) / t  # mean output rate until then
            if wait_normal(g.tokens_mean, g.tokens_var, rate, quantile=self.quantile).bound_s > t:
                return True
        return False

    def served_s(self, batch: Sequence[InstanceView], extra: int, t: float) -> float:
        """Instance-seconds of batch service in the next `t` seconds (a loading instance from when its
        load ends, a new one after `load_s`)."""
        total = 0.0
        for i in batch:
            if i.state is ScaleState.READY:
                total += t
            else:
                left = max(0.0, i.created_at + self.load_s - self.now)
                total += max(0.0, t - left)
        return total + extra * max(0.0, t - self.load_s)

    def needed(self, batch: Sequence[InstanceView], limit: int) -> int:
        """More batch instances (up to `limit`) until no savable group misses."""
        k = 0
        while k < limit and self.misses(batch, k):
            k += 1
        return k

    def spare(self, batch: Sequence[InstanceView]) -> list[InstanceView]:
        """Ready batch instances the groups can do without (the least busy first)."""
        keep = list(batch)
        out: list[InstanceView] = []
        for inst in sorted(ready(batch), key=lambda i: (i.running_batch, i.id)):
            rest = [i for i in keep if i.id != inst.id]
            if not self.misses(rest, 0, every=True):
                keep = rest
                out.append(inst)
        return out


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


SPEC = PluginSpec(
    PluginKind.SCALER,
    "chiron",
    ChironScalerParams,
    lambda p, ctx: ChironScaler(p),
    "Chiron: interactive backpressure band, batch groups' deadlines, re-class before start",
)
