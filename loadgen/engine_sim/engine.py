"""`SimEngine`: a sans-IO model of one vLLM/SGLang engine's continuous-batching loop.

The engine holds a waiting queue and a running batch and advances in *iterations*. It never reads a
clock: callers pass ``now`` to `submit`, `abort` and `step`, and `step` returns the requests that
received tokens and the time of the next iteration end (``next_wake``), so a driver sleeps exactly
until then (the asyncio driver in `server`, or a test advancing a `FakeClock`).

One iteration, started at time ``t`` (the end of the previous one, or ``now`` when idle):

1. **Admission.** While fewer than ``max_num_seqs`` requests run, take the head of the waiting queue
   (FCFS, or by priority: vLLM semantics lower value first, SGLang higher first) if it has arrived by
   ``t``, the prompt-token budget of the prefill (``max_prefill_tokens``) allows it, and its KV fits:
   ``kv_used + context + 1 + (one token per running request) <= kv_capacity``. The queue head blocks the
   rest (no skipping), as in vLLM.
2. If anything was admitted, the iteration is a **prefill** of those prompts only (running decodes pause):
   ``t_pre = k1 · Σ context + c1``; each admitted request gets its first token at the end. The context of
   a re-admitted (preempted) request is prompt + tokens generated so far (recompute).
3. Otherwise, if requests run, it is a **decode** iteration: every running request needs one more KV
   slot; while they do not fit, the least urgent running request (the most recently admitted one under
   FCFS) is **preempted by recompute**: its KV is freed and it goes back to the head of the waiting
   queue, keeping the tokens it already streamed. Then ``t_dec = (k2 · l_avg + c2) · b + c3`` and every
   running request gets one token at the end.

KV is counted in tokens: a running request holds its context (prompt + generated) plus one slot for
the token being computed. With prefix caching on (``EngineConfig.prefix_caching``, `prefix_cache`), a
request submitted with its prompt's token ids shares the full prompt blocks the cache holds: they skip
the prefill (``t_pre`` counts the uncached tokens only, and so does the ``max_prefill_tokens`` budget), a
block held by several running requests is counted once, and cached blocks nobody uses are evicted
least-recently-used when space is needed. A request finishes when it has produced its target number of tokens
(``finish_reason`` "length" when that is ``max_tokens``, else "stop"). An aborted request (client gone)
leaves the queue or batch at once and frees its KV; an iteration already in flight still takes its
computed time.
"""

from __future__ import annotations

import enum
import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from loadgen.engine_sim.flavors import VLLM_BUCKETS
from loadgen.engine_sim.latency import LatencyModel
from loadgen.engine_sim.prefix_cache import PrefixCache
from loadgen.engine_sim.stats import EngineStats
from loadgen.engine_sim.tokens import TokenIds

SchedulingPolicy = Literal["fcfs", "priority"]
IterationKind = Literal["prefill", "decode"]


class RequestState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


class SimRequest:
    """One request inside the engine. The driver reads ``generated`` and ``state`` after a step."""

    __slots__ = (
        "admitted_at",
        "arrival",
        "block_keys",
        "blocks_held",
        "cached_tokens",
        "finish_reason",
        "finished_at",
        "first_token_at",
        "generated",
        "kv_held",
        "last_token_at",
        "max_tokens",
        "output_tokens",
        "preemptions",
        "priority",
        "prompt_tokens",
        "rid",
        "seq",
        "state",
        "token_ids",
    )

    def __init__(
        self,
        rid: str,
        *,
        prompt_tokens: int,
        output_tokens: int,
        max_tokens: int,
        priority: int,
        arrival: float,
        seq: int,
    ) -> None:
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.max_tokens = max_tokens
        self.priority = priority
        self.arrival = arrival
        self.seq = seq
        self.state = RequestState.WAITING
        self.generated = 0
        self.kv_held = 0  # with a prefix cache: the tokens held outside shared blocks
        self.token_ids: TokenIds | None = None  # with a prefix cache: the prompt's ids, and its blocks' keys
        self.block_keys: list[int] | None = None
        self.blocks_held = 0
        self.cached_tokens = 0  # prompt tokens found in the prefix cache at the last admission
        self.preemptions = 0
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.finished_at: float | None = None
        self.finish_reason: str | None = None

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def done(self) -> bool:
        return self.state is RequestState.FINISHED or self.state is RequestState.ABORTED

    def __repr__(self) -> str:
        return f"SimRequest({self.rid!r}, {self.state.value}, {self.generated}/{self.output_tokens})"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    latency: LatencyModel
    max_num_seqs: int
    kv_capacity_tokens: int
    max_prefill_tokens: int = 8192
    policy: SchedulingPolicy = "fcfs"
    higher_priority_first: bool = False  # SGLang's default; vLLM runs the lowest value first
    prefix_caching: bool = False
    block_size: int = 16  # tokens per KV block (vLLM's default on GPU; 128 on CPU)

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.kv_capacity_tokens < 2:
            raise ValueError("kv_capacity_tokens must be >= 2")
        if self.max_prefill_tokens < 1:
            raise ValueError("max_prefill_tokens must be >= 1")
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")


