"""The driver of `bench decisions` (`loadgen.bench.overhead.decision_cost`): a warmed-up gateway's
scheduler called directly on its virtual clock, every call timed (`Driver`), the times per kind
(`Timings`)."""

from __future__ import annotations

import dataclasses
import gc
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import numpy as np

from gateway.core.errors import BerthError
from gateway.core.heap import TICK_S as GC_TICK_S
from gateway.core.heap import GcSchedule
from gateway.core.slo import SloKind
from gateway.core.types import ApiKind, EndpointId, EngineGauges, ModelName, RequestId
from gateway.dispatch.context import RequestContext
from gateway.sched.decisions import Decision, Dispatch, Preempt, Reject
from gateway.sched.scheduler import Scheduler
from loadgen.bench.overhead.slow_calls import CallProfiles
from loadgen.client import build_body, build_headers
from loadgen.fleetsim.gateway import SimGateway
from loadgen.fleetsim.sim import Simulation
from loadgen.runner import RunOptions, build_schedule
from loadgen.workloads import get_workload
from loadgen.workloads.base import TaskSpec

MODEL: Final = ModelName("model-7b")
ROUND_S: Final = 0.005  # virtual time per round (a 100-endpoint fleet finishes ~200 requests/s)
TICK_S: Final = 0.1  # the daemon's queue ticker (gateway.app.QUEUE_TICK_S)
SCRAPE_S: Final = 2.0
REFRESH_S: Final = 1.0
PROGRESS_PER_ROUND: Final = 10  # ~2,000 progress reports/s: 1,600 streams, one report per 16 tokens
PROGRESS_EVERY: Final = 16
#: Submissions in a row without a deeper queue after which filling stops at the depth reached.
FILL_STALL: Final = 3000
_T = TypeVar("_T")
#: `bench decisions --columns`: placement over columns as the profile decides, for every placement it can,
#: or for none (the plain path), by the profile's threshold (`SchedulerProfile.columns_from`).
COLUMNS: Final = {"auto": None, "always": 0, "never": 1 << 30}
_API: Final = {"chat": ApiKind.CHAT, "completion": ApiKind.COMPLETION}


@dataclass(slots=True)
class Timings:
    """Nanoseconds per call, by kind."""

    ns: dict[str, list[int]] = field(default_factory=dict)

    def add(self, kind: str, ns: int) -> None:
        self.ns.setdefault(kind, []).append(ns)

    def summary(self) -> dict[str, dict[str, float | int]]:
        out: dict[str, dict[str, float | int]] = {}
        for kind, vals in self.ns.items():
            a = np.asarray(vals, dtype=np.float64) / 1000.0
            out[kind] = {
                "n": len(vals),
                "p50_us": round(float(np.percentile(a, 50)), 1),
                "p99_us": round(float(np.percentile(a, 99)), 1),
                "max_us": round(float(a.max()), 1),
                "mean_us": round(float(a.mean()), 1),
            }
        return out


