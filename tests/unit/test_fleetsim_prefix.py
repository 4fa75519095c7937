"""The fleet simulator feeds its scheduler the same prefix index as the daemon: the approximate source
from what it dispatched, or an oracle reading the simulated engines' true caches."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from gateway.core.blockhash import token_chain
from gateway.core.types import ApiKind, EndpointId, EngineGauges
from gateway.dispatch.context import RequestContext
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim import SimOptions
from loadgen.fleetsim.prefix_oracle import OracleHolder, TrueCache, hit_counters, true_cache
from loadgen.fleetsim.sim import Simulation

POLICIES = Path(__file__).resolve().parents[2] / "policies"


def opts(**kw: Any) -> SimOptions:
    fleet = tuple(EndpointSpec(models=("m",), profile="test-fast", seed=i, id=f"e{i}") for i in range(3))
    base: dict[str, Any] = {
        "policy": POLICIES / "coding-assistant.toml",
        "fleet": fleet,
        "workload": "sharegpt-like",
        "rate": 3.0,
        "duration_s": 10.0,
        "seed": 3,
    }
    return SimOptions(**{**base, **kw})


def test_the_simulated_dispatcher_feeds_the_approximate_index() -> None:
    sim = Simulation(opts())
    sim.run()
    prefix = sim.gw.telemetry.prefix
    stats = [prefix.stats(EndpointId(f"e{i}")) for i in range(3)]
    assert all(s is not None and s.source == "approximate" and s.cached_blocks > 0 for s in stats)


def test_off_leaves_the_index_empty() -> None:
    sim = Simulation(opts(prefix="off"))
    sim.run()
    assert sim.gw.telemetry.prefix.stats(EndpointId("e0")) is None or (
        sim.gw.telemetry.prefix.stats(EndpointId("e0")).cached_blocks == 0  # type: ignore[union-attr]
    )


class FakeTrueCache:
    def __init__(self, keys: Sequence[int], block_size: int) -> None:
        self._keys = set(keys)
        self._size = block_size

    @property
    def block_size(self) -> int:
        return self._size

    def holds(self, key: int) -> bool:
        return key in self._keys

    def cached_blocks(self) -> int:
        return len(self._keys)


class FakeEngine:
    def __init__(self, cache: TrueCache) -> None:
        self.prefix_cache = cache


def test_the_oracle_reads_the_engines_true_cache() -> None:
    ids = list(range(64))
    held = token_chain(ids, 16)
    # the engine evicted block 2 but kept 3: the oracle stops at the first block missing
    cache = FakeTrueCache([held[0], held[1], held[3]], 16)
    holder = OracleHolder(cache)
    assert holder.matched(held) == 2
    assert holder.block_tokens == 16
    assert holder.cached_blocks() == 3
    assert true_cache(FakeEngine(cache)) is cache
    assert true_cache(object()) is None

    sim = Simulation(opts(prefix="oracle"))
    gw = sim.gw
    assert gw.attach_oracle(EndpointId("e1"), FakeEngine(cache))
    gw.token_ids = lambda api, body: ids
    prefix = gw.telemetry.prefix
    keys = prefix.keys("m", ApiKind.COMPLETION, {"prompt": "x" * 10})
    assert keys is not None
    keys.with_token_ids(ids)
    assert prefix.lookup(keys, 64).get_tokens(EndpointId("e1")) == 32
    assert prefix.source(EndpointId("e1")) == "precise"


def test_the_engines_hit_counters_reach_the_index() -> None:
    class Counting:
        prefix_cache_hits = 300
        prefix_cache_queries = 1000

    assert hit_counters(Counting()) == (300.0, 1000.0)
    assert hit_counters(object()) is None
    sim = Simulation(opts())
    prefix = sim.gw.telemetry.prefix
    eid = EndpointId("e0")
    gauges = EngineGauges(running=0.0, waiting=0.0, kv_usage=0.0)
    sim.gw.scrape(eid, gauges, 1000.0, (0.0, 0.0))
    sim.gw.scrape(eid, gauges, 1000.0, (300.0, 1000.0))
    stats = prefix.stats(eid)
    assert stats is not None
    assert stats.engine_hit_rate == 0.3


def test_admission_hands_the_scheduler_the_cached_tokens_per_endpoint() -> None:
    """The front's admit phase (which the simulator runs as the daemon does) looks the prompt up once:
    a request resending a dispatched prompt is predicted cached where that one went."""
    sim = Simulation(opts())
    gw = sim.gw
    gw.bring_up(sim.opts.fleet)
    body = orjson.dumps({"model": "m", "prompt": "the repository context " * 200, "max_tokens": 4})
    first = RequestContext(id="r1", api=ApiKind.COMPLETION, arrival=0.0)
    req = gw.admit(first, ApiKind.COMPLETION, body, [])
    assert not req.cached
    assert first.prefix_keys is not None
    gw.dispatched(first, req, EndpointId("e1"))
    again = RequestContext(id="r2", api=ApiKind.COMPLETION, arrival=0.0)
    req2 = gw.admit(again, ApiKind.COMPLETION, body, [])
    assert set(req2.cached) == {EndpointId("e1")}
    assert req2.cached.get_tokens(EndpointId("e1")) > 0.9 * req2.prompt_tokens


def test_the_precise_source_follows_the_engines_kv_events() -> None:
    """`prefix = "precise"`: every engine's KV events reach berth's event store (the live subscriber's),
    which then holds what the engine's cache holds and answers the index for that endpoint."""
    fleet = tuple(
        EndpointSpec(models=("m",), profile="test-fast", seed=i, id=f"e{i}", prefix_cache=True)
        for i in range(3)
    )
    chat = POLICIES / "chat-and-batch.toml"
    sim = Simulation(opts(prefix="precise", fleet=fleet, workload="chat", policy=chat))
    sim.run()
    gw = sim.gw
    feed = gw._feed
    assert feed is not None
    feed.pump(sim.clock.now())
    prefix = gw.telemetry.prefix
    for ep in sim.endpoints:
        cache = ep.engine.prefix_cache
        assert cache is not None
        assert prefix.source(ep.id) == "precise"
        stats = prefix.stats(ep.id)
        assert stats is not None
        assert stats.cached_blocks == len(cache) > 0
