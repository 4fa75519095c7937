"""Carrying out the instance state machine's actions with the node agents (`AgentActions`, the base
`gateway.lifecycle.manager.LifecycleManager` extends): the agent calls (`node`, `list`, `start`, `stop`;
each counted and logged), re-adopting or declaring crashed what an agent lists, the endpoints that join,
change class and leave the endpoint set, and the metrics all this counts. Whether this replica acts on
the fleet at all (cluster mode's `FleetLeadership`) is asked here too: a follower carries out no start
or stop. The manager holds the state (its constructor) and the events that feed the state machine."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

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
from gateway.lifecycle.endpoints import EndpointSet
from gateway.lifecycle.instances import (
    Action,
    DeviceSpec,
    InstanceState,
    JoinEndpoint,
    LeaveEndpoint,
    Lifecycle,
    LifecycleSettings,
    LoadFailed,
    NodeSpec,
    ReclassEndpoint,
    StartInstance,
    StopInstance,
)
from gateway.sched.scheduler import Scheduler
from gateway.sched.types import EndpointSpec

log = structlog.get_logger("berth.lifecycle")

LOAD_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0)
#: Agent errors that refuse a start for memory (`start_refused`: the core plans the model again).
MEMORY_REFUSALS = frozenset(
    {AgentErrorCode.DOES_NOT_FIT, AgentErrorCode.DEVICE_BUSY, AgentErrorCode.MEMORY_NOT_RELEASED}
)
#: Consecutive lists whose health probe of a running engine failed before it is declared crashed (and
#: stopped, with whatever runs there): one probe is a single wall-clock timeout, which a stalled machine
#: or a busy engine misses without being dead (an engine that exited is listed so, and crashes at once).
FAILED_PROBES_TO_CRASH = 3


class LifecycleMetrics:
    def __init__(self, registry: CollectorRegistry, manager: AgentActions) -> None:
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
    def __init__(self, manager: AgentActions) -> None:
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


class FleetLeadership(Protocol):
    """Cluster mode (gateway.cluster.member): one replica, the leader, changes the fleet; the others
    route to what it started. None in the manager: this gateway is the only one."""

    @property
    def is_leader(self) -> bool: ...

    def fencing_token(self) -> int | None:
        """The token every agent command carries while this replica leads (None: it does not)."""

    def forward_cold(self, models: Iterable[str]) -> None:
        """A follower: ask the leader to cold-start these models."""

    def load_failed(self, model: str, reason: str) -> None:
        """The leader: a cold start of `model` failed with `reason`."""

    def fleet_changed(self, draining: Iterable[str]) -> None:
        """The leader: agent-started endpoints changed; `draining`: endpoint ids it drains now."""

    def peer_inflight(self, eid: EndpointId) -> int:
        """The other replicas' requests running on `eid`, as they last published them."""


class AgentActions:
    """The agent calls and the actions carried out; `LifecycleManager` holds the state they use."""

    # The manager's state (`LifecycleManager.__init__` sets it).
    setup: LifecycleSetup
    settings: LifecycleSettings
    core: Lifecycle
    leadership: FleetLeadership | None
    clients: dict[str, AgentClient]
    metrics: LifecycleMetrics
    autoscaler: LiveAutoscaler
    node_reports: dict[str, NodeReport]
    node_errors: dict[str, str]
    follower_drops: int
    load_times: dict[ModelName, list[float]]
    evictions: dict[str, int]
    starts: dict[str, int]
    agent_errors: int
    _driver: SchedulerDriver
    _scheduler: Scheduler
    _endpoints: EndpointSet
    _clock: Clock
    _supervisor: TaskSupervisor
    _default_cap: int
    _retry_after_s: float
    _allowed: dict[str, frozenset[ModelName] | None]
    _node_specs: dict[str, NodeSpec]
    _eids: dict[EndpointId, str]
    _joined: dict[str, EndpointSpec]
    _leaving: dict[EndpointId, int]
    _configs: dict[str, tuple[str | None, int | None]]
    _cold_since: dict[ModelName, float]
    _failed_probes: dict[str, int]  # instance id -> consecutive lists whose health probe of it failed
    _changed: asyncio.Event

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    @property
    def acting(self) -> bool:
        """This gateway changes the fleet: it is the only one, or the cluster's leader."""
        return self.leadership is None or self.leadership.is_leader

    def _fleet_changed(self) -> None:
        if self.leadership is not None and self.leadership.is_leader:
            self.leadership.fleet_changed(str(eid) for eid in self._leaving)

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
            if rep.healthy is not False:
                self._failed_probes.pop(rep.id, None)
            if rep.state is AgentState.READY and rep.healthy is not False:
                # An instance stopped (or failed) after the list was asked for may be listed as it was
                # before ("ready"): the answer is older than what the gateway knows, not an engine to adopt.
                if inst is None or (
                    inst.state in (InstanceState.STOPPED, InstanceState.FAILED) and inst.changed_at <= asked
                ):
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
                if rep.state is AgentState.READY:  # running, and its health probe failed
                    failed = self._failed_probes[rep.id] = self._failed_probes.get(rep.id, 0) + 1
                    if failed < FAILED_PROBES_TO_CRASH:
                        log.info("instance_probe_failed", node=name, instance=rep.id, failed=failed)
                        continue
                self._failed_probes.pop(rep.id, None)
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
                self.fail_waiting(a.model, a.reason)
                if self.leadership is not None:  # followers fail the requests they hold for it too
                    self.leadership.load_failed(a.model, a.reason)
        if acted:
            self._notify()

    def fail_waiting(self, model: ModelName, reason: str) -> None:
        """Every request queued for `model` rejected with 503 model_load_failed (its load failed)."""
        log.warning("model_load_failed", model=model, reason=reason)
        self._cold_since.pop(model, None)
        err = errors.model_load_failed(model, reason, self._retry_after_s)
        self._driver.apply(self._scheduler.fail_model(model, err))

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
