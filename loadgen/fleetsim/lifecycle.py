"""Model lifecycle in the fleet simulator: the gateway's own state machine (`gateway.lifecycle.instances`,
with its `Evictor` plugin) driving simulated node agents on the virtual clock.

The agent's behaviour is simulated: a start takes the model's load time (memory admission and one load
per device are the state machine's, as the real agent also enforces them), a stop takes `stop_s` (drain
already done by the gateway; SIGTERM, exit, memory seen free). Each model has one simulated engine (its
endpoint in the fleet file, `id` = the model name); it is in the scheduler's endpoint set only while an
instance of the model is ready, exactly as the live manager adds and removes agent-started endpoints.

Counted: loads and load seconds, stops by reason (evictions), model hit rate (requests whose model had a
ready instance when they arrived), and the waits from a model's first cold request to its instance joining;
for every eviction: how many instances were evictable (did the evictor have a choice), how many of them had
a known or predicted next request (the demand term's data), and whether each `compare` evictor would have
picked other victims on the same state.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.core import errors
from gateway.core.types import EndpointHealth, EndpointId, ModelName
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
    StartInstance,
    StopInstance,
)
from gateway.sched.decisions import Decision
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.eviction.interface import Evictor
from gateway.sched.registry import PluginKind
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.types import EndpointSpec


@dataclass(frozen=True, slots=True)
class LifecycleOptions:
    models: tuple[ModelSpec, ...]  # load_s: the simulated agent's load time
    nodes: tuple[NodeSpec, ...]
    evictor: str = "cace"
    evictor_params: Mapping[str, Any] = field(default_factory=dict)
    settings: LifecycleSettings = field(default_factory=LifecycleSettings)
    stop_s: float = 2.0
    demand_history: int = DEFAULT_HISTORY  # recent requests whose shares predict demand
    # A prebuilt evictor instead of `evictor` (the eviction benchmark's clairvoyant oracle).
    evictor_impl: Evictor | None = None
    # Evictors whose victims are worked out on the same state at every eviction (`PlanStats.differs`).
    compare: tuple[Evictor, ...] = ()


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
    cold_waits: list[float] = field(default_factory=list)

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
            "cold_wait_mean_s": round(sum(self.cold_waits) / len(self.cold_waits), 3)
            if self.cold_waits
            else None,
        }


def build_evictor(name: str, params: Mapping[str, Any]) -> Evictor:
    ev = default_registry().build(PluginKind.EVICTOR, name, dict(params), path="lifecycle.evictor")
    assert isinstance(ev, Evictor)
    return ev


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
    ) -> None:
        self.opts = opts
        self._sched = scheduler
        self._now = now
        self._later = later  # run a callback at a virtual time
        self._apply = apply
        self._spec_of = {ModelName(next(iter(s.models))): s for s in specs if s.models}
        missing = [m.name for m in opts.models if m.name not in self._spec_of]
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
        self._active: dict[str, EndpointSpec] = {}  # instance id -> its endpoint, while in the set
        self._eids: dict[EndpointId, str] = {}
        self._traffic = DemandTracker(opts.demand_history)
        self._cold_since: dict[ModelName, float] = {}
        self.stats = LifecycleStats()

    def install(self) -> None:
        """An empty endpoint set; every model loadable on demand."""
        self._apply(self._sched.sync_endpoints([]))
        self._sched.set_loadable(self.core.models(), self.opts.settings.load_deadline_s)

    # ----------------------------------------------------------------- events from the simulation
    def before_submit(self, model: ModelName) -> None:
        if model in self._sched.models(ready_only=True):
            self.stats.hits += 1
        else:
            self.stats.misses += 1

    def after_submit(self) -> None:
        if not self._sched.cold:
            return
        now = self._now()
        self._sync_inflight()
        for m in self._sched.take_cold():
            self._cold_since.setdefault(m, now)
            self._do(self.core.request(m, now))

    def on_dispatch(self, req: SchedRequest, eid: EndpointId) -> None:
        iid = self._eids.get(eid)
        if iid is not None:
            self.core.touch(iid, self._now())
        expect = req.predicted_output_tokens if req.predicted_output_tokens is not None else req.max_tokens
        self._traffic.dispatched(req.model, expect)

    def tick(self) -> None:
        self._sync_inflight()
        self._do(self.core.tick(self._now()))

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
        for eid, iid in list(self._eids.items()):
            self._do(self.core.observe_inflight(iid, self._sched.inflight_on(eid), now))

    def _do(self, actions: Sequence[Action]) -> None:
        for a in actions:
            if isinstance(a, StartInstance):
                load_s = self.core.models()[a.model].load_s
                self.stats.loads += 1
                self.stats.load_s += load_s
                self._later(load_s, functools.partial(self._loaded, a, load_s))
            elif isinstance(a, StopInstance):
                self.stats.stops[a.reason] = self.stats.stops.get(a.reason, 0) + 1
                self._later(self.opts.stop_s, functools.partial(self._stopped, a.instance))
            elif isinstance(a, JoinEndpoint):
                self._join(a.instance)
            elif isinstance(a, LeaveEndpoint):
                if self._active.pop(a.instance, None) is not None:
                    self._apply(self._sched.sync_endpoints(list(self._active.values())))
            elif isinstance(a, LoadFailed):
                self.stats.load_failures += 1
                self._cold_since.pop(a.model, None)
                self._apply(self._sched.fail_model(a.model, errors.model_load_failed(a.model, a.reason, 1.0)))

    def _stopped(self, iid: str) -> None:
        self._do(self.core.stopped(iid, self._now()))

    def _loaded(self, a: StartInstance, load_s: float) -> None:
        self._do(
            self.core.started(a.instance, url=f"http://{a.instance}.sim", load_s=load_s, now=self._now())
        )

    def _join(self, iid: str) -> None:
        inst = self.core.get(iid)
        assert inst is not None
        spec = self._spec_of[inst.model]
        # One simulated engine per model: a later instance of the model reuses its endpoint id.
        for other, s in list(self._active.items()):
            if s.id == spec.id:
                del self._active[other]
        self._active[iid] = dataclasses.replace(spec, node=inst.node)
        self._eids[spec.id] = iid
        since = self._cold_since.pop(inst.model, None)
        if since is not None:
            self.stats.cold_waits.append(self._now() - since)
        self._apply(self._sched.sync_endpoints(list(self._active.values())))
        self._apply(self._sched.set_health(spec.id, EndpointHealth.READY))
