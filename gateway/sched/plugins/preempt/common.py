"""The parameters every preemption plugin shares: which kinds of request may preempt which, where, how
often a request may be preempted, and how its own SLO is judged before it is (`PreemptionRules`)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from gateway.core.slo import SloKind
from gateway.core.types import InstanceClass
from gateway.sched.interfaces import PreemptionRules


class PreemptParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    by: list[SloKind] = msgspec.field(default_factory=lambda: [SloKind.INTERACTIVE])  # may preempt
    victims: list[SloKind] = msgspec.field(default_factory=lambda: [SloKind.BATCH])  # may be preempted
    # Endpoint classes where running requests may be preempted (Chiron: mixed only).
    classes: list[InstanceClass] = msgspec.field(default_factory=lambda: [InstanceClass.MIXED])
    max_preemptions: Annotated[int, Meta(ge=0, le=100)] = 1  # per request; 0: never a victim
    max_victims: Annotated[int, Meta(ge=1, le=1024)] = 1  # per preempting request, on one endpoint
    requeue_wait_s: Annotated[float, Meta(ge=0.0, le=86400.0)] = 10.0  # assumed wait before it resumes
    margin: Annotated[float, Meta(gt=0.0, le=2.0)] = 1.0  # < 1: the victim's SLO must hold with room
    # Try the endpoints class by class in the order `classes` lists them (e.g. ["interactive", "mixed"]:
    # an interactive request first takes back seats batch work borrowed on interactive endpoints, and
    # preempts on mixed ones only when that is not enough); else the preemptor's order across classes.
    by_class: bool = False

    def rules(self) -> PreemptionRules:
        if not self.by or not self.victims or not self.classes:
            raise ValueError("by, victims and classes must each name at least one")
        if set(self.by) & set(self.victims):
            raise ValueError("a kind may not both preempt and be preempted (by and victims overlap)")
        return PreemptionRules(
            by=frozenset(self.by),
            victims=frozenset(self.victims),
            classes=frozenset(self.classes),
            max_preemptions=self.max_preemptions,
            max_victims=self.max_victims,
            requeue_wait_s=self.requeue_wait_s,
            margin=self.margin,
            class_order=tuple(self.classes) if self.by_class else (),
        )
