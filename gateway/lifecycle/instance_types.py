"""The vocabulary of the instance state machine (`gateway.lifecycle.instances`): the states, the models,
devices and nodes it plans on, an instance's record, the actions it returns, and the device fit.
Sans-IO, like the machine itself (imports only core and sched)."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gateway.core.types import InstanceClass, ModelName
from gateway.sched.plugins.autoscale.interface import InstanceConfig
from gateway.sched.plugins.eviction.interface import (
    EvictionCandidate,
    EvictionContext,
)


class InstanceState(enum.StrEnum):
    PENDING = "pending"
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


#: States whose instance holds (or has reserved) memory on its devices.
HOLDS_MEMORY: frozenset[InstanceState] = frozenset(
    {
        InstanceState.PENDING,
        InstanceState.STARTING,
        InstanceState.READY,
        InstanceState.DRAINING,
        InstanceState.STOPPING,
    }
)
#: States whose engine may be using device memory now (the ledger's invariant is over these).
RESIDENT: frozenset[InstanceState] = HOLDS_MEMORY - {InstanceState.PENDING}
#: States that will be (or are) serving the model: a request for it joins them.
SERVING: frozenset[InstanceState] = frozenset(
    {InstanceState.PENDING, InstanceState.STARTING, InstanceState.READY}
)
#: States in which a device is taken by a load (one load per device at a time).
LOADING: frozenset[InstanceState] = frozenset({InstanceState.PENDING, InstanceState.STARTING})
#: After an agent refused a start for memory, the model is planned again no sooner than this.
REFUSAL_RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What the registry (models.toml) says of a model."""

    name: ModelName
    memory_bytes: int  # per device
    devices: int = 1  # tensor parallel
    load_s: float = 30.0  # expected load time until one is measured
    # The instance configurations a scale-out may ask for (models.toml); each overrides `devices` (the
    # memory per device stays `memory_bytes`). Empty: the one default configuration.
    configs: tuple[InstanceConfig, ...] = ()
    # Which of `configs` a start without one runs (the agent's default_config, else its first); None:
    # the model as written (no configurations).
    default_config: str | None = None

    def devices_of(self, config: str | None) -> int | None:
        """Devices an instance of configuration `config` takes (None: no such configuration)."""
        if config is None:
            return self.devices
        return next((c.devices for c in self.configs if c.name == config), None)


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    name: str
    capacity_bytes: int  # total − headroom


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    devices: tuple[DeviceSpec, ...]
    models: frozenset[ModelName] | None = None  # None: any registered model


@dataclass(frozen=True, slots=True)
class LifecycleSettings:
    load_deadline_s: float = 300.0  # wanted → ready, or the model's waiting requests fail
    churn_guard_s: float = 60.0  # never evict an instance loaded less than this ago
    min_idle_s: float = 0.0  # never evict an instance used less than this ago
    drain_timeout_s: float = 30.0  # in-flight requests of a victim finish up to this
    pinned: frozenset[ModelName] = frozenset()  # never evicted
    lookahead: int = 32  # queue look-ahead window for the evictor's demand term


@dataclass(frozen=True, slots=True)
class Demand:
    """What the gateway knows about the future: the models of the next queued requests (arrival order,
    at most the look-ahead window), each model's share of the recent requests (a sliding window over
    dispatches: `gateway.lifecycle.demand`), and the expected output tokens of each model's traffic."""

    window: tuple[ModelName, ...] = ()
    expected_output: Mapping[ModelName, float] = field(default_factory=dict)
    recent_share: Mapping[ModelName, float] = field(default_factory=dict)

    def next_position(self, model: ModelName, window: int) -> float | None:
        """Expected 0-based position of `model`'s next request among the coming ones: its first queued
        request's place in the window; else, behind the queued ones, the requests expected before its
        next one if traffic keeps its recent shares (1/share − 1: the mean of a geometric count); None
        when neither tells (not queued, not requested recently).

        Requests for a resident model are placed at once, so the queue alone holds almost only cold
        models' requests and would say nothing about the candidates for eviction."""
        queued = self.window[:window]
        if model in queued:
            return float(queued.index(model))
        share = self.recent_share.get(model, 0.0)
        if share <= 0.0:
            return None
        return len(queued) + 1.0 / share - 1.0


