"""Instance classes, preemption and adaptive caps in the scheduler: playbooks on a fake clock.

Policies are built from policy-file text (the config path an operator uses), endpoints from specs with
their instance class; decisions are asserted as they come out of `submit`, `take_preemptions`,
`complete` and `tick`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config.policy import load_policy, parse_policy_text
from gateway.core.clock import FakeClock
from gateway.core.errors import ConfigError
from gateway.core.types import (
    SLO,
    ApiKind,
    EndpointHealth,
    EndpointId,
    EngineKind,
    InstanceClass,
    ModelName,
    RequestId,
)
from gateway.sched.decisions import Decision, Dispatch, Preempt, Reject
from gateway.sched.plugins import default_registry
from gateway.sched.profile import Policy
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.snapshot import FleetSnapshot
from gateway.sched.types import EndpointSpec, QueueLimits

M = ModelName("m")
INTERACTIVE, MIXED, BATCH = InstanceClass.INTERACTIVE, InstanceClass.MIXED, InstanceClass.BATCH

SLO_TABLE = """
[slo]
default_class = "chat"
[[slo.classes]]
name = "chat"
kind = "interactive"
band = 0
ttft_ms = 10000.0
itl_ms = 200.0
[[slo.classes]]
name = "batch"
kind = "batch"
band = 1
ttft_ms = 3600000.0
itl_ms = 2000.0
"""


def make_policy(
    *, filters: str = '[{ plugin = "instance-class" }]', extra: str = "", ordering: str = "priority-bands"
) -> Policy:
    text = f"""
