"""The live lifecycle manager: carries out the instance state machine's actions (`lifecycle.instances`)
with node agents, and feeds it what happens (agent answers, dispatches, the queue, time).

- At start, every node's agent is asked for its devices (`node`) and instances (`list`); ready engines are
  re-adopted (they join the endpoint set). The gateway is ready once every node's agent has answered.
- A request for a registered model with no ready endpoint waits in the gateway queue (the scheduler notes
  the model, the driver hands it here): the state machine starts an instance, joins the load in progress,
  or evicts; the started engine joins the endpoint set (scraped, modelled, placed like a configured one)
  and the queue is served from it. A failed load rejects the model's waiting requests with 503
  `model_load_failed` and the agent's reason.
- Evicted instances leave the endpoint set first (no new placements), their in-flight requests finish (up
  to the drain timeout), then the agent stops them; the load that waits for their memory starts after.
- Every agent call runs as a supervised task with a timeout; failures are logged and counted.
- Autoscaling (the policy's `[autoscale]`, `gateway.lifecycle.autoscaler`): on each tick, once every agent
  answered, the autoscaler's round (when its interval is due) returns the lifecycle's actions, carried out
  like the rest: `StartInstance` with its class (and configuration) through the agent, `JoinEndpoint` with
  the class, `ReclassEndpoint` by re-registering the joined endpoint with its new class, a scale-in as a
  drain (`LeaveEndpoint`, then `StopInstance` with reason `scaled_in`). A scale-out whose start fails is
  counted (the core fails the model's waiting requests only when no other instance of it serves them).

The agent calls and the actions carried out with them are `gateway.lifecycle.agent_actions`
(`AgentActions`, the base of `LifecycleManager`); here are the manager's state, its loop and the events
that feed the state machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from gateway.agent.config import ModelSpec as RegistryModel
from gateway.agent.contract import NodeReport
from gateway.config.lifecycle import LifecycleSetup
from gateway.core.clock import Clock
from gateway.core.tasks import TaskSupervisor
from gateway.core.types import EndpointId, ModelName
from gateway.dispatch.driver import SchedulerDriver
from gateway.lifecycle.agent_actions import AgentActions, FleetLeadership, LifecycleMetrics
from gateway.lifecycle.agent_client import AgentClient
from gateway.lifecycle.autoscaler import LiveAutoscaler
from gateway.lifecycle.demand import DemandTracker
from gateway.lifecycle.endpoints import EndpointSet
from gateway.lifecycle.instances import (
    Demand,
    InstanceState,
    Lifecycle,
    LifecycleSettings,
    ModelSpec,
    NodeSpec,
)
from gateway.lifecycle.placements import ThreadPlans
from gateway.sched.perf import PerfCoefficients
from gateway.sched.plugins.autoscale.interface import InstanceConfig
from gateway.sched.request import SchedRequest
from gateway.sched.types import EndpointSpec
from gateway.telemetry.records import FinishedRequest

log = structlog.get_logger("berth.lifecycle")

TICK_S = 0.5


def registry_models(setup: LifecycleSetup) -> dict[ModelName, ModelSpec]:
    """The registry as the instance state machine sees it; a model's load time is models.toml's
    `expected_load_s`, else [lifecycle]'s, until a load of it is measured."""
    default = setup.config.expected_load_s
    return {ModelName(name): _model_spec(m, m.expected_load_s or default) for name, m in setup.models.items()}


def _model_spec(m: RegistryModel, load_s: float) -> ModelSpec:
    """The lifecycle core's view of a registry model: a cold start runs its default configuration (the
    agent's choice too); a scale-out may name any configuration, planned with its devices and the largest
    memory per device of any configuration (the core keeps one memory figure per model, so it never
    under-reserves)."""
    default = m.configured()
    configs = tuple(
        InstanceConfig(name=k.name, devices=m.configured(k.name).devices, max_batch=k.max_batch)
        for k in m.configs
    )
    memory = max([default.memory_bytes] + [m.configured(k.name).memory_bytes for k in m.configs])
    return ModelSpec(
        ModelName(m.name),
        memory,
        default.devices,
        load_s,
        configs=configs,
        default_config=default.default_config if m.configs else None,
    )


