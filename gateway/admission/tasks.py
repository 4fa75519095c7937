"""The task clock (CATO, papers/ALGORITHMS.md §1): calls that carry the same `x-berth-task-id` share one
task SLA, and each call gets its allotted share of it.

A task starts with its first call (the gateway's arrival time of that call). Its type is the SLO class of
that call; the class lists the steps' shares of the task SLA (`steps = [0.9, 0.1]`), or, with
`learn_allotments`, the shares follow the measured durations of each step of that task type once every
step has `learn_min_samples` of them (CATO's profiling, kept current). Call ``k`` (0-based) is due at

    task start + task SLA × (share_0 + ... + share_k)

so a call that comes late because an earlier one overran has less time (its slack is computed from the
time the task already spent), and one after a quick predecessor has more. The last allotted step is due
at the task's own deadline; calls beyond the listed steps are due then too. What that deadline measures
is the class's `task_metric`: the first token of the last call (`ttft`) or its end (`e2e`); earlier
calls must finish by theirs.

Each call also carries its own share, `TaskCall.allotment`: task SLA × share_k from the call's own
arrival, on the same measure (CATO's allotted time per node). Its deadline is for the scheduler (how much
time the task has left); its share is for counting slack violations (`cato-sla`): a call that only
inherited a predecessor's overrun did not run long itself. A call beyond the listed steps is allotted
the last step's share.

Memory is bounded: a task unseen for `idle_expiry_s` is forgotten, and at most `max_tasks` are kept (the
least recently seen dropped first). Sans-IO: every method takes the clock time.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from gateway.core.slo import Allotment, SloClass, TaskCall, TaskMetric, TaskSettings


@dataclass(slots=True)
class _Task:
    task_type: str
    sla_s: float | None
    start: float
    last_seen: float
    calls: int = 0


class _StepStats:
    """Mean measured duration of one step of one task type (EWMA once warmed up)."""

    __slots__ = ("mean", "n")

    def __init__(self) -> None:
        self.mean = 0.0
        self.n = 0

    def add(self, seconds: float, alpha: float = 0.05) -> None:
        self.n += 1
        if self.n == 1:
            self.mean = seconds
        elif self.n <= 1.0 / alpha:
            self.mean += (seconds - self.mean) / self.n
        else:
            self.mean += alpha * (seconds - self.mean)


class TaskClock:
    def __init__(self, settings: TaskSettings | None = None) -> None:
        self.settings = settings or TaskSettings()
        self._tasks: OrderedDict[str, _Task] = OrderedDict()
        self._steps: dict[tuple[str, int], _StepStats] = {}
        self.expired = 0  # tasks forgotten for idleness
        self.evicted = 0  # tasks dropped to stay within max_tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, key: str) -> bool:
        return key in self._tasks

    def call(self, key: str, now: float, cls: SloClass, sla_ms: float | None) -> TaskCall:
        """Register the next call of task `key` (starting the task if it is new or expired)."""
        self.expire(now)
        task = self._tasks.get(key)
        if task is None:
            sla = sla_ms if sla_ms is not None else cls.task_sla_ms
            task = self._tasks[key] = _Task(cls.name, None if sla is None else sla / 1000.0, now, now)
            while len(self._tasks) > self.settings.max_tasks:
                self._tasks.popitem(last=False)
                self.evicted += 1
        else:
            self._tasks.move_to_end(key)
            task.last_seen = now
            if sla_ms is not None and task.sla_s is None:
                task.sla_s = sla_ms / 1000.0
        step = task.calls
        task.calls += 1
        shares = self.shares(task.task_type, cls)
        final = step >= len(shares) - 1
        deadline: float | None = None
        metric = cls.task_metric if final else TaskMetric.E2E
        allotment: Allotment | None = None
        if task.sla_s is not None:
            done = 1.0 if final else sum(shares[: step + 1])
            deadline = task.start + task.sla_s * done
            share = shares[min(step, len(shares) - 1)]
            allotment = Allotment(task.sla_s * share, metric is TaskMetric.E2E)
        return TaskCall(key, task.task_type, step, task.start, task.sla_s, deadline, metric, final, allotment)

    def adopt(
        self, key: str, *, task_type: str, sla_s: float | None, start: float, calls: int, now: float
    ) -> None:
        """Take task `key` as another replica left it (cluster mode, gateway.cluster.tasks): its type, SLA,
        start (on this clock) and the calls made so far; the next `call` is step `calls`."""
        task = self._tasks.get(key)
        if task is None:
            task = self._tasks[key] = _Task(task_type, sla_s, start, now, calls)
            while len(self._tasks) > self.settings.max_tasks:
                self._tasks.popitem(last=False)
                self.evicted += 1
            return
        self._tasks.move_to_end(key)
        task.task_type, task.sla_s, task.start, task.calls, task.last_seen = (
            task_type,
            sla_s,
            start,
            calls,
            now,
        )

    def shares(self, task_type: str, cls: SloClass) -> tuple[float, ...]:
        """Each step's share of the task SLA: learned from measured step durations when enabled and
        known for every step, else the class's configured steps."""
        configured = cls.shares()
        s = self.settings
        if not s.learn_allotments or len(configured) < 2:
            return configured
        stats = [self._steps.get((task_type, k)) for k in range(len(configured))]
        if any(st is None or st.n < s.learn_min_samples for st in stats):
            return configured
        means = [max(1e-6, st.mean) for st in stats if st is not None]
        total = sum(means)
        return tuple(m / total for m in means)

    def finished(self, call: TaskCall, seconds: float) -> None:
        """A call of the task finished ok after `seconds` (to its first token when its deadline bounds
        the first token): measured step durations, for learned allotments."""
        if seconds >= 0 and call.step < 64:
            self._steps.setdefault((call.task_type, call.step), _StepStats()).add(seconds)

    def abandon(self, call: TaskCall) -> None:
        """The call never ran (rejected before dispatch): a retry of it is the same step again."""
        task = self._tasks.get(call.key)
        if task is not None and task.calls == call.step + 1:
            task.calls -= 1

    def expire(self, now: float) -> int:
        """Forget tasks idle longer than `idle_expiry_s`; returns how many. O(1) per forgotten task:
        the dict is in order of last use."""
        limit = now - self.settings.idle_expiry_s
        n = 0
        tasks = self._tasks
        while tasks:
            key, task = next(iter(tasks.items()))
            if task.last_seen >= limit:
                break
            del tasks[key]
            n += 1
        self.expired += n
        return n

    def learned(self) -> dict[str, list[float | None]]:
        """Mean measured duration per step (None: none measured yet), by task type (admin API)."""
        out: dict[str, list[float | None]] = {}
        for (task_type, step), st in sorted(self._steps.items()):
            steps = out.setdefault(task_type, [])
            while len(steps) < step:
                steps.append(None)
            steps.append(st.mean)
        return out
