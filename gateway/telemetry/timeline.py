"""The token timeline of one endpoint: the sans-IO record that turns the token receipts of the streams
that ran there into the performance-model observations `gateway.telemetry.perfmodel` documents.

The request path adds nothing for it: the relay already times every token (`first_token_at` and the
gaps after it), and the finish phase hands those to the background fold. There, `add_stream` keeps each
finished stream's receipts (``first + cumsum(gaps)``, one array per stream) and `add_untracked` the span
of a request whose tokens were not timed (not streamed, or failed before its first token). An
observation needs every stream that ran at the times it looks at, so `settle(before)` derives only what
lies before ``before``, the dispatch time of the oldest request still running on the endpoint (now when
none is): everything that ran before it has finished and been added. Observations lag by the age of
that request; within the bound below, nothing is lost.

(One module of ~420 lines on purpose: the derivation is one algorithm over one set of arrays, and its
parts are only correct together.)

What `settle` derives (the contract in `gateway.telemetry.perfmodel`'s docstring):

- **prefill**, once per *group* of first tokens that arrived together (receipts within the tolerance of
  each other: one engine step), with the sum of the group's prompts:
  - busy endpoint: from each running stream whose gap contains the group and nothing else (no other first
    token in that gap or the one before it), the gap minus the mean of the stream's next uninterrupted
    gaps (up to `NEXT_GAPS`), when the gap before and the gaps after agree within `REGULAR` of their
    median (no stalled event loop); the median over up to `MAX_REFERENCES` such streams;
  - idle endpoint (no receipt from it between the latest dispatch in the group and the group's first
    tokens): TTFT from that dispatch, unless a first token came in one read with its stream's next one
    (held back on the way: its time is not the prefill's end);
  - otherwise none: a raw TTFT on a busy endpoint would time the engine's queue too.
- **decode**, once per clean stream with at least `MIN_KEPT_GAPS` kept gaps: its mean gap leaving out
  every gap in which a first token arrived, at ``batch`` = the mean running count (streams past their
  first token and not past their last, sampled mid-gap) and ``avg_context`` = the mean running-context
  sum (prompt + tokens received so far) / ``batch``; plus the stream's overall tokens/s and the mean
  running count over all its gaps, for the throughput curve. None when most kept gaps are within the
  tolerance: receipts that came several to a read (an engine starved of CPU flushes its output in
  bursts) do not time iterations.

A first token "lands in" a gap ``(t[k-1], t[k]]`` of a stream when it arrives within
``(t[k-1] + tol, t[k] + tol]``: an engine that prefills in an iteration of its own (the simulator;
SGLang by default) sends it inside the gap; one that mixes a prefill chunk into a decode iteration
(vLLM's chunked prefill) sends it with ``t[k]``, and that gap is the one the prefill lengthened. ``tol``
is `TOLERANCE` times the median gap of the streams held (a step's receipts spread by the gateway's own
processing, a small part of an iteration). Gaps and groups that overlap an untracked request's span
are left out: its prefill and its place in the batch are unknown.

Bounded: streams are dropped once nothing left to derive can look at them (`lookback_s` before the
oldest pending work); past `max_tokens` receipts (a request that stays in flight for long holds the
settling back) the oldest go first, and whatever needed them is skipped (`known_from`).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from itertools import pairwise
from operator import sub as _sub
from typing import Final, NamedTuple

import numpy as np

from gateway.telemetry.robust_regression import median as median_of
from gateway.telemetry.timeline_store import Array, SpanColumns, StreamArrays, TimedStream

#: Gaps after an interrupted one that time the decode iteration it shares with the prefill.
NEXT_GAPS: Final = 4
#: The gap before and the gaps after an interrupted one agree within this factor of their median.
REGULAR: Final = 1.5
#: Running streams whose interrupted gaps time one prefill group (their median is the observation).
MAX_REFERENCES: Final = 5
#: A stream with fewer gaps free of first tokens gives no decode observation.
MIN_KEPT_GAPS: Final = 8


class PrefillObservation(NamedTuple):
    prompt_tokens: float  # the sum of the group's prompts
    seconds: float
    idle: bool  # TTFT from dispatch on an idle endpoint (else from running streams' gaps)


class DecodeObservation(NamedTuple):
    batch: float  # mean running count over the kept gaps
    avg_context: float  # mean running-context sum over the kept gaps / batch
    seconds: float  # mean kept gap
    concurrency: float  # mean running count over all the stream's gaps
    tokens_per_s: float  # (tokens - 1) / (last - first)


class Settled(NamedTuple):
    prefill: list[PrefillObservation]
    decode: list[DecodeObservation]


class EndpointTimeline:
    """One endpoint's recent streams; see the module docstring."""

    def __init__(self, *, max_tokens: int = 262_144, lookback_s: float = 5.0) -> None:
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        self._max_tokens = max_tokens
        self._lookback_s = lookback_s
        self._streams: list[TimedStream] = []
        self._dirty = SpanColumns()
        self._tokens = 0
        self._last_group = -math.inf  # the last first-token receipt of the last group derived
        self._settled = -math.inf  # the latest `before` derived up to
        self._earliest_added = math.inf  # the earliest time added since then
        self._horizon = -math.inf  # what ended before this is no longer needed
        self.known_from = -math.inf  # nothing that needs receipts from before this is derived
        self.dropped = 0  # streams let go before their decode observation (the bound)

    def __len__(self) -> int:
        return len(self._streams)

    @property
    def tokens(self) -> int:
        """Receipts held."""
        return self._tokens

    # ----------------------------------------------------------------- inputs
    def add_stream(
        self,
        *,
        dispatched_at: float | None,
        first_token_at: float,
        gaps: Sequence[float],
        prompt_tokens: float,
        clean: bool,
        prefill_tokens: float | None = None,
    ) -> None:
        """A finished stream that had a first token here. `dispatched_at` None: unknown (the request was
        retried from another endpoint); `clean`: it ran to its end (its gaps time the decode);
        `prefill_tokens`: the prompt tokens its prefill computed (the uncached ones; None: all), what
        its group's prefill observation counts."""
        times = np.empty(len(gaps) + 1)
        times[0] = 0.0
        times[1:] = gaps
        times.cumsum(out=times)  # in place: the same sums as `np.cumsum`, without its wrapper and copies
        times += first_token_at
        computed = float(prompt_tokens if prefill_tokens is None else prefill_tokens)
        self._streams.append(TimedStream(dispatched_at, times, float(prompt_tokens), clean, computed))
        self._tokens += len(times)
        self._earliest_added = min(self._earliest_added, first_token_at)

    def add_untracked(self, start: float, end: float) -> None:
        """A request that ran here from `start` to `end` with no token times."""
        self._dirty.add(start, max(start, end))
        self._earliest_added = min(self._earliest_added, start)

    def forget(self, before: float) -> None:
        """Drop everything (some finished requests were lost): nothing before `before` is known."""
        self.dropped += sum(1 for s in self._streams if s.pending)
        self._streams.clear()
        self._dirty.clear()
        self._tokens = 0
        self.known_from = max(self.known_from, before)

    # ----------------------------------------------------------------- derivation
    def settle(self, before: float) -> Settled:
        """The observations of everything before `before` not derived yet. The caller guarantees that
        every request that ran here and was dispatched before `before` has been added."""
        out = Settled([], [])
        if before <= self._settled and self._earliest_added >= before:
            # Nothing new before `before` (a request older than everything added since still runs):
            # nothing new to derive; only keep to the bound.
            self._evict(self._horizon)
            return out
        if self._streams:
            arr = StreamArrays(self._streams, self._dirty)
            horizon = self._prefill(arr, before, out.prefill)
            self._decode(arr, before, out.decode)
            pending = min((s.first for s in self._streams if s.pending), default=math.inf)
            self._horizon = min(horizon, pending) - self._lookback_s
        else:
            self._horizon = before - self._lookback_s
        self._settled = max(self._settled, before)
        self._earliest_added = math.inf
        self._evict(self._horizon)
        return out

    def _prefill(self, arr: StreamArrays, before: float, out: list[PrefillObservation]) -> float:
        """Derive the groups that are complete; returns the first receipt of the first one left."""
        f, tol = arr.first, arr.tol
        start = int(f.searchsorted(self._last_group, side="right"))
        if start >= len(f):
            return before
        tail = f[start:]
        breaks = ((tail[1:] - tail[:-1]) > tol).nonzero()[0] + start + 1  # np.flatnonzero(np.diff())
        bounds = [start, *breaks.tolist(), len(f)]
        for a, b in pairwise(bounds):
            at0, at1 = float(f[a]), float(f[b - 1])
            if at1 + tol >= before:
                return at0  # a first token still to come may belong to this group
            members = [self._streams[int(k)] for k in arr.first_owner[a:b]]
            got = self._group(arr, members, at0, at1, before)
            if got is _DEFER:
                return at0
            if isinstance(got, PrefillObservation):
                out.append(got)
            self._last_group = at1
        return before

    def _group(
        self, arr: StreamArrays, members: list[TimedStream], at0: float, at1: float, before: float
    ) -> PrefillObservation | object | None:
        tol = arr.tol
        size = len(members)
        tokens = sum(s.computed for s in members)
        samples: list[float] = []
        untracked = arr.untracked
        # `arr.landed(lo, hi)` inline below (about twenty a group): first tokens in ``(lo + tol, hi + tol]``
        firsts, right = arr.first_list, bisect_right
        known_from, streams = self.known_from, self._streams
        lead = at1 - tol
        running = ((arr.firsts < at0 - tol) & (arr.lasts >= lead)).nonzero()[0]  # np.flatnonzero
        for k in running.tolist():  # the streams running when the group's prefill ran
            times = streams[k].times
            i = int(times.searchsorted(lead))  # the gap the group landed in
            if i < 2 or i + 1 >= len(times):
                continue
            # the receipts looked at, as floats: t[0] is receipt i - 2, t[2] ends the gap of the group
            t: list[float] = times[i - 2 : i + NEXT_GAPS + 2].tolist()
            n = len(t)
            t0, t1, t2 = t[0], t[1], t[2]
            if not t1 + tol < at0 or t0 <= known_from:
                continue
            r1, r2 = right(firsts, t1 + tol), right(firsts, t2 + tol)
            if r2 - r1 != size or r1 != right(firsts, t0 + tol):
                continue  # another prefill in the same gap, or in the one before it
            m = 0  # the uninterrupted gaps after it: none lands in them while the count stays r2
            while m < NEXT_GAPS and 3 + m < n and right(firsts, t[3 + m] + tol) == r2:
                m += 1
            if t[min(3 + m, n - 1)] + tol >= before:
                return _DEFER  # a first token not added yet may land in the gaps looked at
            if m == 0 or untracked(t0, t[2 + m]):
                continue
            around = [t1 - t0, *map(_sub, t[3 : 3 + m], t[2 : 2 + m])]  # the gaps before and after
            mid = _median(around)  # `around` sorted in place
            if mid > tol and mid / REGULAR <= around[0] and around[-1] <= mid * REGULAR:
                samples.append((t2 - t1) - (t[2 + m] - t2) / m)
                if len(samples) >= MAX_REFERENCES:
                    break
        if samples:
            seconds = _median(samples)
            return PrefillObservation(tokens, seconds, idle=False) if seconds > 0 else None
        return self._idle_group(arr, members, tokens, at0, at1)

    def _idle_group(
        self, arr: StreamArrays, members: list[TimedStream], tokens: float, at0: float, at1: float
    ) -> PrefillObservation | None:
        """A group no running stream timed: its TTFT from the latest dispatch, if the endpoint was idle."""
        tol, untracked = arr.tol, arr.untracked
        dispatched = [s.dispatched_at for s in members]
        if any(d is None for d in dispatched):
            return None
        latest = max(d for d in dispatched if d is not None)
        if latest <= self.known_from or not at0 > latest:
            return None
        if any(len(s.times) > 1 and s.times[1] - s.times[0] <= tol for s in members):
            return None  # its first token came in one read with the next: it was held back on the way
        if self._received(arr.receipts, latest, at1 + tol) > sum(
            self._received(s.times, latest, at1 + tol) for s in members
        ) or untracked(latest, at1):
            return None  # another stream's token came meanwhile (busy), or an untracked request ran
        return PrefillObservation(tokens, at0 - latest, idle=True)

    @staticmethod
    def _received(times: Array, lo: float, hi: float) -> int:
        """Receipts in ``(lo, hi]``."""
        return int(times.searchsorted(hi, side="right") - times.searchsorted(lo, side="right"))

    def _decode(self, arr: StreamArrays, before: float, out: list[DecodeObservation]) -> None:
        tol = arr.tol
        ready: list[TimedStream] = []  # the streams whose observation is due now
        for s in self._streams:
            if not s.pending or s.last + tol >= before:
                continue
            s.pending = False
            if len(s.times) < MIN_KEPT_GAPS + 1 or s.first <= self.known_from:
                continue
            ready.append(s)
        if not ready:
            return
        # Every ready stream's gaps at once: whether a gap is kept, and the running count and context at
        # its middle, are elementwise in the gap's ends, so one pass over all of them gives each stream
        # the numbers a pass over its own gaps gives (the streams of a batch share their iterations).
        los = np.concatenate([s.times[:-1] for s in ready])
        his = np.concatenate([s.times[1:] for s in ready])
        keeps = (arr.firsts_in(los, his) == 0) & ~arr.untracked_in(los, his)
        counts, contexts = arr.running((los + his) / 2.0)
        # The kept gaps of every stream, selected at once: a stream's are a slice of them, the same
        # numbers in the same order as selecting from its own gaps (and a slice of a contiguous array
        # sums as its copy does). Each ready stream has at least `MIN_KEPT_GAPS` gaps.
        kept_gaps, kept_counts, kept_contexts = (his - los)[keeps], counts[keeps], contexts[keeps]
        ends = np.cumsum([len(s.times) - 1 for s in ready]).tolist()
        kept_ends = keeps.cumsum()[[e - 1 for e in ends]].tolist()
        # Whether a stream's median kept gap is over the tolerance, from how many of its kept gaps are
        # (`_over_tolerance`): one pass over every kept gap instead of a partition per stream.
        over = np.zeros(len(kept_gaps) + 1, dtype=np.intp)
        (kept_gaps > tol).cumsum(out=over[1:])
        over_at = over[[0, *kept_ends]].tolist()  # kept gaps over it up to each stream's end
        at = kept_at = 0
        for j, (s, end, kept_end) in enumerate(zip(ready, ends, kept_ends, strict=True)):
            span, kept = slice(at, end), slice(kept_at, kept_end)
            at, kept_at = end, kept_end
            if kept_end - kept.start < MIN_KEPT_GAPS:
                continue
            gaps = kept_gaps[kept]
            if not _over_tolerance(gaps, over_at[j + 1] - over_at[j], tol):
                continue  # most receipts came several to a read (held back on the way): not timed
            seconds = _mean(gaps)
            batch = _mean(kept_counts[kept])
            out.append(
                DecodeObservation(
                    batch,
                    _mean(kept_contexts[kept]) / batch,  # avg_context
                    seconds,
                    _mean(counts[span]),  # concurrency
                    (end - span.start) / (s.last - s.first),  # tokens_per_s: (receipts - 1) / span
                )
            )

    def _evict(self, horizon: float) -> None:
        """Let go of what ended before `horizon` (nothing left to derive looks that far back), then of
        the oldest streams while over the bound. Whatever goes moves `known_from` past its end, so a
        derivation that would have needed it is skipped rather than made without it."""
        known = self.known_from
        keep: list[TimedStream] = []
        for s in self._streams:
            if s.last < horizon and not s.pending:
                known = max(known, s.last)
                self._tokens -= len(s.times)
            else:
                keep.append(s)
        if self._tokens > self._max_tokens:
            keep.sort(key=lambda s: s.last)
            cut = 0
            while self._tokens > self._max_tokens and cut < len(keep):
                s = keep[cut]
                self._tokens -= len(s.times)
                known = max(known, s.last)
                self.dropped += s.pending
                cut += 1
            keep = keep[cut:]
        self._streams = keep
        latest = self._dirty.evict(horizon)
        self.known_from = known if latest is None else max(known, latest)


