"""Decode runs (`loadgen.fleetsim.runs`): an engine whose decode iterations over an unchanged batch are
one event gives every request the same token times, finishes, KV and counters as the engine model one
iteration at a time; and the fleet simulator built on it gives the same report as token by token."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.types import ModelName
from gateway.lifecycle.instances import DeviceSpec, LifecycleSettings, ModelSpec, NodeSpec
from loadgen.engine_sim.engine import EngineConfig, RequestState, SimEngine, SimRequest
from loadgen.engine_sim.latency import LatencyModel
from loadgen.engine_sim.profiles import get_profile
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim import SimOptions, simulate
from loadgen.fleetsim.lifecycle import LifecycleOptions
from loadgen.fleetsim.runs import DecodeRun, RunEngine, plan_loop, plan_run

LAT = LatencyModel(k1=1e-4, c1=0.02, k2=2e-6, c2=1e-3, c3=0.025)
POLICIES = Path(__file__).resolve().parents[2] / "policies"


@dataclass(frozen=True)
class Submit:
    at: float
    prompt: int
    output: int
    priority: int


@dataclass(frozen=True)
class Abort:
    at: float
    which: int  # index of an earlier submit


@dataclass
class Trace:
    tokens: dict[str, list[float]]
    finished: dict[str, float | None]
    kv: list[int]  # the engine's KV use at each outside event, after it
    counters: tuple[Any, ...]


def config(seqs: int, kv: int, policy: str) -> EngineConfig:
    return EngineConfig(
        latency=LAT,
        max_num_seqs=seqs,
        kv_capacity_tokens=kv,
        max_prefill_tokens=4096,
        policy=policy,  # type: ignore[arg-type]
    )


def drive(engine: SimEngine, events: list[Submit | Abort]) -> Trace:
    """Submits and aborts at their times, the engine stepped at each of its wakes in between (as the
    fleet simulator does: a run is cut before an abort); each request's token times from `woken` and,
    for runs, the committed iterations."""
    tokens: dict[str, list[float]] = {}
    reqs: list[SimRequest] = []
    kv: list[int] = []

    def collect(now: float, woken: list[SimRequest]) -> None:
        if isinstance(engine, RunEngine):
            for run, a, b in engine.take_committed():
                for r in run.members:
                    tokens[r.rid].extend(run.ends[a:b])
        for r in woken:
            tokens[r.rid].append(now)

    def step(now: float) -> float | None:
        res = engine.step(now)
        collect(now, res.woken)
        return res.next_wake

    wake: float | None = None
    for ev in events:
        while wake is not None and wake <= ev.at:
            wake = step(wake)
        if isinstance(ev, Submit):
            rid = f"r{len(reqs)}"
            tokens[rid] = []
            reqs.append(
                engine.submit(
                    rid, prompt_tokens=ev.prompt, output_tokens=ev.output, now=ev.at, priority=ev.priority
                )
            )
        else:
            if isinstance(engine, RunEngine):
                engine.cut(ev.at)
            engine.abort(reqs[ev.which % len(reqs)])
        if isinstance(engine, RunEngine):
            engine.sync(ev.at)  # what a scrape does: the KV of the iteration in flight
        collect(ev.at, [])
        kv.append(engine.kv_used)
        wake = step(ev.at) if wake is None else engine.next_wake
    while wake is not None:
        wake = step(wake)
    s = engine.stats
    counters = (
        s.generation_tokens,
        s.iterations,
        s.preemptions,
        s.requests_aborted,
        dict(s.requests_finished),
        s.itl.counts,
        s.ttft.counts,
        s.e2e.counts,
        round(s.busy_s, 6),
    )
    finished = {r.rid: r.finished_at for r in reqs}
    assert all(r.state in {RequestState.FINISHED, RequestState.ABORTED} for r in reqs)
    return Trace(tokens, finished, kv, counters)


@st.composite
def schedules(draw: st.DrawFn) -> list[Submit | Abort]:
    n = draw(st.integers(1, 14))
    t = 0.0
    out: list[Submit | Abort] = []
    for i in range(n):
        t += draw(st.floats(0.0, 1.5))
        out.append(Submit(t, draw(st.integers(1, 600)), draw(st.integers(1, 120)), draw(st.integers(0, 3))))
        if i and draw(st.integers(0, 5)) == 0:
            t += draw(st.floats(0.0, 0.5))
            out.append(Abort(t, draw(st.integers(0, 100))))
    return out


@settings(max_examples=120, deadline=None)
@given(
    events=schedules(),
    seqs=st.integers(1, 6),
    kv=st.sampled_from([800, 2_000, 100_000]),
    policy=st.sampled_from(["fcfs", "priority"]),
    max_run=st.sampled_from([2, 7, 128]),
)
def test_runs_give_the_same_tokens_kv_and_counters(
    events: list[Submit | Abort], seqs: int, kv: int, policy: str, max_run: int
) -> None:
    events = [e for e in events if not isinstance(e, Submit) or e.prompt + e.output + 1 <= kv]
    plain = drive(SimEngine(config(seqs, kv, policy)), events)
    runs = drive(RunEngine(config(seqs, kv, policy), max_run=max_run), events)
    assert runs.tokens == plain.tokens  # the same floats: the same arithmetic in the same order
    assert runs.finished == plain.finished
    assert runs.kv == plain.kv
    assert runs.counters == plain.counters


def _run_of(eng: RunEngine) -> DecodeRun | None:
    return eng.run


def test_a_decode_stretch_is_one_event() -> None:
    eng = RunEngine(config(4, 100_000, "fcfs"))
    for i in range(3):
        eng.submit(f"r{i}", prompt_tokens=100, output_tokens=50 + 10 * i, now=0.0)
    res = eng.step(0.0)  # the prefill
    assert res.next_wake is not None
    res = eng.step(res.next_wake)  # first tokens; the decode iterations up to the first finish: one run
    assert eng.run is not None
    assert len(eng.run.ends) == 49  # r0 has 49 tokens left: its last comes at the run's last iteration
    assert res.next_wake == eng.run.ends[-1]
    # an arrival mid-run cuts it after the iteration in flight
    mid = (eng.run.ends[9] + eng.run.ends[10]) / 2
    eng.submit("late", prompt_tokens=10, output_tokens=5, now=mid)
    assert _run_of(eng) is None
    assert eng.next_wake is not None
    assert eng.next_wake > mid
    spans = eng.take_committed()
    assert [(a, b) for _, a, b in spans] == [(0, 10)]


# ----------------------------------------------------------------- the fleet simulator, both ways
def _fleet(n: int, profile: str) -> tuple[EndpointSpec, ...]:
    return tuple(EndpointSpec(models=("m",), profile=profile, seed=i, id=f"e{i}") for i in range(n))


def _report(max_run: int, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "policy": POLICIES / "default.toml",
        "fleet": _fleet(4, "fleet-7b"),
        "workload": "sharegpt-like",
        "rate": 2.0,
        "duration_s": 20.0,
        "seed": 3,
    }
    data = simulate(SimOptions(**{**base, **kw}, max_run=max_run)).data
    sim = data["simulation"]
    data["simulation"] = {
        k: v for k, v in sim.items() if k not in ("wall_s", "events_per_s", "requests_per_s", "events")
    }
    return data


@pytest.mark.parametrize(
    "kw",
    [
        pytest.param({}, id="default"),
        pytest.param(
            {"policy": POLICIES / "coding-assistant.toml", "workload": "coding:pattern1", "rate": 6.0},
            id="coding-assistant",
        ),
        pytest.param(
            {"policy": POLICIES / "chat-and-batch.toml", "rate": 8.0, "fleet": _fleet(3, "fleet-7b")},
            id="chat-and-batch-overloaded",
        ),
        pytest.param({"rate": 6.0, "stall_timeout_s": 0.5, "request_timeout_s": 4.0}, id="client-timeouts"),
        pytest.param(  # engines caching prefixes: shared blocks, cached output, evictions of free blocks
            {"workload": "chat", "rate": 1.5, "fleet": _fleet(2, "fleet-8b-long")},
            id="prefix-cache-chat",
        ),
    ],
)
def test_the_simulator_gives_the_same_report_token_by_token_and_by_runs(kw: dict[str, Any]) -> None:
    a = _report(1, **kw)
    b = _report(128, **kw)
    assert orjson.dumps(a, option=orjson.OPT_SORT_KEYS) == orjson.dumps(b, option=orjson.OPT_SORT_KEYS)


def test_the_same_report_with_instances_started_and_stopped_under_it() -> None:
    """Engines join and leave the fleet as the lifecycle loads and evicts models."""
    gib = 1 << 30
    models = tuple(ModelSpec(ModelName(f"m{i}"), 4 * gib, 1, 3.0) for i in range(4))
    kw: dict[str, Any] = {
        "policy": None,
        "fleet": tuple(EndpointSpec(models=(m.name,), id=m.name, profile="fleet-7b") for m in models),
        "workload": "multi-model:uniform",
        "rate": 2.0,
        "duration_s": 30.0,
        "models": tuple(m.name for m in models),
        "lifecycle": LifecycleOptions(
            models=models,
            nodes=(NodeSpec("n1", (DeviceSpec("gpu0", 9 * gib),)),),
            evictor="lru",
            settings=LifecycleSettings(churn_guard_s=1.0, drain_timeout_s=0.5, load_deadline_s=120.0),
            stop_s=0.5,
        ),
    }
    a = _report(1, **kw)
    b = _report(128, **kw)
    assert a["lifecycle"]["evictions"] > 0
    assert orjson.dumps(a, option=orjson.OPT_SORT_KEYS) == orjson.dumps(b, option=orjson.OPT_SORT_KEYS)


#: How a decode run is planned: `plan_run` or `plan_loop`.
Planner: TypeAlias = (
    "Callable[[LatencyModel, int, int, tuple[float, float], int], tuple[list[float], array[float]]]"
)


@pytest.mark.parametrize("plan", [plan_run, plan_loop], ids=["over arrays", "spelled-out loop"])
@settings(max_examples=200, deadline=None)
@given(
    st.tuples(st.integers(1, 64), st.integers(0, 200_000), st.integers(2, 300)),
    st.floats(0.0, 1e5),
    st.floats(1e-4, 1.0),
    st.sampled_from(["fleet-7b", "fleet-13b", "a100-llama2-70b", "h100-llama3-8b"]),
)
def test_a_planned_run_is_bit_for_bit_the_loop(
    plan: Planner, sizes: tuple[int, int, int], start: float, first: float, profile: str
) -> None:
    """`plan_run` (over arrays) and `plan_loop` (the latency model's decode time written out) against one
    `decode_s` call an iteration."""
    b, tokens0, n = sizes
    lat = get_profile(profile).latency
    got_ends, got_gaps = plan(lat, b, tokens0, (start, start + first), n)
    assert (got_ends, got_gaps.tolist()) == _run_by_loop(lat, b, tokens0, start, start + first, n)


def test_a_run_longer_than_the_kept_iteration_index_is_planned_the_same() -> None:
    lat = get_profile("fleet-7b").latency
    b, tokens0, n, start = 9, 4321, 3000, 2.5
    got_ends, got_gaps = plan_run(lat, b, tokens0, (start, start + 0.04), n)
    assert (got_ends, got_gaps.tolist()) == _run_by_loop(lat, b, tokens0, start, start + 0.04, n)


def _run_by_loop(  # noqa: PLR0917 (a run's terms, as plan_run takes them)
    lat: Any, b: int, tokens0: int, start: float, first_end: float, n: int
) -> tuple[list[float], list[float]]:
    """A decode run's iteration ends and gaps by the plain loop `plan_run` must match bit for bit."""
    end = first_end
    ends, gaps = [end], [end - start]
    tokens = tokens0
    for _ in range(n - 1):
        tokens += b
        nxt = end + lat.decode_s(b, tokens / b)
        ends.append(nxt)
        gaps.append(nxt - end)
        end = nxt
    return ends, gaps
