"""The slack ordering's ranked queue (hypothesis, random scripts of pushes, serves with requests passed
over, preemption requeues, cancels, demotions, time passing, load changing and refits):

- it picks exactly what a scan of the ranked rule's keys (`SlackOrdering.approximate_key`) picks, under
  every order of the classes;
- where the ranked rule is exact (one kind of hardware, idle endpoints, first-token deadlines) it picks
  what the scan of the exact slack keys picks;
- it ranks each request once per stay in the queue and asks no key (a serve does not walk the queue).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.types import SLO, ApiKind, EndpointId, ModelName, RequestId
from gateway.sched.interfaces import OrderKey, Rank
from gateway.sched.loads import LoadCache
from gateway.sched.perf import default_prior
from gateway.sched.plugins.ordering.slack import SlackOrdering, SlackParams, assess
from gateway.sched.queues import ModelQueue, Queued, first, ranked
from gateway.sched.request import SchedRequest
from gateway.sched.running import running_from
from gateway.sched.snapshot import EndpointEstimates, EndpointView, FleetSnapshot
from tests.unit.sched_builders import view

PRIOR = default_prior()
MODEL = ModelName("m")


def request(
    rid: str, arrival: float, slo: SLO, prompt: int, out: float, *, best_effort: bool
) -> SchedRequest:
    return SchedRequest(
        id=RequestId(rid),
        model=MODEL,
        api=ApiKind.CHAT,
        arrival=arrival,
        slo=slo,
        prompt_tokens=prompt,
        max_tokens=None,
        stream=True,
        predicted_output_tokens=out,
        predicted_output_p90=out * 1.5,
        best_effort=best_effort,
    )


def endpoint(eid: str, speed: float, running: int, now: float) -> EndpointView:
    """An endpoint whose coefficients are the prior's divided by `speed`, running `running` requests
    dispatched just now (their prefills pending: a wait and a delay for the ranked rule)."""
    perf = dataclasses.replace(
        PRIOR, k1=PRIOR.k1 / speed, c1=PRIOR.c1 / speed, k2=PRIOR.k2 / speed, c2=PRIOR.c2 / speed
    )
    base = view(eid, cap=4)
    reqs = tuple(
        running_from(request(f"{eid}-{i}", now, SLO(), 500, 100.0, best_effort=False), now)
        for i in range(running)
    )
    return dataclasses.replace(
        base, inflight=running, running=reqs, estimates=EndpointEstimates(perf=perf), id=EndpointId(eid)
    )


@dataclass(frozen=True)
class Push:
    arrival: float
    ttft_ms: float | None
    deadline_ms: float | None
    prompt: int
    out: float
    best_effort: bool


@dataclass(frozen=True)
class Serve:
    skips: int
    requeue: bool


@dataclass(frozen=True)
class Cancel:
    pick: int


@dataclass(frozen=True)
class Demote:
    pick: int


@dataclass(frozen=True)
class Advance:
    seconds: float


@dataclass(frozen=True)
class Load:
    endpoint: int
    running: int


@dataclass(frozen=True)
class Refit:
    endpoint: int
    speed: float


ops = st.one_of(
    st.builds(
        Push,
        arrival=st.sampled_from((0.0, 0.5, 1.0)),
        ttft_ms=st.sampled_from((None, 300.0, 1000.0, 3000.0)),
        deadline_ms=st.sampled_from((None, 2000.0, 8000.0)),
        prompt=st.sampled_from((16, 500, 4000)),
        out=st.sampled_from((1.0, 50.0, 400.0)),
        best_effort=st.integers(0, 9).map(lambda n: n == 0),
    ),
    st.builds(Serve, skips=st.integers(0, 3), requeue=st.booleans()),
    st.builds(Cancel, pick=st.integers(0, 1000)),
    st.builds(Demote, pick=st.integers(0, 1000)),
    st.builds(Advance, seconds=st.sampled_from((0.001, 0.05, 0.4))),
    st.builds(Load, endpoint=st.integers(0, 2), running=st.integers(0, 6)),
    st.builds(Refit, endpoint=st.integers(0, 2), speed=st.sampled_from((0.5, 1.0, 1.01, 2.0))),
)


class ApproximateKeys:
    """The ranked rule as plain keys, scanned (its rank epoch asked first, as the queue does)."""

    name = "approximate"

    def __init__(self, slack: SlackOrdering) -> None:
        self.slack = slack

    def key(self, req: SchedRequest, snap: FleetSnapshot) -> OrderKey:
        return self.slack.approximate_key(req, snap)


class ExactKeys:
    """The slack scan's keys, every one computed afresh (no key reuse across a demotion)."""

    name = "exact"

    def __init__(self, slack: SlackOrdering) -> None:
        self.slack = slack

    def key(self, req: SchedRequest, snap: FleetSnapshot) -> OrderKey:
        cls, slack = assess(req, snap, LoadCache(self.slack.params.predict_params()))
        return float(self.slack.rank_of(cls)), slack