name = "t"
[ordering]
plugin = "{ordering}"
[placement]
picker = {{ plugin = "max-score" }}
filters = {filters}
[[placement.scorers]]
plugin = "least-outstanding"
{extra}
{SLO_TABLE}
"""
    return parse_policy_text(text, "t.toml", default_registry())


PREEMPT = """
[preemption]
plugin = "least-progress"
"""


def spec(name: str, cls: InstanceClass = MIXED, *, cap: int = 1) -> EndpointSpec:
    return EndpointSpec(
        id=EndpointId(name),
        url=f"http://{name}:8000",
        engine=EngineKind.VLLM,
        models=frozenset({M}),
        instance_class=cls,
        cap=cap,
    )


def req(
    name: str, cls: str = "chat", *, arrival: float = 1000.0, resumable: bool = True, **kw: object
) -> SchedRequest:
    return SchedRequest(
        id=RequestId(name),
        model=M,
        api=ApiKind.CHAT,
        arrival=arrival,
        slo=SLO(
            slo_class=cls,
            ttft_ms=10_000.0 if cls == "chat" else 3_600_000.0,
            itl_ms=200.0 if cls == "chat" else 2_000.0,
        ),
        prompt_tokens=100,
        max_tokens=200,
        stream=True,
        resumable=resumable,
        **kw,  # type: ignore[arg-type]
    )


class Rig:
    """A scheduler on a fake clock with every given endpoint ready."""

    def __init__(self, pol: Policy, *specs: EndpointSpec, limits: QueueLimits | None = None) -> None:
        self.clock = FakeClock()
        self.sched = Scheduler(pol, self.clock, limits or QueueLimits(max_wait_s=3600.0))
        self.sched.sync_endpoints(specs)
        for s in specs:
            self.sched.set_health(s.id, EndpointHealth.READY)

    def place(self, r: SchedRequest) -> str | None:
        """Submit `r`; the endpoint it was dispatched to (None: queued). Fails on a rejection."""
        d = self.sched.submit(r)
        if d is None:
            return None
        assert isinstance(d, Dispatch), d
        return str(d.endpoint.id)


def where(decisions: Sequence[Decision]) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    for d in decisions:
        if isinstance(d, Preempt):
            out.append(("preempt", str(d.victim.id), str(d.endpoint.id)))
        elif isinstance(d, Dispatch):
            out.append(("dispatch", str(d.req.id), str(d.endpoint.id)))
        else:
            out.append(("reject", str(d.req.id), d.error.code))
    return out


# --------------------------------------------------------------------- instance classes
@pytest.mark.parametrize(
    ("cls", "free", "expected"),
    [
        pytest.param("chat", ("i", "m", "b"), "i", id="interactive-to-its-own-class"),
        pytest.param("chat", ("m", "b"), "m", id="interactive-spills-to-mixed"),
        pytest.param("chat", ("b",), None, id="interactive-never-to-batch"),
        pytest.param("batch", ("i", "m", "b"), "b", id="batch-to-its-own-class"),
        pytest.param("batch", ("i", "m"), "m", id="batch-spills-to-mixed"),
        pytest.param("batch", ("i",), None, id="batch-never-to-interactive"),
    ],
)
def test_class_tiers_and_spill(cls: str, free: tuple[str, ...], expected: str | None) -> None:
    rig = Rig(make_policy(), spec("i", INTERACTIVE), spec("m", MIXED), spec("b", BATCH))
    # fill the endpoints that are not free (the mixed one with a kind whose own class is full already)
    for name in ("b", "i", "m"):
        if name not in free:
            holder = {"b": "batch", "i": "chat", "m": "batch" if "b" not in free else "chat"}[name]
            assert rig.place(req(f"hold-{name}", holder)) == name
    assert rig.place(req("x", cls)) == expected


def test_spill_rule_lets_batch_use_interactive_endpoints_last() -> None:
    pol = make_policy(
        filters='[{ plugin = "instance-class", params = { batch = ["batch", "mixed", "interactive"] } }]'
    )
    rig = Rig(pol, spec("i", INTERACTIVE), spec("m", MIXED), spec("b", BATCH))
    assert [rig.place(req(f"b{k}", "batch")) for k in range(4)] == ["b", "m", "i", None]


BORROW = (
    '[{ plugin = "instance-class", params = { batch = ["batch", "mixed", "interactive"], '
    "reserve = { interactive = 2 } } }]"
)


def test_borrowed_work_leaves_the_reserve_free_for_its_owner() -> None:
    pol = make_policy(filters=BORROW, extra=PREEMPT + 'params = { classes = ["mixed", "interactive"] }\n')
    rig = Rig(pol, spec("i", INTERACTIVE, cap=4), spec("b", BATCH))
    # batch fills its own endpoint, then borrows the interactive one up to its cap less the reserve
    assert [rig.place(req(f"b{k}", "batch")) for k in range(4)] == ["b", "i", "i", None]
    # the owner's arrivals take the reserved seats: no preemption
    assert [rig.place(req(f"c{k}", arrival=rig.clock.now())) for k in range(2)] == ["i", "i"]
    assert rig.sched.take_preemptions() == []
    # a seat a borrower frees while the owner holds the reserve stays with the owner
    out = rig.sched.complete(RequestId("b1"))
    assert where(out) == []
    assert rig.place(req("c2", arrival=rig.clock.now())) == "i"
    assert rig.sched.take_preemptions() == []


@pytest.mark.parametrize(
    ("reserve", "placed"),
    [
        pytest.param(0, ["i", "i", "i", "i"], id="no-reserve-fills-the-cap"),
        pytest.param(1, ["i", "i", "i", None], id="one-seat-kept"),
        pytest.param(4, [None, None, None, None], id="all-seats-kept"),
    ],
)
def test_reserve_bounds_borrowed_seats(reserve: int, placed: list[str | None]) -> None:
    filters = BORROW.replace("interactive = 2", f"interactive = {reserve}")
    rig = Rig(make_policy(filters=filters), spec("i", INTERACTIVE, cap=4))
    assert [rig.place(req(f"b{k}", "batch")) for k in range(4)] == placed


def test_reserve_window_keeps_seats_for_the_owner_s_recent_arrivals() -> None:
    """With a 30 s window the reserve is at least as many seats as the owner's requests dispatched there
    within the last 30 s and still running."""
    filters = BORROW.replace("interactive = 2 }", "interactive = 1 }, reserve_window_s = 30.0")
    rig = Rig(make_policy(filters=filters), spec("i", INTERACTIVE, cap=8))
    assert [rig.place(req(f"c{k}", arrival=rig.clock.now())) for k in range(3)] == ["i"] * 3
    # 3 owners running, 3 recent: borrowers leave 3 seats free -> 2 borrowed seats (3 + 2 + 3 = 8)
    assert [rig.place(req(f"b{k}", "batch")) for k in range(3)] == ["i", "i", None]
    rig.clock.advance(31.0)  # the owners' arrivals are old now: the fixed reserve (1) is left
    assert where(rig.sched.tick()) == [("dispatch", "b2", "i")]
    assert [rig.place(req(f"late{k}", "batch")) for k in range(2)] == ["i", None]


def test_reserve_does_not_hold_back_the_owner() -> None:
    rig = Rig(make_policy(filters=BORROW), spec("i", INTERACTIVE, cap=2))
    assert [rig.place(req(f"c{k}")) for k in range(3)] == ["i", "i", None]


def test_class_filter_scopes_admission() -> None:
    pol = make_policy()
    view = Rig(pol, spec("i", INTERACTIVE), spec("b", BATCH)).sched.snapshot()
    scoped = pol.profile.scope(req("x"), view)
    assert [e.id for e in scoped.endpoints] == [EndpointId("i")]


# --------------------------------------------------------------------- preemption
def busy_mixed_rig(pol: Policy | None = None) -> Rig:
    """One interactive and one mixed endpoint, one seat each; the interactive one holds a chat request,
    the mixed one a batch request."""
    rig = Rig(pol or make_policy(extra=PREEMPT), spec("i", INTERACTIVE), spec("m", MIXED))
    assert rig.place(req("chat0")) == "i"
    assert rig.place(req("batch0", "batch", arrival=900.0)) == "m"
    return rig


def test_interactive_request_takes_a_batch_seat_on_a_mixed_endpoint() -> None:
    rig = busy_mixed_rig()
    rig.clock.advance(5.0)
    rig.sched.progress(RequestId("batch0"), 40, rig.clock.now() - 4.0)
    d = rig.sched.submit(req("chat1", arrival=rig.clock.now()))
    assert isinstance(d, Dispatch)
    assert d.endpoint.id == EndpointId("m")
    (p,) = rig.sched.take_preemptions()
    assert rig.sched.take_preemptions() == []  # drained
    assert (p.victim.id, p.endpoint.id, p.reason) == (
        RequestId("batch0"),
        EndpointId("m"),
        "interactive_waiting",
    )
    # the victim as requeued: one preemption more, its progress kept, its arrival and class unchanged
    assert (p.victim.preemptions, p.victim.produced_tokens) == (1, 40)
    assert (p.victim.arrival, p.victim.slo.slo_class) == (900.0, "batch")
    assert rig.sched.running_on(RequestId("batch0")) is None
    assert rig.sched.running_on(RequestId("chat1")) == EndpointId("m")
    assert rig.sched.queue_depth(M) == 1
    assert rig.sched.inflight_on(EndpointId("m")) == 1  # the seat changed hands, no more


def test_requeued_victim_keeps_its_place_and_resumes_when_a_seat_frees() -> None:
    rig = busy_mixed_rig(make_policy(extra=PREEMPT, ordering="fcfs"))
    rig.sched.progress(RequestId("batch0"), 8, rig.clock.now())
    rig.sched.submit(req("chat1"))
    assert len(rig.sched.take_preemptions()) == 1
    assert rig.place(req("batch1", "batch", arrival=950.0)) is None
    # the victim (arrival 900) comes before batch1 (arrival 950) once the mixed seat frees
    out = rig.sched.complete(RequestId("chat1"))
    assert where(out) == [("dispatch", "batch0", "m")]
    (d,) = out
    assert isinstance(d, Dispatch)
    assert (d.req.produced_tokens, d.req.preemptions) == (8, 1)


def test_complete_returns_a_preemption_before_the_dispatch_that_takes_its_seat() -> None:
    rig = busy_mixed_rig()
    assert rig.place(req("chat1")) == "m"  # preempted batch0 (in the outbox)
    rig.sched.take_preemptions()
    assert rig.place(req("batch1", "batch")) is None
    # the requeued batch0 is placed when chat1 completes; a chat waiting then preempts it again
    rig.sched.submit(req("chat2"))  # queued: the mixed seat holds chat1 (not a victim)
    assert rig.sched.take_preemptions() == []
    out = rig.sched.complete(RequestId("chat0"))  # the interactive seat frees: chat2 takes it
    assert where(out) == [("dispatch", "chat2", "i")]


def test_preemption_inside_served_queue_comes_before_its_dispatch() -> None:
    rig = busy_mixed_rig()
    rig.sched.sync_endpoints([spec("i", INTERACTIVE), spec("m", MIXED)])
    rig.sched.set_health(EndpointId("i"), EndpointHealth.UNHEALTHY)  # chat0 keeps running there
    rig.clock.advance(1.0)
    assert rig.sched.submit(req("chat1")) is not None  # preempts batch0 at once
    assert where(rig.sched.take_preemptions()) == [("preempt", "batch0", "m")]
    # chat2 cannot preempt chat1; it is placed by the tick after chat1 completes, without a preemption
    assert rig.sched.submit(req("chat2")) is None
    assert rig.sched.take_preemptions() == []
    assert where(rig.sched.complete(RequestId("chat1"))) == [("dispatch", "chat2", "m")]


@pytest.mark.parametrize(
    ("victim", "why"),
    [
        pytest.param(
            req("batch0", "batch", arrival=900.0, resumable=False), "not resumable", id="not-resumable"
        ),
        pytest.param(req("batch0", "batch", arrival=900.0, preemptions=1), "at its limit", id="at-limit"),
        pytest.param(req("batch0", "chat", arrival=900.0), "interactive", id="interactive-victim"),
        pytest.param(
            dataclasses.replace(
                req("batch0", "batch", arrival=900.0),
                slo=SLO(slo_class="batch", ttft_ms=3_600_000.0, itl_ms=2_000.0, deadline_ms=100_000.0),
            ),
            "deadline would be missed",
            id="own-slo-infeasible",
        ),
    ],
)
def test_never_an_ineligible_victim(victim: SchedRequest, why: str) -> None:
    rig = Rig(make_policy(extra=PREEMPT), spec("i", INTERACTIVE), spec("m", MIXED))
    assert rig.place(req("chat0")) == "i"
    assert rig.place(victim) == "m"
    rig.clock.advance(99.0)  # the deadline case: 1 s left, a requeue is assumed to take 10
    assert rig.sched.submit(req("chat1", arrival=rig.clock.now())) is None, why
    assert rig.sched.take_preemptions() == []
    assert rig.sched.running_on(RequestId("batch0")) == EndpointId("m")


@pytest.mark.parametrize(
    ("params", "victim"),
    [
        pytest.param('classes = ["interactive", "mixed"]', "on-m", id="preemptor-order-across-classes"),
        pytest.param('classes = ["interactive", "mixed"], by_class = true', "on-i", id="own-class-first"),
        pytest.param('classes = ["mixed", "interactive"], by_class = true', "on-m", id="listed-order"),
    ],
)
def test_by_class_takes_back_borrowed_seats_first(params: str, victim: str) -> None:
    """Batch work borrows the interactive endpoint's seat (no reserve) and fills the mixed one; the batch
    request on the mixed endpoint has the least progress (least-progress ranks it first). With `by_class`
    the classes are tried in their listed order."""
    borrow = '[{ plugin = "instance-class", params = { batch = ["batch", "mixed", "interactive"] } }]'
    pol = make_policy(filters=borrow, extra=PREEMPT + f"params = {{ {params} }}\n")
    rig = Rig(pol, spec("i", INTERACTIVE), spec("m", MIXED))
    assert rig.place(req("on-m", "batch", arrival=900.0)) == "m"
    assert rig.place(req("on-i", "batch", arrival=901.0)) == "i"
    rig.clock.advance(5.0)
    rig.sched.progress(RequestId("on-i"), 40, rig.clock.now() - 4.0)
    d = rig.sched.submit(req("chat0", arrival=rig.clock.now()))
    assert isinstance(d, Dispatch)
    assert [str(p.victim.id) for p in rig.sched.take_preemptions()] == [victim]


def test_only_mixed_endpoints_by_default_and_classes_param_widens() -> None:
    def run(extra: str) -> list[Preempt]:
        rig = Rig(make_policy(extra=extra), spec("i", INTERACTIVE), spec("b", BATCH))
        # batch work on the interactive endpoint is impossible by class; put a batch request on "b"
        assert rig.place(req("batch0", "batch")) == "b"
        assert rig.place(req("chat0")) == "i"
        rig.sched.submit(req("chat1"))
        return rig.sched.take_preemptions()

    assert run(PREEMPT) == []  # the batch endpoint is out of the interactive request's classes anyway
    widened = """
