"""Requests for a loadable model with no ready endpoint wait in the queue for its load (cold start)."""

from __future__ import annotations

from gateway.core import errors
from gateway.core.types import EndpointHealth, ModelName
from gateway.sched.decisions import Dispatch, Reject
from gateway.sched.types import QueueLimits
from tests.unit.test_sched_scheduler import Fleet, spec

COLD = ModelName("cold")


def test_unknown_model_is_still_rejected_at_once() -> None:
    f = Fleet(spec("e1"))
    d = f.submit("r1", "cold")
    assert isinstance(d, Reject)
    assert d.error.code == "no_ready_endpoint"


def test_loadable_model_waits_and_is_noted_once_then_placed_when_its_endpoint_is_ready() -> None:
    f = Fleet(spec("e1"))
    f.sched.set_loadable([COLD], load_deadline_s=120)
    assert f.submit("r1", "cold") is None
    assert f.submit("r2", "cold") is None
    assert f.sched.take_cold() == [COLD]
    assert f.sched.take_cold() == []
    assert f.sched.lookahead(5) == (COLD, COLD)
    assert f.sched.sync_endpoints([spec("e1"), spec("c1", cap=4, models=["cold"])]) == []
    out = f.sched.set_health(spec("c1").id, EndpointHealth.READY)
    assert sorted((d.req.id, d.endpoint.id) for d in out if isinstance(d, Dispatch)) == [
        ("r1", "c1"),
        ("r2", "c1"),
    ]


def test_waiting_for_a_load_is_bounded_by_the_load_deadline_not_max_wait() -> None:
    f = Fleet(spec("e1"), limits=QueueLimits(max_wait_s=5))
    f.sched.set_loadable([COLD], load_deadline_s=60)
    assert f.submit("r1", "cold") is None
    f.clock.advance(30)
    assert f.sched.tick() == []
    f.clock.advance(31)
    [d] = f.sched.tick()
    assert isinstance(d, Reject)
    assert d.error.code == "queue_timeout"


def test_a_failed_load_rejects_every_waiting_request_with_its_reason() -> None:
    f = Fleet(spec("e1"))
    f.sched.set_loadable([COLD], load_deadline_s=60)
    f.submit("r1", "cold")
    f.submit("r2", "cold")
    out = f.sched.fail_model(COLD, errors.model_load_failed("cold", "engine_exited: boom", 1.0))
    rejects = [d for d in out if isinstance(d, Reject)]
    assert len(rejects) == len(out)
    assert [d.req.id for d in rejects] == ["r1", "r2"]
    assert all(d.error.code == "model_load_failed" and d.error.status == 503 for d in rejects)
    assert "engine_exited: boom" in rejects[0].error.message
    assert f.sched.queue_depth(COLD) == 0
