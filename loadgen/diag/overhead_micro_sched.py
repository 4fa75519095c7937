"""The scheduler's pieces of `overhead_micro` (`sched`, `sched_stream`, `backlog_N`, `fleet_N`): what each
measures is in that module's docstring, and the helpers the other pieces build a scheduler with."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any, Final

#: With `--policy`: the fleet pieces' requests' targets, and the clock's step per request.
POLICY_TTFT_MS: Final = 2000.0
POLICY_E2E_MS: Final = 8000.0
POLICY_STEP_S: Final = 0.005
#: The backlog pieces' policy: chat-and-batch's ordering and classes, least-outstanding placement, and
#: admission that only bounds the interactive class's queue (no predictions).
BACKLOG_POLICY: Final = """
name = "backlog"
[ordering]
plugin = "priority-bands"
params = { within = "arrival" }
[placement]
picker = { plugin = "max-score" }
filters = []
[[placement.scorers]]
plugin = "least-outstanding"
weight = 1.0
[admission]
plugin = "admit-all"
[slo]
default_class = "interactive"
[[slo.classes]]
name = "interactive"
band = 0
max_queue = 512
[[slo.classes]]
name = "batch"
kind = "batch"
band = 1
"""
PROGRESS_EVERY: Final = 16  # as gateway.dispatch.relay
STREAM_TOKENS: Final = 256


def _scheduler(inflight: int, policy_text: str | None = None, endpoints: int = 2) -> Any:
    from gateway.config.policy import load_default_policy, parse_policy_text
    from gateway.core.clock import FakeClock
    from gateway.core.types import EndpointHealth, EndpointId, EngineKind, ModelName
    from gateway.sched.plugins import default_registry
    from gateway.sched.scheduler import Scheduler
    from gateway.sched.types import EndpointSpec, QueueLimits

    clock = FakeClock()
    reg = default_registry()
    pol = (
        load_default_policy(reg) if policy_text is None else parse_policy_text(policy_text, "micro.toml", reg)
    )
    sched = Scheduler(pol, clock, QueueLimits(max_queue_per_model=1_000_000))
    model = ModelName("bench")
    specs = [
        EndpointSpec(EndpointId(f"e{i}"), f"http://e{i}", EngineKind.VLLM, frozenset({model}), cap=inflight)
        for i in range(endpoints)
    ]
    sched.sync_endpoints(specs)
    for s in specs:
        sched.set_health(s.id, EndpointHealth.READY)
    return sched, clock


def _requests(n: int, clock: Any, slo_class: str = "default", prefix: str = "b") -> list[Any]:
    from gateway.core.types import SLO, ApiKind, ModelName, RequestId
    from gateway.sched.request import SchedRequest

    slo = SLO(slo_class=slo_class)
    return [
        SchedRequest(
            id=RequestId(f"{prefix}{i}"),
            model=ModelName("bench"),
            api=ApiKind.CHAT,
            arrival=clock.now(),
            slo=slo,
            prompt_tokens=12,
            max_tokens=16,
            stream=False,
            predicted_output_tokens=16.0,
            predicted_output_p90=16.0,
        )
        for i in range(n)
    ]


def bench_sched(
    n: int, inflight: int, *, stream: bool, endpoints: int = 2, policy: str | None = None
) -> float:
    """CPU ns per request of the scheduler's cycle (submit, progress, complete) with `inflight` requests
    running over `endpoints` endpoints (each capped at `inflight`); `policy`: a shipped preset's name
    (see the module's docstring)."""
    import dataclasses

    from gateway.core.types import SLO
    from gateway.sched.decisions import Dispatch

    text = None if policy is None else (Path.cwd() / "policies" / f"{policy}.toml").read_text()
    sched, clock = _scheduler(inflight, text, endpoints=endpoints)
    reqs = _requests(n + inflight, clock)
    step = 0.0
    if policy is not None:
        step = POLICY_STEP_S
        slo_policy = sched.policy.slo
        slo = SLO(slo_class=slo_policy.default_class, ttft_ms=POLICY_TTFT_MS, deadline_ms=POLICY_E2E_MS)
        # each request arrives when it is submitted (the clock moves a step before each submit), so its
        # targets are its own and not eaten by the run's length
        start = clock.now()
        reqs = [
            dataclasses.replace(r, slo=slo, arrival=start + max(0, j - inflight + 1) * step)
            for j, r in enumerate(reqs)
        ]
    for r in reqs[:inflight]:
        assert isinstance(sched.submit(r), Dispatch)
    reports = [(k, k * 0.01) for k in range(1, STREAM_TOKENS + 1, PROGRESS_EVERY)] if stream else []
    progress, submit, complete = sched.progress, sched.submit, sched.complete
    gc.collect()
    t0 = time.thread_time_ns()
    for i in range(n):
        old = reqs[i].id
        if reports:
            for produced, _ in reports:
                progress(old, produced, 0.001)
        if step:
            clock.advance(step)
        complete(old)
        d = submit(reqs[i + inflight])
        if type(d) is not Dispatch:
            raise RuntimeError(f"the micro-benchmark's request must be placed at once, not {d!r}")
    took = (time.thread_time_ns() - t0) / n
    outcomes = {outcome for (_, outcome) in sched.admission.counts()}
    if outcomes - {"admit"}:
        # a request admission found infeasible is judged on every endpoint: not the cost measured here
        raise RuntimeError(f"the micro-benchmark's requests must be admitted as feasible, not {outcomes}")
    return took


def bench_backlog(n: int, inflight: int, backlog: int) -> float:
    """CPU ns per request of the scheduler's cycle behind `backlog` queued batch requests (see the
    module's docstring)."""
    from collections import deque

    from gateway.sched.decisions import Dispatch

    sched, clock = _scheduler(inflight, BACKLOG_POLICY)
    seated = _requests(2 * inflight, clock, "interactive", "s")
    for r in seated:
        assert isinstance(sched.submit(r), Dispatch)
    for r in _requests(backlog, clock, "batch", "q"):
        assert sched.submit(r) is None
    reqs = _requests(n, clock, "interactive")
    running = deque(r.id for r in seated)
    submit, complete = sched.submit, sched.complete
    gc.collect()
    t0 = time.thread_time_ns()
    for r in reqs:
        if submit(r) is not None:
            raise RuntimeError(
                "the backlog micro-benchmark's request was not queued: every seat must be taken"
            )
        placed = complete(running.popleft())
        if len(placed) != 1 or placed[0].req is not r:
            raise RuntimeError(
                "the backlog micro-benchmark's completion must place the waiting interactive request"
            )
        running.append(r.id)
    return (time.thread_time_ns() - t0) / n
