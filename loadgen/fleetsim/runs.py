"""`RunEngine`: the engine model (`SimEngine`) with decode iterations over an unchanged batch planned as
one *run*, so the fleet simulator handles an engine's iterations, not its tokens.

When a decode iteration starts and nothing can change the batch before some later iteration (no request
can be admitted: the waiting queue is empty, the batch is full, or its head does not fit the KV cache,
which only fills during decode; the KV cache holds the batch's next tokens; no request finishes before
the last), the iterations up to the first finish (at most `max_run` of them) are planned at once: their
end times are computed exactly as one iteration after another would compute them (same arithmetic, same
order), and every member gets one token at each. Nothing in the run is handed out until it is
*committed*: `step` at the run's end commits it all, the last iteration through the base model (finishes,
stats, `woken`); `sync(now)` commits the iterations that ended by `now` (a scrape sees the KV of the
iteration in flight, as with one iteration at a time); `cut(now)` also drops the iterations after the
one in flight, which is what an outside change (a submit, an abort) needs: the next iteration is then
planned from the engine's state as it then is. `submit` cuts by itself; a driver cuts before `abort`.

Committed iterations are listed in `committed` (the driver takes them with `take_committed`): a token of
each member at each of `run.ends[a:b]`, so a request's token times are a slice of its engine's iteration
log and its gaps the differences of that slice.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from typing import Final

import numpy as np

from loadgen.engine_sim.engine import (
    EngineConfig,
    SimEngine,
    SimRequest,
    StepResult,
    _Iteration,
)
from loadgen.engine_sim.latency import LatencyModel
from loadgen.engine_sim.stats import EngineStats, Histogram
from loadgen.engine_sim.tokens import TokenIds

#: The most iterations planned in one run: an outside change discards what follows it, so planning far
#: ahead of the next arrival is wasted work.
MAX_RUN: Final = 128
#: Runs of more iterations than this are planned over arrays (`plan_run`: only with `max_run` raised
#: above `MAX_RUN`), the others in a loop (`plan_loop`). Inside a run of the simulator numpy's fixed
#: cost per call is about twice what a micro-benchmark shows (its code out of cache between runs): a
#: planned run costs about 20 µs over arrays, and the loop is cheaper up to a run of `MAX_RUN`.
_VECTOR_FROM: Final = MAX_RUN + 1


class DecodeRun:
    """Decode iterations of one batch: `ends[i]` is iteration i's end (iteration i > 0 starts at
    `ends[i - 1]`, iteration 0 at `start`); `gaps[i] = ends[i] - ends[i - 1]`; a member has one more token
    at each. `started` iterations hold their KV (the engine's `kv_used`, each member's `kv_held`),
    `done` are committed. A cut shortens `ends` to the committed iterations and ends the run."""

    __slots__ = ("done", "ends", "gaps", "members", "start", "started", "tokens0")

    def __init__(self, start: float, members: list[SimRequest], tokens0: int) -> None:
        self.start = start
        self.members = members
        self.tokens0 = tokens0  # Σ context of the batch at iteration 0 (each later one: + batch size)
        self.ends: list[float] = []
        # as doubles: a member's call takes a slice of them per commit (`streams.hand_out`), a copy of a
        # buffer instead of a float object converted per token
        self.gaps: array[float] = array("d")
        self.started = 1  # the base model started iteration 0
        self.done = 0

    @property
    def batch(self) -> int:
        return len(self.members)

    def iteration_at(self, t: float) -> int:
        """The index of the first iteration that has not ended by `t` (len(ends) if all have)."""
        return bisect_right(self.ends, t)


class RunEngine(SimEngine):
    def __init__(
        self, config: EngineConfig, *, stats: EngineStats | None = None, max_run: int = MAX_RUN
    ) -> None:
        super().__init__(config, stats=stats)
        self.max_run = max_run
        self.run: DecodeRun | None = None  # the run in flight; `_iter` is then its last iteration
        self.committed: list[tuple[DecodeRun, int, int]] = []  # (run, a, b): iterations a..b-1 handed out

    def take_committed(self) -> list[tuple[DecodeRun, int, int]]:
        out = self.committed
        if out:
            self.committed = []
        return out

    # ---- events ------------------------------------------------------------------------------
    def submit(
        self,
        rid: str,
        *,
        prompt_tokens: int,
        output_tokens: int,
        now: float,
        max_tokens: int | None = None,
        priority: int = 0,
        token_ids: TokenIds | None = None,
    ) -> SimRequest:
        self.cut(now)  # a new request may be admitted after the iteration in flight
        return super().submit(
            rid,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            now=now,
            max_tokens=max_tokens,
            priority=priority,
            token_ids=token_ids,
        )

    def abort(self, req: SimRequest) -> bool:
        if self.run is not None and req in self.run.members:
            raise RuntimeError("cut(now) the run before aborting one of its requests")
        return super().abort(req)

    def abort_all(self) -> list[SimRequest]:
        run = self.run
        if run is not None:  # every iteration of the run counts as begun: all its KV is freed below
            self._hold(run, len(run.ends))
            self.run = None
        return super().abort_all()

    def step(self, now: float) -> StepResult:
        """As `SimEngine.step`, but a run's iterations before its last are committed into `committed`
        instead of `woken` (the last one's tokens and finishes are in `woken`), and `iterations` stays
        empty (the runs are the iteration log)."""
        result = StepResult()
        while True:
            run = self.run
            it = self._iter
            if it is None or it.end > now:
                if run is not None:
                    self.sync(now)
                break
            if run is not None:
                self._commit(run, len(run.ends) - 1)
                self.run = None
            self._iter = None
            self._complete(it, result.woken)
            self._start(it.end)
        if self._iter is None:
            self._start(now)
        result.next_wake = self._iter.end if self._iter is not None else None
        return result

    def sync(self, now: float) -> None:
        """Bring the run to `now`: the iterations begun by then hold their KV, those ended are committed."""
        run = self.run
        if run is None:
            return
        last = len(run.ends) - 1
        ended = min(run.iteration_at(now), last)  # the last iteration is committed by `step`
        self._hold(run, min(ended + 1, last + 1))
        if ended > run.done:
            self._commit(run, ended)

    def cut(self, now: float) -> None:
        """`sync(now)`, then end the run after the iteration in flight, which becomes a plain one."""
        run = self.run
        if run is None:
            return
        self.sync(now)
        f = run.done  # in flight (begun, not ended; or the last, ended at `now`)
        start = run.start if f == 0 else run.ends[f - 1]
        self._iter = _Iteration("decode", start, run.ends[f], run.members, run.tokens0 + f * run.batch)
        del run.ends[f:]  # the run keeps its committed iterations: the one in flight is a plain one now
        del run.gaps[f:]
        self.run = None

    # ---- the batching loop -------------------------------------------------------------------
    def _start(self, t: float) -> None:
        super()._start(t)
        it = self._iter
        if it is None or it.kind != "decode" or not self._settled(t):
            return
        b = len(it.members)
        members = it.members
        remaining = min(r.output_tokens - r.generated for r in members)
        cfg = self.config
        cap = cfg.kv_capacity_tokens
        room = (cap - self.kv_used) // b  # later iterations whose KV fits
        n = min(remaining, room + 1, self.max_run)
        if n < 2:
            return
        run = DecodeRun(t, members, it.tokens)
        plan = plan_run if n >= _VECTOR_FROM else plan_loop
        ends, run.gaps = plan(self._lat, b, it.tokens, (t, it.end), n)
        run.ends = ends
        self.run = run
        self._iter = _Iteration("decode", ends[-2], ends[-1], members, it.tokens + (n - 1) * b)

    def _settled(self, t: float) -> bool:
        """Whether no waiting request can be admitted at the start of any iteration of a run from `t`:
        none waits, the batch is full, or the head does not fit the KV cache (which decode only fills)."""
        if not len(self._waiting):
            return True
        if len(self.running) >= self.config.max_num_seqs:
            return True
        head = self._waiting.peek()
        if head is None:
            return True
        if head.arrival > t:
            return False
        return self.kv_used + head.context + 1 + len(self.running) > self.config.kv_capacity_tokens

    def _hold(self, run: DecodeRun, started: int) -> None:
        """Iterations up to `started` have begun: their KV slots are taken (one per member each)."""
        more = started - run.started
        if more <= 0:
            return
        run.started = started
        self.kv_used += more * len(run.members)
        for req in run.members:
            req.kv_held += more

    def _commit(self, run: DecodeRun, upto: int) -> None:
        """Hand out iterations `run.done .. upto - 1` (none finishes a request): each member has one more
        token at each; the engine's counters as the iterations one by one would leave them (its sums of
        times up to rounding)."""
        a = run.done
        if upto <= a:
            return
        self._hold(run, upto + 1 if upto < len(run.ends) else upto)
        n = upto - a
        ends = run.ends
        first_end = ends[a]
        stats = self.stats
        itl = stats.itl
        b = len(run.members)
        for req in run.members:
            req.generated += n
            if req.last_token_at is not None:
                itl.observe(first_end - req.last_token_at)
            req.last_token_at = ends[upto - 1]
        start = run.start if a == 0 else ends[a - 1]
        stats.busy_s += ends[upto - 1] - start  # the iterations' durations, summed (up to rounding)
        if n > 1:  # the gaps between the run's own iterations, the same for every member
            gaps = run.gaps[a + 1 : upto]
            bounds = itl.bounds
            lo, hi = bisect_left(bounds, min(gaps)), bisect_left(bounds, max(gaps))
            if lo == hi:  # one bucket for all (the common case: decode time grows slowly in a run)
                itl.counts[lo] += (n - 1) * b
                itl.sum += sum(gaps) * b
                itl.count += (n - 1) * b
            else:
                for g in gaps:
                    _observe(itl, g, b)
        stats.iterations += n
        stats.generation_tokens += n * b
        run.done = upto
        self.committed.append((run, a, upto))


def plan_loop(
    lat: LatencyModel, b: int, tokens0: int, span: tuple[float, float], n: int
) -> tuple[list[float], array[float]]:
    """`plan_run` one iteration after another: each iteration's time is `LatencyModel.decode_s` of its
    batch and mean context, spelled out (the same operations in the same order, no call per iteration),
    each end the previous end plus that time, each gap the difference of two ends."""
    start, end = span
    k2, c2, c3 = lat.k2, lat.c2, lat.c3
    ends = [end]
    gaps = array("d", (end - start,))
    add_end, add_gap = ends.append, gaps.append
    tokens = tokens0
    for _ in range(n - 1):
        tokens += b
        nxt = end + ((k2 * (tokens / b) + c2) * b + c3)
        add_end(nxt)
        add_gap(nxt - end)
        end = nxt
    return ends, gaps


def plan_run(
    lat: LatencyModel, b: int, tokens0: int, span: tuple[float, float], n: int
) -> tuple[list[float], array[float]]:
    """A run's `ends` and `gaps` over arrays, bit for bit what the loop one iteration after another
    computes: each iteration's time is the same elementwise expression of its context sum (integers,
    exact in float64, as is its mean over the batch), each end the previous end plus that time (`cumsum`
    adds in order), each gap the difference of two ends. `span`: the first iteration's start and end.
    In place over one scratch array and without numpy's function wrappers (a run is planned per event)."""
    start, end0 = span
    ends = np.empty(n)
    ends[0] = end0
    steps = ends[1:]
    ks = _STEPS[: n - 1] if n <= len(_STEPS) else np.arange(1, n, dtype=np.float64)
    np.multiply(ks, b, out=steps)  # the context sums beyond tokens0: b, 2b, ... (exact)
    steps += tokens0
    steps /= b  # the mean context: the loop's `tokens / b`
    steps *= lat.k2
    steps += lat.c2
    steps *= b
    steps += lat.c3
    ends.cumsum(out=ends)
    gaps = np.empty(n)
    gaps[0] = end0 - start
    np.subtract(ends[1:], ends[:-1], out=gaps[1:])
    doubles = array("d")
    doubles.frombytes(gaps.data.cast("B"))  # the same doubles, one copy
    return ends.tolist(), doubles


#: 1, 2, 3, ...: the iterations after a run's first, as float64 (exact), sliced per run (a longer run
#: than `MAX_RUN`'s, with `SimOptions.max_run` set higher, makes its own).
_STEPS: Final = np.arange(1, 8 * MAX_RUN, dtype=np.float64)


def _observe(hist: Histogram, value: float, count: int) -> None:
    """`count` observations of `value` in an engine histogram."""
    hist.counts[bisect_left(hist.bounds, value)] += count
    hist.sum += value * count
    hist.count += count


__all__ = ["MAX_RUN", "DecodeRun", "RunEngine", "plan_loop", "plan_run"]