def _median(values: list[float]) -> float:
    """`statistics.median` of a non-empty list of floats, the same number (the middle of the sorted
    values, or the mean of the two middles) without its wrapper's cost; sorts `values` in place."""
    values.sort()
    n = len(values)
    if n % 2:
        return values[n // 2]
    return (values[n // 2 - 1] + values[n // 2]) / 2


def _over_tolerance(gaps: Array, over: int, tol: float) -> bool:
    """``median(gaps) > tol`` (`median_of`: the middle of the sorted gaps, or the mean of the two
    middles) given how many of the gaps are over `tol`: the middle is over it when more than half are;
    of two middles, both are when more than half are (and their mean then is: rounding is monotone) and
    neither when fewer than half are. Only with exactly half over (or a tolerance so large that two
    middles' sum could overflow) is the median itself taken."""
    n = len(gaps)
    half = n // 2
    if n % 2:
        return over > half
    if over != half and tol < 1e300:
        return over > half
    return median_of(gaps) > tol


def _mean(a: Array) -> float:
    """`float(a.mean())` of a non-empty 1-D float array, the same number (the same pairwise sum, divided
    by the count) without the method's wrapper (four per stream observed)."""
    return float(np.add.reduce(a)) / len(a)


_DEFER: Final = object()  # a group that needs receipts from after `before`: derived at a later settle
