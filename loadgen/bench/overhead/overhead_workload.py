"""A workload's requests for the overhead benchmark's closed-loop client (`overhead_client`).

The loadgen runner sends a workload open loop, at a rate; the overhead client keeps a fixed number of
requests open instead (enough for every seat of the fleet plus a standing queue in the gateway). This
takes the workload's tasks from the runner's schedule (`loadgen.runner.build_schedule`: the same
tasks, prompts and headers for the same seed) and hands them out in order, each call's body and
headers built as the runner builds them (`loadgen.client.build_body`, `build_headers`): the task type
as `x-berth-slo-class`, the task id and its SLA (times `sla_scale`). Two changes for a closed loop:
each request's output is capped at `max_output_tokens` (short requests, so the fleet turns its seats
over quickly and the gateway decides often), and when the schedule runs out it starts again with fresh
task ids (a task's clock starts at its first call; a reused id would be long overdue).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

import orjson

from loadgen.client import build_body, build_headers
from loadgen.runner import RunOptions, build_schedule
from loadgen.workloads import get_workload
from loadgen.workloads.base import TaskSpec
from loadgen.workloads.prompt import call_salt

#: The schedule drawn: this many seconds of tasks at this rate (repeated as needed).
SCHEDULE_RATE: Final = 50.0
SCHEDULE_S: Final = 60.0


class WorkloadRequests:
    """The workload's tasks in schedule order, then again (with fresh task ids), without end."""

    def __init__(
        self,
        workload: str,
        model: str,
        *,
        sla_scale: float = 1.0,
        max_output_tokens: int = 0,
        stream: bool = False,
        seed: int = 0,
        extra_headers: Mapping[str, str] | None = None,
    ) -> None:
        opts = RunOptions(target="", workload=workload, rate=SCHEDULE_RATE, duration_s=SCHEDULE_S, seed=seed)
        self._tasks = build_schedule(get_workload(workload), opts)
        if not self._tasks:
            raise ValueError(f"the workload {workload!r} scheduled no task")
        self._model = model
        self._sla_scale = sla_scale
        self._max_output = max_output_tokens
        self._stream = stream
        self._seed = seed
        self._headers = dict(extra_headers or {})
        self._next = 0
        self._lap = 0

    def next_task(self) -> TaskSpec:
        """The next task (its id suffixed with the lap after the first pass through the schedule)."""
        if self._next == len(self._tasks):
            self._next = 0
            self._lap += 1
        task = self._tasks[self._next]
        self._next += 1
        if self._lap and task.task_id is not None:
            task = dataclasses.replace(task, task_id=f"{task.task_id}-{self._lap}")
        return task

    def request(self, task: TaskSpec, i: int) -> tuple[bytes, dict[str, str]]:
        """The body and headers of the task's call `i`."""
        call = task.calls[i]
        raw = build_body(call, self._model, salt=call_salt(task.index, i, self._seed))
        body: dict[str, Any] = orjson.loads(raw)
        if self._max_output > 0 and body["max_tokens"] > self._max_output:
            body["max_tokens"] = body["min_tokens"] = self._max_output
        body["stream"] = self._stream
        if not self._stream:
            body.pop("stream_options", None)
        headers = build_headers(task, call, self._headers, slo_scale=self._sla_scale, slo_headers=False)
        return orjson.dumps(body), headers