[preemption]
plugin = "least-progress"
params = { classes = ["mixed", "batch"] }
"""
    # the interactive request still cannot be placed on a batch endpoint (the class filter), so even
    # where preemption is allowed the seat it would free is not one it may take
    assert run(widened) == []


def test_victim_choice_by_plugin() -> None:
    def victim(plugin: str) -> str:
        pol = make_policy(extra=f'[preemption]\nplugin = "{plugin}"\n')
        rig = Rig(pol, spec("m1", MIXED), spec("m2", MIXED))
        assert rig.place(req("long", "batch")) is not None
        tight = SLO(slo_class="batch", ttft_ms=3_600_000.0, itl_ms=2_000.0, deadline_ms=60_000.0)
        assert rig.place(dataclasses.replace(req("short", "batch"), slo=tight)) is not None
        rig.clock.advance(10.0)
        rig.sched.progress(RequestId("long"), 150, rig.clock.now() - 9.0)
        rig.sched.progress(RequestId("short"), 5, rig.clock.now() - 1.0)
        rig.sched.submit(req("chat", arrival=rig.clock.now()))
        (p,) = rig.sched.take_preemptions()
        return str(p.victim.id)

    assert victim("least-progress") == "short"
    assert victim("smallest-kv-loss") == "short"
    # the short one must end within a minute; the long one has its 2 s per token only: more in hand
    assert victim("most-slack") == "long"


def test_cancel_removes_a_requeued_victim() -> None:
    rig = busy_mixed_rig()
    rig.sched.submit(req("chat1"))
    (p,) = rig.sched.take_preemptions()
    assert rig.sched.cancel(p.victim.id) is True
    assert rig.sched.queue_depth(M) == 0
    assert rig.sched.complete(RequestId("chat1")) == []  # nothing left to place


def test_requeued_victim_waits_from_its_requeue_not_its_arrival() -> None:
    rig = busy_mixed_rig()
    rig.sched.set_limits(QueueLimits(max_wait_s=30.0))
    rig.clock.advance(100.0)  # batch0 arrived at 900: 200 s before now
    rig.sched.submit(req("chat1", arrival=rig.clock.now()))
    assert len(rig.sched.take_preemptions()) == 1
    rig.clock.advance(1.0)
    assert not [d for d in rig.sched.tick() if isinstance(d, Reject)]


def test_no_preemption_without_a_preemption_plugin() -> None:
    rig = busy_mixed_rig(make_policy())
    assert rig.sched.submit(req("chat1")) is None
    assert rig.sched.take_preemptions() == []


# --------------------------------------------------------------------- adaptive caps
CHIRON = """
[concurrency]
plugin = "chiron"
params = {{ alpha = 0.5, min_cap = 2, interval_s = 1.0, start = {start} }}
"""


def stream(rig: Rig, ids: Sequence[str], tokens: int, gap_s: float) -> None:
    """The running requests `ids` each stream `tokens` more tokens, `gap_s` apart (the clock moves on by
    that much), and the dispatcher reports their progress."""
    rig.clock.advance(tokens * gap_s)
    now = rig.clock.now()
    view = rig.sched.endpoint_view(EndpointId("e"))
    assert view is not None
    for r in ids:
        run = next(x for x in view.running if x.id == RequestId(r))
        first = run.first_token_at if run.first_token_at is not None else now
        rig.sched.progress(RequestId(r), (run.produced or 0) + tokens, first)


def test_chiron_grows_while_binding_under_low_itl_and_halves_over_it() -> None:
    rig = Rig(make_policy(filters="[]", extra=CHIRON.format(start=4)), spec("e", cap=64))
    e = EndpointId("e")
    assert rig.sched.cap_of(e) == 4
    ids: list[str] = []
    made = iter(range(1000))

    def fill() -> None:
        """Place requests until the cap binds (the one that finds no seat leaves again)."""
        while True:
            name = f"r{next(made)}"
            if rig.place(req(name)) is None:
                assert rig.sched.cancel(RequestId(name))
                return
            ids.append(name)
            stream(rig, [name], 1, 0.0)

    caps: list[int] = []
    for _ in range(5):
        fill()
        # 20 ms per token against a 200 ms target: LBP = 0.1, the cap binding: B
        # grows (at most twice per step); the reading right after a growth is skipped (the new seats'
        # prefills), the one after that judges the growth by throughput (TBP) and grows again
        stream(rig, ids, 50, 0.02)
        rig.sched.complete(RequestId(ids.pop(0)))
        cap = rig.sched.cap_of(e)
        assert cap is not None
        caps.append(cap)
    assert caps[:2] == [8, 8]  # grown, then held while the new seats fill
    assert caps[1] < caps[2] == caps[3] < caps[4]
    # seats to spare: no growth, however low the latency
    stream(rig, ids, 50, 0.02)
    rig.sched.complete(RequestId(ids.pop(0)))
    stream(rig, ids, 50, 0.02)
    rig.sched.complete(RequestId(ids.pop(0)))
    assert rig.sched.cap_of(e) == caps[4]
    caps.append(caps[4])
    # now 400 ms per token: LBP = 2 -> halve (the running set is within the cap: nothing draining)
    stream(rig, ids, 3, 0.4)
    rig.sched.complete(RequestId(ids.pop(0)))
    assert rig.sched.cap_of(e) in {caps[4] // 2, (caps[4] + 1) // 2}


def test_a_cut_cap_on_a_mixed_endpoint_preempts_batch_work_down_to_it() -> None:
    """An interactive stream on a mixed endpoint full of batch work: when the controller halves the cap
    for the stream's inter-token target, batch requests are preempted down to the cap at once."""
    pol = make_policy(filters="[]", extra=PREEMPT + CHIRON.format(start=8))
    rig = Rig(pol, spec("e", MIXED, cap=8))
    e = EndpointId("e")
    names = [f"b{k}" for k in range(7)]
    for n in names:
        assert rig.place(req(n, "batch")) == "e"
    assert rig.place(req("chat")) == "e"
    stream(rig, [*names, "chat"], 1, 0.0)
    stream(rig, [*names, "chat"], 5, 0.5)  # 500 ms per token against the chat's 200 ms: LBP > 1
    out = rig.sched.complete(RequestId("b0"))  # a change of the running set: the controller acts
    assert rig.sched.cap_of(e) == 4  # 8 halved
    preempted = [d for d in out if isinstance(d, Preempt)]
    assert {d.reason for d in preempted} == {"cap_lowered"}
    assert len(preempted) == 3  # 7 running (6 batch + chat) down to 4
    assert rig.sched.inflight_on(e) == 4
    assert rig.sched.running_on(RequestId("chat")) == e  # never the interactive stream
    assert rig.sched.queue_depth(M) == 3


