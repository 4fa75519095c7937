"""The prefix benchmark's goodput bound: what no placement can beat, from the engine model alone."""

from __future__ import annotations

import dataclasses

import pytest

from loadgen.bench.scheduling.prefix_bound import call_bound, goodput_bound, ttft_floor_ms, uncached_tokens
from loadgen.engine_sim.latency import LatencyModel
from loadgen.engine_sim.profiles import EngineProfile
from loadgen.workloads.base import CallSpec, Slo, TaskSpec
from loadgen.workloads.prompt import Message, Prompt, Span

# 1 ms a prompt token, 10 ms a prefill; decode 10 ms an iteration + 1 ms a request; 4 seats
PROFILE = EngineProfile(
    latency=LatencyModel(k1=1e-3, c1=0.010, k2=0.0, c2=1e-3, c3=0.010),
    max_num_seqs=4,
    kv_capacity_tokens=100_000,
    max_prefill_tokens=1_000,
    block_size=16,
)


def _call(prompt: int, out: int, slo: Slo, text: Prompt | None = None) -> CallSpec:
    return CallSpec(prompt, out, slo=slo, prompt=text, cls="c")


def test_an_isolated_call_meets_its_target_only_when_an_idle_engine_can() -> None:
    fits = call_bound(PROFILE, _call(100, 1, Slo(ttft_ms=111.0)), 100, 0, 0.0)
    late = call_bound(PROFILE, _call(100, 1, Slo(ttft_ms=109.0)), 100, 0, 0.0)
    assert fits.feasible  # 100 ms prefill + 10 ms
    assert not late.feasible
    # E2E 1 s, 101 tokens: first token 110 ms, then 100 iterations of >= 11 ms (batch 1)
    e2e = call_bound(PROFILE, _call(100, 101, Slo(e2e_ms=1_000.0)), 100, 0, 0.0)
    assert not e2e.feasible
    ok = call_bound(PROFILE, _call(100, 101, Slo(e2e_ms=1_300.0)), 100, 0, 0.0)
    # spare 1.3 - 0.11 - 1.0 = 0.19 s over 100 tokens at 1 ms a batch-mate: batches of 1.9 on average
    assert ok.feasible
    assert ok.cost_s == pytest.approx(0.1 + 0.01 / 4 + 100 * 0.001 + 100 * 0.010 / 1.9)  # 4 prompts a prefill


def test_a_perfect_cache_skips_the_leading_blocks_sent_before() -> None:
    shared = Message("system", (Span("ctx", 1, 64),))
    first = Prompt((shared, Message("user", (Span("own", 1, 32),))))
    second = Prompt((shared, Message("user", (Span("own", 2, 32),))))
    a = _call(first.tokens("chat"), 1, Slo(ttft_ms=1e6), first)
    b = _call(second.tokens("chat"), 1, Slo(ttft_ms=1e6), second)
    tasks = [TaskSpec(0, 0.0, "t", (a,)), TaskSpec(1, 1.0, "t", (b,))]
    got = uncached_tokens(tasks, 16, 0)
    assert got[(0, 0)] == a.prompt_tokens  # nothing sent before it
    assert 0 < got[(1, 0)] <= b.prompt_tokens - 64  # the shared context's blocks are hits


def test_the_bound_counts_the_fleets_engine_time() -> None:
    # 10 calls of 1 s of prefill each within a 2 s deadline window: one engine serves two of them
    calls = [TaskSpec(i, 0.0, "t", (_call(990, 1, Slo(ttft_ms=2_000.0)),)) for i in range(10)]
    one = goodput_bound(calls, PROFILE, 1, 0)
    assert one.feasible_share == 1.0
    assert one.goodput == pytest.approx(2 / 10, abs=0.01)
    assert one.busy_ratio == pytest.approx(5.0, rel=0.01)
    assert goodput_bound(calls, PROFILE, 5, 0).goodput == pytest.approx(1.0, abs=0.01)
    # an impossible target caps it whatever the fleet
    late = [dataclasses.replace(t, calls=(_call(990, 1, Slo(ttft_ms=500.0)),)) for t in calls[:5]]
    assert goodput_bound(late + calls[5:], PROFILE, 100, 0).goodput == pytest.approx(0.5 / (0.5 + 0.5))


def test_batch_mates_add_at_least_the_shortest_context() -> None:
    # k2 = 1 us a context token: a batch-mate of at least 1,000 tokens adds 1 ms + 1 ms an iteration
    profile = dataclasses.replace(PROFILE, latency=dataclasses.replace(PROFILE.latency, k2=1e-6))
    call = _call(100, 101, Slo(e2e_ms=1_300.0))
    alone = call_bound(profile, call, 100, 0, 0.0)
    mates = call_bound(profile, call, 100, 0, 0.0, least_context=1_000)
    assert alone.feasible
    assert mates.feasible
    # spare 1.19 s less Σ k2 · context and 100 · 10 ms: what is left bounds the mean batch
    ctx = 100 * (1e-6 * 100) + 1e-6 * 100 * 101 / 2
    left = 1.3 - 0.11 - ctx - 100 * 0.010
    assert alone.cost_s == pytest.approx(0.1 + 0.01 / 4 + ctx + 100 * 0.001 + 100 * 0.010 / (left / 0.1))
    batch = 1.0 + (left - 100 * 0.001) / (0.002 * 100)
    assert mates.cost_s == pytest.approx(0.1 + 0.01 / 4 + ctx + 100 * 0.001 + 100 * 0.010 / batch)
    assert mates.cost_s > alone.cost_s  # smaller batches: more of the fixed iteration cost each
    # with no context at all a batch-mate adds c2 only: the bound as before
    assert call_bound(profile, call, 100, 0, 0.0, least_context=0).cost_s == pytest.approx(alone.cost_s)


def test_the_ttft_floor_is_each_call_alone_with_a_perfect_cache() -> None:
    # ten one-call tasks of 100 uncached tokens (100 ms + 10 ms) and one of 990 (1 s): p90 110 ms
    short = [TaskSpec(i, float(i), "t", (_call(100, 1, Slo(ttft_ms=1e6)),)) for i in range(10)]
    long = TaskSpec(10, 10.0, "t", (_call(990, 1, Slo(ttft_ms=1e6)),))
    assert ttft_floor_ms([*short, long], PROFILE, 0) == pytest.approx(110.0)
    assert ttft_floor_ms([*short, long], PROFILE, 0, q=100.0) == pytest.approx(1000.0)
    # a task's second call is cached where its first ran: one token to prefill
    two = TaskSpec(0, 0.0, "t", (_call(500, 1, Slo(ttft_ms=1e6)), _call(600, 1, Slo(ttft_ms=1e6))))
    assert ttft_floor_ms([two], PROFILE, 0, q=0.0) == pytest.approx(11.0)
    assert ttft_floor_ms([], PROFILE, 0) == 0.0
