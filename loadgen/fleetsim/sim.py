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
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import orjson

from gateway.core import errors
from gateway.core.errors import BerthError
from gateway.core.types import ApiKind, EndpointId, EngineGauges, ModelName, RequestId
from gateway.dispatch.context import RequestContext
from gateway.sched.decisions import Decision, Dispatch, Preempt
from gateway.sched.types import PeerLoad
from gateway.upstream.dialects import dialect_for
from loadgen.client import RequestResult, build_body, build_headers
from loadgen.engine_sim.engine import RequestState, SimRequest
from loadgen.engine_sim.prefix_cache import PrefixCacheView
from loadgen.engine_sim.protocol import prompt_token_ids
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.engine_sim.tokens import GENERATED_TOKEN_ID, TokenIds
from loadgen.fleetsim.clock import VirtualClock
from loadgen.fleetsim.gateway import SimGateway
from loadgen.fleetsim.lifecycle import EngineHooks, SimLifecycle
from loadgen.fleetsim.options import SimOptions
from loadgen.fleetsim.prefix_oracle import hit_counters
from loadgen.fleetsim.runs import RunEngine
from loadgen.fleetsim.streams import PROGRESS_EVERY, Call, Endpoint, Reports, Task, hand_out, plan_reports
from loadgen.fleetsim.timeline import FleetTimeline
from loadgen.report import GapHistogram, Report, TaskResult, build_report, complete_task
from loadgen.runner import RunOptions, build_schedule
from loadgen.workloads import get_workload
from loadgen.workloads.base import TaskSpec
from loadgen.workloads.prompt import call_salt

#: The daemon's queue ticker period (gateway.app.QUEUE_TICK_S).
TICK_S: Final = 0.1
#: Finished requests' gaps are counted into the report's histograms this many at a time.
GAP_BATCH: Final = 65536

_API: Final = {"chat": ApiKind.CHAT, "completion": ApiKind.COMPLETION}

# Event kinds, in the order events of the same instant are handled (a progress report is a token's, as
# an engine's wake is).
_WAKE, _SEND, _ARRIVE, _TICK, _SCRAPE, _REFRESH, _SAMPLE, _CHECK, _DRAIN, _LIFE, _PUBLISH = range(11)
_REPORT: Final = _WAKE

#: What the simulator leaves out (written at the top of its report).
LEFT_OUT: Final = (
    "network: every request, token and scrape arrives the instant it is sent (no HTTP, no loopback)",
    "the daemon's CPU: berth's decisions, parsing and relaying take no virtual time",
    "engine faults and retries: simulated engines never fail",
    "the scrapers' health checks: every endpoint is ready from the start",
)