def test_gaps_begun_before_a_cut_are_kept_apart_from_those_after_it() -> None:
    """The endpoint's view counts every reported gap in `gap_s`, and in `gap_after_cut_s` only the gaps
    that began after its cap was last lowered (what `chiron` judges a cut by)."""
    pol = make_policy(filters="[]", extra=PREEMPT + CHIRON.format(start=8))
    rig = Rig(pol, spec("e", MIXED, cap=8))
    e = EndpointId("e")
    names = [f"b{k}" for k in range(7)]
    for n in names:
        assert rig.place(req(n, "batch")) == "e"
    assert rig.place(req("chat")) == "e"
    stream(rig, [*names, "chat"], 1, 0.0)
    stream(rig, [*names, "chat"], 5, 0.5)
    rig.clock.advance(0.5)  # the streams reported 0.5 s before the cut
    rig.sched.complete(RequestId("b0"))
    assert rig.sched.cap_of(e) == 4
    v = rig.sched.endpoint_view(e)
    assert v is not None
    assert v.cut_at == rig.clock.now()
    before = (v.gap_s, v.gap_tokens, v.gap_after_cut_s, v.gap_after_cut_tokens)
    left = [r.id for r in v.running]
    rig.clock.advance(1.0)
    # a stream whose last report was before the cut: its gap spans it
    rig.sched.progress(left[0], (v.running[0].produced or 0) + 4, v.running[0].first_token_at)
    v = rig.sched.endpoint_view(e)
    assert v is not None
    assert v.gap_tokens == before[1] + 4
    assert v.gap_after_cut_tokens == before[3]
    assert v.gap_s == pytest.approx(before[0] + 1.5)  # 0.5 s before the cut, 1 s after
    rig.clock.advance(1.0)
    rig.sched.progress(left[0], (v.running[0].produced or 0) + 5, v.running[0].first_token_at)
    v = rig.sched.endpoint_view(e)
    assert v is not None
    assert v.gap_after_cut_tokens == before[3] + 5
    assert v.gap_after_cut_s == pytest.approx(before[2] + 1.0)


