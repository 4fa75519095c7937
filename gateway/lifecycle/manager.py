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
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable, Iterator
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from gateway.agent.contract import InstanceState as AgentState
from gateway.agent.contract import NodeReport
from gateway.config.lifecycle import LifecycleSetup
from gateway.core import errors
from gateway.core.clock import Clock
from gateway.core.tasks import TaskSupervisor
from gateway.core.types import EndpointId, EngineKind, ModelName
from gateway.dispatch.driver import SchedulerDriver
from gateway.lifecycle.agent_client import AgentCallError, AgentClient
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
    StartInstance,
    StopInstance,
)
from gateway.sched.request import SchedRequest
from gateway.sched.types import EndpointSpec

log = structlog.get_logger("berth.lifecycle")

TICK_S = 0.5
LOAD_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0)
#: Weight of the newest request in a model's expected output length (exponential average).
OUTPUT_EWMA_ALPHA = 0.1


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
    ) -> None:
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
        models = {
            ModelName(name): ModelSpec(ModelName(name), m.memory_bytes, m.devices, c.expected_load_s)
            for name, m in setup.models.items()
        }
        self.core = Lifecycle(
            models=models, nodes=[], evictor=setup.evictor, settings=self.settings, demand=self._demand
        )
        self._allowed = {
            n.name: (None if n.models is None else frozenset(ModelName(m) for m in n.models))
            for n in setup.nodes
        }
        self.clients = {
            n.name: AgentClient(n.name, n.agent, timeout_s=c.agent_timeout_s) for n in setup.nodes
        }
        self._node_specs: dict[str, NodeSpec] = {}
        self.node_reports: dict[str, NodeReport] = {}
        self.node_errors: dict[str, str] = {}
        self._answered = asyncio.Event()
        self._eids: dict[EndpointId, str] = {}  # endpoint id -> instance id
        self._joined: dict[str, EndpointSpec] = {}  # instance id -> its endpoint
        self._cold_since: dict[ModelName, float] = {}
        self._expected_output: dict[ModelName, float] = {}
        self.load_times: dict[ModelName, list[float]] = {}
        self.evictions: dict[str, int] = {}
        self.agent_errors = 0
        self.metrics = LifecycleMetrics(registry, self)
        self._scheduler.set_loadable(models, c.load_deadline_s)
        driver.on_cold = self.on_cold
        driver.on_dispatch = self.on_dispatch

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

    # ----------------------------------------------------------------- the loop
    async def run(self) -> None:
        """Ask every agent for its node and instances until all answered; then tick, and re-read each
        agent's list every refresh interval (engines that died, agents that came back)."""
        refresh = self.setup.config.refresh_interval_s
        next_refresh = 0.0
        while True:
            now = self._clock.now()
            if now >= next_refresh:
                await asyncio.gather(*(self._refresh(name) for name in self.clients))
                if len(self.node_reports) == len(self.clients):
                    self._answered.set()
                next_refresh = now + refresh
            self._sync_inflight()
            self._do(self.core.tick(self._clock.now()))
            await asyncio.sleep(TICK_S)

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
            ):
                why = rep.reason or (
                    "health check failed" if rep.healthy is False else f"agent says {rep.state}"
                )
                log.warning("instance_crashed", node=name, instance=rep.id, model=rep.model, reason=why)
                self._do(self.core.crashed(rep.id, why, now))
        for inst in self.core.instances():
            if inst.node == name and inst.state is InstanceState.READY and inst.id not in seen:
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

    # ----------------------------------------------------------------- events from the request path
    def on_cold(self, models: Iterable[ModelName]) -> None:
        """Requests for loadable models found no ready endpoint (the driver calls this after submit)."""
        now = self._clock.now()
        self._sync_inflight()
        for m in models:
            self._cold_since.setdefault(m, now)
            self._do(self.core.request(m, now))

    def on_dispatch(self, req: SchedRequest, eid: EndpointId) -> None:
        iid = self._eids.get(eid)
        if iid is not None:
            self.core.touch(iid, self._clock.now())
        expect = req.predicted_output_tokens if req.predicted_output_tokens is not None else req.max_tokens
        if expect is not None:
            old = self._expected_output.get(req.model)
            self._expected_output[req.model] = (
                float(expect) if old is None else old + OUTPUT_EWMA_ALPHA * (float(expect) - old)
            )

    def _demand(self) -> Demand:
        return Demand(
            window=self._scheduler.lookahead(self.settings.lookahead), expected_output=self._expected_output
        )

    def _sync_inflight(self) -> None:
        """In-flight counts from the scheduler (exact), so eviction never takes a busy instance and a
        draining one stops once its last request ends."""
        now = self._clock.now()
        for eid, iid in list(self._eids.items()):
            inst = self.core.get(iid)
            if inst is None or inst.state in (InstanceState.STOPPED, InstanceState.FAILED):
                del self._eids[eid]
                continue
            self._do(self.core.observe_inflight(iid, self._scheduler.inflight_on(eid), now))

    # ----------------------------------------------------------------- carrying out actions
    def _do(self, actions: Iterable[Action]) -> None:
        for a in actions:
            if isinstance(a, StartInstance):
                log.info(
                    "instance_starting",
                    node=a.node,
                    instance=a.instance,
                    model=a.model,
                    devices=list(a.devices),
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
                self._join(a.instance)
            elif isinstance(a, LeaveEndpoint):
                self._leave(a.instance)
            elif isinstance(a, LoadFailed):
                self._cold_since.pop(a.model, None)
                log.warning("model_load_failed", model=a.model, reason=a.reason)
                err = errors.model_load_failed(a.model, a.reason, self._retry_after_s)
                self._driver.apply(self._scheduler.fail_model(a.model, err))

    async def _start(self, a: StartInstance) -> None:
        client = self.clients[a.node]
        try:
            report = await self._call(
                client, "start", client.start(a.model, a.instance, timeout_s=self.settings.load_deadline_s)
            )
        except AgentCallError as e:
            self.metrics.loads.labels(a.model, "failed").inc()
            self._do(self.core.start_failed(a.instance, f"{e.code}: {e.message}", self._clock.now()))
            return
        self.metrics.loads.labels(a.model, "ok").inc()
        self.metrics.load_seconds.labels(a.model).observe(report.load_s)
        self.load_times.setdefault(a.model, []).append(report.load_s)
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

    def _join(self, iid: str) -> None:
        inst = self.core.get(iid)
        if inst is None or inst.url is None:
            return
        eid = EndpointId(f"{inst.node}/{iid}")
        engine = self.setup.models[inst.model].engine if inst.model in self.setup.models else EngineKind.VLLM
        spec = EndpointSpec(
            id=eid,
            url=inst.url,
            engine=engine,
            models=frozenset({inst.model}),
            default_cap=self._default_cap,
            node=inst.node,
        )
        self._eids[eid] = iid
        self._joined[iid] = spec
        since = self._cold_since.pop(inst.model, None)
        if since is not None:
            self.metrics.cold_start_wait.labels(inst.model).observe(max(0.0, self._clock.now() - since))
        self._endpoints.set_agent_endpoints(list(self._joined.values()))

    def _leave(self, iid: str) -> None:
        spec = self._joined.pop(iid, None)
        if spec is None:
            return
        # Keep the id -> instance mapping while requests still run there (draining reads in-flight counts).
        self._endpoints.set_agent_endpoints(list(self._joined.values()))

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
            "agent_errors": self.agent_errors,
        }