@dataclass(frozen=True, slots=True)
class IterationRecord:
    kind: IterationKind
    start: float
    end: float
    batch: int
    tokens: int  # prefill: Σ prompt (context) tokens; decode: Σ context tokens of the batch

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(slots=True)
class StepResult:
    woken: list[SimRequest] = field(default_factory=list)  # got tokens or finished (may repeat)
    iterations: list[IterationRecord] = field(default_factory=list)
    next_wake: float | None = None


@dataclass(slots=True)
class _Iteration:
    kind: IterationKind
    start: float
    end: float
    members: list[SimRequest]
    tokens: int


class _WaitQueue:
    """FCFS deque or priority heap with lazy removal of aborted entries."""

    __slots__ = ("_fifo", "_heap", "_live", "_sign")

    def __init__(self, policy: SchedulingPolicy, higher_first: bool) -> None:
        self._fifo: deque[SimRequest] | None = deque() if policy == "fcfs" else None
        self._heap: list[tuple[int, int, SimRequest]] = []
        self._sign = -1 if higher_first else 1
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def push(self, req: SimRequest) -> None:
        if self._fifo is not None:
            self._fifo.append(req)
        else:
            heapq.heappush(self._heap, (self._sign * req.priority, req.seq, req))
        self._live += 1

    def push_preempted(self, req: SimRequest) -> None:
        if self._fifo is not None:
            self._fifo.appendleft(req)
        else:  # its original sequence number puts it ahead of later arrivals of the same priority
            heapq.heappush(self._heap, (self._sign * req.priority, req.seq, req))
        self._live += 1

    def discard(self, req: SimRequest) -> None:
        """`req` left the queue (aborted); its entry is dropped lazily."""
        self._live -= 1

    def peek(self) -> SimRequest | None:
        if self._fifo is not None:
            while self._fifo and self._fifo[0].state is not RequestState.WAITING:
                self._fifo.popleft()
            return self._fifo[0] if self._fifo else None
        while self._heap and self._heap[0][2].state is not RequestState.WAITING:
            heapq.heappop(self._heap)
        return self._heap[0][2] if self._heap else None

    def pop(self) -> SimRequest:
        req = self.peek()
        if req is None:
            raise IndexError("pop from an empty wait queue")
        if self._fifo is not None:
            self._fifo.popleft()
        else:
            heapq.heappop(self._heap)
        self._live -= 1
        return req


