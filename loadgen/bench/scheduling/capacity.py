"""The capacity floor of a simulated fleet: how few endpoints any router could possibly use.

Each call costs its engine at least a known amount of busy time under the simulator's iteration model
(`loadgen.engine_sim.latency`): its prefill, ``k1 · prompt`` plus its share of ``c1`` in the fullest
prefill iteration the engine allows, and one decode iteration share per further token, ``k2 · context
+ c2 + c3 / max_num_seqs`` (the fixed term split over a full batch). That is the most optimistic an
engine can be: full batches always, no preemption, no idle time. A fleet serving ``rate`` tasks/s
therefore needs at least ``rate × E[busy seconds per task]`` endpoints of each model, whatever the
router does.

A goodput target below 1 lets a router give up on some tasks, so the floor drops the costliest
``1 − goodput`` share of tasks (per model: each model's floor is a bound on its own) before averaging.
The scheduling benchmark prints the floor beside Aladdin's fewest-endpoints search, so a target that
would need a fleet busier than this ideal is seen as a capacity question, not a placement one.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from loadgen.engine_sim.profiles import EngineProfile
from loadgen.workloads.base import TaskMix, TaskSpec

SLOTS = 2  # model slots of a task's calls (coding: slot 0 first calls, slot 1 validations)


def call_busy_s(profile: EngineProfile, prompt_tokens: int, output_tokens: int) -> float:
    """The least engine busy time one call can cost: its prefill (the first token) and `output_tokens - 1`
    decode iterations, each shared with a full batch."""
    lat, b = profile.latency, profile.max_num_seqs
    per_prefill = max(1, min(b, profile.max_prefill_tokens // max(1, prompt_tokens)))
    prefill = lat.k1 * prompt_tokens + lat.c1 / per_prefill
    n = max(0, output_tokens - 1)
    # Σ_{i=1..n} (k2 · (prompt + i) + c2 + c3 / b)
    decode = n * (lat.k2 * prompt_tokens + lat.c2 + lat.c3 / b) + lat.k2 * n * (n + 1) / 2
    return prefill + decode


def task_busy_s(profile: EngineProfile, task: TaskSpec) -> tuple[float, ...]:
    """Busy seconds a task costs each model slot."""
    out = [0.0] * SLOTS
    for call in task.calls:
        out[min(call.model_slot, SLOTS - 1)] += call_busy_s(profile, call.prompt_tokens, call.output_tokens)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class CapacityFloor:
    rate: float  # tasks/s
    goodput: float  # share of tasks that must be served
    busy: tuple[float, ...]  # per model slot: endpoint-seconds per second, costliest share dropped
    busy_all: tuple[float, ...]  # the same with every task served

    @property
    def endpoints(self) -> tuple[int, ...]:
        """The fewest endpoints per model slot (at least one each)."""
        return tuple(max(1, math.ceil(x - 1e-9)) for x in self.busy)

    @property
    def total(self) -> int:
        return sum(self.endpoints)

    def utilization(self, endpoints: Sequence[int], *, every_task: bool = True) -> tuple[float, ...]:
        """The ideal busy share of each slot's endpoints on a fleet of this size, serving every task (or
        with the costliest share given up); above 1 the fleet cannot keep up even with perfect batching."""
        busy = self.busy_all if every_task else self.busy
        return tuple(x / max(1, n) for x, n in zip(busy, endpoints, strict=True))


def floor(
    profile: EngineProfile, tasks: Sequence[TaskSpec], rate: float, goodput: float = 1.0
) -> CapacityFloor:
    """The floor for `tasks` (a sample of the workload) arriving at `rate` tasks/s."""
    if not tasks:
        raise ValueError("no tasks to size")
    if not 0.0 < goodput <= 1.0:
        raise ValueError("goodput must be in (0, 1]")
    costs = [task_busy_s(profile, t) for t in tasks]
    n = len(costs)
    keep = math.ceil(n * goodput - 1e-9)
    busy, busy_all = [], []
    for slot in range(SLOTS):
        col = sorted(c[slot] for c in costs)
        busy.append(rate * sum(col[:keep]) / n)
        busy_all.append(rate * sum(col) / n)
    return CapacityFloor(rate, goodput, tuple(busy), tuple(busy_all))


def sample(workload: TaskMix, n: int = 20_000, seed: int = 0) -> list[TaskSpec]:
    """`n` tasks drawn from a task mix (arrival times do not matter to the floor)."""
    rng = random.Random(seed)
    return [workload.make(rng, i, 0.0) for i in range(n)]
