"""The best goodput any placement could reach on a schedule: an upper bound for the prefix benchmark.

Every placement of a schedule, however well informed (of every engine's cache and of the future), is
held to three facts of the simulator's engine model (`loadgen.engine_sim.latency`), which this bound
relaxes as far as they allow and no further:

- *a perfect cache*: a call prefills at least its tokens that no earlier call sent (the blocks a cache
  shared by the whole fleet, never evicting, would miss: `loadgen.workloads.stats`), and at least one;
- *its own SLO alone*: its first token comes at least ``k1 · uncached + c1`` after it arrives (an idle
  engine, no queue); a call with an E2E target decodes its ``n`` further tokens in iterations of at
  least ``k2 · context + c2 · b + c3`` for a batch of ``b`` (its batch-mates adding no context of their
  own), so it meets the target only in batches of at most ``B`` on average, ``B = (E2E − TTFT_min −
  Σ (k2 · context + c3)) / (c2 · n)``; ``B < 1`` means no placement can make it;
- *the fleet's engine time*: an iteration costs ``Σ (k2 · context + c2) + c3`` over its batch, so a
  call costs at least its prefill, ``k1 · uncached + c1 / (prompts per prefill iteration)``, and, per
  further token, ``k2 · context + c2 + c3 / B`` (Jensen: the fixed term split over batches of ``B``
  on average at best; ``B`` capped by the engine's seats). What must be done before the last deadline
  (a TTFT call's prefill, an E2E call's whole run) fits in ``endpoints × (last deadline − first
  arrival)`` engine-seconds.

The bound then serves the calls cheapest first while their engine time fits (fractionally: a knapsack's
relaxation, so still an upper bound). Goodput counts the calls a policy sends: a task refused at its
first call sends no second one, so the bound lets every refused task cost one missed call only
(``met / (met + refused tasks)``, both at their most favourable). Ignored, so the bound stays above every
real placement: queueing, seats, chunked prefill, evictions, decode interference beyond ``b``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gateway.core.blockhash import text_chain
from loadgen.engine_sim.profiles import EngineProfile
from loadgen.workloads.base import CallSpec, TaskSpec, call_prompt
from loadgen.workloads.prompt import call_salt


@dataclass(frozen=True, slots=True)
class CallBound:
    task: int
    uncached: int  # prompt tokens a perfect shared cache misses
    feasible: bool  # its SLO can be met on an idle engine with that cache
    cost_s: float  # the least engine time it costs before its deadline (when feasible)
    deadline_s: float  # arrival + its target (TTFT or E2E), from the start of the run
    cls: str


@dataclass(frozen=True, slots=True)
class GoodputBound:
    goodput: float  # no placement's goodput is higher
    feasible_share: float  # calls whose SLO an idle engine with a perfect cache meets
    busy_ratio: float  # engine time of every feasible call over what the fleet has before the deadlines
    by_class: dict[str, float]  # feasible share per class

    def document(self) -> dict[str, object]:
        return {
            "goodput": round(self.goodput, 4),
            "feasible_share": round(self.feasible_share, 4),
            "busy_ratio": round(self.busy_ratio, 4),
            "by_class": {k: round(v, 4) for k, v in sorted(self.by_class.items())},
        }


def uncached_tokens(tasks: Sequence[TaskSpec], block_tokens: int, seed: int) -> dict[tuple[int, int], int]:
    """(task index, call index) -> prompt tokens a perfect cache shared by the fleet misses, calls taken
    in the order they would be sent (as `loadgen.workloads.stats.reusable_share` counts them)."""
    order = []
    for t in tasks:
        at = t.at_s
        for i, c in enumerate(t.calls):
            at += c.gap_before_s
            order.append((at, t.index, i, c))
    order.sort(key=lambda x: x[:3])
    seen: set[int] = set()
    out: dict[tuple[int, int], int] = {}
    for _, index, i, call in order:
        text = call_prompt(call, call_salt(index, i, seed)).rendered(call.api)
        root = hash(("model", call.model if call.model is not None else call.model_slot))
        keys = text_chain(text, 4 * block_tokens, parent=root)
        hit = 0
        for k in keys:  # the leading blocks sent before: what an engine's prefix cache skips
            if k not in seen:
                break
            hit += 1
        seen.update(keys)
        out[(index, i)] = max(1, call.prompt_tokens - hit * block_tokens)
    return out


def call_bound(profile: EngineProfile, call: CallSpec, uncached: int, task: int, at_s: float) -> CallBound:
    lat, seats = profile.latency, profile.max_num_seqs
    ttft_min = lat.k1 * uncached + lat.c1
    per_prefill = max(1, min(seats, profile.max_prefill_tokens // max(1, uncached)))
    prefill = lat.k1 * uncached + lat.c1 / per_prefill
    n = max(0, call.output_tokens - 1)
    ctx = n * (lat.k2 * call.prompt_tokens) + lat.k2 * n * (n + 1) / 2  # Σ k2 · context
    slo = call.slo
    if slo.ttft_ms is not None and ttft_min * 1000.0 > slo.ttft_ms:
        return CallBound(task, uncached, False, 0.0, at_s, call.cls)
    if slo.e2e_ms is None:  # a TTFT target: only the prefill is due by the deadline
        deadline = at_s + (slo.ttft_ms or 0.0) / 1000.0
        return CallBound(task, uncached, True, prefill, deadline, call.cls)
    spare = slo.e2e_ms / 1000.0 - ttft_min - ctx - n * lat.c3
    batch = float(seats) if spare >= 0 else 0.0  # no decode, or no per-request decode term
    if n > 0 and lat.c2 > 0:
        batch = min(float(seats), spare / (lat.c2 * n))
    feasible = batch >= 1.0
    cost = prefill + ctx + n * lat.c2 + (n * lat.c3 / batch if feasible and n else 0.0)
    return CallBound(task, uncached, feasible, cost, at_s + slo.e2e_ms / 1000.0, call.cls)


def goodput_bound(
    tasks: Sequence[TaskSpec], profile: EngineProfile, endpoints: int, seed: int
) -> GoodputBound:
    """The bound for `tasks` on `endpoints` engines of `profile` (module docstring)."""
    if not tasks:
        return GoodputBound(1.0, 1.0, 0.0, {})
    uncached = uncached_tokens(tasks, profile.block_size, seed)
    calls: list[CallBound] = []
    for t in tasks:
        at = t.at_s
        for i, spec in enumerate(t.calls):
            at += spec.gap_before_s
            calls.append(call_bound(profile, spec, uncached[(t.index, i)], t.index, at))
    first = min(t.at_s for t in tasks)
    last = max(c.deadline_s for c in calls)
    capacity = endpoints * max(last - first, 1e-9)
    feasible = [c for c in calls if c.feasible]
    by_class: dict[str, list[int]] = {}
    for c in calls:
        got = by_class.setdefault(c.cls, [0, 0])
        got[0] += c.feasible
        got[1] += 1
    # Most calls met: cheapest first, the last one fractionally (an upper bound on the knapsack).
    met = _fill((c.cost_s for c in feasible), capacity)
    # Fewest tasks refused: a task is served when its first call is feasible (with its other feasible
    # calls); cheapest tasks first.
    task_cost: dict[int, float] = {}
    firsts = {t.index for t, c in zip(tasks, _firsts(calls), strict=True) if c.feasible}
    for c in feasible:
        if c.task in firsts:
            task_cost[c.task] = task_cost.get(c.task, 0.0) + c.cost_s
    served_tasks = _fill(task_cost.values(), capacity)
    refused = len(tasks) - served_tasks
    total_busy = sum(c.cost_s for c in feasible)
    return GoodputBound(
        goodput=min(1.0, met / (met + refused)) if met + refused > 0 else 0.0,
        feasible_share=len(feasible) / len(calls),
        busy_ratio=total_busy / capacity,
        by_class={k: v[0] / v[1] for k, v in by_class.items()},
    )


def _firsts(calls: Sequence[CallBound]) -> list[CallBound]:
    """Each task's first call (`calls` are in task order, a task's calls together)."""
    out: list[CallBound] = []
    last = None
    for c in calls:
        if c.task != last:
            out.append(c)
            last = c.task
    return out


def _fill(costs: Iterable[float], capacity: float) -> float:
    """How many items, cheapest first, fit in `capacity` (the last one fractionally)."""
    left, n = capacity, 0.0
    for cost in sorted(costs):
        if cost <= left:
            left -= cost
            n += 1.0
        else:
            n += left / cost if cost > 0 else 0.0
            break
    return n if math.isfinite(n) else 0.0