class Driver:
    """Drives a warmed-up gateway's scheduler directly, timing every call."""

    def __init__(
        self,
        sim: Simulation,
        workload: str,
        *,
        sla_scale: float,
        seed: int,
        batch_only: bool = False,
        timer: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        """`timer`: what a call is timed with (ns)."""
        self.timer = timer
        self.profiles: CallProfiles | None = None  # each call profiled on its own (`profile_preset`)
        self.gw: SimGateway = sim.gw
        self.sched: Scheduler = sim.gw.scheduler
        self.clock = sim.clock
        self.sla_scale = sla_scale
        self.rng = random.Random(seed)
        run = RunOptions(target="decisions", workload=workload, rate=50.0, duration_s=400.0, seed=seed + 1000)
        self.tasks: list[TaskSpec] = build_schedule(get_workload(workload), run)
        if batch_only:  # the backlog case: only the calls of a class of kind batch in the preset
            slo = sim.gw.policy.slo
            self.tasks = [
                t
                for t in self.tasks
                if t.calls[0].slo_class is not None
                and t.calls[0].slo_class in slo.classes
                and slo.class_of(t.calls[0].slo_class).kind is SloKind.BATCH
            ]
            if not self.tasks:
                raise ValueError(f"{workload}: no requests of a batch class in policy {sim.gw.policy.name!r}")
        self.next_task = 0
        self.running: list[RequestId] = []
        self.produced: dict[RequestId, int] = {}
        self.first_token: dict[RequestId, float] = {}
        self.rejected = 0
        # The timed submits, and those of them the scheduler refused (SLO admission: a refusal is far
        # cheaper than a request let wait, so the share says what the submit figures are made of).
        self.submits = 0
        self.submits_refused = 0
        self.timings = Timings()
        self.estimates = {v.id: v.estimates for v in self.sched.snapshot().endpoints}
        self.ids: list[EndpointId] = list(self.sched.endpoint_ids())
        self._last_tick = self._last_scrape = self._last_refresh = self.clock.t

    # ----------------------------------------------------------------- requests
    def _new_request(self) -> Any:
        """The next task's first call through the front's admission path (not timed); None when the
        front refused it."""
        spec = self.tasks[self.next_task % len(self.tasks)]
        k = self.next_task
        self.next_task += 1
        if k >= len(self.tasks):  # another lap: new task ids
            spec = dataclasses.replace(spec, task_id=f"{spec.task_id}-{k // len(self.tasks)}")
        call = spec.calls[0]
        ctx = RequestContext(id=f"dc-{k}", api=_API[call.api], arrival=self.clock.t)
        body = build_body(call, MODEL, salt=k)
        headers = build_headers(spec, call, {}, slo_scale=self.sla_scale, slo_headers=False)
        try:
            return self.gw.admit(ctx, ctx.api, body, list(headers.items()))
        except BerthError:
            self.rejected += 1
            return None

    def _timed(self, kind: str, fn: Callable[..., _T], *args: Any) -> _T:
        if self.profiles is not None:
            out, ns = self.profiles.timed(kind, fn, *args)
            self.timings.add(kind, ns)
            return out  # type: ignore[no-any-return]  # fn's result, passed through
        timer = self.timer
        t0 = timer()
        out = fn(*args)
        self.timings.add(kind, timer() - t0)
        return out

    def _apply(self, decisions: Sequence[Decision]) -> None:
        for d in decisions:
            if isinstance(d, Dispatch):
                self.running.append(d.req.id)
                self.produced[d.req.id] = 0
            elif isinstance(d, Preempt):
                # Its seat was freed and it waits again (not a completion): it leaves the running set
                # and its next Dispatch adds it back.
                self._forget(d.victim.id)
            else:
                self.rejected += 1

    def _forget(self, rid: RequestId) -> None:
        self.produced.pop(rid, None)
        self.first_token.pop(rid, None)
        try:
            i = self.running.index(rid)  # preemptions are rare: a walk of the running set is fine
        except ValueError:
            return
        last = self.running.pop()
        if i < len(self.running):
            self.running[i] = last

    def submit(self, *, timed: bool = True) -> None:
        sreq = self._new_request()
        if sreq is None:
            return
        d = self._timed("submit", self.sched.submit, sreq) if timed else self.sched.submit(sreq)
        if timed:
            self.submits += 1
            self.submits_refused += isinstance(d, Reject)
        if d is not None:
            self._apply((d,))
        if self.sched.outbox:  # the preemptions the submit made for its request
            self._apply(self.sched.take_preemptions())

    def complete_one(self) -> None:
        if not self.running:
            return
        i = self.rng.randrange(len(self.running))
        rid = self.running[i]
        self.running[i] = self.running[-1]
        self.running.pop()
        self.produced.pop(rid, None)
        self.first_token.pop(rid, None)
        self._apply(self._timed("complete", self.sched.complete, rid))
        self._go_on()

    def _go_on(self) -> None:
        """The serving a call left to do (`Scheduler.owed`), one slice a call, each timed as its own
        call (`serve`), as the daemon runs one slice per turn of its event loop."""
        while self.sched.owed:
            self._apply(self._timed("serve", self.sched.serve))

    def progress(self, n: int) -> None:
        for _ in range(min(n, len(self.running))):
            rid = self.running[self.rng.randrange(len(self.running))]
            produced = self.produced[rid] + PROGRESS_EVERY if self.produced[rid] else 1
            self.produced[rid] = produced
            first = self.first_token.setdefault(rid, self.clock.t)
            self._timed("progress", self.sched.progress, rid, produced, first)

    # ----------------------------------------------------------------- periodic work
    def periodic(self) -> None:
        now = self.clock.t
        if now - self._last_tick >= TICK_S:
            self._last_tick = now
            self._apply(self._timed("tick", self.sched.tick))
            self._go_on()
        if now - self._last_scrape >= SCRAPE_S:
            self._last_scrape = now
            for eid in self.ids:
                inflight = float(self.sched.inflight_on(eid))
                gauges = EngineGauges(running=inflight, waiting=0.0, kv_usage=0.5)
                self._timed("observe_gauges", self.sched.observe_gauges, eid, gauges)
        if now - self._last_refresh >= REFRESH_S:
            self._last_refresh = now
            self._timed("set_estimates (all endpoints)", self._push_estimates)

    def _push_estimates(self) -> None:
        """What the telemetry refresh hands in: every endpoint's estimates, their EWMAs moved a little."""
        wobble = 1.0 + self.rng.uniform(-0.01, 0.01)
        for eid in self.ids:
            est = self.estimates.get(eid)
            if est is not None and est.ttft_ewma_s is not None:
                est = dataclasses.replace(est, ttft_ewma_s=est.ttft_ewma_s * wobble)
            self.sched.set_estimates(eid, est)

    # ----------------------------------------------------------------- phases
    def fill(self, queued: int) -> int:
        """Submit (untimed) until `queued` requests wait; the depth reached (admission may refuse)."""
        limits = self.sched.limits
        if limits.max_queue_per_model < queued + 1000:  # the benchmark's gateway.toml allows 8,192
            self._apply(self.sched.set_limits(dataclasses.replace(limits, max_queue_per_model=queued + 1000)))
            self._go_on()
        attempts = 0
        limit = 30 * queued + 10 * len(self.ids) * 64
        deepest, grew_at = 0, 0
        while self.sched.queue_depth(MODEL) < queued and attempts < limit:
            self.clock.t += 0.001
            self.submit(timed=False)
            attempts += 1
            self.periodic()
            depth = self.sched.queue_depth(MODEL)
            if depth > deepest:
                deepest, grew_at = depth, attempts
            elif attempts - grew_at > FILL_STALL and depth > 0:
                break  # admission refuses what would queue (the SLAs cannot be met): the depth reached
        self.timings = Timings()  # the fill's periodic calls are not measured
        return self.sched.queue_depth(MODEL)

    def measure(self, rounds: int, queued: int, *, gc_mode: str = "daemon") -> None:
        """`rounds` rounds timed; `gc_mode` "daemon": the collector on the daemon's schedule
        (`GcSchedule`), stepped between rounds as the daemon's timer steps it between callbacks, each
        pause timed as `gc (between calls)`; "cpython": CPython's own thresholds (a collection counts in
        the call it interrupts)."""
        schedule = GcSchedule() if gc_mode == "daemon" else None
        if schedule is None:
            gc.collect()
        else:
            schedule.settle()
        last_tick = time.monotonic()
        try:
            for _ in range(rounds):
                self.clock.t += ROUND_S
                self.complete_one()
                self.progress(PROGRESS_PER_ROUND)
                for _ in range(4):  # refill what was dispatched (a refused submission is tried again)
                    if self.sched.queue_depth(MODEL) >= queued:
                        break
                    self.submit()
                self.periodic()
                if schedule is not None:
                    t0 = self.timer()
                    ran = schedule.step()
                    if time.monotonic() - last_tick >= GC_TICK_S:
                        last_tick = time.monotonic()
                        full = schedule.full_collections
                        schedule.tick(len(self.running) + self.sched.queue_depth(MODEL))
                        ran = ran or schedule.full_collections != full
                    if ran:
                        self.timings.add("gc (between calls)", self.timer() - t0)
        finally:
            if schedule is not None:
                schedule.close()


def force_columns(sim: Simulation, columns: str) -> None:
    """Place over columns as `columns` says (`COLUMNS`) from the start of `sim`'s run: its gateway's
    policy with the profile's threshold set (the plain and the columnar path make the same choices, so
    runs with either compare their cost on the same decisions)."""
    least = COLUMNS[columns]
    if least is None:
        return
    gw = sim.gw
    profile = dataclasses.replace(gw.policy.profile, columns_from=least)
    policy = dataclasses.replace(gw.policy, profile=profile)
    gw.policy = policy
    gw.scheduler.set_policy(policy)
