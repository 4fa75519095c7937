"""Model lifecycle in the fleet simulator: the gateway's own state machine (`gateway.lifecycle.instances`,
with its `Evictor` plugin, and the policy's autoscaler through `gateway.lifecycle.scaling.ScaleLoop`)
driving simulated node agents on the virtual clock.

The agent's behaviour is simulated: a start takes the model's load time (memory admission and one load
per device are the state machine's, as the real agent also enforces them), a stop takes `stop_s` (drain
already done by the gateway; SIGTERM, exit, memory seen free). Every instance is its own simulated engine
(the fleet file's endpoint for its model is the template: profile, seats, KV cache) and its own endpoint
(id = the instance id, class = the instance's class), in the scheduler's endpoint set while the instance
is ready, exactly as the live manager adds and removes agent-started endpoints. A model run as
several configurations has a fleet-file endpoint per configuration (its `config` names it): an instance
of a configuration is made from that one (a configuration without one, and the default, from the
model's first). A draining instance's
in-flight count is its engine's (the scheduler forgets what ran on an endpoint that left the set); an
instance stopped with requests still running (the drain timeout) loses them: their clients get an error,
as when a real engine is stopped.

Counted: loads and load seconds, stops by reason (evictions, scale-ins), model hit rate (requests whose
model had a ready instance when they arrived), the waits from a model's first cold request to its
instance joining, device-seconds (each instance's devices from its start, loading included, to its stop
or the end of the run), and the autoscaler's decisions and counters (hysteresis).
For every eviction: how many instances were evictable (did the evictor have a choice), how many of them
had a known or predicted next request (the demand term's data), and whether each `compare` evictor would
have picked other victims on the same state.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.core import errors
from gateway.core.slo import SloKind
from gateway.core.types import EndpointHealth, EndpointId, InstanceClass, ModelName
from gateway.lifecycle.demand import DEFAULT_HISTORY, DemandTracker
from gateway.lifecycle.instances import (
    Action,
    Demand,
    EvictionDecision,
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
from gateway.lifecycle.scaling import ScaleLoop
from gateway.sched.autoscale import DecisionRecord
from gateway.sched.decisions import Decision
from gateway.sched.perf import PerfCoefficients
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.autoscale.interface import FinishedCall, Reclass, ScaleIn, ScaleOut, allotted
from gateway.sched.plugins.eviction.interface import Evictor
from gateway.sched.registry import PluginKind
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.types import EndpointSpec


@dataclass(frozen=True, slots=True)
class InitialInstances:
    """Instances running when the simulation starts (loaded before it: ready at t = 0)."""

    model: ModelName
    count: int
    instance_class: InstanceClass = InstanceClass.MIXED


@dataclass(frozen=True, slots=True)
class LifecycleOptions:
    models: tuple[ModelSpec, ...]  # load_s: the simulated agent's load time
    nodes: tuple[NodeSpec, ...]
    evictor: str = "cace"
    evictor_params: Mapping[str, Any] = field(default_factory=dict)
    settings: LifecycleSettings = field(default_factory=LifecycleSettings)
    stop_s: float = 2.0
    initial: tuple[InitialInstances, ...] = ()
    demand_history: int = DEFAULT_HISTORY  # recent requests whose shares predict demand
    # A prebuilt evictor instead of `evictor` (the eviction benchmark's clairvoyant oracle).
    evictor_impl: Evictor | None = None
    # Evictors whose victims are worked out on the same state at every eviction (`PlanStats.differs`).
    compare: tuple[Evictor, ...] = ()
    # Per model and configuration, the throughput-decay curve the autoscale loop's configuration choice
    # plans with until telemetry fitted one (`ScaleLoop`'s `priors`).
    priors: Mapping[ModelName, Mapping[str, PerfCoefficients]] = field(default_factory=dict)


@dataclass(slots=True)
class PlanStats:
    """The eviction plans carried out, and what the evictor had to decide on."""

    n: int = 0
    with_choice: int = 0  # ... where more than one instance was evictable
    candidates: int = 0  # evictable instances, summed over the plans
    demand_known: int = 0  # ... whose next request's position was known or predicted
    demand_queued: int = 0  # ... known: a request for its model was in the queue's look-ahead window
    differs: dict[str, int] = field(default_factory=dict)  # plans where that evictor's victims differ

    def document(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "with_choice": self.with_choice,
            "candidates": self.candidates,
            "demand_known": self.demand_known,
            "demand_queued": self.demand_queued,
            "differs": dict(sorted(self.differs.items())),
        }


@dataclass(slots=True)
class LifecycleStats:
    plans: PlanStats = field(default_factory=PlanStats)
    loads: int = 0
    load_s: float = 0.0
    stops: dict[str, int] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0
    load_failures: int = 0
    lost_requests: int = 0  # in flight on an instance when it stopped
    cold_waits: list[float] = field(default_factory=list)
    device_s: float = 0.0  # closed intervals; open ones are added by `SimLifecycle.close`
    peak_devices: int = 0
    decisions: list[dict[str, Any]] = field(default_factory=list)
    autoscale: dict[str, Any] | None = None
    started_by_config: dict[str, int] = field(default_factory=dict)  # the model's default named as such

    def document(self) -> dict[str, Any]:
        n = self.hits + self.misses
        return {
            "eviction_plans": self.plans.document(),
            "loads": self.loads,
            "load_seconds": round(self.load_s, 3),
            "evictions": self.stops.get("evicted", 0),
            "stops": dict(sorted(self.stops.items())),
            "hit_rate": round(self.hits / n, 6) if n else None,
            "load_failures": self.load_failures,
            "lost_requests": self.lost_requests,
            "cold_wait_mean_s": round(sum(self.cold_waits) / len(self.cold_waits), 3)
            if self.cold_waits
            else None,
            "device_hours": round(self.device_s / 3600.0, 4),
            "peak_devices": self.peak_devices,
            "autoscale": self.autoscale,
            "decisions": self.decisions,
            "started_by_config": dict(sorted(self.started_by_config.items())),
        }


def build_evictor(name: str, params: Mapping[str, Any]) -> Evictor:
    ev = default_registry().build(PluginKind.EVICTOR, name, dict(params), path="lifecycle.evictor")
    assert isinstance(ev, Evictor)
    return ev


def _record(r: DecisionRecord) -> dict[str, Any]:
    d = r.decision
    out: dict[str, Any] = {"t": round(r.at, 3), "outcome": r.outcome, "note": r.note}
    if isinstance(d, ScaleOut):
        out |= {
            "kind": "scale_out",
            "model": d.model,
            "class": str(d.instance_class),
            "count": d.count,
            "config": d.config,
        }
    elif isinstance(d, ScaleIn):
        out |= {"kind": "scale_in", "instance": d.instance}
    elif isinstance(d, Reclass):
        out |= {"kind": "reclass", "instance": d.instance, "class": str(d.to_class)}
    out["reason"] = "" if d is None else d.reason
    return out


@dataclass(frozen=True, slots=True)
class EngineHooks:
    """What the lifecycle asks of the simulation's engines."""

    add: Callable[[EndpointId, ModelName, str | None], None]  # a started instance's engine comes up
    remove: Callable[[EndpointId], int]  # ... goes away; returns the requests it lost
    load: Callable[[EndpointId], int]  # requests an engine holds (running + waiting)


