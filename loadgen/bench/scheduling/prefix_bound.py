"""The best goodput any placement could reach on a schedule: an upper bound for the prefix benchmark.

Every placement of a schedule, however well informed (of every engine's cache and of the future), is
held to three facts of the simulator's engine model (`loadgen.engine_sim.latency`), which this bound
relaxes as far as they allow and no further:

- *a perfect cache*: a call prefills at least its tokens that no earlier call sent (the blocks a cache
  shared by the whole fleet, never evicting, would miss: `loadgen.workloads.stats`), and at least one;
- *its own SLO alone*: its first token comes at least ``k1 · uncached + c1`` after it arrives (an idle
  engine, no queue); it decodes its ``n`` further tokens in iterations of at least ``k2 · context +
  c2 · b + c3`` for a batch of ``b``, so with an E2E target it meets it only in batches of at most
  ``B`` on average, ``B = (E2E − TTFT_min − Σ (k2 · context + c3)) / (c2 · n)``, and with an ATGT
  target likewise with ``n · ATGT`` for the time in
  hand; ``B < 1`` means no placement can make it; each of its ``B − 1`` batch-mates adds at least
  ``k2 · L_min + c2`` to an iteration, ``L_min`` the shortest prompt of the schedule (a running call's
  context is at least its prompt, cached or not: decoding reads all of it), so with
  ``c2 + (B − 1)(c2 + k2 · L_min)`` in place of ``c2 · B`` ``B`` is smaller where every prompt is long
  (a coding session's repository context);
- *the fleet's engine time*: an iteration costs ``Σ (k2 · context + c2) + c3`` over its batch, so a
  call costs at least its prefill, ``k1 · uncached + c1 / (prompts per prefill iteration)``, and, per
  further token, ``k2 · context + c2 + c3 / B`` (Jensen: the fixed term split over batches of ``B``
  on average at best; ``B`` capped by the engine's seats). What must be done before the last deadline
  (a TTFT call's prefill; the whole of a call with an E2E target, or with TTFT and ATGT targets, due
  ``n`` ATGTs after its first token's target) fits in ``endpoints × (last deadline − first arrival)``
  engine-seconds.

The bound then counts, window by window (time cut into windows of 2.5 s to the whole run, two offsets
each; the count of the width that misses most is kept), the calls that arrive and are due within a
window: beyond the cheapest of them that fit in its engine time (fractionally: a knapsack's
relaxation), every one is missed, and disjoint windows miss apart. Goodput counts the calls a policy
sends, and a task refused at its first call sends no more, so the missed calls are spread as thinly
as possible: at least ``missed / (calls per task, at most)`` tasks miss, each costing at least one of
its calls, and goodput <= ``1 − that / calls``. Ignored, so the bound stays above every real
placement: queueing for seats and prefill, the engines' seat limit, chunked prefill, evictions, a
batch-mate's own context. It is loose where the targets are loose in time (an ATGT target lets a
call's decode run long after the window it arrived in); what it shows is where even a perfect
placement could not reach.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from gateway.core.blockhash import text_chain
from loadgen.bench.scheduling.prefix_setup import (
    DEFAULT_ENDPOINTS,
    load_for,
    profile_for,
    schedule,
    trace_path,
)
from loadgen.engine_sim.profiles import EngineProfile, get_profile
from loadgen.workloads.base import CallSpec, TaskSpec, call_prompt
from loadgen.workloads.prompt import call_salt

#: Window widths the engine-time count cuts time into (seconds; the whole run besides).
WINDOWS_S: Final = (2.5, 5.0, 10.0, 20.0, 40.0, 80.0)


@dataclass(frozen=True, slots=True)
class CallBound:
    task: int
    uncached: int  # prompt tokens a perfect shared cache misses
    feasible: bool  # its SLO can be met on an idle engine with that cache
    cost_s: float  # the least engine time it costs before its deadline (when feasible)
    deadline_s: float  # when what it costs is due, from the start of the run
    cls: str
    at_s: float = 0.0  # when it is sent


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


def call_bound(
    profile: EngineProfile, call: CallSpec, uncached: int, task: int, at_s: float, *, least_context: int = 0
) -> CallBound:
    """One call's feasibility alone and its least engine time before its deadline (module docstring);
    `least_context`: the shortest context a batch-mate can have (the schedule's shortest prompt)."""
    lat, seats = profile.latency, float(profile.max_num_seqs)
    ttft_min = lat.k1 * uncached + lat.c1
    per_prefill = max(1, min(profile.max_prefill_tokens // max(1, uncached), profile.max_num_seqs))
    prefill = lat.k1 * uncached + lat.c1 / per_prefill
    n = max(0, call.output_tokens - 1)
    ctx = n * (lat.k2 * call.prompt_tokens) + lat.k2 * n * (n + 1) / 2  # Σ k2 · context
    slo = call.slo
    if slo.ttft_ms is not None and ttft_min * 1000.0 > slo.ttft_ms:
        return CallBound(task, uncached, False, 0.0, at_s, call.cls, at_s)
    # The decode's time in hand: after the least first token to the E2E target, and n tokens at the
    # ATGT target; each bounds the mean batch (B) the call can decode in.
    spares = []
    if slo.e2e_ms is not None:
        spares.append(slo.e2e_ms / 1000.0 - ttft_min)
    if slo.atgt_ms is not None and n > 0:
        spares.append(n * slo.atgt_ms / 1000.0)
    batch = seats
    for spare in spares:
        left = spare - ctx - n * lat.c3
        if left < 0:
            return CallBound(task, uncached, False, 0.0, at_s, call.cls, at_s)
        mate = lat.c2 + lat.k2 * least_context  # what each batch-mate adds to an iteration, at least
        if n > 0 and mate > 0:
            batch = min(batch, 1.0 + (left - n * lat.c2) / (mate * n))
    if batch < 1.0:
        return CallBound(task, uncached, False, 0.0, at_s, call.cls, at_s)
    decode = ctx + n * lat.c2 + n * lat.c3 / batch
    if slo.e2e_ms is not None:  # all of it is due by the E2E target
        return CallBound(task, uncached, True, prefill + decode, at_s + slo.e2e_ms / 1000.0, call.cls, at_s)
    if slo.ttft_ms is not None and slo.atgt_ms is not None:  # the last token n ATGTs after the first's target
        due = at_s + (slo.ttft_ms + n * slo.atgt_ms) / 1000.0
        return CallBound(task, uncached, True, prefill + decode, due, call.cls, at_s)
    if slo.ttft_ms is not None:  # a TTFT target alone: only the prefill is due
        return CallBound(task, uncached, True, prefill, at_s + slo.ttft_ms / 1000.0, call.cls, at_s)
    return CallBound(task, uncached, True, 0.0, at_s, call.cls, at_s)  # nothing is ever due


def goodput_bound(
    tasks: Sequence[TaskSpec], profile: EngineProfile, endpoints: int, seed: int
) -> GoodputBound:
    """The bound for `tasks` on `endpoints` engines of `profile` (module docstring)."""
    if not tasks:
        return GoodputBound(1.0, 1.0, 0.0, {})
    uncached = uncached_tokens(tasks, profile.block_size, seed)
    least = min(c.prompt_tokens for t in tasks for c in t.calls)
    calls: list[CallBound] = []
    for t in tasks:
        at = t.at_s
        for i, spec in enumerate(t.calls):
            at += spec.gap_before_s
            calls.append(call_bound(profile, spec, uncached[(t.index, i)], t.index, at, least_context=least))
    by_class: dict[str, list[int]] = {}
    for c in calls:
        got = by_class.setdefault(c.cls, [0, 0])
        got[0] += c.feasible
        got[1] += 1
    infeasible = sum(1 for c in calls if not c.feasible)
    dropped, peak = _dropped(calls, endpoints)
    per_task = max(len(t.calls) for t in tasks)
    unmet_tasks = (infeasible + dropped) / per_task  # tasks with a call unmet, at the fewest
    return GoodputBound(
        goodput=max(0.0, 1.0 - unmet_tasks / len(calls)),
        feasible_share=1.0 - infeasible / len(calls),
        busy_ratio=peak,
        by_class={k: v[0] / v[1] for k, v in by_class.items()},
    )


def ttft_floor_ms(tasks: Sequence[TaskSpec], profile: EngineProfile, seed: int, q: float = 90.0) -> float:
    """The least TTFT percentile `q` (ms) of a schedule's calls, every call served: each alone on an idle
    engine with a perfect cache, its first token ``k1 · uncached + c1`` after it is sent. A task's
    later calls are counted as cached but for one token (their task's earlier prompt and answer are
    cached where those ran), so no placement that serves every call has a lower percentile."""
    if not tasks:
        return 0.0
    lat = profile.latency
    uncached = uncached_tokens(tasks, profile.block_size, seed)
    firsts = [
        lat.k1 * (uncached[(t.index, i)] if i == 0 else 1) + lat.c1
        for t in tasks
        for i in range(len(t.calls))
    ]
    return float(np.percentile(firsts, q)) * 1000.0


def _dropped(calls: Sequence[CallBound], endpoints: int) -> tuple[float, float]:
    """The most feasible calls any placement must miss for want of engine time (fractional), and the
    busiest window's work over the fleet's time in it.

    Time is cut into windows of one width; the calls that arrive and are due within one window need
    their engine time in it, so beyond the cheapest that fit, the rest of them are missed, and windows
    apart miss apart. Every width and offset gives a valid count; the largest is kept."""
    busy = [c for c in calls if c.feasible and c.cost_s > 0]
    if not busy:
        return 0.0, 0.0
    t0 = min(c.at_s for c in calls)
    t1 = max(c.deadline_s for c in busy)
    most, peak = 0.0, 0.0
    for width in (*WINDOWS_S, max(t1 - t0, 1e-9)):
        for offset in (0.0, width / 2):
            slots: dict[int, list[float]] = {}
            for c in busy:
                k = math.floor((c.at_s - t0 + offset) / width)
                if c.deadline_s - t0 + offset <= (k + 1) * width:
                    slots.setdefault(k, []).append(c.cost_s)
            room = endpoints * width
            lost = 0.0
            for costs in slots.values():
                lost += len(costs) - _fill(costs, room)
                peak = max(peak, sum(costs) / room)
            most = max(most, lost)
    return most, peak


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


def main(argv: Sequence[str] | None = None) -> None:
    """Print the bound of the prefix benchmark's schedules: ``python -m loadgen.bench.scheduling.prefix_bound
    --workload coding --loads 1,2,3`` (seed 0's schedule, as the benchmark's report states it)."""
    ap = argparse.ArgumentParser(
        prog="python -m loadgen.bench.scheduling.prefix_bound", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--workload", default="coding")
    ap.add_argument("--loads", default="1,2,3")
    ap.add_argument("--endpoints", type=int, default=DEFAULT_ENDPOINTS)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--trace")
    a = ap.parse_args(argv)
    trace, profile = trace_path(a.trace), profile_for(a.workload)
    for load in (float(x) for x in a.loads.split(",")):
        at = load_for(a.workload, trace, load, a.duration, a.endpoints, profile_name=profile)
        tasks = schedule(a.workload, trace, at, a.duration, 0)
        best = goodput_bound(tasks, get_profile(profile), a.endpoints, 0)
        floor = ttft_floor_ms(tasks, get_profile(profile), 0)
        print(f"{a.workload} load {load:g}: {best.document()}, TTFT p90 floor {floor:.0f} ms")


if __name__ == "__main__":
    main()