class LifecycleManager(AgentActions):
    def __init__(
        self,
        setup: LifecycleSetup,
        *,
        driver: SchedulerDriver,
        endpoints: EndpointSet,
        clock: Clock,
        supervisor: TaskSupervisor,
        registry: CollectorRegistry,
        default_cap: int,
        retry_after_s: float,
        prior: Callable[[], PerfCoefficients] | None = None,
        leadership: FleetLeadership | None = None,
    ) -> None:
        """`prior`: the gateway's telemetry prior as it is now (`[telemetry.prior]`; the autoscaler's
        configuration choice plans with it until telemetry fits a curve). `leadership`: cluster mode
        (starts, stops, evictions and the autoscaler only on the leader)."""
        c = setup.config
        self.setup = setup
        self._driver = driver
        self._scheduler = driver.scheduler
        self._endpoints = endpoints
        self._clock = clock
        self._supervisor = supervisor
        self._default_cap = default_cap
        self._retry_after_s = retry_after_s
        self.settings = LifecycleSettings(
            load_deadline_s=c.load_deadline_s,
            churn_guard_s=c.churn_guard_s,
            min_idle_s=c.min_idle_s,
            drain_timeout_s=c.drain_timeout_s,
            pinned=frozenset(ModelName(m) for m in c.pinned),
            lookahead=c.lookahead,
        )
        models = registry_models(setup)
        self.core = Lifecycle(
            models=models, nodes=[], evictor=setup.evictor, settings=self.settings, demand=self._demand
        )
        self._allowed = {
            n.name: (None if n.models is None else frozenset(ModelName(m) for m in n.models))
            for n in setup.nodes
        }
        self.leadership = leadership
        fencing = None if leadership is None else leadership.fencing_token
        self.clients = {
            n.name: AgentClient(n.name, n.agent, timeout_s=c.agent_timeout_s, fencing=fencing)
            for n in setup.nodes
        }
        self._refresh_now = False  # a follower: the leader changed the fleet, re-read the agents now
        self.follower_drops = 0  # fleet actions a follower's state machine proposed and did not carry out
        self._node_specs: dict[str, NodeSpec] = {}
        self.node_reports: dict[str, NodeReport] = {}
        self.node_errors: dict[str, str] = {}
        self._answered = asyncio.Event()
        self._eids: dict[EndpointId, str] = {}  # endpoint id -> instance id
        self._joined: dict[str, EndpointSpec] = {}  # instance id -> its endpoint
        # Endpoints that left the set while requests ran there -> those still running. The scheduler
        # forgets a removed endpoint's requests, so the drain counts them down from the finish records.
        self._leaving: dict[EndpointId, int] = {}
        # instance id -> (its instance configuration, that configuration's max batch), as its agent says
        self._configs: dict[str, tuple[str | None, int | None]] = {}
        self._cold_since: dict[ModelName, float] = {}
        self._failed_probes: dict[str, int] = {}
        self._traffic = DemandTracker(c.demand_history)
        self.load_times: dict[ModelName, list[float]] = {}
        self.evictions: dict[str, int] = {}
        self.starts: dict[str, int] = {}  # instances started: "cold_start" | "autoscale"
        self.agent_errors = 0
        self.metrics = LifecycleMetrics(registry, self)
        self.autoscaler = LiveAutoscaler(
            self.core, self._scheduler, registry, ahead=ThreadPlans(supervisor), prior=prior
        )
        self._changed = asyncio.Event()
        self._scheduler.set_loadable(models, c.load_deadline_s)
        driver.on_cold = self.on_cold
        driver.on_dispatch = self.on_dispatch
        driver.on_submit = self.on_submit

    # ----------------------------------------------------------------- readiness
    @property
    def answered(self) -> bool:
        """Every node's agent has answered `node` and `list` once."""
        return self._answered.is_set()

    async def wait_answered(self, timeout_s: float) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                await self._answered.wait()
        except TimeoutError:
            log.warning(
                "lifecycle_agents_not_answered", missing=sorted(set(self.clients) - set(self.node_reports))
            )
            return False
        return True

    async def wait_for(self, what: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until `what()` holds, re-checked after every batch of actions carried out and every
        agent answer; False on timeout (tests and the demo wait on the lifecycle this way)."""
        try:
            async with asyncio.timeout(timeout_s):
                while not what():
                    await self._changed.wait()
        except TimeoutError:
            return False
        return True

    # ----------------------------------------------------------------- the loop
    async def run(self) -> None:
        """Ask every agent for its node and instances until all answered; then tick, and re-read each
        agent's list every refresh interval (engines that died, agents that came back)."""
        refresh = self.setup.config.refresh_interval_s
        next_refresh = 0.0
        while True:
            now = self._clock.now()
            if now >= next_refresh or self._refresh_now:
                self._refresh_now = False
                await asyncio.gather(*(self._refresh(name) for name in self.clients))
                if len(self.node_reports) == len(self.clients):
                    self._answered.set()
                next_refresh = now + refresh
            self._sync_inflight()
            if self.acting:
                self._do(self.core.tick(self._clock.now()))
                if self.answered:  # the nodes' devices are known: the autoscaler sees the free ones
                    self._do(self.autoscaler.step(self._clock.now(), self.joined_endpoints()))
            self._notify()  # agent answers, drains and decisions that produced no action
            await asyncio.sleep(TICK_S)

    def joined_endpoints(self) -> dict[str, EndpointId]:
        """Instance id -> endpoint id of the agent-started instances in the endpoint set."""
        return {iid: eid for eid, iid in self._eids.items() if iid in self._joined}

    # ----------------------------------------------------------------- cluster mode
    def on_fleet_changed(self, draining: Iterable[str]) -> None:
        """A follower: the leader changed the fleet. Endpoints it drains leave this replica's set now
        (no new placements; requests running there finish); the agents are re-read on the next tick."""
        self._refresh_now = True
        for eid in draining:
            iid = self._eids.get(EndpointId(eid))
            if iid is not None and iid in self._joined:
                self._leave(iid)

    def on_load_failed(self, model: str, reason: str) -> None:
        """A follower: the leader's cold start of `model` failed; the requests waiting here for it get the
        503 model_load_failed a single gateway answers."""
        if not self.acting:
            self.fail_waiting(ModelName(model), reason)

    def on_leadership(self, leader: bool) -> None:
        """This replica became the leader (or stopped being it): models its requests still wait for,
        asked of a former leader that may never have started them, are requested again here."""
        if leader:
            now = self._clock.now()
            for m in list(self._cold_since):
                self._do(self.core.request(m, now))

    def leaving_inflight(self) -> dict[EndpointId, int]:
        """Requests still running on endpoints that left this replica's set (draining): the scheduler no
        longer counts them, the replica still publishes them so the leader's drain waits for them."""
        return {eid: n for eid, n in self._leaving.items() if n}

    # ----------------------------------------------------------------- events from the request path
    def on_cold(self, models: Iterable[ModelName]) -> None:
        """Requests for loadable models found no ready endpoint (the driver calls this after submit).
        A follower asks the leader to start them and routes to them once an agent lists them ready."""
        now = self._clock.now()
        self._sync_inflight()
        models = list(models)
        for m in models:
            self._cold_since.setdefault(m, now)
        if not self.acting and self.leadership is not None:
            self.leadership.forward_cold(models)
            self._refresh_now = True
            return
        for m in models:
            self._do(self.core.request(m, now))

    def retire(self, iid: str, reason: str = "scaled_in") -> bool:
        """Drain and stop a ready instance now, as an accepted scale-in does (False: not ready)."""
        self._sync_inflight()  # the drain starts from the exact in-flight count
        actions = self.core.scale_in(iid, self._clock.now(), reason=reason)
        self._do(actions)
        return bool(actions)

    def on_submit(self, req: SchedRequest) -> None:
        """Every request submitted to the scheduler (the autoscaler's arrival rates)."""
        self.autoscaler.arrived(req, self._clock.now())

    def on_finished(self, record: FinishedRequest) -> None:
        """Every admitted request that finished (the front's finish phase; the autoscaler's SLA counts)."""
        self.autoscaler.finished(record, self._scheduler.policy.slo)
        eid = record.endpoint
        if eid is not None and eid in self._leaving:
            self._leaving[eid] = max(0, self._leaving[eid] - 1)
            iid = self._eids.get(eid)
            if iid is not None:
                self._do(self.core.observe_inflight(iid, self._leaving[eid], self._clock.now()))

    def on_dispatch(self, req: SchedRequest, eid: EndpointId) -> None:
        iid = self._eids.get(eid)
        if iid is not None:
            self.core.touch(iid, self._clock.now())
        self._traffic.placed(req)

    def _demand(self) -> Demand:
        return self._traffic.demand(self._scheduler.lookahead(self.settings.lookahead))

    def _sync_inflight(self) -> None:
        """In-flight counts from the scheduler (exact), so eviction never takes a busy instance and a
        draining one stops once its last request ends (counted down by `on_finished` once it left the
        endpoint set; a request retried or resumed elsewhere is waited for up to the drain timeout)."""
        now = self._clock.now()
        for eid, iid in list(self._eids.items()):
            inst = self.core.get(iid)
            if inst is None or inst.state in (InstanceState.STOPPED, InstanceState.FAILED):
                del self._eids[eid]
                self._leaving.pop(eid, None)
                continue
            n = self._leaving[eid] if eid in self._leaving else self._scheduler.inflight_on(eid)
            if self.leadership is not None:
                n += self.leadership.peer_inflight(eid)  # the other replicas' requests there
            self._do(self.core.observe_inflight(iid, n, now))

    # ----------------------------------------------------------------- admin
    def document(self) -> dict[str, Any]:
        """The lifecycle part of /admin/fleet."""
        now = self._clock.now()
        insts = self.core.instances()
        nodes = []
        for name in self.clients:
            spec = self._node_specs.get(name)
            devices = []
            for d in spec.devices if spec else ():
                used = sum(
                    i.memory_bytes
                    for i in insts
                    if i.node == name
                    and d.name in i.devices
                    and i.state
                    in (
                        InstanceState.STARTING,
                        InstanceState.READY,
                        InstanceState.DRAINING,
                        InstanceState.STOPPING,
                    )
                )
                devices.append({"name": d.name, "capacity_bytes": d.capacity_bytes, "used_bytes": used})
            nodes.append(
                {
                    "name": name,
                    "answered": name in self.node_reports,
                    "error": self.node_errors.get(name),
                    "devices": devices,
                }
            )
        loads = {
            m: {"n": len(ts), "mean_s": sum(ts) / len(ts), "last_s": ts[-1]}
            for m, ts in sorted(self.load_times.items())
        }
        return {
            "evictor": self.core.evictor.name,
            "ready": self.answered,
            "nodes": nodes,
            "instances": [
                {
                    "id": i.id,
                    "model": i.model,
                    "node": i.node,
                    "state": i.state.value,
                    "instance_class": i.instance_class.value,
                    "config": i.config,
                    "devices": list(i.devices),
                    "memory_bytes": i.memory_bytes,
                    "load_s": i.load_s,
                    "idle_s": max(0.0, now - i.last_used),
                    "inflight": i.inflight,
                    "url": i.url,
                    "reason": i.reason,
                }
                for i in sorted(insts, key=lambda i: (i.node, i.id))
                if i.state not in (InstanceState.STOPPED,) or now - i.changed_at < 600
            ],
            "waiting_loads": {m: max(0.0, now - t) for m, t in sorted(self._cold_since.items())},
            "loads": loads,
            "evictions": dict(sorted(self.evictions.items())),
            "starts": dict(sorted(self.starts.items())),
            "agent_errors": self.agent_errors,
            "acting": self.acting,
            "autoscale": self.autoscaler.document(),
        }
