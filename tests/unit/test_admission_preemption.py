"""SLO admission under a policy that preempts: a request of a kind that may preempt counts the seats its
preemption rules would free (running batch work it may take the seat of) before it is called
infeasible, on the free-seat path, the queue path and the "infeasible" recheck; the same rule as the
scheduler's preemption (`gateway.sched.victims`), wired from the policy file's `[preemption]`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config.policy import parse_policy_text
from gateway.core.clock import FakeClock
from gateway.core.slo import Infeasible, SloClass, SloKind, SloPolicy
from gateway.core.types import EndpointHealth, EndpointId, EngineKind, InstanceClass, ModelName
from gateway.sched.decisions import Dispatch, Reject
from gateway.sched.interfaces import AdmitOutcome, PreemptionRules
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.admission.slo_feasibility import SloFeasibilityAdmitter, SloFeasibilityParams
from gateway.sched.running import RunningRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.snapshot import EndpointEstimates, EndpointView
from gateway.sched.types import EndpointSpec, QueueLimits
from tests.unit.slo_fixtures import COEF, req, running, snap, view

SLO = SloPolicy(
    classes={
        "chat": SloClass("chat", kind=SloKind.INTERACTIVE, band=0, on_infeasible=Infeasible.REJECT),
        "batch": SloClass("batch", kind=SloKind.BATCH, band=1, on_infeasible=Infeasible.BEST_EFFORT),
    },
    default_class="chat",
)
RULES = PreemptionRules(classes=frozenset({InstanceClass.MIXED}), max_victims=4)
PARAMS = SloFeasibilityParams(margin=1.0, retry_after_s=1.0)


def admitter(rules: PreemptionRules | None = RULES, **params: object) -> SloFeasibilityAdmitter:
    p = msgspec.structs.replace(PARAMS, **params)
    return SloFeasibilityAdmitter(p, SLO, preemption=rules)


def queued(**counts: int) -> Callable[[str], int]:
    return lambda cls: counts.get(cls, 0)


def batch(rid: str, *, resumable: bool = True, preemptions: int = 0, cls: str = "batch") -> RunningRequest:
    """A long batch request (about 60 s left at one seat), preemptible unless told otherwise."""
    r = running(rid, dispatched_at=-0.1, out=5000.0, cls=cls)
    return dataclasses.replace(r, resumable=resumable, preemptions=preemptions)


def full(*runs: RunningRequest, cls: InstanceClass = InstanceClass.MIXED, eid: str = "e") -> EndpointView:
    return dataclasses.replace(view(eid, cap=len(runs), runs=runs), instance_class=cls)


CHAT = req(cls="chat", e2e_ms=2000.0)


def test_a_seat_preemption_frees_makes_the_request_feasible() -> None:
    s = snap(full(batch("x")))
    assert admitter(None).admit(CHAT, s, queued()).outcome is AdmitOutcome.REJECT
    assert admitter().admit(CHAT, s, queued()).outcome is AdmitOutcome.ADMIT


def test_only_what_the_preemption_rules_allow_counts() -> None:
    cases = {
        "not resumable": full(batch("x", resumable=False)),
        "preempted too often": full(batch("x", preemptions=RULES.max_preemptions)),
        "an interactive stream": full(batch("x", cls="chat")),
        "an endpoint class without preemption": full(batch("x"), cls=InstanceClass.INTERACTIVE),
    }
    for why, e in cases.items():
        assert admitter().admit(CHAT, snap(e), queued()).outcome is AdmitOutcome.REJECT, why
    # a batch request may not preempt: demoted as before
    job = req(cls="batch", e2e_ms=2000.0)
    assert admitter().admit(job, snap(full(batch("x"))), queued()).outcome is AdmitOutcome.BEST_EFFORT


def test_a_victim_whose_own_slo_a_resume_would_miss_frees_no_seat() -> None:
    due = dataclasses.replace(batch("x"), e2e_deadline=70.0)  # ~60 s left: a 10 s requeue wait misses it
    assert admitter().admit(CHAT, snap(full(due)), queued()).outcome is AdmitOutcome.REJECT
    assert (
        admitter(dataclasses.replace(RULES, requeue_wait_s=0.0))
        .admit(CHAT, snap(full(due)), queued())
        .outcome
        is AdmitOutcome.ADMIT
    )


def test_queued_requests_ahead_take_the_freed_seats_first() -> None:
    one = snap(full(batch("x")))
    two = snap(full(batch("x"), batch("y")))
    assert admitter().admit(CHAT, one, queued(chat=1)).outcome is AdmitOutcome.REJECT
    assert admitter().admit(CHAT, two, queued(chat=1)).outcome is AdmitOutcome.ADMIT
    # queued batch work is behind it
    assert admitter().admit(CHAT, one, queued(batch=5)).outcome is AdmitOutcome.ADMIT


def test_a_free_seat_too_slow_still_leaves_the_preempted_one() -> None:
    """A free seat exists but its endpoint misses the target (a slower model); preempting on a fast
    endpoint meets it."""
    slow = view("s", cap=2, coef=dataclasses.replace(COEF, c3=1.0))
    s = snap(slow, full(batch("x")))
    assert admitter(None).admit(CHAT, s, queued()).outcome is AdmitOutcome.REJECT
    assert admitter().admit(CHAT, s, queued()).outcome is AdmitOutcome.ADMIT


def test_the_infeasible_recheck_counts_preempted_seats() -> None:
    s = snap(full(batch("x")))
    assert admitter(None, recheck="infeasible").recheck(CHAT, s).outcome is AdmitOutcome.REJECT
    assert admitter(recheck="infeasible").recheck(CHAT, s).outcome is AdmitOutcome.ADMIT


# ----------------------------------------------------------------- the policy file wires the rules
M = ModelName("m")
POLICY = """
name = "t"
[ordering]
plugin = "priority-bands"
[placement]
picker = {{ plugin = "max-score" }}
[[placement.scorers]]
plugin = "least-outstanding"
[admission]
plugin = "slo-feasibility"
params = {{ recheck = "off" }}
{preemption}
[slo]
default_class = "chat"
[[slo.classes]]
name = "chat"
kind = "interactive"
band = 0
ttft_ms = 1000.0
on_infeasible = "reject"
[[slo.classes]]
name = "batch"
kind = "batch"
band = 1
"""


def test_the_policys_preemption_rules_reach_admission() -> None:
    """One seat, held by a batch job: a chat request with a 1 s first-token target is refused under a
    policy that does not preempt, and placed (preempting the job) under one that does."""
    outcomes = []
    for section in ("", '[preemption]\nplugin = "least-progress"'):
        pol = parse_policy_text(POLICY.format(preemption=section), "t.toml", default_registry())
        clock = FakeClock()
        sched = Scheduler(pol, clock, QueueLimits(max_wait_s=3600.0))
        eid = EndpointId("e")
        sched.sync_endpoints(
            [EndpointSpec(id=eid, url="http://e:8000", engine=EngineKind.VLLM, models=frozenset({M}), cap=1)]
        )
        sched.set_health(eid, EndpointHealth.READY)
        sched.set_estimates(eid, EndpointEstimates(perf=COEF))
        job = dataclasses.replace(
            req("job", arrival=clock.now(), cls="batch", out=5000.0, model="m"), resumable=True
        )
        assert isinstance(sched.submit(job), Dispatch)
        outcomes.append(
            type(sched.submit(req("chat", arrival=clock.now(), cls="chat", ttft_ms=1000.0, model="m")))
        )
    assert outcomes == [Reject, Dispatch]


# ----------------------------------------------------------------- property
@st.composite
def fleets(draw: st.DrawFn) -> list[EndpointView]:
    out = []
    for i in range(draw(st.integers(1, 3))):
        runs = [
            dataclasses.replace(
                running(
                    f"r{i}-{k}", dispatched_at=-draw(st.floats(0.0, 5.0)), out=draw(st.floats(1.0, 3000.0))
                ),
                slo_class=draw(st.sampled_from(["chat", "batch"])),
                resumable=draw(st.booleans()),
                preemptions=draw(st.integers(0, 2)),
            )
            for k in range(draw(st.integers(0, 4)))
        ]
        cap = draw(st.integers(1, 4))
        cls = draw(st.sampled_from([InstanceClass.MIXED, InstanceClass.INTERACTIVE]))
        out.append(dataclasses.replace(view(f"e{i}", cap=cap, runs=runs), instance_class=cls))
    return out


@settings(max_examples=150, deadline=None)
@given(
    fleet=fleets(),
    e2e_ms=st.floats(50.0, 30_000.0),
    itl_ms=st.one_of(st.none(), st.floats(1.0, 200.0)),
    ahead=st.integers(0, 6),
    cls=st.sampled_from(["chat", "batch"]),
    recheck=st.sampled_from(["off", "infeasible"]),
)
def test_what_is_admitted_without_preemption_is_admitted_with_it(  # noqa: PLR0917 (hypothesis)
    fleet: list[EndpointView], e2e_ms: float, itl_ms: float | None, ahead: int, cls: str, recheck: str
) -> None:
    r = req(cls=cls, e2e_ms=e2e_ms, itl_ms=itl_ms)
    s = snap(*fleet)
    without = admitter(None, recheck=recheck)
    with_ = admitter(recheck=recheck)
    if without.admit(r, s, queued(chat=ahead)).outcome is AdmitOutcome.ADMIT:
        assert with_.admit(r, s, queued(chat=ahead)).outcome is AdmitOutcome.ADMIT
    if without.recheck(r, s).outcome is AdmitOutcome.ADMIT:
        assert with_.recheck(r, s).outcome is AdmitOutcome.ADMIT