class Simulation:
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
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._running: dict[RequestId, Call] = {}  # berth's id -> the call (queued or running)
        self._on_engine: dict[SimRequest, Call] = {}  # an engine's request -> its call
        self.requests: list[RequestResult] = []
        self.tasks: list[TaskResult] = []
        self.gaps: dict[str, GapHistogram] = {}
        self._gap_buffer: dict[str, list[float]] = {}  # per class, gaps not yet in `gaps`
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

    # ----------------------------------------------------------------- the loop
    def push(self, t: float, kind: int, obj: Any = None) -> None:
        heapq.heappush(self._heap, (t, kind, next(self._seq), obj))

    def run(self) -> Report:
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
        run_opts = RunOptions(
            target="sim",
            workload=opts.workload,
            rate=opts.rate,
            duration_s=opts.duration_s,
            arrival=opts.arrival,
            cv=opts.cv,
            seed=opts.seed,
        )
        if opts.schedule is None:
            tasks: Sequence[TaskSpec] = build_schedule(
                get_workload(opts.workload, opts.workload_options), run_opts
            )
        else:
            tasks = opts.schedule
        schedule = sorted(tasks, key=lambda s: s.at_s)
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
        while heap and not self._ended:
            t, kind, _, obj = pop(heap)
            clock.t = t
            self.events += 1
            if kind == _WAKE:
                if obj.__class__ is Reports:
                    self._progress(obj)
                elif obj.wake_at == t and not obj.removed:  # else a wake that a later step replaced
                    obj.wake_at = None
                    self._step(obj)
            elif kind == _SEND:
                self._send(*obj)
            elif kind == _ARRIVE:
                self._arrive(obj)
            elif kind == _TICK:
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

    # ----------------------------------------------------------------- engines of lifecycle instances
    def _add_engine(self, eid: EndpointId, model: ModelName, config: str | None) -> None:
        template = self._templates.get((model, config)) or self._templates[(model, None)]
        ep = Endpoint(eid, RunEngine(template.resolve().engine, max_run=self.opts.max_run))
        if self.opts.prefix == "oracle":
            self.gw.attach_oracle(eid, ep.engine)
        elif self.opts.prefix == "precise":
            self.gw.attach_events(eid, ep.engine)
        self.endpoints.append(ep)
        self._by_id[eid] = ep
        self.push(self.clock.t + self.gw.cfg.scrape.interval_s, _SCRAPE, ep)

    def _remove_engine(self, eid: EndpointId) -> int:
        """The instance stopped: its engine goes, and the requests still on it fail (their clients get
        an error, as when a real engine is stopped under them). Returns how many there were."""
        ep = self._by_id.pop(eid, None)
        if ep is None:
            return 0
        ep.removed = True
        self.endpoints.remove(ep)
        lost = [c for c in self._on_engine.values() if c.endpoint is ep]
        for call in lost:
            self._engine_lost(call)
        return len(lost)

    def engine_cache(self, eid: EndpointId) -> PrefixCacheView | None:
        """The true prefix cache of endpoint `eid`'s engine, read-only (None: no such endpoint, or no
        caching): ``view.cached_prefix_tokens(view.block_keys(ids))`` is how much of a prompt it holds."""
        ep = self._by_id.get(eid)
        return None if ep is None else ep.engine.prefix_cache

    def _engine_load(self, eid: EndpointId) -> int:
        ep = self._by_id.get(eid)
        return 0 if ep is None else ep.engine.num_running + ep.engine.num_waiting

    def _engine_lost(self, call: Call) -> None:
        ep = call.endpoint
        if call.engine_req is not None:
            if ep is not None:
                self._cut(ep)
                ep.engine.abort(call.engine_req)
            self._on_engine.pop(call.engine_req, None)
            call.engine_req = None
        if call.sreq_id is not None:
            self._running.pop(call.sreq_id, None)
            self._record_stream(call)
            self._apply(call.gw.scheduler.complete(call.sreq_id), call.gw)
        err = errors.upstream_status(502, "the engine instance was stopped")
        call.ctx.fail(err)
        call.gw.finish(call.ctx)
        call.result.status = err.status
        self._client_done(call, ok=False, error="engine_stopped")

    def _busy(self) -> bool:
        """Whether anything can still happen (tasks open): periodic events stop once nothing can."""
        return self._open_tasks > 0

    # ----------------------------------------------------------------- the client
    def _arrive(self, spec: TaskSpec) -> None:
        now = self.clock.t
        res = TaskResult(
            spec.index,
            spec.task_id,
            spec.task_type,
            spec.at_s,
            len(spec.calls),
            spec.task_sla_ms,
            spec.sla_metric,
        )
        self.tasks.append(res)
        task = Task(spec, res, now)
        self._next_call(task, 0)

    def _next_call(self, task: Task, i: int) -> None:
        gap = task.spec.calls[i].gap_before_s
        if gap > 0:
            self.push(self.clock.t + gap, _SEND, (task, i))
        else:
            self._send(task, i)

    def _send(self, task: Task, i: int) -> None:
        opts = self.opts
        now = self.clock.t
        spec = task.spec
        call_spec = spec.calls[i]
        model = call_spec.model or self.models[call_spec.model_slot % len(self.models)]
        result = RequestResult(
            task_index=spec.index,
            call_index=i,
            task_id=spec.task_id,
            task_type=spec.task_type,
            cls=call_spec.cls,
            model=model,
            api=call_spec.api,
            prompt_tokens=call_spec.prompt_tokens,
            output_tokens=call_spec.output_tokens,
            slo=call_spec.slo,
            sent_at_s=now,
        )
        self.requests.append(result)
        task.result.calls_sent += 1
        rid = f"sim-{spec.index}-{i}"
        ctx = RequestContext(id=rid, api=_API[call_spec.api], arrival=now)
        gw = self.gws[self._turn]
        self._turn = (self._turn + 1) % len(self.gws)
        call = Call(task, i, result, ctx, gw)
        call.last_byte = now
        task.sent.append(result)
        body = build_body(call_spec, model, salt=call_salt(spec.index, i, opts.seed))
        if self._caching:
            call.prompt_ids = prompt_token_ids(call_spec.api, orjson.loads(body))
        headers = build_headers(
            spec, call_spec, dict(opts.extra_headers), slo_scale=1.0, slo_headers=opts.slo_headers
        )
        try:
            sreq = gw.admit(ctx, ctx.api, body, list(headers.items()))
        except BerthError as e:
            self._reject(call, e)
            return
        call.sreq_id = sreq.id
        self._running[sreq.id] = call
        if self.life is not None:
            self.life.before_submit(sreq)
        decision = gw.scheduler.submit(sreq)
        self._count_faults()
        made: list[Decision] = list(gw.scheduler.take_preemptions())
        if decision is not None:
            made.append(decision)
        if made:
            self._apply(made, gw)
        if self.life is not None:
            self.life.after_submit()
        if not call.done:
            self.push(now + min(opts.stall_timeout_s, opts.request_timeout_s), _CHECK, call)

    def _check(self, call: Call) -> None:
        """The client's timers: the whole request, and the silence since its last byte."""
        if call.done:
            return
        if call.endpoint is not None:  # its last byte may be in a run not yet handed out
            self._sync(call.endpoint)
        now = self.clock.t
        opts = self.opts
        total_at = call.result.sent_at_s + opts.request_timeout_s
        stall_at = call.last_byte + opts.stall_timeout_s
        if now >= total_at or now >= stall_at:
            self._give_up(call, "timeout")
        else:
            self.push(min(total_at, stall_at), _CHECK, call)

    def _give_up(self, call: Call, error: str) -> None:
        """The client stops waiting: berth sees a disconnect (queue slot or engine request freed)."""
        ctx = call.ctx
        if call.sreq_id is not None:
            self._running.pop(call.sreq_id, None)
            if call.endpoint is None:
                call.gw.scheduler.cancel(call.sreq_id)
            else:
                if call.engine_req is not None:
                    self._cut(call.endpoint)
                    call.endpoint.engine.abort(call.engine_req)
                    self._on_engine.pop(call.engine_req, None)
                self._record_stream(call)
                self._apply(call.gw.scheduler.complete(call.sreq_id), call.gw)
        ctx.outcome = "client_disconnect"
        ctx.status = ctx.status or 499
        call.gw.finish(ctx)
        self._client_done(call, ok=False, error=error)

    def _reject(self, call: Call, err: BerthError) -> None:
        call.ctx.fail(err)
        if call.sreq_id is not None:
            self._running.pop(call.sreq_id, None)
        call.gw.finish(call.ctx)
        res = call.result
        res.status = err.status
        res.detail = err.json_bytes()[:300].decode("utf-8", "replace")
        self._client_done(call, ok=False, error=f"http_{err.status}")

    def _client_done(self, call: Call, *, ok: bool, error: str | None = None) -> None:
        call.done = True
        res = call.result
        now = self.clock.t
        if ok:
            res.ok = True
            res.status = 200
            res.e2e_s = now - res.sent_at_s
            res.tokens = call.produced
            if call.produced > 1 and res.ttft_s is not None:
                first = res.sent_at_s + res.ttft_s
                res.atgt_s = (call.last_byte - first) / (call.produced - 1)
            res.slo_met = res.slo.met(_ms(res.ttft_s), _ms(res.atgt_s), _ms(res.e2e_s))
            if call.gaps:
                pending = self._gap_buffer.get(res.cls)
                if pending is None:
                    pending = self._gap_buffer[res.cls] = []
                    if res.cls not in self.gaps:  # the histograms in the order their classes first finished
                        self.gaps[res.cls] = GapHistogram()
                pending.extend(call.gaps)
                if len(pending) >= GAP_BATCH:
                    self._flush_gaps(res.cls)
                call.gaps = []  # telemetry's record keeps its own reference until the next refresh
        else:
            res.error = error
            res.tokens = call.produced
        task = call.task
        spec = task.spec
        if ok and call.index + 1 < len(spec.calls):
            self._next_call(task, call.index + 1)
            return
        self._task_done(task, ok)

    def _flush_gaps(self, cls: str) -> None:
        """Count a class's buffered gaps into its histogram (one histogram update per `GAP_BATCH` gaps
        instead of one per request: the same counts)."""
        pending = self._gap_buffer.pop(cls, None)
        if pending:
            self.gaps[cls].add_many(pending)

    def _task_done(self, task: Task, ok: bool) -> None:
        if ok:
            complete_task(task.result, task.sent, task.start)
        self._open_tasks -= 1

    def _drain(self) -> None:
        """The runner's drain limit passed: whatever is still open ends as `unfinished`."""
        for call in list(self._running.values()):
            if not call.done:
                self._give_up(call, "unfinished")
        self._ended = True

    # ----------------------------------------------------------------- berth's decisions
    def _apply(self, decisions: Sequence[Decision], gw: SimGateway | None = None) -> None:
        """Carry out the decisions of replica `gw`'s scheduler (None: the first, the only one without
        cluster mode)."""
        self._count_faults()
        for d in decisions:
            if isinstance(d, Preempt):
                self._preempted(d)
                continue
            call = self._running.get(d.req.id)
            if call is None or call.done:
                if isinstance(d, Dispatch):  # nobody waits for it any more: give the seat back
                    src = gw or self.gw
                    self._apply(src.scheduler.complete(d.req.id), src)
                continue
            if isinstance(d, Dispatch):
                self._dispatch(call, d)
            else:
                self._reject(call, d.error)

    def _preempted(self, d: Preempt) -> None:
        """Abort the victim's engine request; its client keeps waiting for the rest of its stream."""
        self.preemptions += 1
        call = self._running.get(d.victim.id)
        if call is None or call.endpoint is None:
            return
        ep = call.endpoint
        if call.engine_req is not None:
            self._cut(ep)
            ep.engine.abort(call.engine_req)
            self._on_engine.pop(call.engine_req, None)
            call.engine_req = None
        call.endpoint = None
        if ep.wake_at is None:
            self._step(ep)

    def _dispatch(self, call: Call, d: Dispatch) -> None:
        now = self.clock.t
        ep = self._by_id[d.endpoint.id]
        ctx = call.ctx
        ctx.attempts += 1
        ctx.endpoint = ep.id
        ctx.dispatched_at = now
        if self.life is not None:
            self.life.on_dispatch(d.req, ep.id)
        self.gw.dispatched(ctx, d.req, ep.id)
        call.endpoint = ep
        call.result.endpoint = ep.id
        spec = call.task.spec.calls[call.index]
        done = call.produced  # tokens the client has from earlier, preempted runs
        if done:
            self.resumes += 1
            self.recomputed_tokens += spec.prompt_tokens + done
        else:
            call.result.queue_ms = round((now - ctx.arrival) * 1000.0, 3)
        call.run_base = done
        call.run_first_at = None
        call.report_at = done + 1
        priority = spec.priority or 0
        if d.endpoint.priority_scheduling:
            urgency = call.gw.scheduler.engine_priority(d.req.id)
            if urgency is not None:
                priority = dialect_for(d.endpoint.engine).priority(urgency)
        self._cut(ep)  # the iterations after the one in flight may admit it
        try:
            call.engine_req = ep.engine.submit(
                d.req.id,
                # the engine counts the prompt it gets (the body's tokens, when an engine caches)
                prompt_tokens=(spec.prompt_tokens if call.prompt_ids is None else len(call.prompt_ids))
                + done,
                output_tokens=max(1, spec.output_tokens - done),
                max_tokens=max(1, spec.output_tokens - done),
                priority=priority,
                now=now,
                token_ids=_with_output(call.prompt_ids, done),
            )
        except ValueError as e:  # the engine refuses what cannot fit its KV cache (a 400 live)
            self._running.pop(d.req.id, None)
            self._apply(call.gw.scheduler.complete(d.req.id), call.gw)
            self._reject(call, errors.upstream_status(400, str(e)))
            return
        self._on_engine[call.engine_req] = call
        if ep.wake_at is None:
            self._step(ep)

    def _count_faults(self) -> None:
        for gw in self.gws:
            sched = gw.scheduler
            if sched.faults:
                self.faults += len(sched.take_faults())

    def _publish(self) -> None:
        """Cluster mode's beat: every replica's own load per endpoint, summed over the others, handed to
        each replica's scheduler (gateway.cluster.member; Redis's round trip is not modelled)."""
        own = [gw.scheduler.own_loads() for gw in self.gws]
        for i, gw in enumerate(self.gws):
            peers: dict[EndpointId, PeerLoad] = {}
            for j, loads in enumerate(own):
                if j == i:
                    continue
                for eid, v in loads.items():
                    was = peers.get(eid)
                    peers[eid] = (
                        v
                        if was is None
                        else PeerLoad(
                            was.inflight + v.inflight,
                            was.prompt_tokens + v.prompt_tokens,
                            was.output_tokens + v.output_tokens,
                        )
                    )
            self._apply(gw.scheduler.observe_peers(peers), gw)

    # ----------------------------------------------------------------- the engines
    def _step(self, ep: Endpoint) -> None:
        """Advance an engine to now; its next iteration end (a run's last) becomes its one pending wake.
        The wake is set before the tokens are handed out: a dispatch they cause to this engine then cuts
        the run and waits for the iteration in flight instead of stepping it again. A new run's progress
        reports are planned after its first tokens are handed out."""
        now = self.clock.t
        eng = ep.engine
        result = eng.step(now)
        wake = result.next_wake
        if wake is not None and wake != ep.wake_at:
            ep.wake_at = wake
            self.push(wake, _WAKE, ep)
        if eng.committed:
            hand_out(self._on_engine, eng.take_committed())
        self._tokens(result.woken, now)
        run = eng.run
        if run is not None and run is not ep.run_seen:
            ep.run_seen = run
            plan = plan_reports(self._on_engine, run)
            if plan is not None:
                self.push(max(run.ends[plan.at], now), _REPORT, plan)

    def _tokens(self, woken: Sequence[SimRequest], now: float) -> None:
        """One token for each request of `woken`, at `now` (an iteration run one at a time)."""
        on_engine = self._on_engine
        finished = RequestState.FINISHED
        for req in woken:
            call = on_engine.get(req)
            if call is None:
                continue
            produced = call.produced + 1
            if produced > 1 and produced < call.report_at and req.state is not finished:
                # the common case, inline (once per token): one more gap, nothing to report
                call.gaps.append(now - call.last_byte)
                call.produced = produced
                call.last_byte = now
            else:
                self._token(call, req, now)

    # ----------------------------------------------------------------- runs: iterations as events
    def _sync(self, ep: Endpoint) -> None:
        """The engine brought to now (KV of the iteration in flight, ended iterations handed out)."""
        eng = ep.engine
        if eng.run is not None:
            eng.sync(self.clock.t)
            if eng.committed:
                hand_out(self._on_engine, eng.take_committed())

    def _cut(self, ep: Endpoint) -> None:
        """Before an outside change to the engine (a submit, an abort): its run ends after the iteration
        in flight, whose end becomes the engine's wake."""
        eng = ep.engine
        if eng.run is None:
            return
        eng.cut(self.clock.t)
        if eng.committed:
            hand_out(self._on_engine, eng.take_committed())
        wake = eng.next_wake
        if wake is not None and wake != ep.wake_at:
            ep.wake_at = wake
            self.push(wake, _WAKE, ep)

    def _progress(self, plan: Reports) -> None:
        """The reports at iteration `plan.at` of a run, then the next such event."""
        i = plan.at
        ends = plan.run.ends
        if i >= len(ends):
            return  # the run was cut before this iteration
        progress = self.gw.scheduler.progress
        for call, req, p0, i0 in plan.buckets[i % PROGRESS_EVERY]:
            if i >= i0 and call.engine_req is req and not call.done:
                sreq_id = call.sreq_id
                assert sreq_id is not None
                progress(sreq_id, p0 + i + 1 - call.run_base, call.run_first_at)
        nxt = plan.after(i)
        if nxt < plan.stop and nxt < len(ends):
            plan.at = nxt
            self.push(ends[nxt], _REPORT, plan)

    def _token(self, call: Call, req: SimRequest, now: float) -> None:
        res = call.result
        if call.produced == 0:
            res.ttft_s = now - res.sent_at_s
            call.ctx.first_token_at = now
        else:
            call.gaps.append(now - call.last_byte)
        if call.run_first_at is None:
            call.run_first_at = now
        call.produced += 1
        call.last_byte = now
        sreq_id = call.sreq_id
        assert sreq_id is not None
        if call.produced >= call.report_at:
            call.gw.scheduler.progress(sreq_id, call.produced - call.run_base, call.run_first_at)
            call.report_at = call.produced + PROGRESS_EVERY
        if req.state is RequestState.FINISHED:
            res.finish_reason = req.finish_reason
            self._running.pop(sreq_id, None)
            del self._on_engine[req]
            self._record_stream(call)
            ctx = call.ctx
            ctx.status = 200
            self._apply(call.gw.scheduler.complete(sreq_id), call.gw)
            call.gw.finish(ctx)
            self._client_done(call, ok=True)
            if self.life is not None and ctx.sched is not None:
                self.life.on_finish(ctx.sched, now, res.ttft_s, res.slo_met)

    def _record_stream(self, call: Call) -> None:
        """What the relay records into the request's context (usage: the engine's counts)."""
        ctx = call.ctx
        ctx.itl_gaps = call.gaps
        ctx.output_tokens = call.produced
        ctx.prompt_tokens = call.task.spec.calls[call.index].prompt_tokens if call.produced else None

    # ----------------------------------------------------------------- scrapes and samples
    def _scrape(self, ep: Endpoint) -> None:
        self._sync(ep)
        eng = ep.engine
        gauges = EngineGauges(
            running=float(eng.num_running), waiting=float(eng.num_waiting), kv_usage=eng.kv_usage
        )
        hits = hit_counters(eng)
        for gw in self.gws:
            gw.scrape(ep.id, gauges, ep.kv_capacity, hits)

    def _sample(self) -> None:
        busy = sum(1 for ep in self.endpoints if ep.engine.num_running)
        running = sum(ep.engine.num_running for ep in self.endpoints)
        waiting = sum(ep.engine.num_waiting for ep in self.endpoints)
        sched = self.gw.scheduler
        queued = sum(sum(gw.scheduler.queue_depths().values()) for gw in self.gws)
        caps: dict[str, int] = {}
        for eid in sched.endpoint_ids():
            view = sched.endpoint_view(eid)
            if view is not None:
                cls = str(view.instance_class)
                caps[cls] = caps.get(cls, 0) + view.cap
        life = self.life
        self.timeline.add(
            self.clock.t,
            busy,
            running,
            waiting,
            queued,
            caps,
            endpoints=len(self.endpoints),
            devices=None if life is None else life.devices_in_use(),
            busy_devices=None
            if life is None
            else sum(life.devices_of(ep.id) for ep in self.endpoints if ep.engine.num_running),
            by_class=None if life is None else life.instances_by_class(),
        )

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


def _with_output(ids: TokenIds | None, produced: int) -> TokenIds | None:
    """A resumed request's ids: the prompt's, then the tokens the client already has."""
    if ids is None or not produced:
        return ids
    return np.concatenate([ids, np.full(produced, GENERATED_TOKEN_ID, dtype=np.int64)])


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)  # as the live client rounds
