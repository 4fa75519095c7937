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
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from gateway.agent.config import ModelSpec as RegistryModel
from gateway.agent.contract import ErrorCode as AgentErrorCode
from gateway.agent.contract import InstanceState as AgentState
from gateway.agent.contract import NodeReport
from gateway.config.lifecycle import LifecycleSetup
from gateway.core import errors
from gateway.core.clock import Clock
from gateway.core.tasks import TaskSupervisor
from gateway.core.types import EndpointId, EngineKind, InstanceClass, ModelName
from gateway.dispatch.driver import SchedulerDriver
from gateway.lifecycle.agent_client import AgentCallError, AgentClient
from gateway.lifecycle.autoscaler import LiveAutoscaler
from gateway.lifecycle.demand import DemandTracker
from gateway.lifecycle.endpoints import EndpointSet
from gateway.lifecycle.instances import (
    Action,
    Demand,
    DeviceSpec,
    InstanceState,
    JoinEndpoint,
    LeaveEndpoint,
    Lifecycle,
    LifecycleSettings,
    LoadFailed,
    ModelSpec,
    NodeSpec,
    ReclassEndpoint,
    StartInstance,
    StopInstance,
)
from gateway.lifecycle.placements import ThreadPlans
from gateway.sched.perf import PerfCoefficients
from gateway.sched.plugins.autoscale.interface import InstanceConfig
from gateway.sched.request import SchedRequest
from gateway.sched.types import EndpointSpec
from gateway.telemetry.records import FinishedRequest

log = structlog.get_logger("berth.lifecycle")

TICK_S = 0.5
LOAD_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0)
#: Agent errors that refuse a start for memory (`start_refused`: the core plans the model again).
MEMORY_REFUSALS = frozenset(
    {AgentErrorCode.DOES_NOT_FIT, AgentErrorCode.DEVICE_BUSY, AgentErrorCode.MEMORY_NOT_RELEASED}
)


def registry_models(setup: LifecycleSetup) -> dict[ModelName, ModelSpec]:
    """The registry as the instance state machine sees it; a model's load time is models.toml's
    `expected_load_s`, else [lifecycle]'s, until a load of it is measured."""
    default = setup.config.expected_load_s
    return {ModelName(name): _model_spec(m, m.expected_load_s or default) for name, m in setup.models.items()}


class LifecycleMetrics:
    def __init__(self, registry: CollectorRegistry, manager: LifecycleManager) -> None:
        self.loads = Counter(
            "berth_lifecycle_loads",
            "Model loads by node agents, by model and result",
            ["model", "result"],
            registry=registry,
        )
        self.load_seconds = Histogram(
            "berth_lifecycle_load_seconds",
            "Measured load time of started instances",
            ["model"],
            buckets=LOAD_BUCKETS,
            registry=registry,
        )
        self.evictions = Counter(
            "berth_lifecycle_evictions",
            "Instances stopped by the lifecycle, by reason",
            ["reason"],
            registry=registry,
        )
        self.cold_start_wait = Histogram(
            "berth_lifecycle_cold_start_wait_seconds",
            "From the first request for a model with no ready endpoint to its endpoint joining",
            ["model"],
            buckets=LOAD_BUCKETS,
            registry=registry,
        )
        self.agent_calls = Counter(
            "berth_lifecycle_agent_calls",
            "Node agent calls, by node, command and result",
            ["node", "command", "result"],
            registry=registry,
        )
        registry.register(_InstancesCollector(manager))


class _InstancesCollector:
    def __init__(self, manager: LifecycleManager) -> None:
        self._m = manager

    def describe(self) -> list[Metric]:
        return [GaugeMetricFamily("berth_lifecycle_instances", "Model instances by state", labels=["state"])]

    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily("berth_lifecycle_instances", "Model instances by state", labels=["state"])
        counts = dict.fromkeys(InstanceState, 0)
        for inst in self._m.core.instances():
            counts[inst.state] += 1
        for state, n in counts.items():
            g.add_metric([state.value], n)
        yield g


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


class FleetLeadership(Protocol):
    """Cluster mode (gateway.cluster.member): one replica, the leader, changes the fleet; the others
    route to what it started. None in the manager: this gateway is the only one."""

    @property
    def is_leader(self) -> bool: ...

    def fencing_token(self) -> int | None:
        """The token every agent command carries while this replica leads (None: it does not)."""

    def forward_cold(self, models: Iterable[str]) -> None:
        """A follower: ask the leader to cold-start these models."""

    def fleet_changed(self, draining: Iterable[str]) -> None:
        """The leader: agent-started endpoints changed; `draining`: endpoint ids it drains now."""

    def peer_inflight(self, eid: EndpointId) -> int:
        """The other replicas' requests running on `eid`, as they last published them."""