def test_chiron_respects_the_min_interval_bounds_and_configured_cap() -> None:
    rig = Rig(make_policy(filters="[]", extra=CHIRON.format(start=100)), spec("e", cap=8))
    e = EndpointId("e")
    assert rig.sched.cap_of(e) == 8  # never above the configured cap
    assert rig.place(req("a")) == "e"
    stream(rig, ["a"], 1, 0.0)
    stream(rig, ["a"], 5, 1.0)  # 1 s per token against 200 ms: LBP = 5
    assert rig.place(req("b")) == "e"
    assert rig.sched.cap_of(e) == 4  # halved
    assert rig.place(req("c")) == "e"
    assert rig.sched.cap_of(e) == 4  # within the min interval: unchanged
    for _ in range(4):
        stream(rig, ["a", "b", "c"], 2, 1.0)
        rig.sched.complete(RequestId("c"))
        assert rig.place(req("c")) == "e" or rig.sched.queue_depth(M) == 1
        if rig.sched.running_on(RequestId("c")) is None:
            rig.sched.cancel(RequestId("c"))
            break
    assert rig.sched.cap_of(e) == 2  # halved down to min_cap, no further


def test_lowered_cap_takes_no_seat_and_static_is_the_configured_cap() -> None:
    rig = Rig(make_policy(filters="[]", extra='[concurrency]\nplugin = "static"\n'), spec("e", cap=3))
    assert rig.sched.cap_of(EndpointId("e")) == 3
    view = rig.sched.endpoint_view(EndpointId("e"))
    assert view is not None
    assert (view.cap, view.max_cap) == (3, 3)
    # a policy without a controller restores configured caps
    rig2 = Rig(make_policy(filters="[]", extra=CHIRON.format(start=1)), spec("e", cap=5))
    assert rig2.sched.cap_of(EndpointId("e")) == 2  # start 1, floor 2
    rig2.sched.set_policy(make_policy(filters="[]"))
    assert rig2.sched.cap_of(EndpointId("e")) == 5


