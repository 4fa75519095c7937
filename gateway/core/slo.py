"""SLO classes, the rules that pick one, and task settings: what a policy file's `[slo]` and `[tasks]`
sections become once checked (built by `gateway.config.policy`, read by admission and the scheduler).

Plain frozen data: admission resolves a request's SLO from it (`gateway.admission.slo`), and scheduler
plugins read a class's kind, band and infeasibility outcome by the class name a request carries.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

#: The class of a policy without an `[slo]` section (no targets: every request that finishes ok meets it).
DEFAULT_CLASS: Final = "default"


class SloKind(enum.StrEnum):
    """Interactive work is latency-bound (a person waits); batch work is throughput-bound."""

    INTERACTIVE = "interactive"
    BATCH = "batch"


class Infeasible(enum.StrEnum):
    """What admission does with a request whose SLO no endpoint can meet (predicted)."""

    REJECT = "reject"  # 429 now, with Retry-After and the reason in the error code
    HOLD = "hold"  # queue it anyway and hope
    BEST_EFFORT = "best-effort"  # queue it in the lowest band


class UnknownClass(enum.StrEnum):
    """What admission does with a request whose x-berth-slo-class names a class the policy lacks."""

    DEFAULT = "default"  # serve it in the default class (counted; the response names the class used)
    REJECT = "reject"  # 400 naming the header and the known classes


class TaskMetric(enum.StrEnum):
    """What a task SLA measures: the first token of the task's last call, or the end of it."""

    TTFT = "ttft"
    E2E = "e2e"


@dataclass(frozen=True, slots=True)
class Allotment:
    """A task call's own share of its task SLA: CATO's allotted time for its step (papers/ALGORITHMS.md
    §1; a 50 s SLA of steps profiled at 5 s, 15 s, 5 s allots 10 s, 30 s, 10 s), measured from the call's
    own arrival, to its end (`e2e`) or to its first token. Unlike the call's deadline (the rest of the
    task SLA, so a call after a late predecessor is late on arrival) it says whether this call itself
    ran long (the violations CATO's scaler counts)."""

    seconds: float
    e2e: bool


@dataclass(frozen=True, slots=True)
class TaskCall:
    """One call of a task, as admission resolved it."""

    key: str
    task_type: str
    step: int  # 0-based position of the call in its task
    start: float  # the task's start (clock seconds)
    sla_s: float | None  # the task SLA
    deadline: float | None  # this call's allotted deadline (clock seconds); None: no task SLA
    metric: TaskMetric  # what `deadline` bounds: this call's first token or its end
    final: bool  # the last allotted step
    allotment: Allotment | None = None  # this step's own share of the task SLA; None: no task SLA


@dataclass(frozen=True, slots=True)
class SloClass:
    name: str
    kind: SloKind = SloKind.INTERACTIVE
    band: int = 0  # priority band: lower runs first (priority-bands ordering, engine priority)
    ttft_ms: float | None = None  # per-request targets; None: no target
    itl_ms: float | None = None  # inter-token (average token generation time) target
    e2e_ms: float | None = None
    # Tasks (CATO): the SLA of a task of this type when a call does not send x-berth-task-sla-ms, what
    # it measures, and each call's share of it (normalised; empty: one step).
    task_sla_ms: float | None = None
    task_metric: TaskMetric = TaskMetric.E2E
    steps: tuple[float, ...] = ()
    on_infeasible: Infeasible = Infeasible.HOLD
    max_queue: int = 0  # requests of this class waiting in the gateway at most (0: no bound of its own)

    def shares(self) -> tuple[float, ...]:
        """The configured step shares, normalised to sum to 1 (one step of 1.0 when none)."""
        total = sum(self.steps)
        if not self.steps or total <= 0:
            return (1.0,)
        return tuple(s / total for s in self.steps)


@dataclass(frozen=True, slots=True)
class SloRule:
    """Requests matching every given field get `slo_class` (None fields match anything)."""

    slo_class: str
    model: str | None = None  # the model name the client sent, or the served name
    path: str | None = None  # /v1/chat/completions, /v1/completions, /v1/embeddings
    stream: bool | None = None
    max_tokens_min: int | None = None  # a request without max_tokens matches neither bound
    max_tokens_max: int | None = None
    prompt_chars_min: int | None = None
    prompt_chars_max: int | None = None
    body: Mapping[str, str | int | float | bool] = field(default_factory=dict)  # top-level body fields


@dataclass(frozen=True, slots=True)
class TaskSettings:
    idle_expiry_s: float = 600.0  # a task unseen this long is forgotten
    max_tasks: int = 100_000  # tasks remembered at most (least recently seen dropped first)
    learn_allotments: bool = False  # split task SLAs by measured step durations once known
    learn_min_samples: int = 20  # per (task type, step) before measured durations replace the shares


@dataclass(frozen=True, slots=True)
class SloPolicy:
    classes: Mapping[str, SloClass]  # in the order the policy lists them
    default_class: str
    rules: tuple[SloRule, ...] = ()
    tasks: TaskSettings = TaskSettings()
    unknown_class: UnknownClass = UnknownClass.DEFAULT

    def get(self, name: str) -> SloClass | None:
        return self.classes.get(name)

    def class_of(self, name: str) -> SloClass:
        """The class named `name`; a name the policy does not define (a request admitted under an
        older policy) is treated as the default class."""
        c = self.classes.get(name)
        return c if c is not None else self.classes[self.default_class]

    @property
    def lowest_band(self) -> int:
        return max((c.band for c in self.classes.values()), default=0)


def default_slo_policy() -> SloPolicy:
    """One class without targets: what a policy without an `[slo]` section means."""
    return SloPolicy(classes={DEFAULT_CLASS: SloClass(DEFAULT_CLASS)}, default_class=DEFAULT_CLASS)
