"""The schema of a policy file (policies/*.toml), exactly as written: one frozen msgspec Struct per
section, unknown keys are errors. `gateway.config.policy` decodes a file into `PolicyFile` and builds the
policy from it; what each key means is in that module's docstring and the shipped presets."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import msgspec.structs
from msgspec import Meta

from gateway.core.slo import (
    Infeasible,
    SloKind,
    TaskMetric,
    UnknownClass,
)


class PluginRef(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    plugin: str
    params: dict[str, Any] = {}


class ScorerRef(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    plugin: str
    weight: Annotated[float, Meta(ge=0)] = 1.0
    params: dict[str, Any] = {}


class PlacementSection(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    picker: PluginRef
    filters: tuple[PluginRef, ...] = ()
    scorers: tuple[ScorerRef, ...] = ()
    # Requests behind one that fits nowhere (filters left nothing while endpoints have room) that may be
    # placed before it in one round; 0: strict priority.
    lookahead: Annotated[int, Meta(ge=0, le=1024)] = 0


PositiveMs = Annotated[float, Meta(gt=0, le=1e9)]


class SloClassSection(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """One [[slo.classes]] item (see gateway.core.slo.SloClass)."""

    name: str
    description: str = ""
    kind: SloKind = SloKind.INTERACTIVE
    band: Annotated[int, Meta(ge=0, le=1000)] | None = None  # default: its position in the list
    ttft_ms: PositiveMs | None = None
    itl_ms: PositiveMs | None = None
    e2e_ms: PositiveMs | None = None
    task_sla_ms: PositiveMs | None = None
    task_metric: TaskMetric = TaskMetric.E2E
    steps: tuple[Annotated[float, Meta(gt=0)], ...] = ()
    on_infeasible: Infeasible = Infeasible.HOLD
    max_queue: Annotated[int, Meta(ge=0)] = 0


class SloRuleSection(
    msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True, rename={"slo_class": "class"}
):
    """One [[slo.rules]] item: requests matching every given key get `class`."""

    slo_class: str
    model: str | None = None
    path: str | None = None
    stream: bool | None = None
    max_tokens_min: Annotated[int, Meta(ge=0)] | None = None
    max_tokens_max: Annotated[int, Meta(ge=0)] | None = None
    prompt_chars_min: Annotated[int, Meta(ge=0)] | None = None
    prompt_chars_max: Annotated[int, Meta(ge=0)] | None = None
    body: dict[str, str | int | float | bool] = {}


class SloSection(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    default_class: str = ""  # empty: the first class listed
    # A request naming a class this policy lacks: serve it in the default class, or answer 400.
    unknown_class: UnknownClass = UnknownClass.DEFAULT
    classes: tuple[SloClassSection, ...] = ()
    rules: tuple[SloRuleSection, ...] = ()


class TasksSection(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    idle_expiry_s: Annotated[float, Meta(gt=0)] = 600.0
    max_tasks: Annotated[int, Meta(ge=1)] = 100_000
    learn_allotments: bool = False
    learn_min_samples: Annotated[int, Meta(ge=1)] = 20


class AutoscaleModelSection(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    min_instances: Annotated[int, Meta(ge=0, le=100_000)] | None = None  # None: the [autoscale] default
    max_instances: Annotated[int, Meta(ge=1, le=100_000)] | None = None


class AutoscaleSection(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """[autoscale]: the `Scaler` plugin and the rules its runner enforces (gateway.sched.autoscale).
    Per-model bounds live here rather than in models.toml: they are the operator's policy (hot-reloaded,
    tried with dry_run first), not a property of the model the agents share."""

    plugin: str
    params: dict[str, Any] = {}
    dry_run: bool = False
    interval_s: Annotated[float, Meta(gt=0, le=3600)] = 5.0
    scale_out_cooldown_s: Annotated[float, Meta(ge=0, le=86_400)] = 0.0
    scale_in_cooldown_s: Annotated[float, Meta(ge=0, le=86_400)] = 60.0
    reclass_cooldown_s: Annotated[float, Meta(ge=0, le=86_400)] = 30.0
    min_instances: Annotated[int, Meta(ge=0, le=100_000)] = 0
    max_instances: Annotated[int, Meta(ge=1, le=100_000)] | None = None
    models: dict[str, AutoscaleModelSection] = {}


class PolicyFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A policy file exactly as written."""

    name: str = ""  # empty: the file's stem
    description: str = ""
    ordering: PluginRef
    placement: PlacementSection
    admission: PluginRef | None = None  # None: admit every request (class queue bounds still hold)
    preemption: PluginRef | None = None  # None: never preempt
    concurrency: PluginRef | None = None  # None: every endpoint's configured cap (static)
    slo: SloSection = SloSection()
    tasks: TasksSection = TasksSection()
    autoscale: AutoscaleSection | None = None  # None: no autoscaling
