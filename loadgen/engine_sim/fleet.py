"""`SimFleet`: several simulated endpoints in one process and one event loop, and the TOML fleet file.

    async with SimFleet([EndpointSpec(models=("a",)), EndpointSpec(flavor="sglang", models=("b",))]) as fleet:
        fleet.urls                      # ["http://127.0.0.1:41234", ...] (free ports unless given)
        fleet.endpoint(1).set_faults(fail_fraction=0.5)

Fleet file (``berth-engine-sim --fleet FILE``); unknown keys are errors naming the file and key path::

    [defaults]                      # optional: applies to every endpoint below
    profile = "fleet-7b"
    speed = 1.0

    [[endpoints]]
    flavor = "vllm"                 # vllm | sglang
    models = ["codellama-7b"]       # served names (first one labels the metrics)
    count = 6                       # optional: this many replicas on consecutive ports
    port = 9001                     # optional: else the next port after --port, or a free one
    max_num_seqs = 16               # optional overrides of the profile
    kv_capacity_tokens = 16384
    max_model_len = 4096
    max_prefill_tokens = 8192
    load_time_s = 5.0
    output_len = "lognormal:200:0.8"
    scheduling_policy = "fcfs"      # fcfs | priority
    seed = 1
    latency = { k1 = 2e-4, c1 = 0.02, k2 = 2e-6, c2 = 1e-3, c3 = 0.025 }
    faults = { fail_fraction = 0.0 }
    prefix_cache = true             # automatic prefix caching (default: the profile's setting)
    block_size = 16                 # KV block size in tokens (default: the profile's, 16)
    kv_events = "tcp://127.0.0.1:5557"          # publish KV events (with count: each copy the next port)
    kv_events_replay = "tcp://127.0.0.1:6557"   # optional replay socket (with count: the next ports too)
    kv_events_format = "map"        # map (current vLLM) | array (older vLLM, SGLang)
    # gateway-side keys, read by the offline fleet simulator (`berth-loadgen sim`), ignored here:
    id = "a"                        # berth's endpoint id (with count: "a-0", "a-1", ...)
    class = "mixed"                 # interactive | mixed | batch
    cap = 16                        # berth's concurrency cap (default: the gateway's default cap)
    node = "gpu-01"
    config = "tp1-b16"              # its instance configuration: berth learns the max batch (max_num_seqs)
"""

from __future__ import annotations

import asyncio
import dataclasses
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from loadgen.engine_sim.faults import Faults
from loadgen.engine_sim.latency import LatencyModel
from loadgen.engine_sim.lengths import LengthDist
from loadgen.engine_sim.server import SimEndpoint
from loadgen.engine_sim.spec import EndpointSpec, shifted_port


class SimFleet:
    def __init__(
        self, specs: Sequence[EndpointSpec], *, on_die: Callable[[SimEndpoint], None] | None = None
    ) -> None:
        if not specs:
            raise ValueError("a fleet needs at least one endpoint")
        self._endpoints = [SimEndpoint(s, on_die=on_die) for s in specs]

    async def start(self) -> None:
        try:
            for ep in self._endpoints:  # sequentially: a port clash names the endpoint that failed
                await ep.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        await asyncio.gather(*(ep.stop() for ep in self._endpoints), return_exceptions=True)

    async def __aenter__(self) -> SimFleet:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def urls(self) -> list[str]:
        return [ep.url for ep in self._endpoints]

    @property
    def endpoints(self) -> list[SimEndpoint]:
        return list(self._endpoints)

    def endpoint(self, i: int) -> SimEndpoint:
        return self._endpoints[i]

    def __len__(self) -> int:
        return len(self._endpoints)


class FleetFileError(ValueError):
    pass


_SPEC_KEYS = {
    "flavor",
    "models",
    "profile",
    "max_num_seqs",
    "kv_capacity_tokens",
    "max_model_len",
    "max_prefill_tokens",
    "load_time_s",
    "output_len",
    "speed",
    "seed",
    "scheduling_policy",
    "latency",
    "faults",
    "class",
    "cap",
    "node",
    "config",
    "prefix_cache",
    "block_size",
    "kv_events",
    "kv_events_replay",
    "kv_events_format",
}
_ENDPOINT_KEYS = _SPEC_KEYS | {"port", "count", "id"}
_LATENCY_KEYS = ("k1", "c1", "k2", "c2", "c3")


def load_fleet_file(path: str | Path, *, host: str = "127.0.0.1", base_port: int = 0) -> list[EndpointSpec]:
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise FleetFileError(f"{path}: {e}") from None
    return parse_fleet(doc, source=str(path), host=host, base_port=base_port)