@dataclass(frozen=True, slots=True)
class EvictionDecision:
    """An eviction plan about to be carried out (`Lifecycle.on_eviction`: benchmarks, diagnostics)."""

    now: float
    model: ModelName  # the model the room is for
    node: str
    candidates: tuple[EvictionCandidate, ...]  # the node's evictable instances, as the evictor saw them
    victims: tuple[str, ...]
    context: EvictionContext
    demand: Demand  # what the plan knew of the future


@dataclass(slots=True)
class Instance:
    id: str
    model: ModelName
    node: str
    devices: tuple[str, ...]
    memory_bytes: int  # per device
    state: InstanceState
    created_at: float
    load_s: float  # measured once ready; the registry's expectation before
    ready_at: float | None = None
    last_used: float = 0.0
    inflight: int = 0
    url: str | None = None
    reason: str | None = None
    victims: frozenset[str] = frozenset()  # pending: the instances that must stop first
    drain_deadline: float | None = None
    changed_at: float = 0.0
    instance_class: InstanceClass = InstanceClass.MIXED
    config: str | None = None  # its configuration (ModelSpec.configs); None: the default
    stop_reason: str = "evicted"  # why a draining instance will be stopped ("evicted" | "scaled_in")


# ----------------------------------------------------------------------------- actions
@dataclass(frozen=True, slots=True)
class StartInstance:
    instance: str
    model: ModelName
    node: str
    devices: tuple[str, ...]
    instance_class: InstanceClass = InstanceClass.MIXED
    config: str | None = None  # the configuration for the agent to start; None: the model's default
    reason: str = "cold_start"  # "cold_start" | the scaler's reason


@dataclass(frozen=True, slots=True)
class StopInstance:
    instance: str
    node: str
    reason: str  # "evicted" | "load_deadline" | "crashed" | ...
    evictor: str | None = None  # set when evicted


@dataclass(frozen=True, slots=True)
class JoinEndpoint:
    instance: str
    instance_class: InstanceClass = InstanceClass.MIXED  # the class its endpoint is registered with


@dataclass(frozen=True, slots=True)
class ReclassEndpoint:
    """Re-register the (ready, joined) instance's endpoint with a new class."""

    instance: str
    instance_class: InstanceClass


@dataclass(frozen=True, slots=True)
class LeaveEndpoint:
    instance: str


@dataclass(frozen=True, slots=True)
class LoadFailed:
    model: ModelName
    reason: str


Action = StartInstance | StopInstance | JoinEndpoint | LeaveEndpoint | LoadFailed | ReclassEndpoint


def fit_devices(
    node: NodeSpec, instances: Iterable[Instance], model: ModelSpec, *, without: frozenset[str] = frozenset()
) -> tuple[str, ...] | None:
    """The devices `model` would load on now (best fit: the fullest devices that still have room), or
    None. Instances in `without` are counted as gone; a device with a load in progress is never used."""
    used = {d.name: 0 for d in node.devices}
    busy: set[str] = set()
    for inst in instances:
        if inst.node != node.name or inst.id in without or inst.state not in HOLDS_MEMORY:
            continue
        for d in inst.devices:
            if d in used:
                used[d] += inst.memory_bytes
                if inst.state in LOADING:
                    busy.add(d)
    free = [
        (d.capacity_bytes - used[d.name], d.name)
        for d in node.devices
        if d.name not in busy and d.capacity_bytes - used[d.name] >= model.memory_bytes
    ]
    if len(free) < model.devices:
        return None
    free.sort()
    return tuple(sorted(name for _, name in free[: model.devices]))
