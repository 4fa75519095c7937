"""Which queued requests a scheduler tick looks at (`Scheduler.tick`).

A request needs a look when it may have waited too long (its queue time plus the wait limit) or when
the policy's admitter may refuse it on a recheck. An admitter that says until when its recheck is sure
to admit a request (`RecheckFrom`) is asked that once per request; the queue's `DueChecks` then gives a
tick only the requests whose time has come, and the tick decides each exactly as it would on a walk of
the whole queue. A request the tick keeps is put back at the admitter's next promise (`recheck_next`,
from a tighter bound that holds for fewer refits), or its expiry if that comes first. Without that
capability every queued request is rechecked on every tick.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import Final

from gateway.core.types import ModelName
from gateway.sched.interfaces import Admitter, RecheckFrom
from gateway.sched.queues import ModelQueue, Queued
from gateway.sched.snapshot import FleetSnapshot

#: A request's expiry is looked at this much before its exact time (the exact test then decides).
_EPSILON_S: Final = 1e-6
#: Whether admitters of a type are `RecheckFrom`, per type: the protocol's isinstance check looks at
#: every member (about 16 µs), and a tick would make it on every call.
_RECHECK_FROM: dict[type, bool] = {}


def promising(admitter: Admitter) -> RecheckFrom | None:
    """`admitter` when it is `RecheckFrom` (checked once per type)."""
    kind = type(admitter)
    known = _RECHECK_FROM.get(kind)
    if known is None:
        known = _RECHECK_FROM[kind] = isinstance(admitter, RecheckFrom)
    return admitter if known else None  # type: ignore[return-value]  # checked above, per type


def due(
    queue: ModelQueue,
    model: ModelName,
    now: float,
    wait_limit: float,
    *,
    admitter: Admitter | None,
    snap: FleetSnapshot | None,
) -> tuple[list[Queued], Callable[[Queued], float]]:
    """The requests of `queue` a tick at `now` looks at, in queue order; `admitter` and `snap` are given
    when the tick rechecks admission. Each leaves the schedule: the tick puts one it keeps back
    (`ModelQueue.checks.again`) at the time the function returned beside them gives for it."""
    when: Callable[[Queued], float]
    after: Callable[[Queued], float]
    epoch: Hashable
    again_epoch: Hashable = None
    promises = None if admitter is None else promising(admitter)
    if admitter is None or snap is None:
        epoch = (wait_limit, None, None)

        def when(item: Queued) -> float:
            return item.queued_at + wait_limit - _EPSILON_S

        after = when
    elif promises is not None:
        admitter = promises
        try:
            bound = admitter.recheck_epoch(model, snap)
        except Exception:
            bound = object()  # a new epoch every tick: every request is rechecked (and faults there)
        epoch = (wait_limit, admitter, bound)
        recheck_from = admitter.recheck_from

        def when(item: Queued) -> float:
            try:
                at = recheck_from(item.req, snap)
            except Exception:
                at = -math.inf  # the recheck itself reports the fault
            return min(item.queued_at + wait_limit - _EPSILON_S, at)

        try:
            again_epoch = (admitter, admitter.recheck_next_epoch(model, snap))
        except Exception:
            again_epoch = object()
        recheck_next = admitter.recheck_next

        def after(item: Queued) -> float:
            try:
                at = recheck_next(item.req, snap)
            except Exception:
                at = -math.inf
            return min(item.queued_at + wait_limit - _EPSILON_S, at)

    else:
        epoch = (wait_limit, admitter, None)

        def when(item: Queued) -> float:
            return -math.inf

        after = when

    return queue.due(now, epoch, when, again_epoch), after
