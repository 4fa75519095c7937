"""Serving in slices: a bound on the requests one scheduler call tries to place.

Serving a queue (`Scheduler._serve`) places requests until the next one fits nowhere. Usually that is
one request per completion, but when room appears for many at once (a request that held up the queue
fits at last, and hundreds that fit all along were waiting behind it under strict priority and the
policy's lookahead) one call would place them all: at a few hundred microseconds a placement on a
hundred endpoints, a hundred placements is tens of milliseconds with the event loop held, every stream
the gateway relays stalled that long.

So one call tries at most `Scheduler.serve_slice` requests (placed or found to fit nowhere). A serve
cut short is owed: the queue's model and the serve's own state (the requests it passed over under the
lookahead) are kept, in the order the serves were to run, and `Scheduler.serve` (the continuation)
goes on from exactly there with the next slice. A driver calls it while `Scheduler.owed` says so: the
live daemon on the event loop's next turn (streams are relayed between slices), the fleet simulator
and `bench decisions` at once, at the same instant. Run that way, the slices make the very decisions
one uncut serve makes (each try takes a fresh snapshot either way; `test_sched_serve_slices.py` pins
it). A serve the daemon starts meanwhile for an owed model (a completion, a tick) starts from the head
of the queue again only when none is owed for that model: else it goes on with the owed one. Starting
from the head each time, a queue whose head holds `lookahead` requests that fit nowhere would spend
every call's slice on them again, and with completions coming faster than the loop's turns nothing
behind them would be placed while seats stand free. Going on, a request behind them may take a seat
freed meanwhile before they are tried on it again: they are tried again once the owed serve ends, as
after an uncut serve. (The simulator and `bench decisions` carry owed serves on before anything else
happens, so this case never arises there.)
"""

from __future__ import annotations

from typing import Final

from gateway.core.types import ModelName

#: Requests one scheduler call tries to place at most (placed or found to fit nowhere).
SERVE_SLICE: Final = 2


class ServeSlices:
    """The tries left to the current call, and the serves owed to the next ones (model -> the requests
    its serve passed over so far, by seq), in the order they are to run."""

    __slots__ = ("owed", "tries")

    def __init__(self) -> None:
        self.tries = 0
        self.owed: dict[ModelName, set[int]] = {}

    def start(self, tries: int) -> None:
        """A call that serves begins: it may try `tries` requests."""
        self.tries = tries

    def take(self) -> tuple[ModelName, set[int]] | None:
        """The first owed serve (it leaves the list), or None when none is owed or this call's tries
        are spent."""
        if self.tries <= 0 or not self.owed:
            return None
        model = next(iter(self.owed))
        return model, self.owed.pop(model)

    def begin(self, model: ModelName) -> tuple[bool, set[int] | None]:
        """A serve of `model` is asked for (a completion, a tick): whether it runs now, and the requests
        passed over by the serve owed for `model` that it goes on with (None: none was owed, it starts
        from the head). When this call's tries are spent it does not run now: an owed serve keeps its
        place, else it is owed after those already owed."""
        if self.tries <= 0:
            self.owed.setdefault(model, set())
            return False, None
        return True, self.owed.pop(model, None)

    def cut(self, model: ModelName, skipped: set[int]) -> None:
        """A serve of `model` under way ran out of tries: it goes on first in the next slice."""
        self.owed = {model: skipped, **self.owed}
