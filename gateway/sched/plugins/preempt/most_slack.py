"""Most slack: preempt the victim with the most time in hand against its own SLO, so the one least
likely to miss it after the requeue.

A victim's slack (seconds) is the smallest over its targets of the time it has left minus the time it
still needs at its endpoint's current pace (`gateway.sched.predict`): for an end-to-end deadline, the
deadline minus its predicted last token; for an inter-token target, the time its average may still take
(the target times its tokens minus one, less the time since its first token) minus its remaining tokens'
time. A victim without targets has unbounded slack (preempted first); ties go to the least progress.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gateway.sched.interfaces import Victim
from gateway.sched.loads import LoadCache
from gateway.sched.plugins.preempt.common import PreemptParams
from gateway.sched.predict import PredictParams
from gateway.sched.registry import PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import FleetSnapshot


class MostSlackPreemptor:
    name = "most-slack"

    def __init__(self, params: PreemptParams, loads: LoadCache) -> None:
        self.rules = params.rules()
        self._loads = loads

    def slack(self, v: Victim, now: float) -> float:
        load = self._loads.load(v.endpoint, now)
        r = v.running
        state = next((s for s in load.running if s.req.id == r.id), None)
        if state is None:
            return math.inf
        need = state.finish_s
        slack = math.inf
        if r.e2e_deadline is not None:
            slack = min(slack, r.e2e_deadline - now - need)
        if r.itl_s is not None and state.prefilled:
            first = r.first_token_at if r.first_token_at is not None else now + state.first_s
            tokens = r.produced_before + state.produced + state.remaining
            slack = min(slack, r.itl_s * max(0.0, tokens - 1.0) - (now - first) - need)
        return slack

    def rank(self, req: SchedRequest, victims: Sequence[Victim], snap: FleetSnapshot) -> Sequence[Victim]:
        now = snap.now
        return sorted(victims, key=lambda v: (-self.slack(v, now), v.running.produced or 0))


SPEC = PluginSpec(
    PluginKind.PREEMPTOR,
    "most-slack",
    PreemptParams,
    lambda p, ctx: MostSlackPreemptor(p, ctx.loads.get(PredictParams())),
    "preempt the running request with the most time in hand against its own SLO",
)