class LifecycleManager:
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

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

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

    async def _refresh(self, name: str) -> None:
        client = self.clients[name]
        try:
            if name not in self.node_reports:
                report = await self._call(client, "node", client.node_report())
                self.node_reports[name] = report
                self._node_specs[name] = NodeSpec(
                    name,
                    tuple(
                        DeviceSpec(d.name, max(0, d.total_bytes - d.headroom_bytes)) for d in report.devices
                    ),
                    self._allowed.get(name),
                )
                self.core.set_nodes(list(self._node_specs.values()))
            asked = self._clock.now()
            listed = await self._call(client, "list", client.list_instances())
        except AgentCallError as e:
            self.node_errors[name] = str(e)
            return
        self.node_errors.pop(name, None)
        now = self._clock.now()
        seen = set()
        for rep in listed.instances:
            seen.add(rep.id)
            inst = self.core.get(rep.id)
            if rep.state is AgentState.READY and rep.healthy is not False:
                if inst is None or inst.state in (InstanceState.STOPPED, InstanceState.FAILED):
                    if ModelName(rep.model) not in self.core.models():
                        continue  # not in the gateway's registry: not ours to route to
                    log.info("instance_adopted", node=name, instance=rep.id, model=rep.model, url=rep.url)
                    self._configs[rep.id] = (rep.config, rep.max_batch)
                    self._do(
                        self.core.adopt(
                            iid=rep.id,
                            model=ModelName(rep.model),
                            node=name,
                            devices=rep.devices,
                            memory_bytes=rep.memory_bytes,
                            url=rep.url,
                            load_s=rep.load_s,
                            now=now,
                        )
                    )
            elif (
                inst is not None
                and inst.node == name
                and inst.state in (InstanceState.READY, InstanceState.DRAINING)
                # An instance that became ready after the list was asked for may be listed as it was
                # before ("starting"): the answer is older than what the gateway knows, not a crash.
                and inst.changed_at <= asked
            ):
                why = rep.reason or (
                    "health check failed" if rep.healthy is False else f"agent says {rep.state}"
                )
                log.warning("instance_crashed", node=name, instance=rep.id, model=rep.model, reason=why)
                self._do(self.core.crashed(rep.id, why, now))
        for inst in self.core.instances():
            if (
                inst.node == name
                and inst.state is InstanceState.READY
                and inst.id not in seen
                and inst.changed_at <= asked
            ):
                self._do(self.core.crashed(inst.id, "the agent no longer lists it", now))

    async def _call(self, client: AgentClient, command: str, coro: Any) -> Any:
        try:
            out = await coro
        except AgentCallError as e:
            self.agent_errors += 1
            self.metrics.agent_calls.labels(client.node, command, e.code).inc()
            log.warning("agent_call_failed", node=client.node, command=command, code=e.code, error=e.message)
            raise
        self.metrics.agent_calls.labels(client.node, command, "ok").inc()
        return out

    # ----------------------------------------------------------------- cluster mode
    @property
    def acting(self) -> bool:
        """This gateway changes the fleet: it is the only one, or the cluster's leader."""
        return self.leadership is None or self.leadership.is_leader

    def on_fleet_changed(self, draining: Iterable[str]) -> None:
        """A follower: the leader changed the fleet. Endpoints it drains leave this replica's set now
        (no new placements; requests running there finish); the agents are re-read on the next tick."""
        self._refresh_now = True
        for eid in draining:
            iid = self._eids.get(EndpointId(eid))
            if iid is not None and iid in self._joined:
                self._leave(iid)

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

    def _fleet_changed(self) -> None:
        if self.leadership is not None and self.leadership.is_leader:
            self.leadership.fleet_changed(str(eid) for eid in self._leaving)

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

    # ----------------------------------------------------------------- carrying out actions
    def _do(self, actions: Iterable[Action]) -> None:
        acted = False
        for a in actions:
            acted = True
            if isinstance(a, StartInstance | StopInstance) and not self.acting:
                # A follower's state machine (fed by the agents' lists) proposed a fleet change: the
                # leader's is the one that acts.
                self.follower_drops += 1
                continue
            if isinstance(a, StartInstance):
                why = "cold_start" if a.reason == "cold_start" else "autoscale"
                self.starts[why] = self.starts.get(why, 0) + 1
                log.info(
                    "instance_starting",
                    node=a.node,
                    instance=a.instance,
                    model=a.model,
                    devices=list(a.devices),
                    instance_class=a.instance_class.value,
                    config=a.config,
                    reason=a.reason,
                )
                self._supervisor.spawn(
                    f"agent-start:{a.instance}", functools.partial(self._start, a), restart=False
                )
            elif isinstance(a, StopInstance):
                self.evictions[a.reason] = self.evictions.get(a.reason, 0) + 1
                self.metrics.evictions.labels(a.reason).inc()
                log.info(
                    "instance_stopping", node=a.node, instance=a.instance, reason=a.reason, evictor=a.evictor
                )
                self._supervisor.spawn(
                    f"agent-stop:{a.instance}", functools.partial(self._stop, a), restart=False
                )
            elif isinstance(a, JoinEndpoint):
                self._join(a.instance, a.instance_class)
            elif isinstance(a, ReclassEndpoint):
                self._reclass(a.instance, a)
            elif isinstance(a, LeaveEndpoint):
                self._leave(a.instance)
            elif isinstance(a, LoadFailed):  # (the core emits it only when nothing else serves the model)
                log.warning("model_load_failed", model=a.model, reason=a.reason)
                self._cold_since.pop(a.model, None)
                err = errors.model_load_failed(a.model, a.reason, self._retry_after_s)
                self._driver.apply(self._scheduler.fail_model(a.model, err))
        if acted:
            self._notify()

    async def _start(self, a: StartInstance) -> None:
        client = self.clients[a.node]
        try:
            report = await self._call(
                client,
                "start",
                client.start(a.model, a.instance, timeout_s=self.settings.load_deadline_s, config=a.config),
            )
        except AgentCallError as e:
            reason = f"{e.code}: {e.message}"
            if e.code in MEMORY_REFUSALS:
                # The agent's ledger (NVML's measure) has less room than the plan assumed: plan again
                # (elsewhere, evicting more, or waiting) within the load deadline instead of a 503.
                self.metrics.loads.labels(a.model, "refused").inc()
                free = {d.name: d.free_bytes for d in (e.body.devices or ())} if e.body is not None else {}
                log.info(
                    "instance_start_refused", node=a.node, instance=a.instance, model=a.model, code=e.code
                )
                self._do(self.core.start_refused(a.instance, reason, self._clock.now(), agent_free=free))
                return
            self.metrics.loads.labels(a.model, "failed").inc()
            if a.reason != "cold_start":
                self.autoscaler.start_failed(a.model)
            self._do(self.core.start_failed(a.instance, reason, self._clock.now()))
            return
        self.metrics.loads.labels(a.model, "ok").inc()
        self.metrics.load_seconds.labels(a.model).observe(report.load_s)
        self.load_times.setdefault(a.model, []).append(report.load_s)
        self._configs[a.instance] = (report.instance.config, report.instance.max_batch)
        log.info("instance_ready", node=a.node, instance=a.instance, model=a.model, load_s=report.load_s)
        self._do(
            self.core.started(
                a.instance, url=report.instance.url, load_s=report.load_s, now=self._clock.now()
            )
        )

    async def _stop(self, a: StopInstance) -> None:
        client = self.clients[a.node]
        try:
            await self._call(
                client, "stop", client.stop(a.instance, drain_timeout_s=self.settings.drain_timeout_s)
            )
        except AgentCallError as e:
            if e.code == "unknown_instance":  # never launched (a start that timed out early), or gone
                self._do(self.core.stopped(a.instance, self._clock.now()))
            else:
                self._do(self.core.stop_failed(a.instance, f"{e.code}: {e.message}", self._clock.now()))
            return
        log.info("instance_stopped", node=a.node, instance=a.instance)
        self._do(self.core.stopped(a.instance, self._clock.now()))

    def _join(self, iid: str, instance_class: InstanceClass) -> None:
        inst = self.core.get(iid)
        if inst is None or inst.url is None:
            return
        eid = EndpointId(f"{inst.node}/{iid}")
        engine = self.setup.models[inst.model].engine if inst.model in self.setup.models else EngineKind.VLLM
        config, max_batch = self._configs.get(iid, (None, None))
        spec = EndpointSpec(
            id=eid,
            url=inst.url,
            engine=engine,
            models=frozenset({inst.model}),
            instance_class=instance_class,
            default_cap=self._default_cap,
            node=inst.node,
            max_batch=max_batch,
            config=config,
        )
        self._eids[eid] = iid
        self._joined[iid] = spec
        self._leaving.pop(eid, None)  # (re-adopted: the scheduler counts its requests again)
        since = self._cold_since.pop(inst.model, None)
        if since is not None:
            self.metrics.cold_start_wait.labels(inst.model).observe(max(0.0, self._clock.now() - since))
        self._endpoints.set_agent_endpoints(list(self._joined.values()))
        self._fleet_changed()

    def _reclass(self, iid: str, a: ReclassEndpoint) -> None:
        """A ready instance changes class in place: its endpoint is registered again with the new class
        (no restart; the requests running there stay)."""
        spec = self._joined.get(iid)
        if spec is None:
            return
        log.info("endpoint_reclassed", instance=iid, endpoint=spec.id, instance_class=a.instance_class.value)
        self._joined[iid] = dataclasses.replace(spec, instance_class=a.instance_class)
        self._endpoints.set_agent_endpoints(list(self._joined.values()))
        self._fleet_changed()

    def _leave(self, iid: str) -> None:
        self._configs.pop(iid, None)
        spec = self._joined.pop(iid, None)
        if spec is None:
            return
        # Keep the id -> instance mapping while requests still run there (draining reads in-flight counts),
        # and count them now: once removed, the scheduler reports 0 for the endpoint.
        self._leaving[spec.id] = self._scheduler.inflight_on(spec.id)
        self._endpoints.set_agent_endpoints(list(self._joined.values()))
        self._fleet_changed()

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
