"""The fleet simulator's engines: instances added and removed by the lifecycle, engine steps and runs
(iterations as events), tokens handed to their streams, progress reports, scrapes and samples."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from gateway.core import errors
from gateway.core.types import EndpointId, EngineGauges, ModelName
from loadgen.engine_sim.engine import RequestState, SimRequest
from loadgen.engine_sim.prefix_cache import PrefixCacheView
from loadgen.fleetsim.prefix_oracle import hit_counters
from loadgen.fleetsim.runs import RunEngine
from loadgen.fleetsim.sim_state import _REPORT, _SCRAPE, _WAKE, Event, SimState
from loadgen.fleetsim.streams import PROGRESS_EVERY, Call, Endpoint, hand_out, plan_reports


class EngineSide(SimState):
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
        if self.opts.prefix == "precise":
            self.gw.detach_events(eid)
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
                self.push_report(max(run.ends[plan.at], now), plan)

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

    def _deliver(self, until: Event) -> None:
        """The progress reports' events before `until` (`push_report`), in order, each at its time: the
        reports at iteration `plan.at` of a run, then the run's next such event. The reports made wait
        in `_progress_out` for the end of the burst (`_hand_over_progress`), before anything else
        reaches a scheduler. (One loop for the burst: about 19 such events per request.)"""
        reports = self._reports
        out = self._progress_out
        one = len(self.gws) == 1  # then the reports alone, else each with its replica
        add = out.append
        pop, replace, seq = heapq.heappop, heapq.heapreplace, self._seq
        every, report = PROGRESS_EVERY, _REPORT
        n = 0
        while reports and reports[0] < until:
            now, _, _, plan = reports[0]
            n += 1
            i = plan.at
            ends = plan.ends
            if i >= len(ends):
                pop(reports)
                continue  # the run was cut before this iteration
            members, skip = plan.buckets[i % every]
            for call, req, base, i0 in members:
                if i >= i0 and call.engine_req is req and not call.done:
                    # to the replica whose scheduler placed the call (its own ids and running requests)
                    p = (call.sreq_id, base + i, call.run_first_at, now)
                    add(p if one else (call.gw, p))
            nxt = i + skip  # the run's next iteration with a report
            if nxt < plan.stop and nxt < len(ends):
                plan.at = nxt
                replace(reports, (ends[nxt], report, next(seq), plan))  # one sift, not a pop and a push
            else:
                pop(reports)
        self.events += n
        if out:
            self._hand_over_progress()

    def _hand_over_progress(self) -> None:
        """The reports of a burst, to their replicas' schedulers in one call each, in the order made: the
        same as one call per report at its time, since nothing reached a scheduler in between. With one
        replica `_progress_out` holds the reports alone (`_deliver`), else (replica, report) pairs."""
        out = self._progress_out
        if len(self.gws) == 1:
            self._progress_out = []
            self.gw.scheduler.progress_many(out)
            return
        for g in self.gws:
            mine = [p for r, p in out if r is g]
            if mine:
                g.scheduler.progress_many(mine)
        out.clear()

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
