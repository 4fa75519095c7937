"""How prefix caching and KV events are configured: profiles, CLI flags, fleet-file keys (each copy of a
`count` takes the next event ports), strict errors naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from loadgen.engine_sim.cli import build_parser, specs_from_args
from loadgen.engine_sim.fleet import FleetFileError, parse_fleet
from loadgen.engine_sim.profiles import PROFILES
from loadgen.engine_sim.spec import EndpointSpec


def test_profiles_state_caching_and_block_size() -> None:
    assert not PROFILES["fleet-7b"].prefix_caching  # the fidelity benchmark's engines are unchanged
    for name in ("h100-llama3-8b", "h100x4-llama3-70b", "fleet-8b-long"):
        prof = PROFILES[name]
        assert prof.prefix_caching
        assert prof.block_size == 16
        assert prof.max_model_len == 131_072
        assert prof.kv_capacity_tokens > prof.max_model_len
    engine = EndpointSpec(profile="h100-llama3-8b").resolve().engine
    assert engine.prefix_caching
    assert engine.block_size == 16
    assert not EndpointSpec(profile="h100-llama3-8b", prefix_cache=False).resolve().engine.prefix_caching


def test_cli_flags_with_count_take_consecutive_event_ports() -> None:
    args = build_parser().parse_args(
        [
            "--count", "3", "--port", "9001", "--profile", "test-fast", "--prefix-cache", "--block-size", "8",
            "--kv-events", "tcp://127.0.0.1:5557", "--kv-events-replay", "tcp://127.0.0.1:6557",
            "--kv-events-format", "array",
        ]
    )  # fmt: skip
    specs = specs_from_args(args)
    assert [s.kv_events for s in specs] == [f"tcp://127.0.0.1:{p}" for p in (5557, 5558, 5559)]
    assert [s.kv_events_replay for s in specs] == [f"tcp://127.0.0.1:{p}" for p in (6557, 6558, 6559)]
    engine = specs[0].resolve().engine
    assert engine.prefix_caching
    assert engine.block_size == 8
    assert {s.kv_events_format for s in specs} == {"array"}
    off = specs_from_args(build_parser().parse_args(["--profile", "h100-llama3-8b", "--no-prefix-cache"]))
    assert not off[0].resolve().engine.prefix_caching


def test_fleet_file_keys() -> None:
    doc: dict[str, Any] = {
        "defaults": {"profile": "test-fast", "prefix_cache": True, "block_size": 32},
        "endpoints": [{"count": 2, "kv_events": "tcp://*:5557", "kv_events_format": "map"}, {}],
    }
    a, b, c = parse_fleet(doc)
    assert (a.kv_events, b.kv_events, c.kv_events) == ("tcp://*:5557", "tcp://*:5558", None)
    assert a.resolve().engine.block_size == 32
    assert c.resolve().engine.prefix_caching


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"prefix_cache": "yes"}, r"f\.toml: endpoints\[0\]\.prefix_cache: must be true or false"),
        ({"block_size": 0}, "block_size must be >= 1"),
        ({"kv_events": "tcp://127.0.0.1:5557"}, "kv_events needs the prefix cache"),
        ({"prefix_cache": True, "kv_events": "udp://x:1"}, "kv_events must be tcp://HOST:PORT"),
        ({"prefix_cache": True, "kv_events_format": "json"}, "kv_events_format must be array or map"),
        ({"prefix_cache": True, "kv_events_replay": "tcp://h:1"}, "kv_events_replay needs kv_events"),
    ],
    ids=["bool", "block-size", "needs-cache", "tcp-only", "format", "replay-alone"],
)
def test_fleet_file_errors_name_the_key(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(FleetFileError, match=message):
        parse_fleet({"endpoints": [{"profile": "test-fast", **entry}]}, source="f.toml")
