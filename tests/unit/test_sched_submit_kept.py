"""What a submit keeps between decisions in the 200-endpoint what-if, pinned to the plain way:

- the slack ordering's rank epoch, kept per model by the memo's speed token, is the bound asked afresh
  (`_bound_for`) on every snapshot, over fleets that change entry by entry, for two models in turn
  and for a scope's cut (hypothesis);
- demand-split's scope and tiers, with the model's first endpoint kept per mask and the blocks kept for
  the same ready endpoints while the demand did not move, give what a filter that keeps neither gives,
  and leave it the same demand and blocks (hypothesis);
- the scheduler: the engine priorities it records with the snapshot a request was placed on (the clock
  unmoved) are those of one that takes a snapshot for each dispatch, with the same dispatches, and SLO
  admission makes a request's idle terms when it is queued on arrival, not when it is placed at once
  (hypothesis).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.clock import FakeClock
from gateway.core.slo import Infeasible, SloClass, SloPolicy
from gateway.core.types import EndpointHealth, EndpointId, EngineKind, ModelName, RequestId
from gateway.sched.columns import columns_of
from gateway.sched.decisions import Decision, Dispatch, Reject
from gateway.sched.idle import IdleBound
from gateway.sched.perf import PerfCoefficients
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.admission.slo_feasibility import SloFeasibilityAdmitter
from gateway.sched.plugins.ordering.slack import SlackOrdering, SlackParams
from gateway.sched.plugins.placement.demand_split import DemandSplitFilter, DemandSplitParams
from gateway.sched.profile import Policy, SchedulerProfile
from gateway.sched.registry import BuildContext, PluginKind
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.seen import SeenRequests
from gateway.sched.snapshot import EndpointEstimates, EndpointView, FleetSnapshot
from gateway.sched.types import EndpointSpec
from tests.unit.slo_fixtures import COEF, req
from tests.unit.test_admission_speeds import OTHER, first_views, memo_snaps, steps
from tests.unit.test_sched_ticks import M


# --------------------------------------------------------------------- the slack ordering's epoch
class _PlainEpoch(SlackOrdering):
    """The rank epoch asked afresh on every snapshot."""

    def rank_epoch(self, model: ModelName, snap: FleetSnapshot) -> IdleBound | None:
        return self._bound_for(model, snap)


@settings(max_examples=200, deadline=None)
@given(
    start=st.lists(st.sampled_from((0.5, 1.0, 2.0)), min_size=1, max_size=8),
    script=steps,
    models=st.lists(st.sampled_from(("m", "other", "both")), min_size=12, max_size=12),
)
def test_the_rank_epoch_kept_by_the_speed_token_is_the_bound_asked_afresh(
    start: list[float], script: list[tuple[list[int], list[float], str, bool]], models: list[str]
) -> None:
    kept, plain = SlackOrdering(SlackParams()), _PlainEpoch(SlackParams())
    reqs = [
        req("late", e2e_ms=1.0, model=M),
        req("timed", e2e_ms=5000.0, model=M),
        req("first", ttft_ms=800.0, model=M),
        req("untimed", model=M),
        req("demoted", e2e_ms=5000.0, model=M, best_effort=True),
    ]
    for step, snap, part in memo_snaps(start, script):
        new = snap.endpoints
        asked = models[step % len(models)]
        snaps = [snap, dataclasses.replace(snap, endpoints=new[: max(1, len(new) // 2)])] if part else [snap]
        for s in snaps:
            for model in (M, OTHER) if asked == "both" else (ModelName(asked),):
                assert kept.rank_epoch(model, s) == plain.rank_epoch(model, s)
            for q in reqs:
                assert kept.rank(q, s) == plain.rank(q, s)
                plain.rank_epoch(M, s)
                assert kept.engine_priority(q, s) == int(plain.approximate_key(q, s)[0])


# --------------------------------------------------------------------- demand-split's scope
class _PlainSplit(DemandSplitFilter):
    """Keeps neither the first endpoint per mask nor the blocks between two asks."""

    def _count(
        self, req: SchedRequest, group: int, snap: FleetSnapshot, perf: PerfCoefficients | None
    ) -> dict[EndpointId, int]:
        self._first.clear()
        for state in self._models.values():
            state.asked = None
        return super()._count(req, group, snap, perf)


def _fleet(n: int, ready: list[bool], models: list[bool]) -> tuple[EndpointView, ...]:
    out = []
    for i in range(n):
        v = first_views([1.0 + (i % 3)])[0]
        out.append(
            dataclasses.replace(
                v,
                id=EndpointId(f"e{(i * 7) % n:02d}"),
                health=EndpointHealth.READY if ready[i % len(ready)] else EndpointHealth.UNHEALTHY,
                models=frozenset({M}) if models[i % len(models)] else frozenset({OTHER}),
            )
        )
    return tuple(out)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=12),
    ready=st.lists(st.booleans(), min_size=1, max_size=5),
    models=st.lists(st.booleans(), min_size=1, max_size=5),
    spill=st.sampled_from(("never", "when-full", "when-no-fit")),
    asks=st.lists(
        st.tuples(
            st.sampled_from(("generation", "translation", "completion")),
            st.integers(min_value=1, max_value=4000),  # prompt
            st.sampled_from((0.0, 0.0, 0.5, 3.0)),  # clock step
            st.sampled_from(("scope", "scope+tiers", "tiers", "refleet", "again")),
        ),
        min_size=1,
        max_size=25,
    ),
)
def test_demand_split_kept_answers_are_the_plain_ones(
    n: int,
    ready: list[bool],
    models: list[bool],
    spill: str,
    asks: list[tuple[str, int, float, str]],
) -> None:
    params = DemandSplitParams(
        groups={"decode": ["generation"], "context": ["translation"]},
        spill=spill,  # type: ignore[arg-type]
        hysteresis=0.0,
    )
    kept, plain = DemandSplitFilter(params), _PlainSplit(params)
    views = _fleet(n, ready, models)
    now = 0.0
    last: SchedRequest | None = None
    for k, (cls, prompt, step, how) in enumerate(asks):
        now += step
        if how == "refleet":
            views = _fleet(n, [not r for r in ready] if k % 2 else ready, models)
        cols = columns_of(views)
        snap = FleetSnapshot(now=now, endpoints=views, columns=cols)
        r = last if how == "again" and last is not None else req(f"r{k}", cls=cls, prompt=prompt, model=M)
        last = r
        serving = cols.members.get(M, np.zeros(len(views), dtype=np.bool_))
        if how != "tiers":
            a, b = kept.scope_columns(r, cols, serving, snap), plain.scope_columns(r, cols, serving, snap)
            assert np.array_equal(a, b)
        if how != "scope":
            a2 = kept.tiers_columns(r, cols, serving, snap)
            b2 = plain.tiers_columns(r, cols, serving, snap)
            assert [t.tolist() for t in a2] == [t.tolist() for t in b2]
            listed = [v for v, s in zip(views, serving.tolist(), strict=True) if s]
            assert [[v.id for v in t] for t in kept.tiers(r, listed, snap)] == [
                [v.id for v in t] for t in plain.tiers(r, listed, snap)
            ]
        assert kept.blocks(M) == plain.blocks(M)
        assert kept.shares(M) == plain.shares(M)


# --------------------------------------------------------------------- the scheduler
SLO = SloPolicy(
    classes={
        "ide": SloClass("ide", on_infeasible=Infeasible.REJECT),
        "chat": SloClass("chat", band=1, on_infeasible=Infeasible.HOLD),
    },
    default_class="chat",
)


class _FreshSnapshot(Scheduler):
    """Takes a snapshot for every dispatch's engine priority."""

    def _place(self, req, seq, chosen, out, placed_on=None):  # type: ignore[no-untyped-def]
        super()._place(req, seq, chosen, out)