class SimEngine:
    def __init__(self, config: EngineConfig, *, stats: EngineStats | None = None) -> None:
        self.config = config
        self.stats = stats if stats is not None else EngineStats(VLLM_BUCKETS)
        self._lat = config.latency
        self._waiting = _WaitQueue(config.policy, config.higher_priority_first)
        self.running: list[SimRequest] = []
        self.kv_used = 0
        self._iter: _Iteration | None = None
        self._seq = 0
        self.prefix_cache = PrefixCache(config.block_size) if config.prefix_caching else None

    # ---- observation -------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_usage(self) -> float:
        return self.kv_used / self.config.kv_capacity_tokens

    @property
    def busy(self) -> bool:
        return self._iter is not None

    @property
    def next_wake(self) -> float | None:
        return self._iter.end if self._iter is not None else None

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
        """Queue a request; call `step(now)` afterwards to start an idle engine. `token_ids` (the first
        ``prompt_tokens`` are read) let a prefix cache match and store the prompt's blocks."""
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError("a request needs >= 1 prompt token and >= 1 output token")
        if prompt_tokens + output_tokens + 1 > self.config.kv_capacity_tokens:
            raise ValueError("the request cannot fit in the KV cache even alone")
        self._seq += 1
        req = SimRequest(
            rid,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            max_tokens=max_tokens if max_tokens is not None else output_tokens,
            priority=priority,
            arrival=now,
            seq=self._seq,
        )
        if self.prefix_cache is not None and token_ids is not None:
            req.token_ids = token_ids[:prompt_tokens]
            req.block_keys = self.prefix_cache.block_keys(req.token_ids)
        self._waiting.push(req)
        self.stats.requests_received += 1
        return req

    def abort(self, req: SimRequest) -> bool:
        """The client went away: drop `req` and free its KV. True if it was still live."""
        if req.state is RequestState.WAITING:
            self._waiting.discard(req)
        elif req.state is RequestState.RUNNING:
            self.running.remove(req)
            self._free(req)
        else:
            return False
        req.state = RequestState.ABORTED
        self.stats.requests_aborted += 1
        return True

    def abort_all(self) -> list[SimRequest]:
        """Abort every live request (the endpoint died) and drop the iteration in flight."""
        live: list[SimRequest] = []
        while (req := self._waiting.peek()) is not None:
            self._waiting.pop()
            req.state = RequestState.ABORTED
            self.stats.requests_aborted += 1
            live.append(req)
        for req in list(self.running):
            self.abort(req)
            live.append(req)
        self._iter = None
        return live

    def step(self, now: float) -> StepResult:
        """Complete every iteration that ended by `now`, start the next one; see the module doc."""
        result = StepResult()
        while self._iter is not None and self._iter.end <= now:
            done = self._iter
            self._iter = None
            self._complete(done, result.woken)
            result.iterations.append(
                IterationRecord(done.kind, done.start, done.end, len(done.members), done.tokens)
            )
            self._start(done.end)
        if self._iter is None:
            self._start(now)
        result.next_wake = self._iter.end if self._iter is not None else None
        return result

    # ---- the batching loop -------------------------------------------------------------------
    def _start(self, t: float) -> None:
        cfg = self.config
        admitted: list[SimRequest] = []
        prefill_tokens = 0
        cache = self.prefix_cache
        if len(self._waiting) and len(self.running) < cfg.max_num_seqs:
            while len(self.running) + len(admitted) < cfg.max_num_seqs:
                req = self._waiting.peek()
                if req is None or req.arrival > t:
                    break
                ctx = req.context
                plan = None if cache is None else cache.plan(req, ctx)
                need, computed = (ctx + 1, ctx) if plan is None else (plan.need, ctx - plan.hit_tokens)
                # room for this prompt + its first token, and one more token for every running request
                headroom = len(self.running) + len(admitted)
                if self.kv_used + need + headroom > cfg.kv_capacity_tokens:
                    break
                if admitted and prefill_tokens + computed > cfg.max_prefill_tokens:
                    break
                self._waiting.pop()
                req.state = RequestState.RUNNING
                if cache is None or plan is None:
                    req.kv_held = ctx + 1
                    self.kv_used += ctx + 1
                else:
                    self.kv_used += cache.admit(req, ctx, plan, t)
                    cache.evict_to(cfg.kv_capacity_tokens - self.kv_used)
                if req.admitted_at is None:
                    req.admitted_at = t
                    self.stats.queue.observe(t - req.arrival)
                admitted.append(req)
                prefill_tokens += computed
        if admitted:
            self.running.extend(admitted)
            self._iter = _Iteration(
                "prefill", t, t + self._lat.prefill_s(prefill_tokens), admitted, prefill_tokens
            )
            return
        if not self.running:
            return
        while self.running and self.kv_used + len(self.running) > cfg.kv_capacity_tokens:
            self._preempt(self._victim())
        b = len(self.running)
        if b == 0:
            return
        if cache is not None:
            cache.evict_to(cfg.kv_capacity_tokens - self.kv_used - b)
        ctx_total = 0
        for req in self.running:
            ctx_total += req.prompt_tokens + req.generated
            req.kv_held += 1
        self.kv_used += b
        self._iter = _Iteration(
            "decode", t, t + self._lat.decode_s(b, ctx_total / b), list(self.running), ctx_total
        )

    def _victim(self) -> SimRequest:
        if self.config.policy == "fcfs":
            return self.running[-1]
        sign = -1 if self.config.higher_priority_first else 1
        return max(self.running, key=lambda r: (sign * r.priority, r.seq))

    def _preempt(self, req: SimRequest) -> None:
        self.running.remove(req)
        self._free(req)
        req.state = RequestState.WAITING
        req.preemptions += 1
        self.stats.preemptions += 1
        self.stats.preempted_input_tokens += req.prompt_tokens
        self.stats.preempted_output_tokens += req.generated
        self._waiting.push_preempted(req)

    def _complete(self, it: _Iteration, woken: list[SimRequest]) -> None:
        t = it.end
        stats = self.stats
        stats.iterations += 1
        stats.busy_s += it.end - it.start
        any_finished = False
        for req in it.members:
            if req.state is not RequestState.RUNNING:
                continue  # aborted (or preempted) while the iteration ran
            req.generated += 1
            stats.generation_tokens += 1
            if req.first_token_at is None:
                req.first_token_at = t
                stats.ttft.observe(t - req.arrival)
                stats.prompt_tokens += req.prompt_tokens
            elif req.last_token_at is not None:
                stats.itl.observe(t - req.last_token_at)
            req.last_token_at = t
            if req.generated >= req.output_tokens:
                reason = "length" if req.generated >= req.max_tokens else "stop"
                req.state = RequestState.FINISHED
                req.finish_reason = reason
                req.finished_at = t
                self._free(req)
                stats.e2e.observe(t - req.arrival)
                stats.requests_finished[reason] = stats.requests_finished.get(reason, 0) + 1
                any_finished = True
            woken.append(req)
        if any_finished:
            self.running = [r for r in self.running if r.state is RequestState.RUNNING]

    def _free(self, req: SimRequest) -> None:
        """`req` leaves the batch: its KV is no longer in use (its cached blocks may stay, free)."""
        if self.prefix_cache is None:
            self.kv_used -= req.kv_held
            req.kv_held = 0
        else:
            self.kv_used -= self.prefix_cache.release(req)
