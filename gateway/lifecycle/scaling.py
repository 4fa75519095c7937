"""The autoscale loop shared by the live lifecycle manager and the fleet simulator (sans-IO).

`ScaleLoop` builds the `ScaleView` from the lifecycle's instances (`Lifecycle`), the scheduler's endpoint
views and queue, and what the driver tells it (arrivals, finished requests); runs the policy's
autoscale runner (`gateway.sched.autoscale.AutoscaleRunner`) when its interval is due; and turns the
accepted decisions into the lifecycle's actions (`Lifecycle.scale_out/scale_in/reclass`), which the
driver carries out like any other (`StartInstance` with its class and configuration, `LeaveEndpoint` +
`StopInstance` for a drained scale-in, `ReclassEndpoint`). The driver logs and exports
`runner.take_records()` after each step.

Configurations: a scale-out that names none, of a model with several (`ModelSpec.configs`), gets them
from MaaSO's placement on the model's SLO mix (`gateway.lifecycle.config_choice.ConfigChooser`, the
runner's `ConfigChoice`): one instance at a time, the default configuration when no configuration
raises the serving score; the records name the configuration and the reason says why. Live, the choice
is computed off the event loop: after each round the loop asks for each model's plan on the fleet the
round left (`ConfigChooser.prepare`), and the next round's scale-outs follow it.

The driver calls, in order of what happens: `arrived(req, now)` for every request submitted,
`finished(model, call)` for every request that finished, `step(now, endpoints)` on its tick (the loop
decides whether the interval is due) with `endpoints` mapping each joined instance id to its endpoint id.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Final

from gateway.core.slo import SloKind, SloPolicy
from gateway.core.types import EndpointId, ModelName
from gateway.lifecycle.config_choice import ConfigChooser, PlanAhead
from gateway.lifecycle.instances import (
    Action,
    Instance,
    InstanceState,
    Lifecycle,
)
from gateway.sched.autoscale import Autoscale, AutoscaleRunner
from gateway.sched.perf import PerfCoefficients
from gateway.sched.plugins.autoscale.interface import (
    FinishedCall,
    InstanceView,
    ModelScaleView,
    OpenCall,
    QueuedRequest,
    Reclass,
    ScaleIn,
    ScaleOut,
    ScaleState,
    ScaleView,
    allotted,
)
from gateway.sched.request import SchedRequest
from gateway.sched.running import deadlines, output_estimate
from gateway.sched.scheduler import Scheduler
from gateway.sched.snapshot import EndpointView

#: Arrivals older than this do not count in a model's arrival rate.
RATE_WINDOW_S: Final = 30.0

_STATE: Final = {
    InstanceState.PENDING: ScaleState.STARTING,
    InstanceState.STARTING: ScaleState.STARTING,
    InstanceState.READY: ScaleState.READY,
    InstanceState.DRAINING: ScaleState.DRAINING,
}


class ScaleLoop:
    def __init__(
        self,
        autoscale: Autoscale,
        lifecycle: Lifecycle,
        scheduler: Scheduler,
        *,
        rate_window_s: float = RATE_WINDOW_S,
        priors: Mapping[ModelName, Mapping[str, PerfCoefficients]] | None = None,
        prior: Callable[[], PerfCoefficients] | None = None,
        ahead: PlanAhead | None = None,
    ) -> None:
        """`priors`: per model and configuration, the throughput-decay curve to plan with until telemetry
        fitted one on an instance of it; else `prior()` (the gateway's telemetry prior, read at each
        choice so that a reload counts), else the generic one. `ahead`: where the choice is computed
        ahead of the rounds (the live daemon: a worker thread); None: where it is asked for (the
        simulator on its virtual clock)."""
        self.configs = ConfigChooser(lifecycle, scheduler, priors=priors, prior=prior, ahead=ahead)
        self.runner = AutoscaleRunner(autoscale.scaler, autoscale.settings, configs=self.configs)
        self._life = lifecycle
        self._sched = scheduler
        self._window = rate_window_s
        self._arrivals: dict[ModelName, deque[float]] = {}
        self._finished: dict[ModelName, list[FinishedCall]] = {}

    def set_autoscale(self, autoscale: Autoscale) -> None:
        """A reloaded policy: the new scaler and settings, the counters and cool-downs kept."""
        old = self.runner
        self.runner = AutoscaleRunner(autoscale.scaler, autoscale.settings, configs=self.configs)
        self.runner.adopt(old)

    # ----------------------------------------------------------------- what the driver reports
    def arrived(self, req: SchedRequest, now: float) -> None:
        """A request was submitted: its model's arrival rate, and its deadline in the model's SLO mix."""
        q = self._arrivals.setdefault(req.model, deque())
        q.append(now)
        self.configs.arrived(req)

    def finished(self, model: ModelName, call: FinishedCall) -> None:
        self._finished.setdefault(model, []).append(call)

    # ----------------------------------------------------------------- the step
    def step(self, now: float, endpoints: Mapping[str, EndpointId]) -> list[Action]:
        """When the interval is due: one runner round, its decisions as the lifecycle's actions."""
        if not self.runner.due(now):
            return []
        self.configs.observe()
        view = self.view(now, endpoints)
        self._finished.clear()
        out: list[Action] = []
        for d in self.runner.step(view):
            if isinstance(d, ScaleOut):
                out += self._life.scale_out(
                    d.model,
                    now,
                    instance_class=d.instance_class,
                    config=d.config,
                    count=d.count,
                    reason=d.reason or "scale_out",
                )
            elif isinstance(d, ScaleIn):
                out += self._life.scale_in(d.instance, now, reason=d.reason or "scaled_in")
            elif isinstance(d, Reclass):
                out += self._life.reclass(d.instance, d.to_class, now)
        settings = self.runner.settings
        self.configs.prepare(view, {m: settings.bounds_of(m).max_instances for m in view.models})
        return out

    def view(self, now: float, endpoints: Mapping[str, EndpointId]) -> ScaleView:
        slo = self._sched.policy.slo
        models = self._life.models()
        by_model: dict[ModelName, list[InstanceView]] = {m: [] for m in models}
        running: dict[ModelName, list[OpenCall]] = {m: [] for m in models}
        for inst in self._life.instances():
            state = _STATE.get(inst.state)
            if state is None or inst.model not in by_model:
                continue
            eid = endpoints.get(inst.id)
            ev = None if eid is None or state is not ScaleState.READY else self._sched.endpoint_view(eid)
            by_model[inst.model].append(self._instance_view(inst, state, eid, ev, slo))
            for r in () if ev is None else ev.running:
                req = self._sched.dispatched(r.id)
                if req is not None:
                    running[inst.model].append(_open_call(req, r.first_token_at, now, slo))
        out: dict[ModelName, ModelScaleView] = {}
        for m, spec in models.items():
            queued = []
            waiting = []
            for req in self._sched.queued(m):
                mean, std = output_estimate(req)
                ttft, _ = deadlines(req)
                queued.append(
                    QueuedRequest(slo.class_of(req.slo.slo_class).kind, req.arrival, ttft, mean, std * std)
                )
                waiting.append(_open_call(req, None, now, slo))
            arr = self._arrivals.get(m)
            while arr and arr[0] < now - self._window:
                arr.popleft()
            span = min(self._window, now) if now > 0 else self._window
            out[m] = ModelScaleView(
                model=m,
                instances=tuple(sorted(by_model[m], key=lambda i: i.id)),
                queued=tuple(queued),
                finished=tuple(self._finished.get(m, ())),
                arrival_rate=(len(arr) / span) if arr and span > 0 else 0.0,
                min_instances=0,
                max_instances=0,  # the runner fills the bounds in
                devices_per_instance=spec.devices,
                load_s=spec.load_s,
                configs=spec.configs,
                open_calls=(*waiting, *sorted(running[m], key=lambda c: (c.arrival, c.id))),
            )
        return ScaleView(now=now, models=out, free_devices=self._life.free_devices())

    def _instance_view(
        self,
        inst: Instance,
        state: ScaleState,
        eid: EndpointId | None,
        ev: EndpointView | None,
        slo: SloPolicy,
    ) -> InstanceView:
        interactive = batch = 0
        if ev is not None:
            for r in ev.running:
                if slo.class_of(r.slo_class).kind is SloKind.BATCH:
                    batch += 1
                else:
                    interactive += 1
        busy = interactive + batch > 0 or inst.inflight > 0
        return InstanceView(
            id=inst.id,
            model=inst.model,
            instance_class=inst.instance_class,
            config=inst.config,
            devices=len(inst.devices),
            state=state,
            created_at=inst.created_at,
            ready_at=inst.ready_at,
            running_interactive=interactive,
            running_batch=batch,
            cap=None if ev is None else ev.cap,
            idle_since=None if busy else max(inst.last_used, inst.ready_at or inst.created_at),
            endpoint=eid if ev is not None else None,
            tokens_per_s=None if ev is None else ev.tokens_per_s,
        )


def _open_call(req: SchedRequest, first_token_at: float | None, now: float, slo: SloPolicy) -> OpenCall:
    """A queued or running request on the violation measure (`allotted`); `first_token_at`: its current
    run's first token (None: queued, or none yet)."""
    e2e, allotted_s = allotted(req.slo, req.allotment)
    took: float | None
    if e2e or (req.produced_tokens == 0 and first_token_at is None):
        took = now - req.arrival  # its measure still runs
    elif req.produced_tokens == 0 and first_token_at is not None:
        took = first_token_at - req.arrival
    else:
        took = None  # resumed: its first token came in a run the scheduler no longer holds
    return OpenCall(req.id, slo.class_of(req.slo.slo_class).kind, req.arrival, allotted_s, took)
