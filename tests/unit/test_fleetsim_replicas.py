"""The fleet simulator with N berth replicas (cluster mode): every request served, every replica's own
state back to zero, calls spread over the replicas, the peers' published load seen by each, and one
replica the same run as before."""

from __future__ import annotations

import orjson

from gateway.core.types import EndpointId
from loadgen.fleetsim import simulate
from loadgen.fleetsim.sim import Simulation
from tests.unit.test_fleetsim import POLICIES, opts, without_wall


def test_three_replicas_serve_everything_and_end_empty() -> None:
    sim = Simulation(opts(replicas=3, publish_interval_s=0.5))
    report = sim.run()
    overall = report.data["overall"]
    assert overall["ok"] == overall["count"] == len(report.requests) > 40
    for gw in sim.gws:
        s = gw.scheduler
        assert sum(s.queue_depths().values()) == 0
        assert all(s.inflight_on(EndpointId(e)) == 0 for e in ("e0", "e1", "e2", "e3"))
        assert s.own_loads() == {}
    # Every replica took its share of the calls (round robin).
    served = [sum(a.finished for a in gw.telemetry.fleet.attainment.totals().values()) for gw in sim.gws]
    assert min(served) > 0


def test_the_peers_load_reaches_each_replica() -> None:
    sim = Simulation(opts(replicas=2, publish_interval_s=0.25, rate=8.0))
    seen: list[int] = []
    original = sim._publish

    def publish() -> None:
        original()
        views = [sim.gws[1].scheduler.endpoint_view(EndpointId(e)) for e in ("e0", "e1", "e2", "e3")]
        own = sum(sim.gws[1].scheduler.inflight_on(EndpointId(e)) for e in ("e0", "e1", "e2", "e3"))
        seen.append(sum(v.inflight for v in views if v is not None) - own)

    sim._publish = publish  # type: ignore[method-assign]
    sim.run()
    assert max(seen) > 0  # replica 1 saw replica 0's requests in its views


def test_one_replica_is_the_run_it_always_was() -> None:
    base = opts(policy=POLICIES / "coding-assistant.toml", workload="coding:pattern1", rate=2.0)
    a = simulate(base)
    b = simulate(
        opts(policy=POLICIES / "coding-assistant.toml", workload="coding:pattern1", rate=2.0, replicas=1)
    )
    assert orjson.dumps(without_wall(a.data)) == orjson.dumps(without_wall(b.data))


def test_progress_reports_reach_the_replica_that_placed_the_call() -> None:
    sim = Simulation(opts(replicas=2, publish_interval_s=0.25, rate=8.0))
    heard = [0, 0]
    strays: list[str] = []  # reports a replica got for a request it is not running
    for i, gw in enumerate(sim.gws):
        sched = gw.scheduler
        original = sched.progress

        def progress(req_id, produced, first_at, _orig=original, _s=sched, _i=i):  # type: ignore[no-untyped-def]
            heard[_i] += 1
            if _s.running_on(req_id) is None:
                strays.append(req_id)
            _orig(req_id, produced, first_at)

        sched.progress = progress  # type: ignore[method-assign]
    sim.run()
    assert strays == []
    assert min(heard) > 0  # each replica hears of the calls it placed