class SimLifecycle:
    def __init__(
        self,
        opts: LifecycleOptions,
        scheduler: Scheduler,
        specs: Sequence[EndpointSpec],
        *,
        now: Callable[[], float],
        later: Callable[[float, Callable[[], None]], None],
        apply: Callable[[Sequence[Decision]], None],
        engines: EngineHooks,
        prior: Callable[[], PerfCoefficients] | None = None,
    ) -> None:
        """`prior`: the simulated gateway's telemetry prior (the configuration choice's, for a
        configuration `opts.priors` does not give, as live)."""
        self.opts = opts
        self._sched = scheduler
        self._now = now
        self._later = later  # run a callback at a virtual time
        self._apply = apply
        self._engines = engines
        self._spec_of: dict[tuple[ModelName, str | None], EndpointSpec] = {}
        for s in specs:
            if s.models:
                m = ModelName(next(iter(s.models)))
                self._spec_of.setdefault((m, None), s)
                self._spec_of.setdefault((m, s.config), s)
        missing = [m.name for m in opts.models if (m.name, None) not in self._spec_of]
        if missing:
            raise ValueError(f"no simulated endpoint serves {', '.join(missing)} (give each model one)")
        self.core = Lifecycle(
            models={m.name: m for m in opts.models},
            nodes=opts.nodes,
            evictor=opts.evictor_impl or build_evictor(opts.evictor, opts.evictor_params),
            settings=opts.settings,
            demand=self._demand,
        )
        self.core.on_eviction = self._on_eviction
        autoscale = scheduler.policy.autoscale
        self.scaling = (
            None
            if autoscale is None
            else ScaleLoop(autoscale, self.core, scheduler, priors=opts.priors, prior=prior)
        )
        self._active: dict[str, EndpointSpec] = {}  # instance id -> its endpoint, while in the set
        self._engine_of: dict[str, EndpointId] = {}  # instance id -> its engine, from ready to stop
        self._started_at: dict[str, tuple[float, int]] = {}  # instance id -> (start, devices)
        self._traffic = DemandTracker(opts.demand_history)
        self._cold_since: dict[ModelName, float] = {}
        self.stats = LifecycleStats()

    def install(self) -> None:
        """An empty endpoint set, every model loadable on demand; the initial instances ready."""
        self._apply(self._sched.sync_endpoints([]))
        self._sched.set_loadable(self.core.models(), self.opts.settings.load_deadline_s)
        now = self._now()
        for init in self.opts.initial:
            for a in self.core.scale_out(
                init.model, now, instance_class=init.instance_class, count=init.count, reason="initial"
            ):
                if isinstance(a, StartInstance):
                    self._start(a)
                    self._loaded(a, 0.0)

    # ----------------------------------------------------------------- events from the simulation
    def before_submit(self, req: SchedRequest) -> None:
        if req.model in self._sched.models(ready_only=True):
            self.stats.hits += 1
        else:
            self.stats.misses += 1
        if self.scaling is not None:
            self.scaling.arrived(req, self._now())

    def after_submit(self) -> None:
        if not self._sched.cold:
            return
        now = self._now()
        self._sync_inflight()
        for m in self._sched.take_cold():
            self._cold_since.setdefault(m, now)
            self._do(self.core.request(m, now))

    def on_dispatch(self, req: SchedRequest, eid: EndpointId) -> None:
        self.core.touch(str(eid), self._now())
        self._traffic.placed(req)

    def on_finish(
        self, req: SchedRequest, finished_at: float, ttft_s: float | None, slo_met: bool | None
    ) -> None:
        """A request finished (for the autoscaler's violation counts and fits)."""
        if self.scaling is None:
            return
        slo = req.slo
        kind = self._sched.policy.slo.class_of(slo.slo_class).kind
        e2e, allotted_s = allotted(slo, req.allotment)
        self.scaling.finished(
            req.model,
            FinishedCall(
                kind=SloKind(kind),
                arrival=req.arrival,
                finished_at=finished_at,
                allotted_s=allotted_s,
                took_s=finished_at - req.arrival if e2e else ttft_s,
                slo_met=slo_met,
                id=req.id,
            ),
        )

    def tick(self) -> None:
        self._sync_inflight()
        now = self._now()
        self._do(self.core.tick(now))
        if self.scaling is not None:
            joined = {iid: EndpointId(iid) for iid in self._active}
            self._do(self.scaling.step(now, joined))
            for r in self.scaling.runner.take_records():
                self.stats.decisions.append(_record(r))

    def close(self, *, at: float) -> None:
        """The run ended at `at` (its last request's end): account the devices of the instances still
        holding them until then, and the autoscaler's counters."""
        now = at
        for start, devices in self._started_at.values():
            self.stats.device_s += devices * max(0.0, now - start)
        self._started_at.clear()
        if self.scaling is not None:
            c = self.scaling.runner.counters
            self.stats.autoscale = {
                "scaler": self.scaling.runner.scaler.name,
                "started": c.started,
                "retired": c.retired,
                "reclassed": c.reclassed,
                "refused": c.refused,
                "faults": c.faults,
                "actions": c.actions,
                "hysteresis": None if c.hysteresis is None else round(c.hysteresis, 4),
            }

    def config_of(self, model: ModelName, config: str | None) -> str | None:
        """The configuration an instance runs: its own, else the model's default."""
        return config if config is not None else self.core.models()[model].default_config

    def instances_by_config(self) -> dict[str, int]:
        """Ready instances per configuration (the model's default named as such)."""
        out: dict[str, int] = {}
        for iid in self._active:
            inst = self.core.get(iid)
            if inst is not None:
                name = self.config_of(inst.model, inst.config) or "default"
                out[name] = out.get(name, 0) + 1
        return out

    def devices_in_use(self) -> int:
        return sum(d for _, d in self._started_at.values())

    def devices_of(self, eid: EndpointId) -> int:
        """The devices the instance behind endpoint `eid` holds (its id is the instance's)."""
        held = self._started_at.get(str(eid))
        return 0 if held is None else held[1]

    def instances_by_class(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for spec in self._active.values():
            out[str(spec.instance_class)] = out.get(str(spec.instance_class), 0) + 1
        return out

    # ----------------------------------------------------------------- internals
    def _demand(self) -> Demand:
        return self._traffic.demand(self._sched.lookahead(self.opts.settings.lookahead))

    def _on_eviction(self, d: EvictionDecision) -> None:
        st = self.stats.plans
        st.n += 1
        st.with_choice += len(d.candidates) > 1
        st.candidates += len(d.candidates)
        st.demand_known += sum(1 for c in d.candidates if c.first_pending is not None)
        queued = set(d.demand.window[: d.context.window])
        st.demand_queued += sum(1 for c in d.candidates if c.model in queued)
        for ev in self.opts.compare:
            if set(self.core.eviction_victims(d.model, d.now, ev) or ()) != set(d.victims):
                st.differs[ev.name] = st.differs.get(ev.name, 0) + 1

    def _sync_inflight(self) -> None:
        now = self._now()
        for iid, eid in list(self._engine_of.items()):
            # The engine's own count: the scheduler forgets what ran on an endpoint that left the set.
            n = max(self._sched.inflight_on(eid), self._engines.load(eid))
            self._do(self.core.observe_inflight(iid, n, now))

    def _do(self, actions: Sequence[Action]) -> None:
        for a in actions:
            if isinstance(a, StartInstance):
                self._start(a)
                load_s = self.core.models()[a.model].load_s
                self._later(load_s, functools.partial(self._loaded, a, load_s))
            elif isinstance(a, StopInstance):
                self.stats.stops[a.reason] = self.stats.stops.get(a.reason, 0) + 1
                self._later(self.opts.stop_s, functools.partial(self._stopped, a.instance))
            elif isinstance(a, JoinEndpoint):
                self._join(a.instance, a.instance_class)
            elif isinstance(a, LeaveEndpoint):
                if self._active.pop(a.instance, None) is not None:
                    self._apply(self._sched.sync_endpoints(list(self._active.values())))
            elif isinstance(a, ReclassEndpoint):
                spec = self._active.get(a.instance)
                if spec is not None:
                    self._active[a.instance] = dataclasses.replace(spec, instance_class=a.instance_class)
                    self._apply(self._sched.sync_endpoints(list(self._active.values())))
            elif isinstance(a, LoadFailed):
                self.stats.load_failures += 1
                self._cold_since.pop(a.model, None)
                self._apply(self._sched.fail_model(a.model, errors.model_load_failed(a.model, a.reason, 1.0)))

    def _start(self, a: StartInstance) -> None:
        load_s = self.core.models()[a.model].load_s
        self.stats.loads += 1
        self.stats.load_s += load_s
        name = self.config_of(a.model, a.config) or "default"
        self.stats.started_by_config[name] = self.stats.started_by_config.get(name, 0) + 1
        self._started_at[a.instance] = (self._now(), len(a.devices))
        self.stats.peak_devices = max(self.stats.peak_devices, self.devices_in_use())

    def _stopped(self, iid: str) -> None:
        now = self._now()
        eid = self._engine_of.pop(iid, None)
        if eid is not None:
            self.stats.lost_requests += self._engines.remove(eid)
        started = self._started_at.pop(iid, None)
        if started is not None:
            self.stats.device_s += started[1] * max(0.0, now - started[0])
        self._do(self.core.stopped(iid, now))

    def _loaded(self, a: StartInstance, load_s: float) -> None:
        self._do(
            self.core.started(a.instance, url=f"http://{a.instance}.sim", load_s=load_s, now=self._now())
        )

    def _join(self, iid: str, instance_class: InstanceClass) -> None:
        inst = self.core.get(iid)
        assert inst is not None
        config = self.config_of(inst.model, inst.config)
        template = self._spec_of.get((inst.model, config)) or self._spec_of[(inst.model, None)]
        eid = EndpointId(iid)
        self._active[iid] = dataclasses.replace(
            template, id=eid, url=f"http://{iid}.sim", instance_class=instance_class, node=inst.node
        )
        if iid not in self._engine_of:
            self._engine_of[iid] = eid
            self._engines.add(eid, inst.model, config)
        since = self._cold_since.pop(inst.model, None)
        if since is not None:
            self.stats.cold_waits.append(self._now() - since)
        self._apply(self._sched.sync_endpoints(list(self._active.values())))
        self._apply(self._sched.set_health(eid, EndpointHealth.READY))