# --------------------------------------------------------------------- invariant (hypothesis)
_EVENTS = st.one_of(
    st.tuples(st.just("submit"), st.sampled_from(["chat", "batch"])),
    st.tuples(st.just("complete"), st.integers(0, 50)),
    st.tuples(st.just("progress"), st.integers(0, 50)),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("tick"), st.floats(0.0, 3.0)),
)


@settings(max_examples=60, deadline=None)
@given(
    caps=st.lists(st.integers(1, 3), min_size=3, max_size=3),
    adaptive=st.booleans(),
    victims=st.integers(1, 3),
    script=st.lists(_EVENTS, min_size=5, max_size=40),
)
def test_seats_never_overcommitted_with_preemption(
    caps: list[int], adaptive: bool, victims: int, script: list[tuple[str, Any]]
) -> None:
    """Random submits, completions, progress reports, cancels and ticks on an interactive/mixed/batch
    fleet with preemption (and adaptive caps or not): every dispatch has a free seat under the cap in
    force, no endpoint ever runs more than its configured cap, a victim was running and is queued again,
    and the scheduler's counts always match a ledger of the decisions."""
    extra = (
        '[preemption]\nplugin = "least-progress"\n'
        f"params = {{ max_preemptions = 2, max_victims = {victims} }}\n"
    )
    if adaptive:
        extra += CHIRON.format(start=1)
    rig = Rig(
        make_policy(extra=extra),
        spec("i", INTERACTIVE, cap=caps[0]),
        spec("m", MIXED, cap=caps[1]),
        spec("b", BATCH, cap=caps[2]),
    )
    state: dict[RequestId, str] = {}
    where_: dict[RequestId, EndpointId] = {}
    produced: dict[RequestId, int] = {}

    def apply(decisions: Sequence[Decision]) -> None:
        for d in decisions:
            if isinstance(d, Preempt):
                v = d.victim.id
                assert state[v] == "running"
                assert where_.pop(v) == d.endpoint.id
                state[v] = "queued"
                assert d.victim.preemptions <= 2
            elif isinstance(d, Dispatch):
                assert state[d.req.id] == "queued"
                assert d.endpoint.inflight < d.endpoint.cap <= d.endpoint.hard_cap
                state[d.req.id] = "running"
                where_[d.req.id] = d.endpoint.id
            else:
                assert state[d.req.id] == "queued"
                state[d.req.id] = "rejected"

    for n, (kind, arg) in enumerate(script):
        if kind == "submit":
            r = req(f"r{n}", arg, arrival=rig.clock.now())
            state[r.id] = "queued"
            got = rig.sched.submit(r)
            apply(rig.sched.take_preemptions())
            if got is not None:
                apply([got])
        elif kind in ("complete", "progress"):
            running = sorted(r for r, s in state.items() if s == "running")
            if running:
                rid = running[arg % len(running)]
                if kind == "complete":
                    state[rid] = "done"
                    where_.pop(rid)
                    apply(rig.sched.complete(rid))
                else:
                    produced[rid] = produced.get(rid, 0) + 16
                    rig.sched.progress(rid, produced[rid], rig.clock.now())
        elif kind == "cancel":
            queued = sorted(r for r, s in state.items() if s == "queued")
            if queued:
                rid = queued[arg % len(queued)]
                assert rig.sched.cancel(rid)
                state[rid] = "cancelled"
        else:
            rig.clock.advance(arg)
            apply(rig.sched.tick())
        for e in rig.sched.snapshot().endpoints:
            here = [r for r, at in where_.items() if at == e.id]
            assert e.inflight == len(here)
            assert e.inflight <= e.hard_cap
            assert rig.sched.running_on(here[0]) == e.id if here else True
        assert rig.sched.queue_depth(M) == sum(1 for s in state.values() if s == "queued")


