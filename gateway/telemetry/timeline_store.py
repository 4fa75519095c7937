"""What an endpoint's token timeline (`gateway.telemetry.timeline`) holds between two settles, and the
sorted arrays it derives observations from: a finished stream's receipts (`TimedStream`), the spans of
the requests whose tokens were not timed (`SpanColumns`, two float columns), and the streams held as
sorted arrays (`StreamArrays`, made once per settle)."""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from gateway.telemetry.robust_regression import median

Array = npt.NDArray[np.float64]
Index = npt.NDArray[np.intp]

#: Receipts closer than this fraction of the median gap come from one engine step.
TOLERANCE: Final = 0.25


class TimedStream:
    __slots__ = ("computed", "dispatched_at", "first", "last", "pending", "prompt", "times")

    def __init__(
        self, dispatched_at: float | None, times: Array, prompt: float, pending: bool, computed: float
    ) -> None:
        self.dispatched_at = dispatched_at
        self.times = times
        self.first = float(times[0])
        self.last = float(times[-1])
        self.prompt = prompt  # its context's prompt part
        self.computed = computed  # the prompt tokens its prefill computed (not in the prefix cache)
        self.pending = pending  # its decode observation is still to be derived


class SpanColumns:
    """The spans of the untracked requests held, in the order added, as two columns of floats: a
    non-streamed request adds one, so thousands a second would otherwise be thousands of tuples held for
    seconds, each walked by the cyclic collector and each visited by `_evict` at every settle. Here no
    object is made per span, and eviction is one vectorised pass."""

    __slots__ = ("_ends", "_starts")

    def __init__(self) -> None:
        self._starts = array("d")
        self._ends = array("d")

    def __len__(self) -> int:
        return len(self._starts)

    def add(self, start: float, end: float) -> None:
        self._starts.append(start)
        self._ends.append(end)

    def clear(self) -> None:
        self._starts = array("d")
        self._ends = array("d")

    def columns(self) -> tuple[Array, Array]:
        """(starts, ends), copies in the order added."""
        return np.array(self._starts, dtype=np.float64), np.array(self._ends, dtype=np.float64)

    def evict(self, horizon: float) -> float | None:
        """Let go of the spans that ended before `horizon`; the latest end among them (None: none)."""
        if not self._ends:
            return None
        starts, ends = self.columns()
        gone = ends < horizon
        if not gone.any():
            return None
        latest = float(ends[gone].max())
        keep = ~gone
        self._starts = array("d", starts[keep].tobytes()) if keep.any() else array("d")
        self._ends = array("d", ends[keep].tobytes()) if keep.any() else array("d")
        return latest

    def merged(self) -> tuple[Array, Array]:
        """The spans merged into disjoint intervals sorted by start (overlapping or touching spans are
        one): (starts, ends)."""
        starts, ends = self.columns()
        if not len(starts):
            return starts, ends
        order = np.lexsort((ends, starts))
        s, e = starts[order], ends[order]
        reach = np.maximum.accumulate(e)  # the furthest end so far: an interval's end at its last span
        begins = np.concatenate(([True], s[1:] > reach[:-1])).nonzero()[0]
        lasts = np.concatenate((begins[1:] - 1, [len(s) - 1]))
        return s[begins], reach[lasts]


class StreamArrays:
    """The streams held, as sorted arrays (made once per `settle`)."""

    __slots__ = (
        "dirty_end",
        "dirty_ends",
        "dirty_start",
        "dirty_starts",
        "first",
        "first_cum_prompt",
        "first_list",
        "first_owner",
        "firsts",
        "last",
        "last_cum_prompt",
        "last_cum_tokens",
        "lasts",
        "receipts",
        "tol",
    )

    def __init__(self, streams: Sequence[TimedStream], dirty: SpanColumns) -> None:
        firsts = np.array([s.first for s in streams])
        lasts = np.array([s.last for s in streams])
        prompts = np.array([s.prompt for s in streams])
        sizes = np.array([len(s.times) for s in streams], dtype=np.float64)
        self.firsts: Array = firsts  # in the streams' order
        self.lasts: Array = lasts
        fo = firsts.argsort(kind="stable")
        lo = lasts.argsort(kind="stable")
        self.first: Array = firsts[fo]
        self.first_list: list[float] = self.first.tolist()
        self.first_owner: Index = fo
        self.first_cum_prompt: Array = np.concatenate(([0.0], prompts[fo].cumsum()))
        self.last: Array = lasts[lo]
        self.last_cum_prompt: Array = np.concatenate(([0.0], prompts[lo].cumsum()))
        self.last_cum_tokens: Array = np.concatenate(([0.0], sizes[lo].cumsum()))
        every = np.concatenate([s.times for s in streams])
        # every stream's gaps: the differences of the receipts in the streams' order, but for the one
        # from each stream's last receipt to the next stream's first (the same numbers in the same
        # order as each stream's own differences, one numpy call instead of one per stream)
        gaps = every[1:] - every[:-1]
        inner = gaps > 0
        inner[sizes[:-1].cumsum().astype(np.intp) - 1] = False
        gaps = gaps[inner]
        self.tol = TOLERANCE * median(gaps, scratch=True) if len(gaps) else 0.0
        # a merge of sorted runs (each stream's receipts): the stable sort finds the runs and merges
        # them, several times faster than the default sort here, the same order of the same numbers
        # (in place: the gaps above were taken from the streams' order)
        every.sort(kind="stable")
        self.receipts: Array = every
        # untracked spans, merged into disjoint sorted intervals
        self.dirty_start, self.dirty_end = dirty.merged()
        self.dirty_starts: list[float] = self.dirty_start.tolist()
        self.dirty_ends: list[float] = self.dirty_end.tolist()

    def firsts_in(self, lo: Array, hi: Array) -> Index:
        """First tokens that landed in each gap ``(lo, hi]`` (shifted by the tolerance)."""
        t = self.tol
        f = self.first
        right = f.searchsorted(hi + t, side="right")
        left = f.searchsorted(lo + t, side="right")
        return np.asarray(right - left, dtype=np.intp)

    def landed(self, lo: float, hi: float) -> int:
        """`firsts_in` for one gap (plain floats: no per-call numpy overhead)."""
        t = self.tol
        return bisect_right(self.first_list, hi + t) - bisect_right(self.first_list, lo + t)

    def untracked_in(self, lo: Array, hi: Array) -> npt.NDArray[np.bool_]:
        """Whether each ``[lo, hi]`` overlaps an untracked request's span."""
        if not len(self.dirty_start):
            return np.zeros(np.shape(lo), dtype=np.bool_)
        began = self.dirty_start.searchsorted(hi, side="right")  # spans that start by hi
        ended = self.dirty_end.searchsorted(lo, side="left")  # ... and end before lo
        return np.asarray(began > ended)

    def untracked(self, lo: float, hi: float) -> bool:
        """`untracked_in` for one span."""
        starts = self.dirty_starts
        if not starts:
            return False
        return bisect_right(starts, hi) > bisect_left(self.dirty_ends, lo)

    def running(self, t: Array) -> tuple[Array, Array]:
        """Running count (past their first receipt, not past their last) and their context sum (prompt +
        tokens received so far) at times `t`, taken between engine steps."""
        started = self.first.searchsorted(t, side="right")
        finished = self.last.searchsorted(t, side="left")
        count = (started - finished).astype(np.float64)
        prompts = self.first_cum_prompt[started] - self.last_cum_prompt[finished]
        received = self.receipts.searchsorted(t, side="right") - self.last_cum_tokens[finished]
        return count, prompts + received
