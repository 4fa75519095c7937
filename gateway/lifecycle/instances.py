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
import itertools
from collections.abc import Callable, Mapping, Sequence

from gateway.core.types import InstanceClass, ModelName
from gateway.lifecycle.instance_planning import DevicePlanner
from gateway.lifecycle.instance_types import (
    HOLDS_MEMORY,
    LOADING,
    REFUSAL_RETRY_S,
    RESIDENT,
    SERVING,
    Action,
    Demand,
    DeviceSpec,
    EvictionDecision,
    Instance,
    InstanceState,
    JoinEndpoint,
    LeaveEndpoint,
    LifecycleSettings,
    LoadFailed,
    ModelSpec,
    NodeSpec,
    ReclassEndpoint,
    StartInstance,
    StopInstance,
    fit_devices,
)
from gateway.sched.plugins.eviction.interface import (
    Evictor,
)

# The vocabulary lives in instance_types; callers import it from here with the machine.
__all__ = [
    "HOLDS_MEMORY",
    "LOADING",
    "REFUSAL_RETRY_S",
    "RESIDENT",
    "SERVING",
    "Action",
    "Demand",
    "DeviceSpec",
    "EvictionDecision",
    "Instance",
    "InstanceState",
    "JoinEndpoint",
    "LeaveEndpoint",
    "Lifecycle",
    "LifecycleSettings",
    "LoadFailed",
    "ModelSpec",
    "NodeSpec",
    "ReclassEndpoint",
    "StartInstance",
    "StopInstance",
    "fit_devices",
]


class Lifecycle(DevicePlanner):
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
