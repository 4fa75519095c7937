"""The live driver of the sans-IO scheduler: turns its decisions into resolved futures.

`acquire()` submits a request and waits (in the gateway queue if need be) until the scheduler places
it, raising the scheduler's BerthError when it rejects it. Every successful `acquire()` must be paired
with exactly one `release()`; a caller cancelled while waiting leaves the queue, and if the scheduler had
placed it in the meantime, the slot is released at once.

Preemption: the scheduler frees a running victim's seat and queues it again (`Preempt`). The driver
cancels the victim's task (its engine call's connection closes, which aborts the request in the engine);
the task, on its CancelledError, asks `take_preempted` whether that was why, and then either waits for its
next seat with `resume()` (no `release()` for the run that was cut: the scheduler has freed that seat) or,
when it cannot go on, gives its queued copy up with `abandon()`.

A scheduler call tries to place a bounded number of requests (`gateway.sched.slices`); when it leaves
serving to do (`Scheduler.owed`), the driver goes on with it on the event loop's next turn (`serve`,
one slice a turn), so the streams it relays are served between the slices.

Every call into the scheduler is timed (`time.perf_counter`, and the thread's CPU clock for a slow
call's CPU time) into `times` (`gateway.core.decisiontime`: `berth_sched_decision_seconds{call}`): the
scheduler decides on the event loop, so its slowest call is a stall of every stream. Events from
elsewhere (endpoint changes, reloads, peers) go through `run`, which times the call and applies its
decisions.

A policy plugin that raised while deciding on a request failed only that request (the scheduler
rejected it with a 500); the driver logs each such fault, with its traceback, as `policy_fault`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from time import perf_counter
from typing import Any, ParamSpec

import structlog

from gateway.core.decisiontime import DecisionTimes
from gateway.core.types import EndpointId, ModelName, RequestId
from gateway.sched.decisions import Decision, Dispatch, Preempt, Reject
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler

log = structlog.get_logger("berth.scheduler")
P = ParamSpec("P")


class SchedulerDriver:
    def __init__(self, scheduler: Scheduler, times: DecisionTimes | None = None) -> None:
        self.scheduler = scheduler
        self.times = DecisionTimes() if times is None else times
        self._waiters: dict[RequestId, asyncio.Future[Decision]] = {}
        # The task of each request that holds a seat (from acquire until release), for a preemption.
        self._running: dict[RequestId, asyncio.Task[Any]] = {}
        # Requests preempted while running: their task was cancelled and takes the decision on waking.
        self._preempted: dict[RequestId, Preempt] = {}
        # Set by the lifecycle manager: models requested with no ready endpoint that it can load (the
        # scheduler queued their requests), and every placement (recency of agent-started instances).
        self.on_cold: Callable[[list[ModelName]], None] | None = None
        self.on_dispatch: Callable[[SchedRequest, EndpointId], None] | None = None
        self._continuing = False  # a slice of owed serving is due on the loop's next turn
        # Set by the lifecycle manager: every request submitted (once; not its retries elsewhere), for the
        # autoscaler's arrival rates.
        self.on_submit: Callable[[SchedRequest], None] | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def busy(self) -> int:
        """Requests queued or holding a seat (0: the daemon is idle; the GC schedule collects then)."""
        return len(self._waiters) + len(self._running)

    async def acquire(self, req: SchedRequest, exclude: frozenset[EndpointId] = frozenset()) -> Dispatch:
        """Submit `req` and wait for its seat; raise the scheduler's error if it is rejected. A retry
        after a failed engine call submits it again with `exclude` (the endpoints that failed it)."""
        if self.on_submit is not None and not exclude:
            self.on_submit(req)
        sched = self.scheduler
        times = self.times
        c0 = times.cpu_clock()
        t0 = perf_counter()
        decision = sched.submit(req, exclude=exclude)
        times.record("submit", perf_counter() - t0, c0)
        if sched.outbox:
            self.apply(sched.take_preemptions())
        if sched.faults:
            self.log_faults()
        if decision is None:
            fut: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
            self._waiters[req.id] = fut
            if self.scheduler.cold:
                cold = self.scheduler.take_cold()
                if self.on_cold is not None:
                    self.on_cold(cold)  # may settle `fut` at once (a load that can never succeed)
            decision = await self._wait(req.id, fut)
        return self._seated(decision)

    async def resume(self, req_id: RequestId) -> Dispatch:
        """Wait for the next seat of a request that was preempted (`take_preempted` said so)."""
        fut = self._waiters.get(req_id)
        if fut is None:  # a preemption always leaves a waiter; keep the invariant loud
            raise RuntimeError(f"request {req_id} was not preempted")
        return self._seated(await self._wait(req_id, fut))

    def _seated(self, decision: Decision) -> Dispatch:
        if isinstance(decision, Reject):
            raise decision.error
        assert isinstance(decision, Dispatch)  # a waiter is only ever handed its own dispatch or reject
        task = asyncio.current_task()
        if task is not None:
            self._running[decision.req.id] = task
        if self.on_dispatch is not None:
            self.on_dispatch(decision.req, decision.endpoint.id)
        return decision

    async def _wait(self, rid: RequestId, fut: asyncio.Future[Decision]) -> Decision:
        self._waiters[rid] = fut
        try:
            while True:
                decision = await fut
                current = self._waiters.get(rid)
                if current is None or current is fut:
                    return decision
                # Preempted after it was placed but before it ran: wait for its next placement.
                self._preempted.pop(rid, None)
                fut = current
        except asyncio.CancelledError:
            self._waiters.pop(rid, None)
            self._preempted.pop(rid, None)
            if not self._cancel(rid) and self.scheduler.running_on(rid) is not None:
                self.release(rid)  # placed just as the caller went away
            raise
        finally:
            if self._waiters.get(rid) is fut:
                del self._waiters[rid]

    def take_preempted(self, req_id: RequestId) -> Preempt | None:
        """The preemption that cancelled this request's task, if that is why it was cancelled; the request
        waits in the queue, and `resume` (or `abandon`) must follow."""
        return self._preempted.pop(req_id, None)

    def abandon(self, req_id: RequestId) -> None:
        """A preempted request will not be resumed (its client left, or its stream had just ended): take
        it out of the queue, or give back the seat it was given meanwhile."""
        self._preempted.pop(req_id, None)
        self._waiters.pop(req_id, None)
        if not self._cancel(req_id) and self.scheduler.running_on(req_id) is not None:
            self.release(req_id)

    def release(self, req_id: RequestId) -> None:
        self._running.pop(req_id, None)
        placed = self._complete(req_id)
        sched = self.scheduler
        if placed or sched.faults or sched.owed:  # most completions place nothing
            self.apply(placed)

    def apply(self, decisions: Iterable[Decision]) -> None:
        """Hand decisions made outside a submit (completions, ticks, endpoint events) to their waiters."""
        self.log_faults()
        for d in decisions:
            if isinstance(d, Preempt):
                self._preempt(d)
                continue
            fut = self._waiters.get(d.req.id)
            if fut is not None and not fut.done():
                fut.set_result(d)
            elif isinstance(d, Dispatch):
                # Nobody waits for it any more: give the slot back.
                self.apply(self._complete(d.req.id))
        if self.scheduler.owed:
            self._continue_soon()

    def _continue_soon(self) -> None:
        """Go on with the serving the scheduler left to do: on the event loop's next turn, one slice a
        turn; without a running loop (a synchronous caller), at once."""
        if self._continuing:
            return
        self._continuing = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            try:
                while self.scheduler.owed:
                    self.run("serve", self.scheduler.serve)
            finally:
                self._continuing = False
            return
        loop.call_soon(self._continue)

    def _continue(self) -> None:
        self._continuing = False
        if self.scheduler.owed:
            self.run("serve", self.scheduler.serve)  # its `apply` asks for the next slice

    def _preempt(self, p: Preempt) -> None:
        """Stop the victim's engine call: its task is cancelled (the engine call's connection closes,
        which aborts it in the engine) and, told why by `take_preempted`, waits for its next seat."""
        rid = p.victim.id
        fresh: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        task = self._running.pop(rid, None)
        if task is not None:
            self._preempted[rid] = p
            self._waiters[rid] = fresh
            task.cancel("preempted")
            return
        placed = self._waiters.get(rid)
        if placed is not None and placed.done():
            self._waiters[rid] = fresh  # placed, not yet running: `_wait` goes on waiting
            return
        # Neither running nor about to: it has finished, and its queued copy must go.
        self._cancel(rid)

    def log_faults(self) -> None:
        """Log the policy faults the scheduler kept since the last call (none: one attribute read)."""
        if not self.scheduler.faults:
            return
        policy = self.scheduler.policy.name
        for f in self.scheduler.take_faults():
            log.error(
                "policy_fault",
                request_id=f.req_id,
                stage=f.stage,
                policy=policy,
                exc_info=(type(f.error), f.error, f.error.__traceback__),
            )

    def run(self, call: str, event: Callable[P, list[Decision]], *args: P.args, **kwargs: P.kwargs) -> None:
        """Call the scheduler's `event` (an endpoint change, a reload, peers' load: `call` names its kind
        in `gateway.core.decisiontime.CALLS`), timed, and apply the decisions it made."""
        c0 = self.times.cpu_clock()
        t0 = perf_counter()
        decisions = event(*args, **kwargs)
        self.times.record(call, perf_counter() - t0, c0)
        self.apply(decisions)

    def _complete(self, req_id: RequestId) -> list[Decision]:
        c0 = self.times.cpu_clock()
        t0 = perf_counter()
        placed = self.scheduler.complete(req_id)
        self.times.record("complete", perf_counter() - t0, c0)
        return placed

    def _cancel(self, req_id: RequestId) -> bool:
        c0 = self.times.cpu_clock()
        t0 = perf_counter()
        queued = self.scheduler.cancel(req_id)
        self.times.record("cancel", perf_counter() - t0, c0)
        return queued

    async def tick_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.run("tick", self.scheduler.tick)
