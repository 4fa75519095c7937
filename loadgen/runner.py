"""`run_workload`: send a workload's tasks at their arrival times, measure everything, build the report.

Usable as a library (``berth demo`` drives it with a live view)::

    report = await run_workload(RunOptions(target="http://127.0.0.1:8080", workload="coding:pattern2",
                                           rate=2.0, duration_s=60), on_tick=show)

The schedule is fixed by the seed before anything is sent. Each task runs as its own asyncio task (in
one `asyncio.TaskGroup`): its calls go out one after another, each after its client-side gap; a failed
call ends the task (later calls are not sent). After the last arrival the run waits up to
``drain_timeout_s`` for tasks still in flight, then cancels them; their open requests count as errors
of kind ``unfinished``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from loadgen.client import RequestResult, build_body, build_headers, list_models, normalize_base_url, send
from loadgen.cpu import CpuSampler
from loadgen.report import Report, TaskResult, build_report, complete_task
from loadgen.workloads import get_workload
from loadgen.workloads.arrivals import ArrivalKind, arrival_fn
from loadgen.workloads.base import TaskSpec, Workload
from loadgen.workloads.options import WorkloadOptions
from loadgen.workloads.prompt import call_salt
from loadgen.workloads.trace import trace_line

# Offsets and latencies use one high-resolution clock (uvloop's loop.time() has ms resolution).
_now = time.perf_counter


@dataclass(frozen=True, slots=True)
class RunOptions:
    target: str
    workload: str = "sharegpt-like"  # built-in NAME[:VARIANT], mooncake:PATH or a JSONL trace path
    rate: float = 1.0  # mean task arrivals per second
    duration_s: float = 60.0
    arrival: ArrivalKind = "poisson"
    cv: float = 1.0  # gamma arrivals: coefficient of variation of the gaps
    seed: int = 0
    models: tuple[str, ...] | None = None  # model slot k -> models[k % len]; None: the target's /v1/models
    headers: Mapping[str, str] = field(default_factory=dict)  # e.g. Authorization
    slo_scale: float = 1.0  # multiplies every SLO and task SLA (0.1 for engines run at --speed 10)
    gap_scale: float = 1.0  # multiplies the client-side gaps between calls (1 / speed, like slo_scale)
    slo_headers: bool = False  # also send x-berth-ttft-ms / -itl-ms / -deadline-ms from each call's SLO
    request_timeout_s: float = 600.0
    stall_timeout_s: float = 60.0  # no byte for this long: the request fails with "timeout"
    drain_timeout_s: float = 120.0
    max_connections: int = 0  # 0: unlimited
    watch_pids: Mapping[str, int] = field(default_factory=dict)  # e.g. {"berth": pid}: CPU share report
    record: Path | None = None  # JSONL of what was sent and observed (replayable as a trace)
    workload_options: WorkloadOptions = field(default_factory=WorkloadOptions)  # --sessions, --turns, ...


@dataclass(frozen=True, slots=True)
class LiveSnapshot:
    """What a live view sees, once per tick."""

    elapsed_s: float
    duration_s: float
    tasks_scheduled: int
    tasks_started: int
    tasks_done: int
    requests_done: int
    requests_ok: int
    errors: int
    in_flight: int
    slo_met: int

    @property
    def goodput(self) -> float | None:
        return self.slo_met / self.requests_done if self.requests_done else None


def build_schedule(workload: Workload, opts: RunOptions) -> list[TaskSpec]:
    """The run's tasks, deterministic in the seed; tasks with an SLA or several calls get a task id."""
    arrivals = arrival_fn(opts.arrival, random.Random(opts.seed), cv=opts.cv)
    tasks = workload.schedule(opts.rate, opts.duration_s, arrivals, random.Random(opts.seed + 1))
    return [
        dataclasses.replace(t, task_id=f"lg{opts.seed}-{t.index:06d}")
        if t.task_id is None and (t.task_sla_ms is not None or t.multi_step)
        else t
        for t in tasks
    ]


