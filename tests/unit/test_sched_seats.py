"""An endpoint whose cap the operator did not set: its bound is the engine's batch size as its gauges
show it (day one: endpoints given by URL only). Scheduler playbooks on a fake clock; gauges come in as
scrapes would."""

from __future__ import annotations

import pytest

from gateway.config.policy import parse_policy_text
from gateway.core.clock import FakeClock
from gateway.core.types import EndpointHealth, EndpointId, EngineGauges, EngineKind, ModelName
from gateway.sched.plugins import default_registry
from gateway.sched.profile import Policy
from gateway.sched.scheduler import Scheduler
from gateway.sched.types import EndpointSpec, QueueLimits

E = EndpointId("e")
M = ModelName("m")


def policy(concurrency: str = "") -> Policy:
    text = f"""
name = "t"
[ordering]
plugin = "fcfs"
[placement]
picker = {{ plugin = "max-score" }}
filters = []
[[placement.scorers]]
plugin = "least-outstanding"
{concurrency}
"""
    return parse_policy_text(text, "t.toml", default_registry())


def rig(cap: int | None, pol: Policy | None = None) -> Scheduler:
    sched = Scheduler(pol or policy(), FakeClock(), QueueLimits())
    spec = EndpointSpec(E, "http://e", EngineKind.VLLM, frozenset({M}), cap=cap, default_cap=64)
    sched.sync_endpoints([spec])
    sched.set_health(E, EndpointHealth.READY)
    return sched


def scrape(sched: Scheduler, running: float, waiting: float) -> int | None:
    sched.observe_gauges(E, EngineGauges(running=running, waiting=waiting))
    return sched.cap_of(E)


def test_unset_cap_learns_the_engines_batch_size_from_a_queue_that_stays() -> None:
    sched = rig(None)
    assert sched.cap_of(E) == 64  # the default until the gauges say more
    assert scrape(sched, 16, 0) == 64
    assert scrape(sched, 16, 3) == 64  # one scrape with a queue: a request between two engine steps
    assert scrape(sched, 12, 0) == 64
    assert scrape(sched, 16, 5) == 64
    assert scrape(sched, 16, 40) == 17  # waiting twice in a row: 16 seats, one request waits beside them
    view = sched.endpoint_view(E)
    assert view is not None
    assert (view.cap, view.max_cap) == (17, 17)
    assert scrape(sched, 10, 0) == 17  # a smaller batch later does not lower it
    assert scrape(sched, 17, 0) == 18  # a larger batch raises it (the one waiting request got in)


def test_a_configured_cap_is_the_operators_and_never_learned() -> None:
    sched = rig(32)
    for _ in range(3):
        assert scrape(sched, 16, 40) == 32


@pytest.mark.parametrize("gauges", [EngineGauges(), EngineGauges(running=4.0)], ids=["none", "no-waiting"])
def test_engines_without_the_gauges_keep_the_default(gauges: EngineGauges) -> None:
    sched = rig(None)
    for _ in range(3):
        sched.observe_gauges(E, gauges)
    assert sched.cap_of(E) == 64


def test_a_controllers_cap_is_clamped_to_the_learned_bound() -> None:
    chiron = '[concurrency]\nplugin = "chiron"\nparams = { start = 48 }\n'
    sched = rig(None, policy(chiron))
    assert sched.cap_of(E) == 48  # below the default bound: the controller's
    scrape(sched, 20, 2)
    assert scrape(sched, 20, 2) == 21  # the learned bound is below it: clamped
    view = sched.endpoint_view(E)
    assert view is not None
    assert view.hard_cap == 21