def _run(script: list[tuple[str, Any]], victims: int) -> list[tuple[str, str, str]]:
    """The decisions of `script` on a fleet of eight endpoints of every class, with preemption."""
    extra = f'[preemption]\nplugin = "least-progress"\nparams = {{ max_victims = {victims} }}\n'
    classes = (INTERACTIVE, MIXED, MIXED, BATCH, MIXED, MIXED, BATCH, MIXED)
    rig = Rig(make_policy(extra=extra), *(spec(f"e{i}", c) for i, c in enumerate(classes)))
    out: list[tuple[str, str, str]] = []
    running: list[RequestId] = []

    def note(decisions: Sequence[Decision]) -> None:
        for d in decisions:
            if isinstance(d, Reject):
                out.append(("reject", str(d.req.id), ""))
                continue
            eid = str(d.endpoint.id)
            if isinstance(d, Preempt):
                running.remove(d.victim.id)
                out.append(("preempt", str(d.victim.id), eid))
            else:
                running.append(d.req.id)
                out.append(("dispatch", str(d.req.id), eid))

    for n, (kind, arg) in enumerate(script):
        if kind == "submit":
            got = rig.sched.submit(req(f"r{n}", arg, arrival=rig.clock.now()))
            note(rig.sched.take_preemptions())
            note([] if got is None else [got])
        elif kind in ("complete", "progress", "cancel"):
            if running and kind == "complete":
                rid = running.pop(arg % len(running))
                note(rig.sched.complete(rid))
            elif running and kind == "progress":
                rig.sched.progress(running[arg % len(running)], 16 * (1 + arg), rig.clock.now())
        else:
            rig.clock.advance(arg)
            note(rig.sched.tick())
    return out


_SUBMITS = st.tuples(st.just("submit"), st.sampled_from(["chat", "batch", "batch"]))


