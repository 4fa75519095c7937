"""What the scheduler decides: every event returns decisions, and its driver carries them out.

`Decision` is the union of every kind. A new kind (scale, evict) is one more frozen dataclass
here and one more member of the union; drivers match on the class, so mypy points at every `match` or
`isinstance` chain that must learn the new kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.core import errors
from gateway.core.errors import BerthError
from gateway.core.frozen import frozen
from gateway.core.types import RequestId
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView


@frozen
class Dispatch:
    """Send `req` to `endpoint` now (its seat there is taken until `Scheduler.complete`)."""

    req: SchedRequest
    endpoint: EndpointView


@dataclass(frozen=True, slots=True)
class Reject:
    """Answer `req` with `error` (it is no longer queued)."""

    req: SchedRequest
    error: BerthError


@dataclass(frozen=True, slots=True)
class Preempt:
    """Abort `victim`'s engine request on `endpoint`; it waits in the gateway queue again.

    Made when a request of a kind that may preempt (interactive) could not be placed and a running,
    resumable request of a kind that may be preempted (batch) had a seat it can take
    (`gateway.sched.interfaces.Preemptor`). By the time the driver sees it the scheduler has already
    freed the victim's seat (not counted as a completion: the driver must not call `complete` for the
    aborted run), put the victim back in its model's queue with its arrival time and band, and dispatched
    the preempting request to that seat: the `Dispatch` that takes it follows this decision in the same
    list. `victim` is the request as requeued: `preemptions` counts this one and `produced_tokens` adds
    what its run had streamed as far as the scheduler knew (`Scheduler.progress`). Its next `Dispatch`
    comes like any queued request's; `Scheduler.cancel` removes it while it waits.
    """

    victim: SchedRequest
    endpoint: EndpointView
    # Machine-readable, for metrics: "interactive_waiting" (a request that found no seat takes the
    # victim's: a `Dispatch` for it follows) or "cap_lowered" (the endpoint's concurrency controller cut
    # its cap below the requests it runs, for the interactive streams among them: no `Dispatch` follows,
    # the seat stays empty).
    reason: str


Decision = Dispatch | Reject | Preempt

#: The policy stage a plugin failed in.
FaultStage = Literal["admission", "ordering", "placement", "engine_priority", "preemption", "concurrency"]


@dataclass(frozen=True, slots=True)
class PolicyFault:
    """A policy plugin raised while deciding on a request: the request alone is rejected with a 500
    (`fault_error`) and the fault is kept for the driver to log (the core does no I/O)."""

    req_id: RequestId
    stage: FaultStage
    error: Exception


def fault_error() -> BerthError:
    """The error a request gets when a policy plugin failed on it."""
    return errors.internal("the gateway's scheduling policy failed on this request")