def _scheduler(cls: type[Scheduler], endpoints: int) -> Scheduler:
    reg = default_registry()
    ctx = BuildContext(slo=SLO)
    policy = Policy(
        name="t",
        ordering=reg.build(PluginKind.ORDERING, "slack", None, path="o", ctx=ctx),
        profile=SchedulerProfile(
            filters=(), scorers=(), picker=reg.build(PluginKind.PICKER, "max-score", None, path="p")
        ),
        slo=SLO,
        admitter=reg.build(PluginKind.ADMITTER, "slo-feasibility", None, path="a", ctx=ctx),
    )
    sched = cls(policy, FakeClock(0.0))
    specs = [
        EndpointSpec(
            id=EndpointId(f"e{i}"),
            url=f"http://e{i}:8000",
            engine=EngineKind.VLLM,
            models=frozenset({ModelName("m")}),
            cap=2,
            priority_scheduling=i % 2 == 0,
        )
        for i in range(endpoints)
    ]
    sched.sync_endpoints(specs)
    for s in specs:
        sched.set_health(s.id, EndpointHealth.READY)
        sched.set_estimates(s.id, EndpointEstimates(perf=COEF))
    return sched


def _decision(d: Decision | None) -> tuple[str, ...] | None:
    if d is None:
        return None
    if isinstance(d, Dispatch):
        return ("dispatch", d.req.id, d.endpoint.id)
    assert isinstance(d, Reject)
    return ("reject", d.req.id, d.error.code, d.error.message, str(d.error.headers()))


