"""The live driver of the sans-IO scheduler: turns its decisions into resolved futures.

`acquire()` submits a request and waits (in the gateway queue if need be) until the scheduler places
it, raising the scheduler's BerthError when it rejects it. Every successful `acquire()` must be paired
with exactly one `release()`; a caller cancelled while waiting leaves the queue, and if the scheduler had
placed it in the meantime, the slot is released at once.

A policy plugin that raised while deciding on a request failed only that request (the scheduler
rejected it with a 500); the driver logs each such fault, with its traceback, as `policy_fault`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import structlog

from gateway.core.types import EndpointId, RequestId
from gateway.sched.decisions import Decision, Dispatch, Preempt, Reject
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.snapshot import EndpointView

log = structlog.get_logger("berth.scheduler")


class SchedulerDriver:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._waiters: dict[RequestId, asyncio.Future[Decision]] = {}

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self, req: SchedRequest, exclude: frozenset[EndpointId] = frozenset()) -> EndpointView:
        decision = self.scheduler.submit(req, exclude=exclude)
        self.log_faults()
        if decision is None:
            fut: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
            self._waiters[req.id] = fut
            try:
                decision = await fut
            except asyncio.CancelledError:
                if not self.scheduler.cancel(req.id) and self.scheduler.running_on(req.id) is not None:
                    self.release(req.id)  # placed just as the caller went away
                raise
            finally:
                self._waiters.pop(req.id, None)
        if isinstance(decision, Reject):
            raise decision.error
        return decision.endpoint

    def release(self, req_id: RequestId) -> None:
        self.apply(self.scheduler.complete(req_id))

    def apply(self, decisions: Iterable[Decision]) -> None:
        """Hand decisions made outside a submit (completions, ticks, endpoint events) to their waiters."""
        self.log_faults()
        for d in decisions:
            if isinstance(d, Preempt):
                continue  # the live side of preemption (abort, resume) is not wired yet: policies without
                # a [preemption] plugin never make one
            fut = self._waiters.get(d.req.id)
            if fut is not None and not fut.done():
                fut.set_result(d)
            elif isinstance(d, Dispatch):
                # Nobody waits for it any more: give the slot back.
                self.apply(self.scheduler.complete(d.req.id))

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

    async def tick_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.apply(self.scheduler.tick())
