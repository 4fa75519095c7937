"""Serving stops when no seat of the model is free: with no preemptor, a queued request could be placed
nowhere, so the queue is not ordered nor the profile asked again (a completion that frees one seat
places one request with one placement; a tick on a full fleet asks none). With a preemptor the queue is
still served (a victim may make room)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from gateway.core.types import RequestId
from gateway.sched import scheduler, unfit
from gateway.sched.decisions import Dispatch
from gateway.sched.interfaces import PreemptionRules, Victim
from gateway.sched.profile import SchedulerProfile
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.snapshot import FleetSnapshot
from tests.unit.test_sched_serve_slices import M, Pins, ids, make, req


def _count_places(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    asked: list[str] = []
    plain = SchedulerProfile.place

    def counted(self: SchedulerProfile, r, snap, among=None):  # type: ignore[no-untyped-def]
        asked.append(r.id)
        return plain(self, r, snap, among)

    monkeypatch.setattr(SchedulerProfile, "place", counted)
    return asked


def _count_tries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The queued requests serving tries (each is first looked up in its unfit memo: `retry_on`)."""
    tried: list[str] = []
    plain = unfit.retry_on

    def counted(memo, profile, r, seq, snap):  # type: ignore[no-untyped-def]
        tried.append(r.id)
        return plain(memo, profile, r, seq, snap)

    monkeypatch.setattr(scheduler, "retry_on", counted)
    return tried


def _full(caps: tuple[int, ...], queued: int) -> tuple[Scheduler, list[str]]:
    sched, clock = make(Pins(), lookahead=2, caps=caps, slice_=4)
    running = [sched.submit(req(f"r{i}", clock)) for i in range(sum(caps))]
    assert all(isinstance(d, Dispatch) for d in running)
    for i in range(queued):
        assert sched.submit(req(f"q{i}", clock)) is None
    return sched, [f"q{i}" for i in range(queued)]


def test_a_completion_that_frees_one_seat_places_one_request_and_asks_no_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sched, queued = _full((1, 1, 1), 5)
    asked = _count_places(monkeypatch)
    assert ids(sched.complete(RequestId("r1"))) == queued[:1]
    assert asked == queued[:1]  # the next request is not tried: the freed seat is taken
    assert ids(sched.complete(RequestId("r2"))) == queued[1:2]
    assert asked == queued[:2]


def test_a_tick_on_a_full_fleet_tries_no_request(monkeypatch: pytest.MonkeyPatch) -> None:
    sched, _ = _full((2, 1), 4)
    tried = _count_tries(monkeypatch)
    assert sched.tick() == []
    assert tried == []
    assert sched.queue_depth(M) == 4


def test_with_a_preemptor_a_full_fleet_is_still_served(monkeypatch: pytest.MonkeyPatch) -> None:
    sched, queued = _full((1, 1), 2)
    sched._policy = dataclasses.replace(sched._policy, preemptor=_NeverPreempts())
    tried = _count_tries(monkeypatch)
    assert sched.tick() == []
    assert tried == queued[:1]  # tried, as a victim might have made room (none did here)


class _NeverPreempts:
    """A preemptor whose rules let no request preempt (`by` empty)."""

    name = "never"
    rules = PreemptionRules(by=frozenset())

    def rank(self, req: SchedRequest, victims: Sequence[Victim], snap: FleetSnapshot) -> Sequence[Victim]:
        return victims
