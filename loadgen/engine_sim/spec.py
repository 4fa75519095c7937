"""`EndpointSpec`: everything that describes one simulated endpoint (CLI flags, fleet-file entries
and the Python API all build these), and its resolution against a named profile."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from loadgen.engine_sim.engine import EngineConfig, SchedulingPolicy
from loadgen.engine_sim.faults import Faults
from loadgen.engine_sim.flavors import FlavorName, get_flavor
from loadgen.engine_sim.latency import LatencyModel
from loadgen.engine_sim.lengths import LengthDist
from loadgen.engine_sim.profiles import DEFAULT_PROFILE, get_profile

KVEventsFormat = Literal["array", "map"]


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """One simulated endpoint. ``None`` fields take the profile's value; ``port=0`` picks a free port."""

    flavor: FlavorName = "vllm"
    models: tuple[str, ...] = ("sim-model",)
    host: str = "127.0.0.1"
    port: int = 0
    profile: str = DEFAULT_PROFILE
    latency: LatencyModel | None = None
    max_num_seqs: int | None = None
    kv_capacity_tokens: int | None = None
    max_model_len: int | None = None
    max_prefill_tokens: int | None = None
    load_time_s: float | None = None
    output_len: LengthDist | None = None
    speed: float = 1.0
    seed: int = 0
    scheduling_policy: SchedulingPolicy = "fcfs"
    faults: Faults = field(default_factory=Faults)
    # Automatic prefix caching (None: the profile's setting) and the KV block size in tokens.
    prefix_cache: bool | None = None
    block_size: int | None = None
    # KV events as vLLM publishes them (`kv_events` module): the PUB socket's endpoint, the replay
    # ROUTER's (None: no replay socket, vLLM's default), and the event encoding.
    kv_events: str | None = None
    kv_events_replay: str | None = None
    kv_events_format: KVEventsFormat = "map"
    # Like vLLM's --api-key: every engine route (not /sim/*) wants `Authorization: Bearer <api_key>`,
    # else 401. vLLM checks only /v1/*; the simulator checks /health, /metrics and /tokenize too, as an
    # engine behind an authenticating proxy would, so a test sees berth send the key everywhere.
    api_key: str | None = field(default=None, repr=False)
    # Gateway-side keys (the offline fleet simulator reads them; the engine simulator ignores them): the
    # endpoint's id in berth, its instance class, berth's concurrency cap (None: the gateway's default,
    # at most the max batch when `config` is set), the node it runs on, and its instance configuration.
    id: str | None = None
    instance_class: str = "mixed"
    cap: int | None = None
    node: str | None = None
    # The instance configuration it runs (models.toml [[models.configs]]): berth then knows its max
    # batch (max_num_seqs), as it does for an agent-started engine (the `sub-cluster` filter reads it).
    config: str | None = None

    def __post_init__(self) -> None:
        get_flavor(self.flavor)
        get_profile(self.profile)
        if not self.models:
            raise ValueError("an endpoint serves at least one model name")
        if self.speed <= 0:
            raise ValueError("speed must be > 0")
        if not 0 <= self.port <= 65535:
            raise ValueError("port must be within [0, 65535]")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError("scheduling_policy must be fcfs or priority")
        if self.instance_class not in ("interactive", "mixed", "batch"):
            raise ValueError("class must be interactive, mixed or batch")
        if self.cap is not None and self.cap < 1:
            raise ValueError("cap must be >= 1")
        if self.block_size is not None and self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.kv_events_format not in ("array", "map"):
            raise ValueError("kv_events_format must be array or map")
        for name in ("kv_events", "kv_events_replay"):
            value = getattr(self, name)
            if value is not None:
                tcp_port(value, name)
        if self.kv_events_replay is not None and self.kv_events is None:
            raise ValueError("kv_events_replay needs kv_events")
        if self.kv_events is not None and not self.resolve_prefix_cache():
            raise ValueError("kv_events needs the prefix cache (prefix_cache = true)")

    def resolve_prefix_cache(self) -> bool:
        return (
            self.prefix_cache if self.prefix_cache is not None else get_profile(self.profile).prefix_caching
        )

    def resolve(self) -> ResolvedSpec:
        prof = get_profile(self.profile)
        flavor = get_flavor(self.flavor)
        kv = self.kv_capacity_tokens if self.kv_capacity_tokens is not None else prof.kv_capacity_tokens
        max_model_len = self.max_model_len if self.max_model_len is not None else prof.max_model_len
        max_model_len = min(max_model_len, kv - 1)  # a request must fit the KV cache alone
        latency = self.latency if self.latency is not None else prof.latency
        engine = EngineConfig(
            latency=latency.scaled(self.speed),
            max_num_seqs=self.max_num_seqs if self.max_num_seqs is not None else prof.max_num_seqs,
            kv_capacity_tokens=kv,
            max_prefill_tokens=(
                self.max_prefill_tokens if self.max_prefill_tokens is not None else prof.max_prefill_tokens
            ),
            policy=self.scheduling_policy,
            higher_priority_first=flavor.higher_priority_first,
            prefix_caching=self.resolve_prefix_cache(),
            block_size=self.block_size if self.block_size is not None else prof.block_size,
        )
        load_time = self.load_time_s if self.load_time_s is not None else prof.load_time_s
        return ResolvedSpec(
            spec=self,
            engine=engine,
            unscaled_latency=latency,
            max_model_len=max_model_len,
            load_time_s=load_time / self.speed,
            output_len=self.output_len if self.output_len is not None else prof.output_len,
        )


@dataclass(frozen=True, slots=True)
class ResolvedSpec:
    spec: EndpointSpec
    engine: EngineConfig  # latency already divided by the speed factor
    unscaled_latency: LatencyModel
    max_model_len: int
    load_time_s: float  # wall seconds (already divided by the speed factor)
    output_len: LengthDist


def tcp_port(endpoint: str, what: str = "endpoint") -> int:
    """The port of a ``tcp://HOST:PORT`` endpoint (ValueError naming `what` otherwise)."""
    host, sep, port = endpoint.removeprefix("tcp://").rpartition(":")
    if not endpoint.startswith("tcp://") or not sep or not host or not port.isdigit():
        raise ValueError(f"{what} must be tcp://HOST:PORT, got {endpoint!r}")
    value = int(port)
    if not 0 <= value <= 65535:
        raise ValueError(f"{what}: port must be within [0, 65535] (0: a free port), got {value}")
    return value


def shifted_port(endpoint: str | None, offset: int) -> str | None:
    """`endpoint` with its port moved up by `offset` (replicas of one spec take consecutive ports)."""
    if endpoint is None or offset == 0:
        return endpoint
    port = tcp_port(endpoint)
    if port == 0:
        return endpoint
    return f"{endpoint[: endpoint.rindex(':')]}:{port + offset}"