def parse_fleet(
    doc: Mapping[str, Any], *, source: str = "<fleet>", host: str = "127.0.0.1", base_port: int = 0
) -> list[EndpointSpec]:
    def fail(key_path: str, message: str) -> FleetFileError:
        return FleetFileError(f"{source}: {key_path}: {message}")

    for key in doc:
        if key not in ("defaults", "endpoints"):
            raise fail(key, "unknown key (expected 'defaults' and 'endpoints')")
    defaults = doc.get("defaults", {})
    if not isinstance(defaults, dict):
        raise fail("defaults", "must be a table")
    for key in defaults:
        if key not in _SPEC_KEYS:
            raise fail(f"defaults.{key}", "unknown key")
    entries = doc.get("endpoints")
    if not isinstance(entries, list) or not entries:
        raise fail("endpoints", "needs at least one [[endpoints]] table")
    specs: list[EndpointSpec] = []
    next_port = base_port
    for i, entry in enumerate(entries):
        where = f"endpoints[{i}]"
        if not isinstance(entry, dict):
            raise fail(where, "must be a table")
        for key in entry:
            if key not in _ENDPOINT_KEYS:
                raise fail(f"{where}.{key}", "unknown key")
        merged = {**defaults, **entry}
        count = merged.pop("count", 1)
        if not isinstance(count, int) or count < 1:
            raise fail(f"{where}.count", "must be a positive integer")
        port = merged.pop("port", None)
        base_id = merged.pop("id", None)
        if base_id is not None and (not isinstance(base_id, str) or not base_id):
            raise fail(f"{where}.id", "must be a non-empty string")
        fields = _spec_fields(merged, where, fail)
        for r in range(count):
            if port is not None:
                p = int(port) + r
            elif next_port:
                p = next_port
                next_port += 1
            else:
                p = 0
            seed = int(fields.get("seed", 0)) + len(specs)
            eid = None if base_id is None else (base_id if count == 1 else f"{base_id}-{r}")
            try:
                events: dict[str, str | None] = {
                    k: shifted_port(fields[k], r) for k in ("kv_events", "kv_events_replay") if k in fields
                }
                specs.append(EndpointSpec(host=host, port=p, id=eid, **{**fields, "seed": seed, **events}))
            except (ValueError, TypeError) as e:
                raise fail(where, str(e)) from None
    return specs


def _spec_fields(merged: dict[str, Any], where: str, fail: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for key, value in merged.items():
        if key == "models":
            names = [value] if isinstance(value, str) else value
            if not isinstance(names, list) or not all(isinstance(m, str) for m in names) or not names:
                raise fail(f"{where}.models", "must be a non-empty list of strings")
            fields["models"] = tuple(names)
        elif key == "latency":
            if not isinstance(value, dict):
                raise fail(f"{where}.latency", "must be a table with k1, c1, k2, c2, c3")
            for k in value:
                if k not in _LATENCY_KEYS:
                    raise fail(f"{where}.latency.{k}", "unknown key")
            missing = [k for k in _LATENCY_KEYS if k not in value]
            if missing:
                raise fail(f"{where}.latency", f"missing {', '.join(missing)}")
            fields["latency"] = LatencyModel(**{k: float(value[k]) for k in _LATENCY_KEYS})
        elif key == "output_len":
            try:
                fields["output_len"] = LengthDist.parse(str(value))
            except ValueError as e:
                raise fail(f"{where}.output_len", str(e)) from None
        elif key == "faults":
            if not isinstance(value, dict):
                raise fail(f"{where}.faults", "must be a table")
            try:
                fields["faults"] = Faults().patched(value)
            except ValueError as e:
                raise fail(f"{where}.faults", str(e)) from None
        elif key in ("speed", "load_time_s"):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise fail(f"{where}.{key}", "must be a number")
            fields[key] = float(value)
        elif key == "prefix_cache":
            if not isinstance(value, bool):
                raise fail(f"{where}.prefix_cache", "must be true or false")
            fields[key] = value
        elif key == "class":
            if not isinstance(value, str):
                raise fail(f"{where}.class", "must be a string")
            fields["instance_class"] = value
        elif key in (
            "max_num_seqs",
            "kv_capacity_tokens",
            "max_model_len",
            "max_prefill_tokens",
            "seed",
            "cap",
            "block_size",
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise fail(f"{where}.{key}", "must be an integer")
            fields[key] = value
        else:  # flavor, profile, scheduling_policy, kv_events, kv_events_replay, kv_events_format
            if not isinstance(value, str):
                raise fail(f"{where}.{key}", "must be a string")
            fields[key] = value
    return fields


def replicate(spec: EndpointSpec, count: int, *, base_port: int = 0) -> list[EndpointSpec]:
    """`count` copies of `spec` on consecutive ports from `base_port` (0: free ports), seeds seed+i."""
    return [
        dataclasses.replace(
            spec,
            port=(base_port + i if base_port else 0),
            seed=spec.seed + i,
            kv_events=shifted_port(spec.kv_events, i),
            kv_events_replay=shifted_port(spec.kv_events_replay, i),
        )
        for i in range(count)
    ]
