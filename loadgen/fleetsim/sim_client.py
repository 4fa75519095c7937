"""The fleet simulator's clients: tasks arrive, their calls are sent through berth's front, the client's
timers give up on a request, and a finished call sends the task's next one (as the live runner does)."""

from __future__ import annotations

from array import array

import orjson

from gateway.core.errors import BerthError
from gateway.dispatch.context import RequestContext
from gateway.sched.decisions import Decision
from loadgen.client import RequestResult, build_body, build_headers
from loadgen.engine_sim.protocol import prompt_token_ids
from loadgen.fleetsim.sim_state import _API, _CHECK, _SEND, GAP_BATCH, SimState
from loadgen.fleetsim.streams import Call, Task
from loadgen.report import GapHistogram, TaskResult, complete_task
from loadgen.workloads.base import TaskSpec
from loadgen.workloads.prompt import call_salt


class ClientSide(SimState):
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
                    pending = self._gap_buffer[res.cls] = array("d")
                    if res.cls not in self.gaps:  # the histograms in the order their classes first finished
                        self.gaps[res.cls] = GapHistogram()
                pending.extend(call.gaps)
                if len(pending) >= GAP_BATCH:
                    self._flush_gaps(res.cls)
                call.gaps = array("d")  # telemetry's record keeps its own reference until the next refresh
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


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)  # as the live client rounds
