"""The discrete-event loop: a heap of timed events over a virtual clock, no asyncio and no sockets.

What happens, and when (virtual seconds):
- the workload's schedule is the live runner's (`build_schedule`, same seed); a task's calls go out one
  after another, each after its client-side gap; a failed call ends the task;
- a call reaches berth at the instant it is sent (no network): the front's phases run (`SimGateway`),
  then `Scheduler.submit`; decisions made then or later (a completion, a tick, a scrape) are carried
  out as the live driver does: a dispatch submits the request to its endpoint's `SimEngine` (with the
  engine priority berth sends), a rejection answers the client with its status;
- an engine advances one iteration per event; each token reaches the client when its iteration ends,
  progress goes to the scheduler at the relay's cadence (the first token, then every 16), and the
  finish phase hands telemetry the same record the daemon does;
- the scheduler ticks every 0.1 s, telemetry takes the live loop's turns (`LiveTelemetry.step`: refresh,
  and the refits that are due) at its refresh interval, each endpoint is scraped at `[scrape] interval_s`
  (staggered), so stale gauges matter as they do live;
- the client gives up on a request after `request_timeout_s`, or `stall_timeout_s` without a byte (a
  queued one leaves the queue, a running one is aborted in its engine);
- after the last arrival, tasks still running get `drain_timeout_s`, then their requests are
  `unfinished`, as in the live runner;
- engines with prefix caching get each prompt's token ids (the simulator's tokenizer over the body sent)
  and cache its blocks as the HTTP simulator does; `engine_cache` shows an endpoint's true cache;
- a preemption (`Preempt`) aborts the victim's engine request (the engine's running count drops) and
  leaves its client waiting; when berth places it again, the engine gets the prompt plus the tokens the
  client already has, and the output still to come, so it recomputes that prefix (counted as
  `recomputed_tokens`: the prompt and produced tokens prefilled again) and the client sees one stream
  (the pause is one long inter-token gap). Progress reports count the tokens of the current run.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import random
import time
from array import array
from collections.abc import Sequence
from typing import Any, Final

from gateway.core.types import ModelName, RequestId
from loadgen.client import RequestResult
from loadgen.engine_sim.engine import SimRequest
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim.clock import VirtualClock
from loadgen.fleetsim.collector import SimCollector
from loadgen.fleetsim.gateway import SimGateway
from loadgen.fleetsim.lifecycle import EngineHooks, SimLifecycle
from loadgen.fleetsim.options import SimOptions, schedule_of
from loadgen.fleetsim.runs import RunEngine
from loadgen.fleetsim.sim_client import ClientSide
from loadgen.fleetsim.sim_decisions import DecisionSide
from loadgen.fleetsim.sim_engines import EngineSide
from loadgen.fleetsim.sim_state import (
    _ARRIVE,
    _CHECK,
    _DRAIN,
    _LIFE,
    _PUBLISH,
    _REFRESH,
    _SAMPLE,
    _SCRAPE,
    _SEND,
    _TICK,
    _WAKE,
    TICK_S,
    Event,
)
from loadgen.fleetsim.streams import Call, Endpoint
from loadgen.fleetsim.timeline import FleetTimeline
from loadgen.report import GapHistogram, Report, TaskResult, build_report
from loadgen.workloads.base import TaskSpec

#: What the simulator leaves out (written at the top of its report).
LEFT_OUT: Final = (
    "network: every request, token and scrape arrives the instant it is sent (no HTTP, no loopback)",
    "the daemon's CPU: berth's decisions, parsing and relaying take no virtual time",
    "engine faults and retries: simulated engines never fail",
    "the scrapers' health checks: every endpoint is ready from the start",
)


class Simulation(ClientSide, EngineSide, DecisionSide):
    def __init__(self, opts: SimOptions) -> None:
        self.opts = opts
        self.clock = VirtualClock()
        if opts.replicas < 1 or (opts.replicas > 1 and opts.lifecycle is not None):
            raise ValueError("replicas must be >= 1, and 1 with a lifecycle")
        self.gws = [SimGateway(opts, self.clock) for _ in range(opts.replicas)]
        self.gw = self.gws[0]  # the configuration's reader, and the one replica without cluster mode
        for gw in self.gws[1:]:
            gw.slo = self.gw.slo  # task clocks are shared (Redis) in cluster mode
        self._turn = 0  # the next call's replica (round robin)
        # With a lifecycle, the fleet's endpoints are templates (one per model): every instance the
        # lifecycle starts gets an engine of its own, made when it joins (`_add_engine`).
        # (model, configuration) -> its template; (model, None): the model's first (the default's).
        self._templates: dict[tuple[ModelName, str | None], EndpointSpec] = {}
        for spec in opts.fleet:
            for m in spec.models:
                self._templates.setdefault((ModelName(m), None), spec)
                self._templates.setdefault((ModelName(m), spec.config), spec)
        self.endpoints = (
            []
            if opts.lifecycle is not None
            else [
                Endpoint(eid, RunEngine(spec.resolve().engine, max_run=opts.max_run))
                for eid, spec in zip(self.gw.ids, opts.fleet, strict=True)
            ]
        )
        self._by_id = {e.id: e for e in self.endpoints}
        self._caching = any(s.resolve_prefix_cache() for s in opts.fleet)
        if opts.prefix == "oracle":
            for e in self.endpoints:
                self.gw.attach_oracle(e.id, e.engine)
        elif opts.prefix == "precise":
            for e in self.endpoints:
                self.gw.attach_events(e.id, e.engine)
        self._heap: list[Event] = []
        self._reports: list[Event] = []  # progress reports' events (`push_report`)
        # reports of a burst, not yet handed over (with one replica the reports alone, else (replica, report))
        self._progress_out: list[Any] = []
        self._seq = itertools.count()
        self._running: dict[RequestId, Call] = {}  # berth's id -> the call (queued or running)
        self._on_engine: dict[SimRequest, Call] = {}  # an engine's request -> its call
        self.requests: list[RequestResult] = []
        self.tasks: list[TaskResult] = []
        self.gaps: dict[str, GapHistogram] = {}
        self._gap_buffer: dict[str, array[float]] = {}  # per class, gaps not yet in `gaps`
        self.timeline = FleetTimeline(len(self.endpoints))
        self.events = 0
        self.faults = 0
        self.preemptions = 0
        self.resumes = 0
        self.recomputed_tokens = 0
        self._open_tasks = 0
        self._last_arrival = 0.0
        self._draining_until = math.inf
        self._ended = False
        self.life: SimLifecycle | None = None
        self.collector = SimCollector(lambda: len(self._running)) if opts.collector == "daemon" else None

    # ----------------------------------------------------------------- the loop
    def run(self) -> Report:
        """The simulation, from bringing the fleet up to the report (under the daemon's collector schedule
        from start to end with `SimOptions.collector` "daemon")."""
        collector = self.collector
        if collector is None:
            return self._run()
        collector.start()
        try:
            return self._run()
        finally:
            collector.stop()

    def _run(self) -> Report:
        opts = self.opts
        started = time.perf_counter()
        for gw in self.gws:
            gw.bring_up(opts.fleet)
        models = list(opts.models) if opts.models else self.gw.listed_models()
        self.models = models
        if opts.lifecycle is not None:
            specs = [
                dataclasses.replace(s, models=frozenset(ModelName(m) for m in f.models))
                for s, f in zip(self.gw.specs, opts.fleet, strict=True)
            ]
            self.life = SimLifecycle(
                opts.lifecycle,
                self.gw.scheduler,
                specs,
                now=self.clock.now,
                later=lambda dt, f: self.push(self.clock.t + dt, _LIFE, f),
                apply=self._apply,
                engines=EngineHooks(add=self._add_engine, remove=self._remove_engine, load=self._engine_load),
                prior=lambda: self.gw.telemetry.fleet.settings.prior,
            )
            self.life.install()
        schedule = sorted(schedule_of(opts), key=lambda s: s.at_s)
        for spec in schedule:
            self.push(spec.at_s, _ARRIVE, spec)
        self._open_tasks = len(schedule)
        self._last_arrival = schedule[-1].at_s if schedule else 0.0
        self.push(TICK_S, _TICK)
        self.push(self.gw.cfg.telemetry.refresh_interval_s, _REFRESH)
        if len(self.gws) > 1:
            self.push(opts.publish_interval_s, _PUBLISH)
        self.push(0.0, _SAMPLE)
        interval = self.gw.cfg.scrape.interval_s
        n = len(self.endpoints)
        for i, ep in enumerate(self.endpoints if self.life is None else ()):  # lifecycle engines: _add_engine
            self.push(interval * i / n, _SCRAPE, ep)
        self.push(self._last_arrival + opts.drain_timeout_s, _DRAIN)
        self._loop()
        wall = time.perf_counter() - started
        return self._report(schedule, wall)

    def _loop(self) -> None:
        heap = self._heap
        clock = self.clock
        pop = heapq.heappop
        refresh_every = self.gw.cfg.telemetry.refresh_interval_s
        scrape_every = self.gw.cfg.scrape.interval_s
        reports = self._reports
        collector = self.collector
        deliver, step, send = self._deliver, self._step, self._send
        wake, send_kind = _WAKE, _SEND
        handled = 0  # the heap's events handled (the reports' count themselves in `_deliver`)
        while heap and not self._ended:
            event = pop(heap)
            if reports and reports[0] < event:
                deliver(event)  # the progress reports due before it
            t, kind, _, obj = event
            clock.t = t
            handled += 1
            if kind == wake:
                if obj.wake_at == t and not obj.removed:  # else a wake that a later step replaced
                    obj.wake_at = None
                    step(obj)
            elif kind == send_kind:
                send(*obj)
            elif kind == _ARRIVE:
                self._arrive(obj)
            elif kind == _TICK:
                if collector is not None:
                    collector.step()
                if self.life is not None:
                    self.life.tick()
                for gw in self.gws:
                    self._apply(gw.scheduler.tick(), gw)
                if self._busy():
                    self.push(t + TICK_S, _TICK)
            elif kind == _SCRAPE:
                if obj.removed:
                    continue
                self._scrape(obj)
                if self._busy():
                    self.push(t + scrape_every, _SCRAPE, obj)
            elif kind == _REFRESH:
                for gw in self.gws:
                    gw.telemetry.step()  # the live loop's turn: refresh, and the refit that is due
                if self._busy():
                    self.push(t + refresh_every, _REFRESH)
            elif kind == _SAMPLE:
                self._sample()
                if self._busy():
                    self.push(t + self.opts.sample_every_s, _SAMPLE)
            elif kind == _CHECK:
                self._check(obj)
            elif kind == _LIFE:
                obj()  # a simulated agent's start or stop ends
            elif kind == _PUBLISH:
                self._publish()
                if self._busy():
                    self.push(t + self.opts.publish_interval_s, _PUBLISH)
            else:  # _DRAIN
                self._drain()
        self.events += handled
        if not self._ended:
            self._deliver((math.inf, _WAKE, 0, None))

    # ----------------------------------------------------------------- the report
    def _report(self, schedule: Sequence[TaskSpec], wall: float) -> Report:
        opts = self.opts
        end = max((r.sent_at_s + (r.e2e_s or 0.0) for r in self.requests), default=0.0)
        first = schedule[0].at_s if schedule else 0.0
        meta = {
            "target": "fleetsim",
            "workload": opts.workload,
            "workload_options": opts.workload_options.to_dict(),
            "rate": opts.rate,
            "duration_s": opts.duration_s,
            "arrival": opts.arrival,
            "cv": opts.cv,
            "seed": opts.seed,
            "slo_scale": 1.0,
            "gap_scale": 1.0,
            "models": self.models,
            "started_at_unix": None,
        }
        for cls in list(self._gap_buffer):
            self._flush_gaps(cls)
        requests = sorted(self.requests, key=lambda r: (r.sent_at_s, r.task_index, r.call_index))
        tasks = sorted(self.tasks, key=lambda t: t.index)
        report = build_report(run=meta, requests=requests, tasks=tasks, wall_s=end - first, gaps=self.gaps)
        report.data["simulation"] = {
            "left_out": list(LEFT_OUT),
            "policy": self.gw.policy.name,
            "endpoints": len(self.endpoints),
            "events": self.events,
            "wall_s": round(wall, 3),
            "events_per_s": round(self.events / wall, 1) if wall > 0 else None,
            "requests_per_s": round(len(self.requests) / wall, 1) if wall > 0 else None,
            "policy_faults": self.faults,
            "preemptions": self.preemptions,
            "resumes": self.resumes,
            "recomputed_tokens": self.recomputed_tokens,
        }
        caches = [c for ep in self.endpoints if (c := ep.engine.prefix_cache) is not None]
        if caches:
            queries, hits = sum(c.queries for c in caches), sum(c.hits for c in caches)
            report.data["simulation"]["prefix_cache"] = {
                "queries_tokens": queries,
                "hits_tokens": hits,
                "hit_rate": round(hits / queries, 4) if queries else None,
                "evicted_blocks": sum(c.evictions for c in caches),
            }
        report.data["fleet"] = self.timeline.summary(len(self.endpoints))
        if self.life is not None:
            self.life.close(at=end)
            report.data["lifecycle"] = self.life.stats.document()
        return report


def simulate(opts: SimOptions) -> Report:
    """Run one simulation to the end; the same seed gives the same report (but its `simulation` wall
    figures)."""
    random.seed(opts.seed)  # nothing should read the global RNG; if something does, it is seeded
    return Simulation(opts).run()
