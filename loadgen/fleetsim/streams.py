"""What the simulated client and berth's relay see of each stream: an endpoint (its engine and its one
pending wake), a task and its calls, and how an engine's tokens reach the calls. A token of an iteration
run on its own is handed out at its wake (`Simulation._tokens`); the tokens of a decode run (`runs`)
are a slice of the run's iteration log, handed out when the run commits them (`hand_out`: each call's
count, last byte and gaps in one step), and the relay's progress reports among them are planned when
the run starts (`plan_reports`), each made at its token's time.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Final

from gateway.core.types import EndpointId, RequestId
from gateway.dispatch.context import RequestContext
from loadgen.client import RequestResult
from loadgen.engine_sim.engine import SimRequest
from loadgen.engine_sim.tokens import TokenIds
from loadgen.fleetsim.gateway import SimGateway
from loadgen.fleetsim.runs import DecodeRun, RunEngine
from loadgen.report import TaskResult
from loadgen.workloads.base import TaskSpec

#: Tokens between a stream's progress reports (gateway.dispatch.relay.PROGRESS_EVERY).
PROGRESS_EVERY: Final = 16


class Endpoint:
    __slots__ = ("engine", "id", "kv_capacity", "removed", "run_seen", "wake_at")

    def __init__(self, eid: EndpointId, engine: RunEngine) -> None:
        self.id = eid
        self.engine = engine
        self.kv_capacity = float(engine.config.kv_capacity_tokens)
        self.wake_at: float | None = None
        self.removed = False  # its instance stopped (lifecycle): pending wakes and scrapes are void
        self.run_seen: DecodeRun | None = None  # the engine's last run whose progress reports are planned


class Task:
    __slots__ = ("result", "sent", "spec", "start")

    def __init__(self, spec: TaskSpec, result: TaskResult, start: float) -> None:
        self.spec = spec
        self.result = result
        self.start = start
        self.sent: list[RequestResult] = []


class Call:
    __slots__ = (
        "ctx",
        "done",
        "endpoint",
        "engine_req",
        "gaps",
        "gw",
        "index",
        "last_byte",
        "produced",
        "prompt_ids",
        "report_at",
        "result",
        "run_base",
        "run_first_at",
        "sreq_id",
        "task",
    )

    def __init__(
        self, task: Task, index: int, result: RequestResult, ctx: RequestContext, gw: SimGateway
    ) -> None:
        self.gw = gw  # the replica the call went to
        self.task = task
        self.index = index
        self.result = result
        self.ctx = ctx
        self.done = False
        self.endpoint: Endpoint | None = None
        self.engine_req: SimRequest | None = None
        # the gaps between its tokens so far, as doubles: what telemetry's record and the report's
        # histogram take in (numpy and the windows copy a buffer instead of converting float objects)
        self.gaps: array[float] = array("d")
        self.produced = 0
        self.report_at = 1
        self.last_byte = 0.0
        self.sreq_id: RequestId | None = None
        self.run_base = 0  # tokens the client had when the current engine run started (resumes)
        self.run_first_at: float | None = None  # the current run's first token
        self.prompt_ids: TokenIds | None = None  # when an engine caches prefixes


class Reports:
    """The relay's progress reports at a run's iterations before its last (the last one's tokens are
    handed out one by one): a member whose first report is at iteration `i0` reports again every
    PROGRESS_EVERY iterations, so the members are kept by `i0 % PROGRESS_EVERY` and one event at a time
    stands for the run's next iteration with a report. Void from the iteration a cut removed on.

    A member is kept as (call, request, base, i0): its report at iteration `i >= i0` counts `base + i`
    tokens of the call's current engine run (`base`: the tokens before the run's first iteration, plus
    one, less the call's `run_base`; both stay while the call's engine request is the member)."""

    __slots__ = ("at", "buckets", "ends", "run", "stop")

    def __init__(self, run: DecodeRun) -> None:
        self.run = run
        self.ends = run.ends  # the run's list (a cut shortens it in place)
        self.stop = len(run.ends) - 1
        # the members by `i0 % PROGRESS_EVERY`, only the buckets with members (a batch has a few), each
        # with how far ahead the next bucket is (`plan_reports`): from an iteration `i` with reports, the
        # next is `i + skip` (unless `stop` comes first)
        self.buckets: dict[int, tuple[list[tuple[Call, SimRequest, int, int]], int]] = {}
        self.at = -1  # the iteration of the pending event


def hand_out(on_engine: dict[SimRequest, Call], committed: Sequence[tuple[DecodeRun, int, int]]) -> None:
    """Committed iterations `a..b-1` of runs: each member's call has one token at each of
    `run.ends[a:b]` (its gaps: from its last byte to the first, then the run's own); the progress
    reports among them were made at their times (`plan_reports`)."""
    for run, a, b in committed:
        ends = run.ends
        first = ends[a]
        last = ends[b - 1]
        n = b - a
        tail = run.gaps[a + 1 : b] if n > 1 else None
        for req in run.members:
            call = on_engine.get(req)
            if call is None:
                continue
            call.gaps.append(first - call.last_byte)
            if tail is not None:
                call.gaps.extend(tail)
            produced = call.produced + n
            call.produced = produced
            call.last_byte = last
            if produced >= call.report_at:  # the next report point after `produced`
                call.report_at += PROGRESS_EVERY * ((produced - call.report_at) // PROGRESS_EVERY + 1)


def plan_reports(on_engine: dict[SimRequest, Call], run: DecodeRun) -> Reports | None:
    """The relay's progress reports (every PROGRESS_EVERY tokens) at a new run's iterations before its
    last; None when there are none. Its first is at `plan.at`."""
    plan = Reports(run)
    buckets: dict[int, list[tuple[Call, SimRequest, int, int]]] = {}
    first = plan.stop
    done = run.done
    for req in run.members:
        call = on_engine.get(req)
        if call is None:
            continue
        p0 = call.produced - done  # tokens before the run's first iteration
        i0 = call.report_at - p0 - 1  # >= done: the reports before were made
        first = min(first, i0)
        member = (call, req, p0 + 1 - call.run_base, i0)
        bucket = buckets.get(i0 % PROGRESS_EVERY)
        if bucket is None:
            buckets[i0 % PROGRESS_EVERY] = [member]
        else:
            bucket.append(member)
    if first >= plan.stop:
        return None
    # from each bucket, the distance to the next one (cyclically: the first one's, PROGRESS_EVERY later)
    rs = sorted(buckets)
    plan.buckets = {
        r: (buckets[r], nxt - r) for r, nxt in zip(rs, [*rs[1:], rs[0] + PROGRESS_EVERY], strict=True)
    }
    plan.at = first
    return plan
