"""The fleet simulator's engines cache prefixes like the HTTP simulator's: prompts that share a system
prompt hit on the engine that served it before, and the engines' true caches are readable per endpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.core.types import EndpointId
from loadgen.client import build_body
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.engine_sim.tokens import encode, render_chat
from loadgen.fleetsim import SimOptions
from loadgen.fleetsim import sim_client as fleetsim
from loadgen.fleetsim.sim import Simulation
from loadgen.prompts import prompt_text
from loadgen.workloads.base import CallSpec

POLICIES = Path(__file__).resolve().parents[2] / "policies"
SYSTEM = prompt_text(400, salt=99)


def shared_system_prompt(call: CallSpec, model: str, salt: int) -> bytes:
    """The loadgen body, with one system prompt shared by every request in front of its messages."""
    body = orjson.loads(build_body(call, model, salt))
    body["messages"] = [{"role": "system", "content": SYSTEM}, *body["messages"]]
    return orjson.dumps(body)


def run(caching: bool, monkeypatch: pytest.MonkeyPatch) -> Simulation:
    monkeypatch.setattr(fleetsim, "build_body", shared_system_prompt)
    specs = tuple(
        EndpointSpec(
            models=("m",), profile="test-fast", seed=i, id=f"e{i}", prefix_cache=caching, max_model_len=4000
        )
        for i in range(2)
    )
    opts = SimOptions(
        policy=POLICIES / "default.toml", fleet=specs, workload="sharegpt-like", rate=3.0, duration_s=10.0
    )
    sim = Simulation(opts)
    sim.report = sim.run()  # type: ignore[attr-defined]
    return sim


def test_a_shared_system_prompt_hits_in_the_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = run(True, monkeypatch)
    data: dict[str, Any] = sim.report.data  # type: ignore[attr-defined]
    stats = data["simulation"]["prefix_cache"]
    assert stats["hits_tokens"] > 0
    assert 0 < stats["hit_rate"] < 1
    assert all(r.ok for r in sim.requests)
    system_ids = encode(render_chat([{"role": "system", "content": SYSTEM}], add_generation_prompt=False))
    held = []
    for eid in ("e0", "e1"):
        cache = sim.engine_cache(EndpointId(eid))
        assert cache is not None
        held.append(cache.cached_prefix_tokens(cache.block_keys(system_ids)))
    full = (len(system_ids) // 16) * 16
    assert max(held) == full  # an engine that served a request holds the whole shared prompt's blocks


def test_without_caching_there_is_no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = run(False, monkeypatch)
    assert "prefix_cache" not in sim.report.data["simulation"]  # type: ignore[attr-defined]
    assert sim.engine_cache(EndpointId("e0")) is None


def test_the_chat_workload_hits_on_its_conversations() -> None:
    specs = tuple(EndpointSpec(models=("m",), profile="fleet-8b-long", seed=i, id=f"e{i}") for i in range(2))
    opts = SimOptions(
        policy=POLICIES / "default.toml", fleet=specs, workload="chat", rate=1.0, duration_s=20.0, seed=1
    )
    stats = Simulation(opts).run().data["simulation"]["prefix_cache"]
    assert stats["hits_tokens"] > 0
    assert 0.2 < stats["hit_rate"] < 1.0  # each turn resends the conversation and its system prompt