def _dispatched(out: list[Decision]) -> list[tuple[str, str]]:
    return [(d.req.id, d.endpoint.id) for d in out if isinstance(d, Dispatch)]


@settings(max_examples=60, deadline=None)
@given(
    endpoints=st.integers(min_value=1, max_value=4),
    events=st.lists(
        st.tuples(
            st.sampled_from(("submit", "submit", "complete", "tick")),
            st.sampled_from(("ide", "chat")),
            st.sampled_from((None, 500.0, 3000.0, 60000.0)),  # e2e target
            st.sampled_from((0.0, 0.0, 0.05, 1.0)),  # clock step before it
        ),
        min_size=1,
        max_size=30,
    ),
)
def test_priorities_on_the_placed_on_snapshot_and_terms_of_queued_requests(
    endpoints: int, events: list[tuple[str, str, float | None, float]]
) -> None:
    a, b = _scheduler(Scheduler, endpoints), _scheduler(_FreshSnapshot, endpoints)
    running: list[RequestId] = []
    for k, (what, cls, e2e, step) in enumerate(events):
        for s in (a, b):
            clock = s._clock
            assert isinstance(clock, FakeClock)
            clock.advance(step)
        if what == "submit":
            r = dataclasses.replace(req(f"r{k}", cls=cls, e2e_ms=e2e, out=200.0), arrival=a._clock.now())
            da, db = a.submit(r), b.submit(r)
            assert _decision(da) == _decision(db)
            if isinstance(da, Dispatch):
                running.append(r.id)
            admitter = a._policy.admitter
            assert isinstance(admitter, SloFeasibilityAdmitter)
            # idle terms made for a request queued on arrival, not for one placed at once or refused
            queue = a._queues.get(ModelName("m"))
            queued = da is None and any(q.req.id == r.id for q in queue or ())
            assert (r.id in admitter._terms) is queued
            out_a: list[Decision] = [da] if da is not None else []
            out_b: list[Decision] = [db] if db is not None else []
        elif what == "complete" and running:
            rid = running.pop(0)
            out_a, out_b = a.complete(rid), b.complete(rid)
        else:
            out_a, out_b = a.tick(), b.tick()
        assert _dispatched(out_a) == _dispatched(out_b)
        running += [RequestId(rid) for rid, _ in _dispatched(out_a) if RequestId(rid) not in running]
        for rid in running:
            assert a.engine_priority(rid) == b.engine_priority(rid)


def test_demand_split_forgets_the_oldest_request_first() -> None:
    """Past its bound the filter forgets the requests it counted oldest first, one per new request: a
    forgotten request seen again counts again, one still remembered does not."""
    f = DemandSplitFilter(DemandSplitParams(groups={"decode": ["generation"], "context": ["translation"]}))
    f._seen = SeenRequests(3)
    views = _fleet(4, [True], [True])
    snap = FleetSnapshot(now=0.0, endpoints=views)
    reqs = [req(f"r{i}", cls="generation", prompt=100, model=M) for i in range(5)]
    for r in reqs:
        f.tiers(r, list(views), snap)
    assert [r.id in f._seen for r in reqs] == [False, False, True, True, True]
    before = f.shares(M)
    f.tiers(reqs[3], list(views), snap)  # remembered: not counted again
    assert f.shares(M) == before
    assert [r.id in f._seen for r in reqs] == [False, False, True, True, True]
    f.tiers(reqs[0], list(views), snap)  # forgotten: counted again, and the oldest goes
    assert [r.id in f._seen for r in reqs] == [True, False, False, True, True]