class _Run:
    def __init__(
        self,
        opts: RunOptions,
        session: aiohttp.ClientSession,
        base_url: str,
        models: Sequence[str],
        on_result: Callable[[RequestResult], None] | None,
    ) -> None:
        self.opts = opts
        self.session = session
        self.base_url = base_url
        self.models = list(models)
        self.on_result = on_result
        self.requests: list[RequestResult] = []
        self.tasks: list[TaskResult] = []
        self.records: list[dict[str, Any]] = []
        self.origin = 0.0
        self.started = 0
        self.in_flight = 0
        self.ok = 0
        self.met = 0
        self.tasks_done = 0

    def model_for(self, task: TaskSpec, i: int) -> str:
        call = task.calls[i]
        if call.model is not None:
            return call.model
        return self.models[call.model_slot % len(self.models)]

    async def run_task(self, task: TaskSpec) -> None:
        res = TaskResult(
            task.index,
            task.task_id,
            task.task_type,
            task.at_s,
            len(task.calls),
            None if task.task_sla_ms is None else task.task_sla_ms * self.opts.slo_scale,
            task.sla_metric,
        )
        self.tasks.append(res)
        self.started += 1
        start = _now()
        scale = self.opts.slo_scale
        try:
            mine: list[RequestResult] = []
            for i, call in enumerate(task.calls):
                if call.gap_before_s > 0:
                    await asyncio.sleep(call.gap_before_s * self.opts.gap_scale)
                model = self.model_for(task, i)
                sent_at = _now()
                result = RequestResult(
                    task_index=task.index,
                    call_index=i,
                    task_id=task.task_id,
                    task_type=task.task_type,
                    cls=call.cls,
                    model=model,
                    api=call.api,
                    prompt_tokens=call.prompt_tokens,
                    output_tokens=call.output_tokens,
                    slo=call.slo.scaled(scale),
                    sent_at_s=sent_at - self.origin,
                )
                self.requests.append(result)
                res.calls_sent += 1
                body = build_body(call, model, salt=call_salt(task.index, i, self.opts.seed))
                headers = build_headers(
                    task, call, self.opts.headers, slo_scale=scale, slo_headers=self.opts.slo_headers
                )
                self.in_flight += 1
                try:
                    await send(self.session, self.base_url, result, body, headers)
                finally:
                    self.in_flight -= 1
                    self._done(task, i, result)
                mine.append(result)
                if not result.ok:
                    return
            complete_task(res, mine, start - self.origin)
        finally:
            self.tasks_done += 1

    def _done(self, task: TaskSpec, i: int, result: RequestResult) -> None:
        if result.ok:
            self.ok += 1
        if result.slo_met:
            self.met += 1
        if self.opts.record is not None:
            line = trace_line(task, i, result.model, task.at_s)
            line["observed"] = result.observed()
            self.records.append(line)
        if self.on_result is not None:
            self.on_result(result)

    def snapshot(self, now: float, scheduled: int) -> LiveSnapshot:
        done = len(self.requests) - self.in_flight
        return LiveSnapshot(
            elapsed_s=now - self.origin,
            duration_s=self.opts.duration_s,
            tasks_scheduled=scheduled,
            tasks_started=self.started,
            tasks_done=self.tasks_done,
            requests_done=done,
            requests_ok=self.ok,
            errors=done - self.ok,
            in_flight=self.in_flight,
            slo_met=self.met,
        )


async def run_workload(
    opts: RunOptions,
    *,
    workload: Workload | None = None,
    schedule: Sequence[TaskSpec] | None = None,
    on_result: Callable[[RequestResult], None] | None = None,
    on_tick: Callable[[LiveSnapshot], None] | None = None,
    tick_s: float = 1.0,
) -> Report:
    """Run `opts.workload` (or the given `workload` object, or an explicit `schedule`) against
    `opts.target`; `on_result` sees every finished request, `on_tick` a `LiveSnapshot` every `tick_s`."""
    if schedule is None:
        chosen = workload if workload is not None else get_workload(opts.workload, opts.workload_options)
        schedule = build_schedule(chosen, opts)
    tasks = sorted(schedule, key=lambda t: t.at_s)
    base_url = normalize_base_url(opts.target)
    timeout = aiohttp.ClientTimeout(total=opts.request_timeout_s, sock_read=opts.stall_timeout_s)
    connector = aiohttp.TCPConnector(limit=opts.max_connections, enable_cleanup_closed=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, auto_decompress=False) as session:
        models = list(opts.models) if opts.models else await list_models(session, base_url, opts.headers)
        run = _Run(opts, session, base_url, models, on_result)
        cpu = CpuSampler({"loadgen": os.getpid(), **dict(opts.watch_pids)})
        started_unix = time.time()
        cpu.start()
        run.origin = _now()
        finished = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            if on_tick is not None:
                tg.create_task(_ticker(run, on_tick, tick_s, len(tasks), finished), name="loadgen-ticker")
            children: list[asyncio.Task[None]] = []
            for task in tasks:
                delay = run.origin + task.at_s - _now()
                if delay > 0:
                    await asyncio.sleep(delay)
                children.append(tg.create_task(run.run_task(task), name=f"loadgen-task-{task.index}"))
            pending = [c for c in children if not c.done()]
            if pending:
                _, still = await asyncio.wait(pending, timeout=opts.drain_timeout_s)
                for c in still:
                    c.cancel()
                if still:
                    await asyncio.wait(still)
            finished.set()
        wall = _now() - run.origin
        shares = cpu.stop()
        if on_tick is not None:
            on_tick(run.snapshot(_now(), len(tasks)))
    if opts.record is not None:
        _write_records(opts.record, run.records)
    meta = {
        "target": opts.target,
        "workload": workload.name if workload is not None else opts.workload,
        "workload_options": opts.workload_options.to_dict(),
        "rate": opts.rate,
        "duration_s": opts.duration_s,
        "arrival": opts.arrival,
        "cv": opts.cv,
        "seed": opts.seed,
        "slo_scale": opts.slo_scale,
        "gap_scale": opts.gap_scale,
        "models": models,
        "started_at_unix": round(started_unix, 3),
    }
    requests = sorted(run.requests, key=lambda r: (r.sent_at_s, r.task_index, r.call_index))
    results = sorted(run.tasks, key=lambda t: t.index)
    return build_report(run=meta, requests=requests, tasks=results, wall_s=wall, cpu=shares)


async def _ticker(
    run: _Run, on_tick: Callable[[LiveSnapshot], None], tick_s: float, scheduled: int, finished: asyncio.Event
) -> None:
    while not finished.is_set():
        on_tick(run.snapshot(_now(), scheduled))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(finished.wait(), timeout=tick_s)


def _write_records(path: Path, records: list[dict[str, Any]]) -> None:
    records.sort(key=lambda r: (r["at"], r["observed"]["sent_at"]))
    with path.open("wb") as f:
        for rec in records:
            f.write(orjson.dumps(rec))
            f.write(b"\n")
