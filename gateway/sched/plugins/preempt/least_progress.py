"""Least progress: preempt the victim that has streamed the fewest tokens in its current run (the least
work to recompute when it resumes); ties go to the most recently dispatched."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.sched.interfaces import Victim
from gateway.sched.plugins.preempt.common import PreemptParams
from gateway.sched.registry import PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import FleetSnapshot


class LeastProgressPreemptor:
    name = "least-progress"

    def __init__(self, params: PreemptParams) -> None:
        self.rules = params.rules()

    def rank(self, req: SchedRequest, victims: Sequence[Victim], snap: FleetSnapshot) -> Sequence[Victim]:
        return sorted(victims, key=lambda v: (v.running.produced or 0, -v.running.dispatched_at))


SPEC = PluginSpec(
    PluginKind.PREEMPTOR,
    "least-progress",
    PreemptParams,
    lambda p, ctx: LeastProgressPreemptor(p),
    "preempt the running request with the fewest tokens streamed",
)
