"""Admission: per-class outcomes for infeasible SLOs (reject with a reason and Retry-After, hold,
best-effort), class queue bounds, the counts per class and outcome; and the engine priority the
scheduler records for endpoints with priority scheduling (normalised per dialect)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.core.clock import FakeClock
from gateway.core.slo import Infeasible, SloClass, SloPolicy
from gateway.core.types import EndpointHealth, EndpointId, EngineKind, ModelName, RequestId
from gateway.sched.decisions import Dispatch, Reject
from gateway.sched.interfaces import AdmitOutcome
from gateway.sched.perf import default_prior
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.admission.admit_all import AdmitAll, AdmitAllParams
from gateway.sched.plugins.admission.common import CLASS_QUEUE_FULL, SLO_INFEASIBLE
from gateway.sched.plugins.admission.slo_feasibility import SloFeasibilityAdmitter, SloFeasibilityParams
from gateway.sched.profile import Policy, SchedulerProfile
from gateway.sched.registry import BuildContext, PluginKind
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.snapshot import EndpointEstimates
from gateway.sched.types import EndpointSpec
from gateway.upstream.dialects import SGLANG, VLLM
from tests.unit.slo_fixtures import COEF, req, running, snap, view

SLO = SloPolicy(
    classes={
        "ide": SloClass("ide", on_infeasible=Infeasible.REJECT, max_queue=2),
        "chat": SloClass("chat", band=1, on_infeasible=Infeasible.HOLD),
        "batch": SloClass("batch", band=3, on_infeasible=Infeasible.BEST_EFFORT),
    },
    default_class="chat",
)


def none_queued(cls: str) -> int:
    return 0


def queued(**counts: int) -> Callable[[str], int]:
    return lambda cls: counts.get(cls, 0)


BUSY = view("e", cap=1, runs=[running("x", dispatched_at=-0.1, out=5000.0)])  # full for ~60 s
IDLE = view("f")


@pytest.mark.parametrize(
    ("cls", "outcome"),
    [
        pytest.param("ide", AdmitOutcome.REJECT, id="reject"),
        pytest.param("chat", AdmitOutcome.HOLD, id="hold"),
        pytest.param("batch", AdmitOutcome.BEST_EFFORT, id="best-effort"),
    ],
)
def test_an_infeasible_slo_gets_its_class_outcome(cls: str, outcome: AdmitOutcome) -> None:
    adm = SloFeasibilityAdmitter(SloFeasibilityParams(margin=1.0, retry_after_s=1.0), SLO)
    d = adm.admit(req(cls=cls, e2e_ms=2000.0), snap(BUSY), none_queued)
    assert d.outcome is outcome
    assert d.reason == SLO_INFEASIBLE
    if outcome is AdmitOutcome.REJECT:
        assert d.retry_after_s is not None
        assert d.retry_after_s > 30.0  # the seat frees in about a minute
        assert "completion predicted in" in d.message
    # feasible somewhere: admitted whatever the class
    assert adm.admit(req(cls=cls, e2e_ms=2000.0), snap(BUSY, IDLE), none_queued).outcome is AdmitOutcome.ADMIT


def test_never_refused_on_the_generic_prior() -> None:
    """No endpoint has a fitted model or a configured prior (day one): the generic prior's view of the
    load is a guess about other hardware, so a request it calls infeasible is admitted rather than
    refused, unless it cannot be met even alone on an idle endpoint; the other outcomes (hold, best
    effort) still apply. Once one endpoint predicts from its own fit, refusals do."""
    adm = SloFeasibilityAdmitter(SloFeasibilityParams(margin=1.0, retry_after_s=1.0), SLO)
    guess = view("e", cap=1, runs=[running("x", dispatched_at=-0.1, out=5000.0)], coef=default_prior())
    r = req(cls="ide", e2e_ms=2000.0)
    assert adm.admit(r, snap(guess), none_queued).outcome is AdmitOutcome.ADMIT
    assert adm.admit(req(cls="batch", e2e_ms=2000.0), snap(guess), none_queued).outcome is (
        AdmitOutcome.BEST_EFFORT
    )
    assert adm.admit(r, snap(guess, BUSY), none_queued).outcome is AdmitOutcome.REJECT
    # what cannot be met even alone on an idle endpoint is refused on the prior too
    assert adm.admit(req(cls="ide", e2e_ms=1.0), snap(guess), none_queued).outcome is AdmitOutcome.REJECT


def test_requests_without_targets_or_endpoints_are_admitted() -> None:
    adm = SloFeasibilityAdmitter(SloFeasibilityParams(margin=1.0, retry_after_s=1.0), SLO)
    assert adm.admit(req(cls="ide"), snap(BUSY), none_queued).outcome is AdmitOutcome.ADMIT
    down = view("d", health=EndpointHealth.UNHEALTHY)
    assert adm.admit(req(cls="ide", ttft_ms=1.0), snap(down), none_queued).outcome is AdmitOutcome.ADMIT


def test_the_margin_tolerates_prediction_error() -> None:
    r = req(cls="ide", prompt=100, out=101.0, e2e_ms=1200.0)  # alone: ~1.23 s
    strict = SloFeasibilityAdmitter(SloFeasibilityParams(margin=1.0, retry_after_s=1.0), SLO)
    lenient = SloFeasibilityAdmitter(SloFeasibilityParams(margin=1.1, retry_after_s=1.0), SLO)
    assert strict.admit(r, snap(IDLE), none_queued).outcome is AdmitOutcome.REJECT
    assert lenient.admit(r, snap(IDLE), none_queued).outcome is AdmitOutcome.ADMIT


def test_queued_requests_of_the_same_or_a_more_urgent_band_go_first() -> None:
    one_seat = view("e", cap=2, runs=[running("x", dispatched_at=-0.1, out=3000.0)])
    r = req(cls="chat", e2e_ms=2000.0)
    counting = SloFeasibilityAdmitter(
        SloFeasibilityParams(margin=1.0, retry_after_s=1.0, count_queue=True), SLO
    )
    blind = SloFeasibilityAdmitter(
        SloFeasibilityParams(margin=1.0, retry_after_s=1.0, count_queue=False), SLO
    )
    s = snap(one_seat)
    assert counting.admit(r, s, queued(ide=1)).outcome is AdmitOutcome.HOLD  # ide takes the seat
    assert counting.admit(r, s, queued(batch=5)).outcome is AdmitOutcome.ADMIT  # batch is behind it
    assert blind.admit(r, s, queued(ide=1)).outcome is AdmitOutcome.ADMIT


@pytest.mark.parametrize("admitter", ["admit-all", "slo-feasibility"])
def test_class_queue_bounds(admitter: str) -> None:
    adm = default_registry().build(PluginKind.ADMITTER, admitter, None, path="a", ctx=BuildContext(slo=SLO))
    assert adm.admit(req(cls="ide"), snap(IDLE), queued(ide=1)).outcome is AdmitOutcome.ADMIT
    d = adm.admit(req(cls="ide"), snap(IDLE), queued(ide=2))
    assert (d.outcome, d.reason) == (AdmitOutcome.REJECT, CLASS_QUEUE_FULL)
    assert "2 requests of SLO class 'ide'" in d.message
    assert adm.admit(req(cls="chat"), snap(IDLE), queued(ide=2, chat=100)).outcome is AdmitOutcome.ADMIT


def test_admit_all_admits_the_infeasible() -> None:
    assert AdmitAll(AdmitAllParams(retry_after_s=1.0), SLO).admit(
        req(cls="ide", ttft_ms=1.0), snap(BUSY), none_queued
    ).outcome is (AdmitOutcome.ADMIT)


# --------------------------------------------------------------------- through the scheduler
def policy(ordering: str = "fcfs", admitter: str | None = "slo-feasibility") -> Policy:
    reg = default_registry()
    ctx = BuildContext(slo=SLO)
    return Policy(
        name="t",
        ordering=reg.build(PluginKind.ORDERING, ordering, None, path="o", ctx=ctx),
        profile=SchedulerProfile(
            filters=(), scorers=(), picker=reg.build(PluginKind.PICKER, "max-score", None, path="p")
        ),
        slo=SLO,
        admitter=None
        if admitter is None
        else reg.build(PluginKind.ADMITTER, admitter, None, path="a", ctx=ctx),
    )


def fleet(pol: Policy, *, priority: bool = False, engine: EngineKind = EngineKind.VLLM) -> Scheduler:
    sched = Scheduler(pol, FakeClock(0.0))
    spec = EndpointSpec(
        id=EndpointId("e"),
        url="http://e:8000",
        engine=engine,
        models=frozenset({ModelName("m")}),
        cap=1,
        priority_scheduling=priority,
    )
    sched.sync_endpoints([spec])
    sched.set_health(spec.id, EndpointHealth.READY)
    sched.set_estimates(spec.id, EndpointEstimates(perf=COEF))
    return sched


def long_running(sched: Scheduler) -> SchedRequest:
    first = req("first", cls="chat", out=5000.0)
    assert isinstance(sched.submit(first), Dispatch)
    return first


def test_the_scheduler_answers_a_rejection_with_429_reason_and_retry_after() -> None:
    sched = fleet(policy())
    long_running(sched)
    d = sched.submit(req("late", cls="ide", e2e_ms=2000.0))
    assert isinstance(d, Reject)
    err = d.error
    assert (err.status, err.code, err.type) == (429, SLO_INFEASIBLE, "rate_limit_error")
    assert int(err.headers()["Retry-After"]) >= 30
    assert sched.queue_depth(ModelName("m")) == 0
    assert sched.admission.by_class() == {"chat": {"admit": 1}, "ide": {"reject": 1}}


def test_held_and_demoted_requests_wait_in_the_queue() -> None:
    sched = fleet(policy())
    long_running(sched)
    assert sched.submit(req("held", cls="chat", e2e_ms=2000.0)) is None
    assert sched.submit(req("demoted", cls="batch", e2e_ms=2000.0)) is None
    assert sched.queue_depth(ModelName("m")) == 2
    by_class = sched.admission.by_class()
    assert by_class["chat"] == {"admit": 1, "hold": 1}
    assert by_class["batch"] == {"best_effort": 1}
    out = sched.complete(RequestId("first"))
    assert [(d.req.id, d.req.best_effort) for d in out if isinstance(d, Dispatch)] == [("held", False)]
    out = sched.complete(RequestId("held"))
    assert [(d.req.id, d.req.best_effort) for d in out if isinstance(d, Dispatch)] == [("demoted", True)]


def test_a_retry_is_not_admitted_again() -> None:
    sched = fleet(policy())
    long_running(sched)
    retry = sched.submit(req("retry", cls="ide", e2e_ms=2000.0), exclude=frozenset({EndpointId("x")}))
    assert retry is None  # queued, not rejected
    assert "ide" not in sched.admission.by_class()


def test_no_admitter_admits_everything() -> None:
    sched = fleet(policy(admitter=None))
    long_running(sched)
    assert sched.submit(req("late", cls="ide", ttft_ms=1.0)) is None
    assert sched.admission.by_class()["ide"] == {"admit": 1}


# --------------------------------------------------------------------- engine priority
@pytest.mark.parametrize(
    ("urgency", "vllm", "sglang"),
    [pytest.param(0, 0, 0, id="most-urgent"), pytest.param(2, 2, -2, id="less-urgent")],
)
def test_dialects_normalise_priority(urgency: int, vllm: int, sglang: int) -> None:
    assert VLLM.priority(urgency) == vllm  # vLLM runs the lowest value first
    assert SGLANG.priority(urgency) == sglang  # SGLang the highest
    assert SGLANG.priority(0) > SGLANG.priority(1)
    assert VLLM.priority(0) < VLLM.priority(1)


@pytest.mark.parametrize(
    ("ordering", "priority_endpoint", "expected"),
    [
        pytest.param("slack", True, 2, id="slack-can-wait"),
        pytest.param("priority-bands", True, 1, id="band-of-chat"),
        pytest.param("slack", False, None, id="fcfs-engine-gets-none"),
        pytest.param("fcfs", True, None, id="ordering-without-priority"),
    ],
)
def test_the_scheduler_records_engine_priority_only_for_priority_endpoints(
    ordering: str, priority_endpoint: bool, expected: int | None
) -> None:
    sched = fleet(policy(ordering=ordering, admitter=None), priority=priority_endpoint)
    d = sched.submit(req("r", cls="chat", e2e_ms=60_000.0))
    assert isinstance(d, Dispatch)
    assert d.endpoint.priority_scheduling is priority_endpoint
    assert sched.engine_priority(RequestId("r")) == expected
    sched.complete(RequestId("r"))
    assert sched.engine_priority(RequestId("r")) is None


def test_dispatched_requests_are_in_the_endpoint_view() -> None:
    sched = fleet(policy(admitter=None))
    sched.submit(req("r", cls="chat", prompt=321, out=77.0, e2e_ms=5000.0))
    v = sched.endpoint_view(EndpointId("e"))
    assert v is not None
    (r,) = v.running
    assert (r.id, r.prompt_tokens, r.output_mean, r.e2e_deadline, r.dispatched_at) == (
        "r",
        321,
        77.0,
        5.0,
        0.0,
    )
    sched.complete(RequestId("r"))
    v = sched.endpoint_view(EndpointId("e"))
    assert v is not None
    assert v.running == ()


# --------------------------------------------------------------------- endpoint groups
def grouped_fleet() -> Scheduler:
    """Endpoints e (group "fast": class ide, never spills) and f (group "slow": chat); e runs a request
    of a class in no group for about a minute, f is idle."""
    reg = default_registry()
    ctx = BuildContext(slo=SLO)
    split = reg.build(
        PluginKind.FILTER,
        "demand-split",
        {"groups": {"fast": ["ide"], "slow": ["chat"]}, "spill": {"fast": "never"}},
        path="f",
        ctx=ctx,
    )
    pol = Policy(
        name="t",
        ordering=reg.build(PluginKind.ORDERING, "fcfs", None, path="o", ctx=ctx),
        profile=SchedulerProfile(
            filters=(split,), scorers=(), picker=reg.build(PluginKind.PICKER, "max-score", None, path="p")
        ),
        slo=SLO,
        admitter=reg.build(PluginKind.ADMITTER, "slo-feasibility", None, path="a", ctx=ctx),
    )
    sched = Scheduler(pol, FakeClock(0.0))
    specs = [
        EndpointSpec(
            id=EndpointId(e),
            url=f"http://{e}:8000",
            engine=EngineKind.VLLM,
            models=frozenset({ModelName("m")}),
            cap=1,
        )
        for e in ("e", "f")
    ]
    sched.sync_endpoints(specs)
    for spec in specs:
        sched.set_estimates(spec.id, EndpointEstimates(perf=COEF))
    sched.set_health(EndpointId("e"), EndpointHealth.READY)
    d = sched.submit(req("first", cls="batch", out=5000.0))
    assert isinstance(d, Dispatch)
    assert d.endpoint.id == "e"
    sched.set_health(EndpointId("f"), EndpointHealth.READY)
    return sched


def test_admission_judges_a_request_on_the_endpoints_its_group_may_use() -> None:
    sched = grouped_fleet()
    # f has a free seat, but a request of the group that never spills can only have e's, a minute away
    d = sched.submit(req("ide", cls="ide", e2e_ms=2000.0))
    assert isinstance(d, Reject)
    assert d.error.code == SLO_INFEASIBLE
    # a class that may spill is judged on every endpoint, and f takes it now
    d = sched.submit(req("chat", cls="chat", e2e_ms=2000.0))
    assert isinstance(d, Dispatch)
    assert d.endpoint.id == "f"
    assert sched.admission.by_class()["ide"] == {"reject": 1}
