"""The sans-IO engine simulator driven by a fake clock: iteration times, batching, priorities, KV
preemption, aborts (no sockets, no sleeps)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.clock import FakeClock
from loadgen.engine_sim.engine import EngineConfig, IterationRecord, RequestState, SimEngine, SimRequest
from loadgen.engine_sim.latency import LatencyModel
from loadgen.engine_sim.profiles import PROFILES

LAT = LatencyModel(k1=1e-4, c1=0.02, k2=2e-6, c2=1e-3, c3=0.025)


def make(
    *, seqs: int = 8, kv: int = 100_000, policy: str = "fcfs", higher_first: bool = False, prefill: int = 8192
) -> SimEngine:
    return SimEngine(
        EngineConfig(
            latency=LAT,
            max_num_seqs=seqs,
            kv_capacity_tokens=kv,
            max_prefill_tokens=prefill,
            policy=policy,  # type: ignore[arg-type]
            higher_priority_first=higher_first,
        )
    )


def run(engine: SimEngine, clock: FakeClock, *, limit: int = 100_000) -> list[IterationRecord]:
    """Step the engine at each wake-up until it is idle; the iterations it ran."""
    out: list[IterationRecord] = []
    res = engine.step(clock.now())
    out += res.iterations
    for _ in range(limit):
        if res.next_wake is None:
            return out
        clock.set(res.next_wake)
        res = engine.step(clock.now())
        out += res.iterations
    raise AssertionError("engine did not go idle")


def expected(it: IterationRecord) -> float:
    if it.kind == "prefill":
        return LAT.prefill_s(it.tokens)
    return LAT.decode_s(it.batch, it.tokens / it.batch)


def test_iteration_times_match_the_latency_model() -> None:
    clock = FakeClock()
    eng = make()
    for i, (p, o) in enumerate([(100, 5), (300, 9), (50, 3), (1000, 7)]):
        eng.submit(f"r{i}", prompt_tokens=p, output_tokens=o, now=clock.now())
    iters = run(eng, clock)
    assert {it.kind for it in iters} == {"prefill", "decode"}
    for it in iters:
        assert it.duration == pytest.approx(expected(it), rel=0.10)
        assert it.duration == pytest.approx(expected(it), rel=1e-9)  # in fact exact


def test_first_prefill_and_decode_times_by_hand() -> None:
    clock = FakeClock()
    eng = make()
    a = eng.submit("a", prompt_tokens=200, output_tokens=3, now=clock.now())
    b = eng.submit("b", prompt_tokens=600, output_tokens=3, now=clock.now())
    iters = run(eng, clock)
    prefill, decode = iters[0], iters[1]
    assert prefill.kind == "prefill"
    assert prefill.batch == 2
    assert prefill.duration == pytest.approx(1e-4 * 800 + 0.02)
    # decode of 2 requests with contexts 201 and 601: l_avg = 401
    assert decode.kind == "decode"
    assert decode.batch == 2
    assert decode.duration == pytest.approx((2e-6 * 401 + 1e-3) * 2 + 0.025)
    assert a.first_token_at == b.first_token_at == pytest.approx(1000.0 + prefill.duration)
    assert a.state is b.state is RequestState.FINISHED
    assert a.finish_reason == "length"


def test_ttft_itl_and_e2e_are_recorded() -> None:
    clock = FakeClock()
    eng = make()
    req = eng.submit("a", prompt_tokens=100, output_tokens=4, now=clock.now())
    iters = run(eng, clock)
    st_ = eng.stats
    assert st_.ttft.count == 1
    assert st_.ttft.sum == pytest.approx(iters[0].duration)
    assert st_.itl.count == 3
    assert st_.itl.sum == pytest.approx(sum(i.duration for i in iters[1:]))
    assert st_.e2e.count == 1
    assert st_.e2e.sum == pytest.approx(req.finished_at - req.arrival)  # type: ignore[operator]
    assert st_.prompt_tokens == 100
    assert st_.generation_tokens == 4
    assert st_.requests_finished == {"length": 1}


def test_prefill_pauses_decode() -> None:
    clock = FakeClock()
    eng = make()
    a = eng.submit("a", prompt_tokens=100, output_tokens=50, now=clock.now())
    res = eng.step(clock.now())
    assert res.next_wake is not None
    clock.set(res.next_wake)  # a's prefill done, its decodes begin
    eng.step(clock.now())
    eng.submit("b", prompt_tokens=2000, output_tokens=5, now=clock.now())
    generated_before = a.generated
    res = eng.step(clock.now())  # a decode iteration is in flight: b waits for its end
    assert res.next_wake is not None
    clock.set(res.next_wake)
    res = eng.step(clock.now())
    assert [it.kind for it in res.iterations] == ["decode"]
    assert a.generated == generated_before + 1
    # the next iteration is b's prefill: a gets nothing during it
    assert res.next_wake is not None
    assert res.next_wake == pytest.approx(clock.now() + LAT.prefill_s(2000))
    clock.set(res.next_wake)
    res = eng.step(clock.now())
    assert res.iterations[0].kind == "prefill"
    assert a.generated == generated_before + 1
    assert b_first(eng, "b")


def b_first(eng: SimEngine, rid: str) -> bool:
    return any(r.rid == rid and r.generated == 1 for r in eng.running)


def test_max_num_seqs_caps_the_batch() -> None:
    clock = FakeClock()
    eng = make(seqs=3)
    reqs = [eng.submit(f"r{i}", prompt_tokens=10, output_tokens=20, now=clock.now()) for i in range(7)]
    eng.step(clock.now())
    assert eng.num_running == 3
    assert eng.num_waiting == 4
    iters = run(eng, clock)
    assert max(it.batch for it in iters) == 3
    assert all(r.state is RequestState.FINISHED for r in reqs)


def test_fcfs_admits_in_arrival_order() -> None:
    clock = FakeClock()
    eng = make(seqs=1)
    reqs = [eng.submit(f"r{i}", prompt_tokens=10, output_tokens=2, now=clock.now()) for i in range(4)]
    run(eng, clock)
    firsts = [r.first_token_at for r in reqs]
    assert firsts == sorted(firsts)  # type: ignore[type-var]


@pytest.mark.parametrize(
    ("higher_first", "expected_order"),
    [(False, ["p0", "p1", "p5"]), (True, ["p5", "p1", "p0"])],
    ids=["vllm-lower-first", "sglang-higher-first"],
)
def test_priority_policy_direction(higher_first: bool, expected_order: list[str]) -> None:
    clock = FakeClock()
    eng = make(seqs=1, policy="priority", higher_first=higher_first)
    blocker = eng.submit("blocker", prompt_tokens=10, output_tokens=3, now=clock.now())
    eng.step(clock.now())
    reqs = {
        name: eng.submit(name, prompt_tokens=10, output_tokens=2, priority=p, now=clock.now())
        for name, p in (("p5", 5), ("p1", 1), ("p0", 0))
    }
    run(eng, clock)
    assert blocker.state is RequestState.FINISHED
    order = sorted(reqs, key=lambda n: reqs[n].first_token_at or 0.0)
    assert order == expected_order


def test_kv_pressure_preempts_by_recompute() -> None:
    clock = FakeClock()
    # two requests of 100-token prompts growing to 160 tokens each cannot both fit in 260 KV tokens
    eng = make(kv=260)
    a = eng.submit("a", prompt_tokens=100, output_tokens=60, now=clock.now())
    b = eng.submit("b", prompt_tokens=100, output_tokens=60, now=clock.now())
    peak = 0
    res = eng.step(clock.now())
    while res.next_wake is not None:
        peak = max(peak, eng.kv_used)
        assert eng.kv_used <= 260
        clock.set(res.next_wake)
        res = eng.step(clock.now())
    assert a.state is b.state is RequestState.FINISHED
    assert a.generated == b.generated == 60
    assert eng.stats.preemptions >= 1
    assert b.preemptions >= 1
    assert a.preemptions == 0  # FCFS preempts the most recently admitted
    assert eng.kv_used == 0


def test_recompute_prefill_covers_prompt_and_generated_tokens() -> None:
    clock = FakeClock()
    eng = make(kv=260)
    eng.submit("a", prompt_tokens=100, output_tokens=60, now=clock.now())
    b = eng.submit("b", prompt_tokens=100, output_tokens=60, now=clock.now())
    iters = run(eng, clock)
    first, *later = [it for it in iters if it.kind == "prefill"]
    assert first.batch == 2
    assert first.tokens == 200
    assert later, "b was re-admitted"
    # its prefill recomputes the prompt plus the tokens it had already streamed
    assert all(it.batch == 1 and 100 < it.tokens < 100 + b.output_tokens for it in later)


def test_abort_frees_slot_and_kv() -> None:
    clock = FakeClock()
    eng = make(seqs=1)
    a = eng.submit("a", prompt_tokens=100, output_tokens=1000, now=clock.now())
    b = eng.submit("b", prompt_tokens=100, output_tokens=2, now=clock.now())
    res = eng.step(clock.now())
    assert eng.num_running == 1
    assert eng.kv_used > 0
    assert eng.abort(a)
    assert eng.num_running == 0
    assert eng.kv_used == 0
    assert not eng.abort(a)
    assert res.next_wake is not None
    clock.set(res.next_wake)
    res = eng.step(clock.now())  # a's prefill completes but a gets nothing; b is admitted next
    assert a.generated == 0
    assert a.state is RequestState.ABORTED
    run(eng, clock)
    assert b.state is RequestState.FINISHED
    assert eng.stats.requests_aborted == 1


def test_abort_while_waiting() -> None:
    clock = FakeClock()
    eng = make(seqs=1)
    eng.submit("a", prompt_tokens=10, output_tokens=5, now=clock.now())
    b = eng.submit("b", prompt_tokens=10, output_tokens=5, now=clock.now())
    eng.step(clock.now())
    assert eng.num_waiting == 1
    assert eng.abort(b)
    assert eng.num_waiting == 0
    run(eng, clock)
    assert b.generated == 0


def test_max_prefill_tokens_splits_admission() -> None:
    clock = FakeClock()
    eng = make(prefill=1000)
    for i in range(3):
        eng.submit(f"r{i}", prompt_tokens=600, output_tokens=2, now=clock.now())
    iters = run(eng, clock)
    prefills = [it for it in iters if it.kind == "prefill"]
    assert [it.batch for it in prefills] == [1, 1, 1]


def test_request_that_cannot_fit_is_refused() -> None:
    eng = make(kv=100)
    with pytest.raises(ValueError, match="KV"):
        eng.submit("a", prompt_tokens=90, output_tokens=20, now=0.0)


def test_abort_all_empties_the_engine() -> None:
    clock = FakeClock()
    eng = make(seqs=2)
    reqs = [eng.submit(f"r{i}", prompt_tokens=10, output_tokens=50, now=clock.now()) for i in range(4)]
    eng.step(clock.now())
    live = eng.abort_all()
    assert len(live) == 4
    assert all(r.state is RequestState.ABORTED for r in reqs)
    assert eng.num_running == eng.num_waiting == eng.kv_used == 0
    assert eng.step(clock.now()).next_wake is None


def test_late_step_catches_up_without_reordering_arrivals() -> None:
    clock = FakeClock()
    eng = make()
    a = eng.submit("a", prompt_tokens=10, output_tokens=20, now=clock.now())
    eng.step(clock.now())
    clock.advance(0.5)  # the driver was late: many iterations ended meanwhile
    b = eng.submit("b", prompt_tokens=10, output_tokens=2, now=clock.now())
    eng.step(clock.now())
    assert a.generated > 5
    assert b.state is RequestState.WAITING  # the iteration in flight started before b arrived
    run(eng, clock)
    assert b.admitted_at is not None
    assert b.admitted_at >= b.arrival


@pytest.mark.parametrize("name", sorted(PROFILES), ids=sorted(PROFILES))
def test_profiles_are_valid_engine_configs(name: str) -> None:
    prof = PROFILES[name]
    EngineConfig(
        latency=prof.latency, max_num_seqs=prof.max_num_seqs, kv_capacity_tokens=prof.kv_capacity_tokens
    )
    assert prof.max_model_len < prof.kv_capacity_tokens


def test_fleet_presets_decode_in_tens_of_ms() -> None:
    for name, prof in PROFILES.items():
        if prof.fleet_bench:
            full = prof.latency.decode_s(prof.max_num_seqs, 500)
            assert 0.01 <= full <= 0.1, name


ops = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(1, 300), st.integers(1, 40), st.integers(-2, 2)),
        st.tuples(st.just("abort"), st.integers(0, 50), st.just(0), st.just(0)),
        st.tuples(st.just("advance"), st.integers(0, 200), st.just(0), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(
    ops=ops, seqs=st.integers(1, 6), kv=st.integers(400, 2000), policy=st.sampled_from(["fcfs", "priority"])
)
def test_invariants_hold_under_random_traffic(
    ops: list[tuple[str, int, int, int]], seqs: int, kv: int, policy: str
) -> None:
    clock = FakeClock()
    eng = make(seqs=seqs, kv=kv, policy=policy)
    reqs: list[SimRequest] = []

    def check() -> None:
        assert eng.num_running <= seqs
        assert 0 <= eng.kv_used <= kv
        assert eng.kv_used == sum(r.kv_held for r in eng.running)
        assert all(r.state is RequestState.RUNNING for r in eng.running)
        assert eng.num_waiting == sum(1 for r in reqs if r.state is RequestState.WAITING)

    for op, a, b, c in ops:
        if op == "submit":
            reqs.append(
                eng.submit(f"r{len(reqs)}", prompt_tokens=a, output_tokens=b, priority=c, now=clock.now())
            )
        elif op == "abort" and reqs:
            eng.abort(reqs[a % len(reqs)])
        elif op == "advance":
            clock.advance(a / 1000)
        eng.step(clock.now())
        check()
    run(eng, clock)
    check()
    for r in reqs:
        assert r.state in (RequestState.FINISHED, RequestState.ABORTED)
        if r.state is RequestState.FINISHED:
            assert r.generated == r.output_tokens
    assert eng.kv_used == 0
    assert eng.num_running == 0
    assert eng.num_waiting == 0
