"""The fleet simulator with the gateway's lifecycle (simulated agents); the eviction benchmark's verdict."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gateway.core.types import EndpointId, ModelName
from gateway.lifecycle.instances import DeviceSpec, LifecycleSettings, ModelSpec, NodeSpec
from loadgen.bench.lifecycle.eviction import BenchConfig, Setting, bench
from loadgen.bench.lifecycle.eviction_report import judge
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim.lifecycle import LifecycleOptions
from loadgen.fleetsim.options import SimOptions
from loadgen.fleetsim.sim import Simulation, simulate

GIB = 1 << 30


def _opts(evictor: str, *, device_gib: float, seed: int = 0) -> SimOptions:
    models = tuple(ModelSpec(ModelName(f"m{i}"), 4 * GIB, 1, 3.0) for i in range(4))
    return SimOptions(
        policy=None,
        fleet=tuple(EndpointSpec(models=(m.name,), id=m.name, profile="test-fast") for m in models),
        workload="multi-model:uniform",
        rate=2.0,
        duration_s=60.0,
        seed=seed,
        models=tuple(m.name for m in models),
        lifecycle=LifecycleOptions(
            models=models,
            nodes=(NodeSpec("n1", (DeviceSpec("gpu0", int(device_gib * GIB)),)),),
            evictor=evictor,
            settings=LifecycleSettings(churn_guard_s=1.0, drain_timeout_s=5.0, load_deadline_s=120.0),
            stop_s=0.5,
        ),
    )


@pytest.mark.parametrize("evictor", ["lru", "cace"])
def test_models_load_on_demand_and_swap_under_a_memory_limit(evictor: str) -> None:
    rep = simulate(_opts(evictor, device_gib=9))  # room for two of the four models
    lc = rep.data["lifecycle"]
    assert lc["loads"] > 4  # every model loaded at least once, some again after an eviction
    assert lc["evictions"] > 0
    assert lc["load_failures"] == 0
    assert 0 < lc["hit_rate"] < 1
    assert rep.overall["count"] > 0
    assert rep.overall["errors"] == 0  # every request waited for its load and was served


def test_everything_resident_means_four_loads_and_no_eviction() -> None:
    lc = simulate(_opts("lru", device_gib=17)).data["lifecycle"]
    assert lc["loads"] == 4
    assert lc["evictions"] == 0


def test_same_seed_same_run() -> None:
    a = simulate(_opts("cace", device_gib=9, seed=3)).data["lifecycle"]
    b = simulate(_opts("cace", device_gib=9, seed=3)).data["lifecycle"]
    assert a == b


def _figs(evictions: int, ttft: float, hit: float = 0.5) -> dict[str, object]:
    keys = [
        "errors",
        "load_seconds",
        "ttft_completion_mean_ms",
        "ttft_completion_p99_ms",
        "ttft_reasoning_mean_ms",
        "ttft_reasoning_p99_ms",
        "e2e_mean_ms",
        "e2e_p99_ms",
    ]
    return {"evictions": evictions, "ttft_mean_ms": ttft, "hit_rate": hit, **dict.fromkeys(keys, 1.0)}


def _cis(worse: tuple[str, ...] = ()) -> dict[str, dict[str, dict[str, Any]]]:
    return {"cace": {k: {"ratio": 1.0, "ci95": [0.9, 1.1], "verdict": "worse"} for k in worse}}


def test_judge_needs_half_the_gap_on_two_patterns_and_nothing_worse() -> None:
    # LRU 100 evictions / 1000 ms, the bound 50 / 500: cace at 70 / 700 closes 60 % of both gaps
    good = {"lru": _figs(100, 1000.0), "cace": _figs(70, 700.0), "belady": _figs(50, 500.0)}
    meh = {"lru": _figs(100, 1000.0), "cace": _figs(90, 900.0), "belady": _figs(50, 500.0)}
    worse = {"lru": _figs(100, 1000.0), "cace": _figs(70, 700.0, hit=0.4), "belady": _figs(50, 500.0)}
    same = {p: _cis() for p in "abc"}
    assert judge({"a": good, "b": good, "c": meh}, same)["pass"]
    assert not judge({"a": good, "b": meh, "c": meh}, same)["pass"]
    v = judge({"a": good, "b": good, "c": worse}, {**same, "c": _cis(("hit_rate",))})
    assert not v["pass"]
    assert v["patterns"]["c"]["worse_on"] == ["hit_rate"]


def test_bench_writes_its_reports(tmp_path: Path) -> None:
    cfg = BenchConfig(
        out=tmp_path,
        patterns=("uniform",),
        seeds=(0, 1),
        rate=0.5,
        duration_s=30.0,
        cace_params={},
        variants=("cace-paper",),
    )
    doc = bench(cfg, log=lambda s: None, setting=Setting())
    assert list(doc["results"]["uniform"]) == ["lru", "cace", "cace-paper", "belady"]
    assert set(doc["cis"]["uniform"]) == {"cace", "cace-paper", "belady"}
    assert (tmp_path / "report.json").is_file()
    md = (tmp_path / "report.md").read_text()
    assert "| evictions |" in md
    assert (
        "| figure | lru | cace | cace-paper | belady | cace/lru [95 % CI] | cace-paper/lru [95 % CI] | "
        "belady/lru [95 % CI] |" in md
    )
    assert "(bound) belady meets the ratios" in md
    verdict = doc["verdict"]["patterns"]["uniform"]
    assert {"oracle_evictions_ratio", "oracle_ttft_mean_ratio", "gap_closed"} <= set(verdict)
    assert set(verdict["gap_closed"]) == {"cace", "cace-paper"}


def test_a_removed_engine_no_longer_feeds_the_precise_prefix_index() -> None:
    """With `prefix = "precise"`, the KV events of an engine the lifecycle stops are detached: the feed
    holds exactly the engines still running, and the index no longer takes the removed one's events."""
    base = _opts("lru", device_gib=9)  # room for two of the four models: instances stop and start
    fleet = tuple(dataclasses.replace(s, prefix_cache=True) for s in base.fleet)
    sim = Simulation(dataclasses.replace(base, fleet=fleet, prefix="precise"))
    removed: list[EndpointId] = []
    remove = sim._remove_engine

    def spy(eid: EndpointId) -> int:
        removed.append(eid)
        return remove(eid)

    sim._remove_engine = spy  # type: ignore[method-assign]
    rep = sim.run()
    assert rep.data["lifecycle"]["evictions"] > 0
    assert removed
    feed = sim.gw._feed
    assert feed is not None
    live = {ep.id for ep in sim.endpoints}
    assert feed.attached() == live
    prefix = sim.gw.telemetry.prefix
    for eid in set(removed) - live:
        assert prefix.source(eid) != "precise"