@settings(max_examples=60, deadline=None)
@given(
    victims=st.integers(1, 3),
    script=st.lists(st.one_of(_SUBMITS, _SUBMITS, _EVENTS), min_size=16, max_size=48),
)
def test_victims_looked_for_on_the_kept_places_only_decide_as_a_walk_of_every_endpoint(
    victims: int, script: list[tuple[str, Any]]
) -> None:
    """Preemption looks for victims only on the endpoints that run a candidate, kept per tuple of views
    and carried over where endpoints changed (`FleetSnapshot.places`): the same decisions as a look at
    every endpoint."""
    kept = _run(script, victims)
    with mock.patch.object(FleetSnapshot, "places", return_value=None):
        walked = _run(script, victims)
    assert kept == walked


# --------------------------------------------------------------------- config errors
@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        pytest.param(
            '[preemption]\nplugin = "nope"\n',
            "t.toml:preemption.plugin: unknown preemptor plugin 'nope' (known: least-progress, most-slack, "
            "smallest-kv-loss)",
            id="unknown-preemptor",
        ),
        pytest.param(
            '[preemption]\nplugin = "least-progress"\nparams = { max_preemptions = -1 }\n',
            "t.toml:preemption.params.max_preemptions: expected integer >= 0",
            id="negative-limit",
        ),
        pytest.param(
            '[preemption]\nplugin = "most-slack"\nparams = { by = ["batch"] }\n',
            "t.toml:preemption.params: a kind may not both preempt and be preempted (by and victims overlap)",
            id="kinds-overlap",
        ),
        pytest.param(
            '[preemption]\nplugin = "least-progress"\nparams = { classes = ["gpu"] }\n',
            "t.toml:preemption.params.classes[0]: invalid value 'gpu' "
            "(expected one of: interactive, mixed, batch)",
            id="unknown-class",
        ),
        pytest.param(
            '[concurrency]\nplugin = "chiron"\nparams = { alpha = 0.0 }\n',
            "t.toml:concurrency.params.alpha: expected number > 0.0",
            id="chiron-alpha",
        ),
        pytest.param(
            '[concurrency]\nplugin = "static"\nparams = { cap = 3 }\n',
            "t.toml:concurrency.params.cap: concurrency plugin 'static' takes no parameters",
            id="static-takes-none",
        ),
        pytest.param(
            '[concurrency]\nplugin = "least-progress"\n',
            "t.toml:concurrency.plugin: unknown concurrency plugin 'least-progress' "
            "(known: chiron, chiron-paper, static); "
            "'least-progress' is a preemptor plugin",
            id="wrong-slot",
        ),
    ],
)
def test_config_errors_name_the_file_and_key_path(extra: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_policy(extra=extra)
    assert str(info.value) == expected


def test_instance_class_params_are_checked() -> None:
    with pytest.raises(ConfigError) as info:
        make_policy(filters='[{ plugin = "instance-class", params = { batch = ["batch", "batch"] } }]')
    assert str(info.value) == "t.toml:placement.filters[0].params: batch: an instance class is listed twice"
    with pytest.raises(ConfigError) as info:
        make_policy(filters='[{ plugin = "instance-class", params = { reserve = { mixed = 2 } } }]')
    assert str(info.value) == (
        "t.toml:placement.filters[0].params: reserve: mixed endpoints are no kind's own class (the head "
        "of a kind's list): nothing to reserve them for"
    )
    with pytest.raises(ConfigError) as info:
        make_policy(filters='[{ plugin = "instance-class", params = { reserve = { interactive = -1 } } }]')
    assert str(info.value) == (
        "t.toml:placement.filters[0].params.reserve.interactive: expected integer >= 0"
    )


def test_shipped_chat_and_batch_uses_classes_preemption_and_adaptive_caps() -> None:
    pol = load_policy(
        Path(__file__).resolve().parents[2] / "policies" / "chat-and-batch.toml", default_registry()
    )
    assert [f.name for f in pol.profile.filters] == ["instance-class", "overflow-guard", "prefix-holders"]
    assert pol.preemptor is not None
    assert pol.preemptor.name == "least-progress"
    assert pol.concurrency is not None
    assert pol.concurrency.name == "chiron"


def test_victims_are_judged_on_a_load_made_before_their_progress_report() -> None:
    """A load stands for its endpoint's later views apart in progress reports only (`LoadCache`): the
    victims of the later view are judged on its running states all the same (matched by request id)."""
    rig = busy_mixed_rig()
    pol = rig.sched.policy
    assert pol.preemptor is not None
    rules = pol.preemptor.rules
    m = EndpointId("m")
    rig.sched.progress(RequestId("batch0"), 16, rig.clock.now())
    view = rig.sched.endpoint_view(m)
    assert view is not None
    (first,) = rig.sched._victims(view, rig.clock.now(), rules)
    assert first.running.produced == 16
    rig.clock.advance(0.001)
    rig.sched.progress(RequestId("batch0"), 32, rig.clock.now())
    later = rig.sched.endpoint_view(m)
    assert later is not None
    assert later is not view
    (victim,) = rig.sched._victims(later, rig.clock.now(), rules)
    assert victim.running is later.running[0]
    assert victim.running.produced == 32
