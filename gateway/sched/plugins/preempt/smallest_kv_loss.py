"""Smallest KV loss: preempt the victim whose context (prompt plus the tokens produced, what the engine
must prefill again when it resumes) is smallest; ties go to the most recently dispatched."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.sched.interfaces import Victim
from gateway.sched.plugins.preempt.common import PreemptParams
from gateway.sched.registry import PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import FleetSnapshot


def context_tokens(v: Victim) -> int:
    """Tokens a resume recomputes: its prompt as sent in this run (earlier runs' output included) and what
    this run has streamed."""
    return v.running.prompt_tokens + (v.running.produced or 0)


class SmallestKvLossPreemptor:
    name = "smallest-kv-loss"

    def __init__(self, params: PreemptParams) -> None:
        self.rules = params.rules()

    def rank(self, req: SchedRequest, victims: Sequence[Victim], snap: FleetSnapshot) -> Sequence[Victim]:
        return sorted(victims, key=lambda v: (context_tokens(v), -v.running.dispatched_at))


SPEC = PluginSpec(
    PluginKind.PREEMPTOR,
    "smallest-kv-loss",
    PreemptParams,
    lambda p, ctx: SmallestKvLossPreemptor(p),
    "preempt the running request whose resume recomputes the fewest tokens",
)
