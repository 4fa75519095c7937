"""Serving in slices: a bound on the requests one scheduler call tries to place.

Serving a queue (`Scheduler._serve`) places requests until the next one fits nowhere. Usually that is
one request per completion, but when room appears for many at once (a request that held up the queue
fits at last, and hundreds that fit all along were waiting behind it under strict priority and the
policy's lookahead) one call would place them all: at a few hundred microseconds a placement on a
hundred endpoints, a hundred placements is tens of milliseconds with the event loop held, every stream
the gateway relays stalled that long.

So one call tries at most `Scheduler.serve_slice` requests (placed or found to fit nowhere), counted by
the endpoints a try asks about: a request that fit nowhere and is tried again only on the endpoints that
changed since (`gateway.sched.unfit`) costs that share of the fleet, a request not tried again nothing.
Without that, a queue whose head holds `lookahead` requests that fit nowhere would spend every call's
slice on them again: in the live daemon, where a completion's fresh serve starts from the head, a call
each completion could place nothing while seats stand free behind them. A serve
cut short is owed: the queue's model and the serve's own state (the requests it passed over under the
lookahead) are kept, in the order the serves were to run, and `Scheduler.serve` (the continuation)
goes on from exactly there with the next slice. A driver calls it while `Scheduler.owed` says so: the
live daemon on the event loop's next turn (streams are relayed between slices), the fleet simulator
and `bench decisions` at once, at the same instant. Run that way, the slices make the very decisions
one uncut serve makes (each try takes a fresh snapshot either way; `test_sched_serve_slices.py` pins
it). A serve the daemon starts meanwhile for an owed model (a completion, a tick) starts from the head
of the queue again, as it would have after an uncut serve: it replaces the owed one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from gateway.core.types import ModelName
from gateway.sched.snapshot import EndpointView, FleetSnapshot

#: Requests one scheduler call tries to place at most (placed or found to fit nowhere), in tries over the
#: whole fleet (`try_cost`).
SERVE_SLICE: Final = 2


def try_cost(among: Sequence[EndpointView] | None, snap: FleetSnapshot) -> float:
    """What one try counts against a call's slice: 1 for a try over the whole fleet (`among` None), the
    share of the fleet it asks about when only the endpoints that changed since the request fit nowhere
    are tried (`gateway.sched.unfit.retry_on`), 0 when none did."""
    if among is None:
        return 1.0
    return len(among) / max(1, len(snap.endpoints))


class ServeSlices:
    """The tries left to the current call, and the serves owed to the next ones (model -> the requests
    its serve passed over so far, by seq), in the order they are to run."""

    __slots__ = ("owed", "tries")

    def __init__(self) -> None:
        self.tries = 0.0
        self.owed: dict[ModelName, set[int]] = {}

    def start(self, tries: float) -> None:
        """A call that serves begins: it may try `tries` requests."""
        self.tries = tries

    def take(self) -> tuple[ModelName, set[int]] | None:
        """The first owed serve (it leaves the list), or None when none is owed or this call's tries
        are spent."""
        if self.tries <= 0 or not self.owed:
            return None
        model = next(iter(self.owed))
        return model, self.owed.pop(model)

    def begin(self, model: ModelName) -> bool:
        """A fresh serve of `model` begins (it replaces one owed for it); False when this call's tries
        are spent: it is owed after those already owed, and does not run now."""
        self.owed.pop(model, None)
        if self.tries > 0:
            return True
        self.owed[model] = set()
        return False

    def cut(self, model: ModelName, skipped: set[int]) -> None:
        """A serve of `model` under way ran out of tries: it goes on first in the next slice."""
        self.owed = {model: skipped, **self.owed}
