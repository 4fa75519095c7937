"""The model instances the gateway runs through node agents: one owner for every instance's state.

Sans-IO (imports only core and sched): events in (a request for a model with no resident endpoint, an
agent's answer, a dispatch or completion, a tick), actions out (start, stop, join or leave the endpoint
set, fail a model's load). The live manager (`gateway.lifecycle.manager`) carries the actions out with
agent subprocesses; the fleet simulator carries them out on a virtual clock; the unit tests assert them.

States: pending → starting → ready → draining → stopping → stopped, and failed from any of them.
  pending   planned on its devices, waiting for the victims it evicts to stop (holds the devices)
  starting  the agent's start is running (one load per device: nothing else is planned there)
  ready     serving; in the endpoint set
  draining  evicted: out of the endpoint set, in-flight requests finish (up to the drain timeout)
  stopping  the agent's stop is running
The decision to start, reuse or evict is taken here and only here, where the states live, so a request
never waits on a load that nobody will finish: every model with waiting requests either has an instance
in progress (which ends in ready or failed: the agent's answer, or the load deadline) or is in `wanted`,
which ends in a plan or, at the load deadline, in `LoadFailed` (llama-swap #946 wedged a model on a
request that saw "stopping" and waited for a load nobody started).

Scaling (`scale_out`, `scale_in`, `reclass`; decided by a `Scaler` through the autoscale runner,
`gateway.sched.autoscale`): a model may run many instances, each of an instance class (interactive,
mixed, batch) and an optional configuration. A scale-out places on free room only (it never evicts; the
runner has already clipped it to the free devices, and what does not fit now is dropped, counted by the
caller from the `StartInstance` actions returned); a scale-in drains a ready instance (it leaves the
endpoint set, its in-flight requests finish up to the drain timeout, then it stops with reason
`scaled_in`); a reclass changes a ready instance's class in place (`ReclassEndpoint`: the executor
re-registers its endpoint with the new class). Instances started on a cold request are `mixed`.

Eviction: when no node has room, the node's evictable instances (ready, no request in flight, idle for
`min_idle_s`, loaded at least `churn_guard_s` ago, not pinned) are ranked by the `Evictor` plugin and taken
highest first until the model fits; victims not needed for the fit are put back. Victims drain first.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gateway.core.types import InstanceClass, ModelName
from gateway.sched.plugins.autoscale.interface import InstanceConfig
from gateway.sched.plugins.eviction.interface import (
    EvictionCandidate,
    EvictionContext,
    Evictor,
    checked_score,
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


class Lifecycle:
    def __init__(
        self,
        *,
        models: Mapping[ModelName, ModelSpec],
        nodes: Sequence[NodeSpec],
        evictor: Evictor,
        settings: LifecycleSettings | None = None,
        demand: Callable[[], Demand] = Demand,
    ) -> None:
        self._models = dict(models)
        self._nodes = {n.name: n for n in nodes}
        self._evictor = evictor
        self.settings = settings or LifecycleSettings()
        self._demand = demand
        self._instances: dict[str, Instance] = {}
        self._wanted: dict[ModelName, float] = {}  # model -> when its first request found nothing serving it
        # Called with every eviction plan of the lifecycle's own evictor, before it is carried out.
        self.on_eviction: Callable[[EvictionDecision], None] | None = None
        # Memory refusals (`start_refused`): bytes per (node, device) the agent holds beyond what this
        # core counts (NVML measured more than an engine was admitted with), until an instance there
        # stops; when each refused model was first wanted (its load deadline), and its next try.
        self._short: dict[tuple[str, str], int] = {}
        self._load_since: dict[ModelName, float] = {}
        self._retry_at: dict[ModelName, float] = {}
        self._seq = itertools.count(1)

    # ----------------------------------------------------------------- views
    @property
    def evictor(self) -> Evictor:
        return self._evictor

    def instances(self) -> list[Instance]:
        return list(self._instances.values())

    def get(self, iid: str) -> Instance | None:
        return self._instances.get(iid)

    def wanted(self) -> dict[ModelName, float]:
        return dict(self._wanted)

    def nodes(self) -> list[NodeSpec]:
        return list(self._nodes.values())

    def models(self) -> dict[ModelName, ModelSpec]:
        return dict(self._models)

    def loadable(self, model: ModelName) -> bool:
        return model in self._models

    def ready_instance(self, model: ModelName) -> Instance | None:
        for inst in self._instances.values():
            if inst.model == model and inst.state is InstanceState.READY:
                return inst
        return None

    def set_nodes(self, nodes: Sequence[NodeSpec]) -> None:
        """The nodes' devices as their agents reported them (capacity = total − headroom)."""
        self._nodes = {n.name: n for n in nodes}

    # ----------------------------------------------------------------- events
    def request(self, model: ModelName, now: float) -> list[Action]:
        """A request for `model` found no ready endpoint: start one, or join the load in progress."""
        if model not in self._models:
            return []
        if not any(i.model == model and i.state in SERVING for i in self._instances.values()):
            self._wanted.setdefault(model, now)
        return self._plan(now)

    def dispatched(self, iid: str, now: float) -> None:
        inst = self._instances.get(iid)
        if inst is not None:
            inst.inflight += 1
            inst.last_used = now

    def touch(self, iid: str, now: float) -> None:
        """A request was dispatched there (recency only; in-flight counts come from `observe_inflight`)."""
        inst = self._instances.get(iid)
        if inst is not None:
            inst.last_used = max(inst.last_used, now)

    def observe_inflight(self, iid: str, inflight: int, now: float) -> list[Action]:
        """The requests running there now, as the scheduler counts them: a draining instance whose last
        request ended is stopped."""
        inst = self._instances.get(iid)
        if inst is None:
            return []
        if inflight > 0:
            inst.last_used = max(inst.last_used, now)
        inst.inflight = inflight
        if inst.state is InstanceState.DRAINING and inflight == 0:
            return [self._stop(inst, now, inst.stop_reason)]
        return []

    def finished(self, iid: str, now: float) -> list[Action]:
        inst = self._instances.get(iid)
        if inst is None:
            return []
        inst.inflight = max(0, inst.inflight - 1)
        inst.last_used = max(inst.last_used, now)
        if inst.state is InstanceState.DRAINING and inst.inflight == 0:
            return [self._stop(inst, now, inst.stop_reason)]
        return []

    def started(self, iid: str, *, url: str, load_s: float | None, now: float) -> list[Action]:
        """The agent reports the instance ready."""
        inst = self._instances.get(iid)
        if inst is None or inst.state is not InstanceState.STARTING:
            return []
        self._set(inst, InstanceState.READY, now)
        inst.url = url
        inst.ready_at = now
        inst.last_used = now
        if load_s is not None:
            inst.load_s = load_s
        self._wanted.pop(inst.model, None)
        return [JoinEndpoint(iid, inst.instance_class), *self._plan(now)]

    def start_failed(self, iid: str, reason: str, now: float) -> list[Action]:
        """The agent's start failed (or timed out): the model's waiting requests fail with `reason`."""
        inst = self._instances.get(iid)
        if inst is None or inst.state not in LOADING:
            return []
        self._set(inst, InstanceState.FAILED, now)
        inst.reason = reason
        self._wanted.pop(inst.model, None)
        return [*self._load_failed(inst, reason), *self._plan(now)]

    def start_refused(
        self, iid: str, reason: str, now: float, *, agent_free: Mapping[str, int] | None = None
    ) -> list[Action]:
        """The agent refused the start for memory (`insufficient_memory`, `device_busy`,
        `memory_not_released`): its ledger, which counts what NVML measures, found less room than this
        plan assumed. The model is planned again instead of failing its requests: on other devices, with
        more evictions, or once room appears; its first request's load deadline still bounds the wait.
        `agent_free`: the free bytes the agent reported per device; what this core counted as free
        beyond that is held back on the device until an instance there stops (the drift is learnt, so
        the next plan differs from the refused one)."""
        inst = self._instances.get(iid)
        if inst is None or inst.state not in LOADING:
            return []
        self._set(inst, InstanceState.FAILED, now)
        inst.reason = reason
        node = self._nodes.get(inst.node)
        if node is not None and agent_free:
            insts = [i for i in self._instances.values() if i.node == node.name and i.state in HOLDS_MEMORY]
            for d in node.devices:
                if d.name not in agent_free:
                    continue
                ours = d.capacity_bytes - sum(i.memory_bytes for i in insts if d.name in i.devices)
                self._short[(node.name, d.name)] = max(0, ours - agent_free[d.name])
        if not any(i.model == inst.model and i.state in SERVING for i in self._instances.values()):
            self._wanted.setdefault(inst.model, self._load_since.get(inst.model, inst.created_at))
        self._retry_at[inst.model] = now + REFUSAL_RETRY_S
        return self._plan(now)

    def stopped(self, iid: str, now: float) -> list[Action]:
        inst = self._instances.get(iid)
        if inst is None or inst.state in (InstanceState.STOPPED, InstanceState.FAILED):
            return []
        self._set(inst, InstanceState.STOPPED, now)
        self._forget_short(inst)
        return self._plan(now)

    def stop_failed(self, iid: str, reason: str, now: float) -> list[Action]:
        """The agent could not stop it. It is marked failed and no longer counted (the agent's ledger
        still refuses a start that does not fit, and the next `list` shows what is really resident)."""
        inst = self._instances.get(iid)
        if inst is None:
            return []
        self._set(inst, InstanceState.FAILED, now)
        inst.reason = reason
        self._forget_short(inst)
        return self._plan(now)

    def crashed(self, iid: str, reason: str, now: float) -> list[Action]:
        """The engine died (the agent's list, or health): out of the endpoint set, its record stopped."""
        inst = self._instances.get(iid)
        if inst is None or inst.state not in (InstanceState.READY, InstanceState.DRAINING):
            return []
        self._set(inst, InstanceState.STOPPING, now)
        inst.reason = reason
        return [LeaveEndpoint(iid), StopInstance(iid, inst.node, "crashed")]

    def adopt(
        self,
        *,
        iid: str,
        model: ModelName,
        node: str,
        devices: Sequence[str],
        memory_bytes: int,
        url: str,
        load_s: float | None,
        now: float,
    ) -> list[Action]:
        """A ready engine the agent already runs (after a gateway or agent restart)."""
        if iid in self._instances and self._instances[iid].state in HOLDS_MEMORY:
            return []
        spec = self._models.get(model)
        inst = Instance(
            id=iid,
            model=model,
            node=node,
            devices=tuple(devices),
            memory_bytes=memory_bytes,
            state=InstanceState.READY,
            created_at=now,
            load_s=load_s if load_s is not None else (spec.load_s if spec else 0.0),
            ready_at=now,
            last_used=now,
            url=url,
            changed_at=now,
        )
        self._instances[iid] = inst
        self._wanted.pop(model, None)
        return [JoinEndpoint(iid, inst.instance_class)]

    def scale_out(
        self,
        model: ModelName,
        now: float,
        *,
        instance_class: InstanceClass = InstanceClass.MIXED,
        config: str | None = None,
        count: int = 1,
        reason: str = "scale_out",
    ) -> list[Action]:
        """Start up to `count` more instances of `model` on free room (never by eviction; one load per
        device). Returns a `StartInstance` per instance placed: fewer than `count` when room ran out.
        An unknown model or configuration places nothing."""
        spec = self._models.get(model)
        if spec is None:
            return []
        devices = spec.devices_of(config)
        if devices is None:
            return []
        sized = dataclasses.replace(spec, devices=devices)
        out: list[Action] = []
        for _ in range(max(0, count)):
            best = self._best_fit(sized)
            if best is None:
                break
            inst = self._add(sized, best[0].name, best[1], InstanceState.STARTING, now)
            inst.instance_class = instance_class
            inst.config = config
            out.append(StartInstance(inst.id, model, inst.node, inst.devices, instance_class, config, reason))
        if out:
            self._wanted.pop(model, None)
        return out

    def scale_in(self, iid: str, now: float, *, reason: str = "scaled_in") -> list[Action]:
        """Retire a ready instance by draining it: it leaves the endpoint set now and stops (reason
        `scaled_in`) once its last request ends, or at the drain timeout. Anything not ready: nothing."""
        inst = self._instances.get(iid)
        if inst is None or inst.state is not InstanceState.READY:
            return []
        self._set(inst, InstanceState.DRAINING, now)
        inst.drain_deadline = now + self.settings.drain_timeout_s
        inst.reason = reason
        inst.stop_reason = "scaled_in"
        out: list[Action] = [LeaveEndpoint(iid)]
        if inst.inflight == 0:
            out.append(self._stop(inst, now, "scaled_in"))
        return out

    def reclass(self, iid: str, instance_class: InstanceClass, now: float) -> list[Action]:
        """Change a ready instance's class in place; anything not ready, or of that class: nothing."""
        inst = self._instances.get(iid)
        if inst is None or inst.state is not InstanceState.READY or inst.instance_class == instance_class:
            return []
        inst.instance_class = instance_class
        inst.changed_at = now
        return [ReclassEndpoint(iid, instance_class)]

    def tick(self, now: float) -> list[Action]:
        """Drain timeouts, load deadlines, and another planning round (room may have appeared)."""
        out: list[Action] = []
        s = self.settings
        for inst in list(self._instances.values()):
            if (
                inst.state is InstanceState.DRAINING
                and inst.drain_deadline is not None
                and now >= inst.drain_deadline
            ):
                out.append(self._stop(inst, now, inst.stop_reason))
            elif inst.state is InstanceState.STARTING and now - inst.changed_at > s.load_deadline_s:
                # The agent's answer never came (its call has a timeout of its own): fail the load here
                # so no request waits on it, and stop whatever it left.
                reason = f"no answer from the agent within the load deadline ({s.load_deadline_s:g}s)"
                self._set(inst, InstanceState.STOPPING, now)
                inst.reason = reason
                self._wanted.pop(inst.model, None)
                out += [*self._load_failed(inst, reason), StopInstance(inst.id, inst.node, "load_deadline")]
        for model, since in list(self._wanted.items()):
            if now - since > s.load_deadline_s:
                del self._wanted[model]
                out.append(
                    LoadFailed(
                        model, f"no node had room for it within the load deadline ({s.load_deadline_s:g}s)"
                    )
                )
        return out + self._plan(now)

    # ----------------------------------------------------------------- planning
    def _load_failed(self, inst: Instance, reason: str) -> list[Action]:
        """A failed load fails the model's waiting requests only when nothing else serves or will serve
        the model (a scale-out's failed start leaves the queue to the instances that run)."""
        if any(
            i.model == inst.model and i.id != inst.id and i.state in SERVING for i in self._instances.values()
        ):
            return []
        return [LoadFailed(inst.model, reason)]

    def _set(self, inst: Instance, state: InstanceState, now: float) -> None:
        inst.state = state
        inst.changed_at = now

    def _stop(self, inst: Instance, now: float, reason: str) -> StopInstance:
        self._set(inst, InstanceState.STOPPING, now)
        return StopInstance(inst.id, inst.node, reason, self._evictor.name if reason == "evicted" else None)

    def _new_id(self, model: ModelName) -> str:
        while True:
            iid = f"{model}-{next(self._seq)}"
            if iid not in self._instances:
                return iid

    def _plan(self, now: float) -> list[Action]:
        out: list[Action] = []
        # Pending instances whose victims are gone start now.
        for inst in list(self._instances.values()):
            if inst.state is InstanceState.PENDING and all(
                self._instances[v].state in (InstanceState.STOPPED, InstanceState.FAILED)
                for v in inst.victims
            ):
                self._set(inst, InstanceState.STARTING, now)
                out.append(StartInstance(inst.id, inst.model, inst.node, inst.devices))
        for model in sorted(self._wanted, key=lambda m: (self._wanted[m], m)):
            if any(i.model == model and i.state in SERVING for i in self._instances.values()):
                del self._wanted[model]  # joined a load in progress
                continue
            if self._retry_at.get(model, now) > now:
                continue  # its start was just refused for memory
            self._load_since[model] = self._wanted[model]
            out += self._place(self._models[model], now)
        return out

    def _eligible_nodes(self, spec: ModelSpec, *, as_reported: bool = False) -> list[NodeSpec]:
        """The nodes that may host `spec`, with their devices' capacity less what the agents were found
        to hold beyond this core's count (`as_reported`: as their agents reported them)."""
        nodes = [n for n in self._nodes.values() if n.models is None or spec.name in n.models]
        if as_reported or not self._short:
            return nodes
        return [
            dataclasses.replace(
                n,
                devices=tuple(
                    dataclasses.replace(
                        d, capacity_bytes=max(0, d.capacity_bytes - self._short.get((n.name, d.name), 0))
                    )
                    for d in n.devices
                ),
            )
            for n in nodes
        ]

    def _forget_short(self, inst: Instance) -> None:
        """An instance left its devices: what the agent holds there is measured afresh at the next refusal."""
        for d in inst.devices:
            self._short.pop((inst.node, d), None)

    def _never_fits(self, spec: ModelSpec) -> str | None:
        if not self._nodes:
            return None  # no agent has answered yet: wait for one (the load deadline bounds it)
        nodes = self._eligible_nodes(spec, as_reported=True)
        if not nodes:
            return f"no node may host model '{spec.name}'"
        for n in nodes:
            if sum(1 for d in n.devices if d.capacity_bytes >= spec.memory_bytes) >= spec.devices:
                return None
        return (
            f"model '{spec.name}' needs {spec.devices} device(s) with {spec.memory_bytes} bytes each; "
            "no node has that much even when empty"
        )

    def _place(self, spec: ModelSpec, now: float) -> list[Action]:
        never = self._never_fits(spec)
        if never is not None:
            del self._wanted[spec.name]
            return [LoadFailed(spec.name, never)]
        best = self._best_fit(spec)
        if best is not None:
            del self._wanted[spec.name]
            inst = self._add(spec, best[0].name, best[1], InstanceState.STARTING, now)
            return [StartInstance(inst.id, spec.name, inst.node, inst.devices)]
        plan = self._eviction_plan(spec, now)
        if plan is None:
            return []  # wait: loads in progress, busy or freshly loaded instances; the deadline bounds it
        node, devs, victims = plan
        del self._wanted[spec.name]
        out: list[Action] = []
        for v in victims:
            victim = self._instances[v]
            self._set(victim, InstanceState.DRAINING, now)
            victim.drain_deadline = now + self.settings.drain_timeout_s
            victim.reason = f"evicted for '{spec.name}'"
            out.append(LeaveEndpoint(v))
            if victim.inflight == 0:
                out.append(self._stop(victim, now, "evicted"))
        inst = self._add(spec, node.name, devs, InstanceState.PENDING, now)
        inst.victims = frozenset(victims)
        return out

    def _best_fit(self, spec: ModelSpec) -> tuple[NodeSpec, tuple[str, ...]] | None:
        """The fullest node (and its devices) where `spec` fits now without evicting, or None."""
        insts = list(self._instances.values())
        best: tuple[NodeSpec, tuple[str, ...]] | None = None
        best_free = 0
        for node in self._eligible_nodes(spec):
            devs = fit_devices(node, insts, spec)
            if devs is None:
                continue
            free = self._free_bytes(node, insts)
            if best is None or free < best_free:  # the fullest node that fits: keep big holes for big models
                best, best_free = (node, devs), free
        return best

    def free_devices(self) -> int:
        """Devices no instance holds or reserves, over every node."""
        taken = {(i.node, d) for i in self._instances.values() if i.state in HOLDS_MEMORY for d in i.devices}
        return sum(1 for n in self._nodes.values() for d in n.devices if (n.name, d.name) not in taken)

    def _free_bytes(self, node: NodeSpec, insts: Sequence[Instance]) -> int:
        used = sum(
            i.memory_bytes * len(i.devices) for i in insts if i.node == node.name and i.state in HOLDS_MEMORY
        )
        return sum(d.capacity_bytes for d in node.devices) - used

    def _add(
        self, spec: ModelSpec, node: str, devs: tuple[str, ...], state: InstanceState, now: float
    ) -> Instance:
        inst = Instance(
            id=self._new_id(spec.name),
            model=spec.name,
            node=node,
            devices=devs,
            memory_bytes=spec.memory_bytes,
            state=state,
            created_at=now,
            load_s=spec.load_s,
            last_used=now,
            changed_at=now,
        )
        self._instances[inst.id] = inst
        return inst

    def evictable(self, inst: Instance, now: float) -> bool:
        """May `inst` be chosen as a victim now? (The runner's rule; no evictor can override it.)"""
        s = self.settings
        return (
            inst.state is InstanceState.READY
            and inst.inflight == 0
            and inst.model not in s.pinned
            and now - inst.last_used >= s.min_idle_s
            and inst.ready_at is not None
            and now - inst.ready_at >= s.churn_guard_s
        )

    def _eviction_plan(
        self, spec: ModelSpec, now: float, evictor: Evictor | None = None
    ) -> tuple[NodeSpec, tuple[str, ...], tuple[str, ...]] | None:
        """The node, devices and victims (fewest over the nodes) that make room for `spec`, ranked by
        `evictor` (default: the lifecycle's own, whose plans are reported to `on_eviction`)."""
        ev = evictor or self._evictor
        demand = self._demand()
        window = max(1, self.settings.lookahead)
        ctx = EvictionContext(now=now, window=window)
        insts = list(self._instances.values())
        best: tuple[NodeSpec, tuple[str, ...], tuple[str, ...]] | None = None
        seen: tuple[EvictionCandidate, ...] = ()
        for node in self._eligible_nodes(spec):
            cands = {
                i.id: EvictionCandidate(
                    instance=i.id,
                    model=i.model,
                    last_used=i.last_used,
                    loaded_at=i.ready_at or i.created_at,
                    load_s=i.load_s,
                    frees_bytes=i.memory_bytes,
                    first_pending=demand.next_position(i.model, window),
                    expected_output_tokens=demand.expected_output.get(i.model),
                    queued=i.model in demand.window[:window],
                )
                for i in insts
                if i.node == node.name and self.evictable(i, now)
            }
            ranked = sorted(
                cands.values(), key=lambda c: (-checked_score(ev, c, ctx), c.last_used, c.instance)
            )
            chosen: list[str] = []
            devs: tuple[str, ...] | None = None
            for victim in ranked:
                chosen.append(victim.instance)
                devs = fit_devices(node, insts, spec, without=frozenset(chosen))
                if devs is not None:
                    break
            if devs is None:
                continue
            # Put back victims the fit does not need (lowest-ranked first).
            for v in reversed(chosen[:-1]):
                rest = frozenset(c for c in chosen if c != v)
                if fit_devices(node, insts, spec, without=rest) is not None:
                    chosen.remove(v)
            devs = fit_devices(node, insts, spec, without=frozenset(chosen))
            assert devs is not None
            if best is None or len(chosen) < len(best[2]):
                best = (node, devs, tuple(chosen))
                seen = tuple(cands.values())
        if best is not None and evictor is None and self.on_eviction is not None:
            self.on_eviction(EvictionDecision(now, spec.name, best[0].name, seen, best[2], ctx, demand))
        return best

    def eviction_victims(self, model: ModelName, now: float, evictor: Evictor) -> tuple[str, ...] | None:
        """The victims `evictor` would pick to make room for `model` now (nothing changes), or None when
        no plan would make room: what-if comparisons of evictors on the same state."""
        spec = self._models.get(model)
        if spec is None:
            return None
        plan = self._eviction_plan(spec, now, evictor)
        return None if plan is None else plan[2]
