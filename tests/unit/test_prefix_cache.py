"""The engine model's prefix cache: content-addressed full blocks, hits on full-block prefixes only,
prefill charged on the uncached tokens, LRU eviction of free blocks only, KV accounting that counts a
shared block once and never exceeds the capacity (sans-IO, fake clock)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.clock import FakeClock
from loadgen.engine_sim.engine import EngineConfig, RequestState, SimEngine, SimRequest
from loadgen.engine_sim.latency import LatencyModel
from loadgen.engine_sim.prefix_cache import BlockRemoved, BlockStored, PrefixCache
from loadgen.engine_sim.tokens import GENERATED_TOKEN_ID, TokenIds

LAT = LatencyModel(k1=1e-3, c1=0.01, k2=0.0, c2=1e-3, c3=0.01)
BS = 4


def ids(*values: int) -> TokenIds:
    return np.array(values, dtype=np.int64)


def seq(start: int, n: int) -> TokenIds:
    return np.arange(start, start + n, dtype=np.int64)


def make(kv: int = 10_000, seqs: int = 8, prefill: int = 8192) -> SimEngine:
    return SimEngine(
        EngineConfig(
            latency=LAT,
            max_num_seqs=seqs,
            kv_capacity_tokens=kv,
            max_prefill_tokens=prefill,
            prefix_caching=True,
            block_size=BS,
        )
    )


def drain(eng: SimEngine, clock: FakeClock) -> None:
    res = eng.step(clock.now())
    while res.next_wake is not None:
        clock.set(res.next_wake)
        res = eng.step(clock.now())


# ---- the cache alone -----------------------------------------------------------------------------
def test_keys_chain_full_blocks_only() -> None:
    cache = PrefixCache(BS, root=1)
    a = cache.block_keys(seq(0, 10))  # two full blocks, a partial one
    b = cache.block_keys(np.concatenate([seq(0, 4), seq(100, 8)]))
    assert len(a) == 2
    assert len(b) == 3
    assert a[0] == b[0]
    assert a[1] != b[1]
    # a block's key depends on its parent: the same tokens after a different first block differ
    c = cache.block_keys(np.concatenate([seq(50, 4), seq(4, 4)]))
    assert c[1] != a[1]
    assert PrefixCache(BS, root=2).block_keys(seq(0, 8)) != a  # another process, other keys


class _Req:
    def __init__(self, cache: PrefixCache, tokens: TokenIds) -> None:
        self.token_ids: TokenIds | None = tokens
        self.block_keys: list[int] | None = cache.block_keys(tokens)
        self.blocks_held = 0
        self.cached_tokens = 0
        self.kv_held = 0
        self.generated = 0


def test_free_blocks_are_evicted_lru_tail_first() -> None:
    cache = PrefixCache(BS, root=1)
    a = _Req(cache, seq(0, 16))
    cache.admit(a, 16, cache.plan(a, 16), 0.0)
    cache.release(a)
    ka = a.block_keys
    assert ka is not None
    assert cache.free_order() == [ka[3], ka[2], ka[1], ka[0]]  # the deepest block goes first
    b = _Req(cache, seq(0, 9))  # shares blocks 0 and 1
    plan = cache.plan(b, 9)
    assert plan.hit_tokens == 8
    cache.admit(b, 9, plan, 1.0)
    assert cache.free_order() == [ka[3], ka[2]]
    cache.evict_to(BS)  # room for one free block: the least recently used goes
    assert cache.free_order() == [ka[2]]
    cache.release(b)
    assert cache.free_order() == [ka[2], ka[1], ka[0]]
    cache.evict_to(0)
    assert len(cache) == 0
    assert cache.free_tokens == 0


def test_a_block_in_use_is_never_evicted() -> None:
    cache = PrefixCache(BS, root=1, record_events=True)
    a = _Req(cache, seq(0, 8))
    cache.admit(a, 8, cache.plan(a, 8), 0.0)
    cache.evict_to(0)
    assert len(cache) == 2
    assert cache.blocks_in_use == 2
    events = cache.take_events()
    assert [type(e) for e in events] == [BlockStored]
    cache.release(a)
    cache.evict_to(0)
    assert len(cache) == 0
    [removed] = cache.take_events()
    assert isinstance(removed, BlockRemoved)
    assert len(removed.block_hashes) == 2


def test_the_last_prompt_token_is_always_computed() -> None:
    cache = PrefixCache(BS, root=1)
    a = _Req(cache, seq(0, 8))
    cache.admit(a, 8, cache.plan(a, 8), 0.0)
    b = _Req(cache, seq(0, 8))  # the same 8 tokens: at most one block (4 tokens) can be a hit
    plan = cache.plan(b, 8)
    assert plan.hit_tokens == 4
    assert plan.need == 1  # both blocks are held already; only the first token's slot is new


# ---- inside the engine ---------------------------------------------------------------------------
def test_a_shared_prefix_skips_its_prefill_and_is_counted_once() -> None:
    clock = FakeClock(0.0)
    eng = make()
    prefix = seq(1000, 400)
    first = eng.submit(
        "a", prompt_tokens=402, output_tokens=50, now=0.0, token_ids=np.concatenate([prefix, ids(1, 2)])
    )
    res = eng.step(0.0)
    assert res.next_wake == pytest.approx(LAT.prefill_s(402))
    clock.set(res.next_wake or 0.0)
    eng.step(clock.now())
    used = eng.kv_used
    second = eng.submit(
        "b",
        prompt_tokens=403,
        output_tokens=5,
        now=clock.now(),
        token_ids=np.concatenate([prefix, ids(7, 8, 9)]),
    )
    eng.step(clock.now())  # decode iteration in flight; b is admitted at its end
    clock.set(eng.next_wake or 0.0)
    res = eng.step(clock.now())
    prefill = [it for it in res.iterations if it.kind == "prefill"]
    assert not prefill  # the decode ended; the prefill of b started now
    assert eng.next_wake == pytest.approx(clock.now() + LAT.prefill_s(3))
    assert second.cached_tokens == 400
    # b's KV: its 3 private tokens + 1 slot; the 100 shared blocks are not counted again
    assert eng.kv_used == used + (3 + 1)
    cache = eng.prefix_cache
    assert cache is not None
    assert cache.hits == 400
    assert cache.queries == 402 + 403
    drain(eng, clock)
    assert first.state is RequestState.FINISHED
    assert second.state is RequestState.FINISHED
    assert eng.kv_used == 0
    # the shared prefix stays cached, free, and so do the outputs' full blocks: a's 402 + 50 - 1
    # computed tokens past its 400 prompt-block tokens make 12 blocks, b's 403 + 5 - 1 one
    assert cache.free_tokens == 400 + 4 * 12 + 4 * 1


def test_caching_off_is_the_engine_of_before() -> None:
    clock = FakeClock(0.0)
    eng = SimEngine(EngineConfig(latency=LAT, max_num_seqs=8, kv_capacity_tokens=10_000))
    assert eng.prefix_cache is None
    eng.submit("a", prompt_tokens=100, output_tokens=3, now=0.0, token_ids=seq(0, 100))
    res = eng.step(0.0)
    assert res.next_wake == pytest.approx(LAT.prefill_s(100))
    drain(eng, clock)
    assert eng.kv_used == 0


def test_cached_blocks_make_room_for_new_work() -> None:
    clock = FakeClock(0.0)
    eng = make(kv=200)
    for i in range(5):  # five prompts of 100 tokens one after another: each evicts the last one's blocks
        req = eng.submit(
            f"r{i}", prompt_tokens=100, output_tokens=2, now=clock.now(), token_ids=seq(1000 * i, 100)
        )
        drain(eng, clock)
        assert req.state is RequestState.FINISHED
        cache = eng.prefix_cache
        assert cache is not None
        assert eng.kv_used + cache.free_tokens <= 200


# ---- invariants ----------------------------------------------------------------------------------
PREFIXES = [seq(10_000 * k, 24) for k in range(3)]


@st.composite
def workloads(draw: st.DrawFn) -> list[tuple[str, int, int, int, int]]:
    ops = []
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["submit", "submit", "submit", "abort", "step"]))
        ops.append(
            (
                kind,
                draw(st.integers(0, len(PREFIXES) - 1)),
                draw(st.integers(0, 24)),  # how much of the shared prefix
                draw(st.integers(1, 20)),  # own suffix
                draw(st.integers(1, 6)),  # output tokens
            )
        )
    return ops


def check(eng: SimEngine, published: set[int]) -> None:
    cache = eng.prefix_cache
    assert cache is not None
    cap = eng.config.kv_capacity_tokens
    assert eng.kv_used + cache.free_tokens <= cap  # KV never over capacity
    held: dict[int, int] = {}
    private = 0
    for req in eng.running:
        private += req.kv_held
        for key in (req.block_keys or [])[: req.blocks_held]:
            held[key] = held.get(key, 0) + 1
    for key, n in held.items():
        assert cache.refs(key) == n  # one reference per running request that holds it
    assert cache.blocks_in_use == len(held)
    assert eng.kv_used == private + BS * len(held)  # a shared block counted once
    assert not set(cache.free_order()) & set(held)  # a block in use is never on the free list
    assert len(cache) == len(held) + len(cache.free_order())
    # the KV events tell exactly what the cache holds (so no block in use was reported removed)
    mask = (1 << 64) - 1
    assert published == {k & mask for k in [*held, *cache.free_order()]}


@settings(max_examples=150, deadline=None)
@given(workloads(), st.integers(60, 300))
def test_invariants_hold_under_any_workload(ops: list[tuple[str, int, int, int, int]], kv: int) -> None:
    clock = FakeClock(0.0)
    eng = make(kv=kv, seqs=4, prefill=64)
    cache = eng.prefix_cache
    assert cache is not None
    cache.events = []  # record what is stored and evicted
    reqs: list[SimRequest] = []
    seen: list[TokenIds] = []
    published: set[int] = set()
    for n, (kind, p, share, own, out) in enumerate(ops):
        if kind == "submit":
            prompt = np.concatenate([PREFIXES[p][:share], seq(100_000 + 100 * n, own)])
            if len(prompt) + out + 1 <= kv:
                reqs.append(
                    eng.submit(
                        f"r{n}",
                        prompt_tokens=len(prompt),
                        output_tokens=out,
                        now=clock.now(),
                        token_ids=prompt,
                    )
                )
                seen.append(prompt)
        elif kind == "abort" and reqs:
            eng.abort(reqs[p % len(reqs)])
        res = eng.step(clock.now())
        if kind == "step" and res.next_wake is not None:
            clock.set(res.next_wake)
            eng.step(clock.now())
        for event in cache.take_events():
            if isinstance(event, BlockStored):
                assert not published & set(event.block_hashes)
                published |= set(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                assert set(event.block_hashes) <= published
                published -= set(event.block_hashes)
        check(eng, published)
    drain(eng, clock)
    for event in cache.take_events():
        assert isinstance(event, BlockStored | BlockRemoved)
        if isinstance(event, BlockStored):
            published |= set(event.block_hashes)
        else:
            published -= set(event.block_hashes)
    check(eng, published)
    assert eng.kv_used == 0
    for i, req in enumerate(reqs):
        # hits only on full-block prefixes shared with an earlier prompt (or its own earlier run)
        assert req.cached_tokens % BS == 0
        best = 0
        for other in seen[: i + 1]:
            common = 0
            mine = seen[i]
            while common < min(len(other), len(mine)) and other[common] == mine[common]:
                common += 1
            best = max(best, common if other is not mine else len(mine))
        assert req.cached_tokens <= (best // BS) * BS
        assert req.cached_tokens <= max(0, len(seen[i]) + req.generated - 1)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(0, 3)), min_size=1, max_size=40))
def test_free_blocks_leave_in_lru_order(ops: list[tuple[bool, int, int]]) -> None:
    """Against a reference model: a block joins the free list's tail when its last reference goes (a
    request's deepest block first), leaves it when reused, and eviction takes from the head."""
    cache = PrefixCache(BS, root=1)
    prompts = [np.concatenate([PREFIXES[k % 3][: 4 * (k + 1)], seq(500 * k, 3)]) for k in range(6)]
    live: list[_Req] = []
    model: list[int] = []  # the free list, head first
    for admit, k, room in ops:
        if admit or not live:
            req = _Req(cache, prompts[k])
            keys = req.block_keys or []
            model = [b for b in model if b not in keys]
            cache.admit(req, len(prompts[k]), cache.plan(req, len(prompts[k])), 0.0)
            live.append(req)
        else:
            req = live.pop(k % len(live))
            keys = (req.block_keys or [])[: req.blocks_held]
            cache.release(req)
            model += [b for b in reversed(keys) if cache.refs(b) == 0 and b not in model]
        cache.evict_to(room * BS)
        model = model[len(model) - min(len(model), room) :]
        assert cache.free_order() == model


def test_an_answer_sent_back_hits_the_blocks_its_decode_cached() -> None:
    clock = FakeClock(0.0)
    eng = make()
    prompt = seq(0, 10)  # two full blocks and two tokens
    eng.submit("turn1", prompt_tokens=10, output_tokens=9, now=0.0, token_ids=prompt)
    drain(eng, clock)
    # the next turn resends the prompt, the 9 generated tokens, then more: 8 computed past the prompt
    # blocks' 8 tokens (2 of the prompt, 8 generated: the 9th's KV was never computed) make 2 blocks
    again = np.concatenate([prompt, np.full(9, GENERATED_TOKEN_ID), seq(500, 5)])
    req = eng.submit("turn2", prompt_tokens=len(again), output_tokens=1, now=clock.now(), token_ids=again)
    drain(eng, clock)
    assert req.cached_tokens == 16
