"""What the scheduler decides: every event returns decisions, and its driver carries them out.

`Decision` is the union of every kind. A new kind (preempt, scale, evict) is one more frozen dataclass
here and one more member of the union; drivers match on the class, so mypy points at every `match` or
`isinstance` chain that must learn the new kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.core import errors
from gateway.core.errors import BerthError
from gateway.core.types import RequestId
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView


@dataclass(frozen=True, slots=True)
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
    """`victim` was running on `endpoint` and gave its seat up: the scheduler already put it back in its
    queue (as `victim`: preemptions counted, progress kept), and the `Dispatch` that takes the seat
    follows in the same list. The driver aborts the victim's engine call, without completing it."""

    victim: SchedRequest
    endpoint: EndpointView
    reason: str


Decision = Dispatch | Reject | Preempt

#: The policy stage a plugin failed in.
FaultStage = Literal["admission", "ordering", "placement", "engine_priority"]


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
