"""Where an instance goes and what it evicts: the planning half of the instance state machine
(`gateway.lifecycle.instances.Lifecycle`), kept apart from its event handlers. `DevicePlanner` is the
base `Lifecycle` extends: it reads the machine's instances, nodes, models and demand and returns the
actions a plan needs (start now, or evict first and start when the victims are gone). Sans-IO."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence

from gateway.core.types import ModelName
from gateway.lifecycle.instance_types import (
    HOLDS_MEMORY,
    SERVING,
    Action,
    Demand,
    EvictionDecision,
    Instance,
    InstanceState,
    LeaveEndpoint,
    LifecycleSettings,
    LoadFailed,
    ModelSpec,
    NodeSpec,
    StartInstance,
    StopInstance,
    fit_devices,
)
from gateway.sched.plugins.eviction.interface import (
    EvictionCandidate,
    EvictionContext,
    Evictor,
    checked_score,
)


class DevicePlanner:
    """Planning over the machine's state; `Lifecycle` holds that state and calls these."""

    # The machine's state (`Lifecycle.__init__` sets it).
    settings: LifecycleSettings
    on_eviction: Callable[[EvictionDecision], None] | None
    _models: dict[ModelName, ModelSpec]
    _nodes: dict[str, NodeSpec]
    _evictor: Evictor
    _demand: Callable[[], Demand]
    _instances: dict[str, Instance]
    _wanted: dict[ModelName, float]
    _short: dict[tuple[str, str], int]
    _load_since: dict[ModelName, float]
    _retry_at: dict[ModelName, float]
    _seq: Iterator[int]

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