def run_script(
    script: list[object], params: SlackParams, *, exact: bool, homogeneous: bool
) -> tuple[int, int]:
    """Play `script` and at every serve compare the ranked pick with the scan's; (picks compared, of
    which non-empty)."""
    slack = SlackOrdering(params)
    assert ranked(slack) is slack
    assert ranked(SlackOrdering(msgspec.structs.replace(params, queue="scan"))) is None
    exact_keys = ExactKeys(slack)
    approximate = ApproximateKeys(slack)
    queue = ModelQueue()
    now = 2.0
    speeds = [1.0, 1.0, 1.0] if homogeneous else [1.0, 2.0, 0.5]
    running = [0, 0, 0]
    seq = 0
    compared = chosen = 0

    def snap() -> FleetSnapshot:
        views = tuple(endpoint(f"e{i}", speeds[i], running[i], now) for i in range(3))
        return FleetSnapshot(now=now, endpoints=views)

    for op in script:
        if isinstance(op, Push):
            slo = SLO(ttft_ms=op.ttft_ms, deadline_ms=None if exact else op.deadline_ms)
            req = request(f"r{seq}", op.arrival, slo, op.prompt, op.out, best_effort=op.best_effort)
            queue.push(req, seq, frozenset(), now)
            seq += 1
        elif isinstance(op, Cancel | Demote) and queue:
            item = list(queue)[op.pick % len(queue)]
            if isinstance(op, Cancel):
                queue.remove(item)
            else:
                queue.set_req(item, dataclasses.replace(item.req, best_effort=True))
        elif isinstance(op, Advance):
            now += op.seconds
        elif isinstance(op, Load) and not exact:
            running[op.endpoint] = op.running
        elif isinstance(op, Refit) and not homogeneous:
            speeds[op.endpoint] = op.speed
        elif isinstance(op, Serve):
            s = snap()
            skipped: set[int] = set()
            while True:
                got = queue.first(slack, s, skipped)
                reference = exact_keys if exact else approximate
                want: Queued | None = first(reference, list(queue), s, skipped)
                compared += 1
                assert got is want, (got, want)
                if got is None:
                    break
                chosen += 1
                if len(skipped) < op.skips:
                    skipped.add(got.seq)
                    continue
                queue.remove(got)
                if op.requeue:  # preempted: its request again (resumed: no first-token deadline)
                    queue.push(dataclasses.replace(got.req, produced_tokens=8), got.seq, frozenset(), now)
                break
    return compared, chosen


ORDERS = {
    "cato": SlackParams(),
    "late-last": SlackParams(late="last"),
    "coding-assistant": SlackParams(late="last", at_risk="last", tail="normal", prefill_overhead=0.05),
    "at-risk-last": SlackParams(at_risk="last"),
}


@pytest.mark.parametrize("params", list(ORDERS.values()), ids=list(ORDERS))
@settings(max_examples=120, deadline=None)
@given(script=st.lists(ops, max_size=60))
def test_the_ranked_queue_picks_what_a_scan_of_the_ranked_rule_picks(
    params: SlackParams, script: list[object]
) -> None:
    run_script(script, params, exact=False, homogeneous=False)


@pytest.mark.parametrize("params", list(ORDERS.values()), ids=list(ORDERS))
@settings(max_examples=120, deadline=None)
@given(script=st.lists(ops, max_size=60))
def test_where_the_rule_is_exact_the_ranked_queue_picks_what_the_slack_scan_picks(
    params: SlackParams, script: list[object]
) -> None:
    """One kind of hardware, idle endpoints and first-token deadlines only: idle service on the fastest
    coefficients is every endpoint's, and the delay is the half iteration every endpoint has."""
    run_script(script, params, exact=True, homogeneous=True)


class CountingSlack(SlackOrdering):
    def __init__(self) -> None:
        super().__init__(SlackParams(late="last", at_risk="last"))
        self.ranked = 0
        self.keys = 0

    def rank(self, req: SchedRequest, snap: FleetSnapshot) -> Rank:
        self.ranked += 1
        return super().rank(req, snap)

    def key(self, req: SchedRequest, snap: FleetSnapshot) -> OrderKey:
        self.keys += 1
        return super().key(req, snap)


def test_a_request_is_ranked_once_and_no_key_is_asked() -> None:
    ordering = CountingSlack()
    queue = ModelQueue()
    n = 1000
    for i in range(n):
        req = request(f"r{i}", 0.0, SLO(ttft_ms=1000.0 + i), 500, 50.0, best_effort=False)
        queue.push(req, i, frozenset(), 0.0)
    snap = FleetSnapshot(now=0.1, endpoints=(endpoint("a", 1.0, 2, 0.1), endpoint("b", 1.0, 0, 0.1)))
    taken = []
    for _ in range(100):
        got = queue.first(ordering, snap, set())
        assert got is not None
        taken.append(got.seq)
        queue.remove(got)
    assert taken == list(range(100))  # least slack first: the earliest deadline
    assert ordering.ranked == n
    assert ordering.keys == 0


def test_a_refit_past_the_tolerance_ranks_every_request_again() -> None:
    ordering = CountingSlack()
    queue = ModelQueue()
    for i in range(10):
        queue.push(
            request(f"r{i}", 0.0, SLO(ttft_ms=1000.0), 500, 50.0, best_effort=False), i, frozenset(), 0.0
        )
    fleet = (endpoint("a", 1.0, 0, 0.1),)
    queue.first(ordering, FleetSnapshot(now=0.1, endpoints=fleet), set())
    assert ordering.ranked == 10
    queue.first(ordering, FleetSnapshot(now=0.1, endpoints=(endpoint("a", 1.01, 0, 0.1),)), set())
    assert ordering.ranked == 10  # within 2 %: the ranks hold
    queue.first(ordering, FleetSnapshot(now=0.1, endpoints=(endpoint("a", 1.5, 0, 0.1),)), set())
    assert ordering.ranked == 20


def test_the_shipped_coding_assistant_preset_keeps_a_ranked_queue() -> None:
    assert ranked(SlackOrdering(SlackParams(late="last", at_risk="last"))) is not None
    assert ranked(SlackOrdering(SlackParams(queue="scan"))) is None
