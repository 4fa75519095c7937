"""A tick looks only at the queued requests whose expiry or recheck may have come (`gateway.sched.ticks`):

- the SLO admitter's promise (`recheck_from`): before that time its "late" recheck admits the request, on
  the whole fleet and on any part of it, at any later clock (hypothesis over fleets, refits, requests);
- the scheduler's ticks decide exactly what a walk of the whole queue decides (hypothesis: the old tick
  as the reference, against the same events: submissions, completions, time, refits).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core import errors
from gateway.core.clock import FakeClock
from gateway.core.slo import Infeasible, SloClass, SloPolicy, default_slo_policy
from gateway.core.types import SLO, ApiKind, EndpointHealth, EndpointId, EngineKind, ModelName, RequestId
from gateway.sched.decisions import Decision, Dispatch, Reject, fault_error
from gateway.sched.interfaces import AdmitOutcome
from gateway.sched.perf import PerfCoefficients, default_prior
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.admission.slo_feasibility import SloFeasibilityAdmitter, SloFeasibilityParams
from gateway.sched.profile import Policy, SchedulerProfile, WeightedScorer
from gateway.sched.registry import PluginKind
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.snapshot import EndpointEstimates, FleetSnapshot
from gateway.sched.types import EndpointSpec, QueueLimits
from tests.unit.sched_builders import view

PRIOR = default_prior()
M = ModelName("m")


def perf(speed: float) -> PerfCoefficients:
    return dataclasses.replace(
        PRIOR,
        k1=PRIOR.k1 / speed,
        c1=PRIOR.c1 / speed,
        k2=PRIOR.k2 / speed,
        c2=PRIOR.c2 / speed,
        c3=PRIOR.c3 / speed,
    )


def request(
    rid: str, arrival: float, *, ttft_ms: float | None, deadline_ms: float | None, prompt: int, out: float
) -> SchedRequest:
    return SchedRequest(
        id=RequestId(rid),
        model=M,
        api=ApiKind.CHAT,
        arrival=arrival,
        slo=SLO(ttft_ms=ttft_ms, deadline_ms=deadline_ms),
        prompt_tokens=prompt,
        max_tokens=None,
        stream=True,
        predicted_output_tokens=out,
        predicted_output_p90=out * 1.4,
    )


speeds = st.lists(st.sampled_from((0.5, 0.9, 1.0, 1.1, 2.0)), min_size=1, max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    fleet=speeds,
    refit=speeds,
    ttft_ms=st.sampled_from((None, 100.0, 500.0, 2000.0)),
    deadline_ms=st.sampled_from((None, 1000.0, 5000.0, 30000.0)),
    prompt=st.sampled_from((1, 300, 4000)),
    out=st.sampled_from((1.0, 40.0, 900.0)),
    produced=st.sampled_from((0, 30)),
    tail=st.sampled_from(("mean", "normal", "cantelli")),
    later=st.floats(0.0, 1.0),
    scope=st.integers(1, 4),
)
def test_before_its_time_the_late_recheck_admits_a_request(  # noqa: PLR0917
    fleet: list[float],
    refit: list[float],
    ttft_ms: float | None,
    deadline_ms: float | None,
    prompt: int,
    out: float,
    produced: int,
    tail: str,
    later: float,
    scope: int,
) -> None:
    params = SloFeasibilityParams(tail=tail, recheck="late")  # type: ignore[arg-type]  # a sampled literal
    admitter = SloFeasibilityAdmitter(params, default_slo_policy())
    req = dataclasses.replace(
        request("r", 0.0, ttft_ms=ttft_ms, deadline_ms=deadline_ms, prompt=prompt, out=out),
        produced_tokens=produced,
    )

    def snap(now: float, fleet_speeds: list[float]) -> FleetSnapshot:
        views = tuple(
            dataclasses.replace(view(f"e{i}"), estimates=EndpointEstimates(perf=perf(s)))
            for i, s in enumerate(fleet_speeds)
        )
        return FleetSnapshot(now=now, endpoints=views)

    first = snap(0.0, fleet)
    epoch = admitter.recheck_epoch(M, first)
    at = admitter.recheck_from(req, first)
    # a refit: when the epoch holds, the promise must hold on the refitted fleet too
    refitted = snap(0.0, refit)
    fleets = [fleet, refit] if admitter.recheck_epoch(M, refitted) == epoch else [fleet]
    if at == float("inf"):
        now_points = [0.0, 100.0]
    elif at == -float("inf") or at < 0:
        now_points = []
    else:
        now_points = [at * later]
    for speeds_now in fleets:
        for now in now_points:
            s = snap(now, speeds_now)
            assert admitter.recheck(req, s).outcome is AdmitOutcome.ADMIT
            part = dataclasses.replace(s, endpoints=s.endpoints[:scope])
            assert admitter.recheck(req, part).outcome is AdmitOutcome.ADMIT


# ----------------------------------------------------------------- the scheduler against the walk
class WalkingScheduler(Scheduler):
    """The tick as it was: every queued request looked at on every tick (the reference)."""

    def tick(self) -> list[Decision]:
        now = self._clock.now()
        out: list[Decision] = []
        max_wait = self._limits.max_wait_s
        ready = self._fleet.ready_models()
        admitter = self._policy.admitter
        recheck = admitter is not None and admitter.rechecks and self._queues.any_waiting()
        snap = self.snapshot() if recheck else None
        for model, queue in self._queues.items():
            loading = model not in ready and model in self._loadable
            wait_limit = max(max_wait, self._load_deadline_s) if loading else max_wait
            for item in list(queue):
                if now - item.queued_at > wait_limit:
                    queue.remove(item)
                    out.append(
                        Reject(
                            item.req,
                            errors.queue_timeout(model, now - item.queued_at, self._limits.retry_after_s),
                        )
                    )
                elif loading:
                    pass
                elif model not in ready:
                    queue.remove(item)
                    out.append(Reject(item.req, errors.no_ready_endpoint(model, self._limits.retry_after_s)))
                elif snap is not None:
                    req = item.req
                    try:
                        req, refused = self.admission.recheck(self._policy, req, snap)
                    except Exception as e:
                        self._fault(req, "admission", e)
                        refused = fault_error()
                    if refused is not None:
                        queue.remove(item)
                        out.append(Reject(req, refused))
                    else:
                        queue.set_req(item, req)
        out.extend(self._serve_all())
        return out


def slo_policy(on_infeasible: str) -> Policy:
    reg = default_registry()
    slo = SloPolicy(classes={"c": SloClass("c", on_infeasible=Infeasible(on_infeasible))}, default_class="c")
    admitter = SloFeasibilityAdmitter(SloFeasibilityParams(recheck="late"), slo)
    return Policy(
        name="ticks",
        ordering=reg.build(PluginKind.ORDERING, "fcfs", None, path="ordering"),
        profile=SchedulerProfile(
            filters=(),
            scorers=(WeightedScorer(reg.build(PluginKind.SCORER, "least-outstanding", None, path="s"), 1.0),),
            picker=reg.build(PluginKind.PICKER, "max-score", None, path="picker"),
        ),
        admitter=admitter,
        slo=slo,
    )


@dataclass(frozen=True)
class Submit:
    ttft_ms: float | None
    deadline_ms: float | None
    prompt: int
    out: float


@dataclass(frozen=True)
class Complete:
    pick: int


@dataclass(frozen=True)
class Advance:
    seconds: float


@dataclass(frozen=True)
class Refit:
    endpoint: int
    speed: float


@dataclass(frozen=True)
class Tick:
    pass


events = st.one_of(
    st.builds(
        Submit,
        ttft_ms=st.sampled_from((None, 200.0, 1500.0, 6000.0)),
        deadline_ms=st.sampled_from((None, 3000.0, 20000.0)),
        prompt=st.sampled_from((10, 800, 6000)),
        out=st.sampled_from((1.0, 100.0, 1500.0)),
    ),
    st.builds(Complete, pick=st.integers(0, 100)),
    st.builds(Advance, seconds=st.sampled_from((0.05, 0.3, 2.0, 15.0))),
    st.builds(Refit, endpoint=st.integers(0, 1), speed=st.sampled_from((0.3, 0.98, 1.0, 1.04, 3.0))),
    st.just(Tick()),
)


def summary(ds: list[Decision] | Decision | None) -> list[tuple[str, str, str]]:
    if ds is None:
        return []
    out: list[tuple[str, str, str]] = []
    for d in ds if isinstance(ds, list) else [ds]:
        if isinstance(d, Dispatch):
            out.append(("dispatch", d.req.id, d.endpoint.id))
        elif isinstance(d, Reject):
            out.append(("reject", d.req.id, d.error.code))
        else:
            out.append((type(d).__name__, "", ""))
    return out


@settings(max_examples=150, deadline=None)
@given(script=st.lists(events, max_size=80), on_infeasible=st.sampled_from(("reject", "best-effort", "hold")))
def test_ticks_decide_what_a_walk_of_the_queue_decides(script: list[object], on_infeasible: str) -> None:
    pair = []
    for cls in (Scheduler, WalkingScheduler):
        clock = FakeClock()
        sched = cls(slo_policy(on_infeasible), clock, QueueLimits(max_wait_s=30.0))
        specs = [
            EndpointSpec(EndpointId(f"e{i}"), f"http://e{i}:8000", EngineKind.VLLM, frozenset({M}), cap=2)
            for i in range(2)
        ]
        sched.sync_endpoints(specs)
        for s in specs:
            sched.set_health(s.id, EndpointHealth.READY)
            sched.set_estimates(s.id, EndpointEstimates(perf=perf(1.0)))
        pair.append((sched, clock))
    running: list[list[RequestId]] = [[], []]
    for n, op in enumerate(script):
        got = []
        for i, (sched, clock) in enumerate(pair):
            if isinstance(op, Submit):
                req = request(
                    f"r{n}",
                    clock.now(),
                    ttft_ms=op.ttft_ms,
                    deadline_ms=op.deadline_ms,
                    prompt=op.prompt,
                    out=op.out,
                )
                ds: list[Decision] | Decision | None = sched.submit(req)
            elif isinstance(op, Complete):
                if not running[i]:
                    ds = None
                else:
                    done = running[i].pop(op.pick % len(running[i]))
                    ds = sched.complete(done)
            elif isinstance(op, Advance):
                clock.advance(op.seconds)
                ds = None
            elif isinstance(op, Refit):
                sched.set_estimates(EndpointId(f"e{op.endpoint}"), EndpointEstimates(perf=perf(op.speed)))
                ds = None
            else:
                ds = sched.tick()
            decided = summary(ds)
            running[i].extend(RequestId(rid) for kind, rid, _ in decided if kind == "dispatch")
            got.append(decided)
        assert got[0] == got[1], (op, got)
    assert pair[0][0].queued(M) == pair[1][0].queued(M)
