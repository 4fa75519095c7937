"""The `Scaler` extension point: what a global autoscaler sees and what it may decide.

A scaler only proposes. The runner (`gateway.sched.autoscale.AutoscaleRunner`) applies the rules every
scaler is held to: per-model min/max instances, the free devices, cool-downs (scale-out and scale-in
apart), scale-in only of ready instances and only by draining, dry-run, and a record of every decision
with its reason and outcome. The lifecycle (`gateway.lifecycle.instances.Lifecycle.scale_out`,
`scale_in`, `reclass`) carries out what the runner accepts; the drivers (the live lifecycle manager and
the fleet simulator, through `gateway.lifecycle.scaling.ScaleLoop`) build the view and run the actions.

Sans-IO: a scaler is a synchronous object over an immutable `ScaleView`; it may keep private state
between calls (fits, counters, the time it last saw work) but never awaits, does I/O or mutates the view.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gateway.core.slo import Allotment, SloKind
from gateway.core.types import SLO, EndpointId, InstanceClass, ModelName, RequestId


class ScaleState(enum.StrEnum):
    """An instance's state as a scaler sees it (the lifecycle's states, folded)."""

    STARTING = "starting"  # planned or loading: costs devices, serves nothing yet
    READY = "ready"  # serving
    DRAINING = "draining"  # leaving: no new work, in-flight requests finish (not counted as capacity)


@dataclass(frozen=True, slots=True)
class InstanceConfig:
    """One instance configuration of a model (models.toml; opaque to scalers but for these figures)."""

    name: str
    devices: int
    max_batch: int | None = None  # the engine's max running requests; None: the engine's default


@dataclass(frozen=True, slots=True)
class InstanceView:
    id: str
    model: ModelName
    instance_class: InstanceClass
    config: str | None  # the configuration it was started with; None: the model's default
    devices: int
    state: ScaleState
    created_at: float  # clock time it was planned (a starting instance's age)
    ready_at: float | None  # clock time it joined the endpoint set
    running_interactive: int  # requests of interactive SLO kind running there now
    running_batch: int  # ... of batch kind
    cap: int | None  # its concurrency cap in force (None: not in the endpoint set)
    idle_since: float | None  # clock time since which it runs nothing; None: busy now
    endpoint: EndpointId | None  # its endpoint id while in the endpoint set
    tokens_per_s: float | None  # measured output tokens per second (telemetry); None: not measured yet

    @property
    def running(self) -> int:
        return self.running_interactive + self.running_batch


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """A request waiting in the gateway's queue (arrival order within its model)."""

    kind: SloKind
    arrival: float
    ttft_deadline: float | None  # clock time its first token is due; None: no TTFT target
    output_mean: float  # predicted output tokens
    output_var: float  # variance of that prediction (0: exact or unknown)


def allotted(slo: SLO, allotment: Allotment | None = None) -> tuple[bool, float | None]:
    """A call's measure for violation counts: (measured end to end, the seconds it was allotted). A task
    call's own share of its task SLA when it has one (`SchedRequest.allotment`: CATO's allotted time for
    its step, on the task's measure for that step; not its deadline, which is what the task has left,
    so a call after a late predecessor would be late on arrival). Else its E2E target when it has one
    (measured from arrival to its last token), else its TTFT target (to its first token); None: no
    target on either."""
    if allotment is not None:
        return allotment.e2e, allotment.seconds
    if slo.deadline_ms is not None:
        return True, slo.deadline_ms / 1000.0
    return False, None if slo.ttft_ms is None else slo.ttft_ms / 1000.0


@dataclass(frozen=True, slots=True)
class FinishedCall:
    """A request that finished since the previous decision (for scalers that count violations or fit)."""

    kind: SloKind
    arrival: float
    finished_at: float
    allotted_s: float | None  # the time it was given (`allotted`); None: no target
    took_s: float | None  # what it took on that same measure (E2E, or time to first token); None: unknown
    slo_met: bool | None  # None: no target
    id: RequestId | None = None  # the request (an `OpenCall` of earlier views); None: not known


@dataclass(frozen=True, slots=True)
class OpenCall:
    """A request not finished yet, queued in the gateway or running on one of the model's instances, on
    the measure of `FinishedCall` (for scalers that count a violation before the call ends)."""

    id: RequestId
    kind: SloKind
    arrival: float
    allotted_s: float | None  # as `FinishedCall`'s
    # What it has taken so far on that measure, a lower bound of its `FinishedCall.took_s`: now − arrival
    # while the measure runs (E2E: until it finishes; TTFT: until its first token), then its TTFT. None:
    # not known (a resumed request had its first token in an earlier run).
    took_s: float | None


@dataclass(frozen=True, slots=True)
class ModelScaleView:
    model: ModelName
    instances: tuple[InstanceView, ...]  # every instance that holds devices (starting, ready, draining)
    queued: tuple[QueuedRequest, ...]  # the gateway queue for this model, arrival order
    finished: tuple[FinishedCall, ...]  # finished since the previous decision
    arrival_rate: float  # requests per second over the driver's recent window
    min_instances: int  # the runner's bounds (so a scaler can plan within them)
    max_instances: int
    devices_per_instance: int  # the default configuration's
    load_s: float  # expected time from a start to ready
    configs: tuple[InstanceConfig, ...] = ()  # empty: one default configuration
    # Its requests not finished yet: the queued ones (arrival order), then those running on its ready
    # instances (those on draining instances are not known to the scheduler any more).
    open_calls: tuple[OpenCall, ...] = ()

    def serving(self) -> list[InstanceView]:
        """Instances that count as capacity (starting or ready, not draining)."""
        return [i for i in self.instances if i.state is not ScaleState.DRAINING]


@dataclass(frozen=True, slots=True)
class ScaleView:
    now: float
    models: Mapping[ModelName, ModelScaleView]
    free_devices: int  # devices no instance holds or reserves (summed over nodes)


# ----------------------------------------------------------------------------- decisions
@dataclass(frozen=True, slots=True)
class ScaleOut:
    """Start `count` more instances of `model` of class `instance_class` (configuration `config`)."""

    model: ModelName
    instance_class: InstanceClass
    count: int = 1
    config: str | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ScaleIn:
    """Retire one ready instance: it leaves the endpoint set, drains, then stops."""

    instance: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Reclass:
    """Change a ready instance's class in place (no restart)."""

    instance: str
    to_class: InstanceClass
    reason: str = ""


ScaleDecision = ScaleOut | ScaleIn | Reclass


@runtime_checkable
class Scaler(Protocol):
    """Proposes scaling decisions for the fleet in `view`.

    Called every autoscale interval (clock). Returns decisions in the order they should be applied
    (possibly none). The runner may refuse or clip any of them (bounds, devices, cool-downs, dry-run); a
    scaler learns what happened from the next view, never from the return value. A decision naming an
    unknown model or instance, or a `ScaleIn`/`Reclass` of an instance that is not ready, is refused
    and recorded. Must not mutate the view.
    """

    name: str

    def decide(self, view: ScaleView) -> Sequence[ScaleDecision]: ...
