"""Which running requests may give their seats to a request that cannot be placed, under a policy's
preemption rules (`PreemptionRules`): the one rule both the scheduler's preemption
(`gateway.sched.preempting`) and SLO admission (which counts the seats preemption would free before it
calls a request infeasible) follow.

- a request may preempt when its SLO class's kind is one of the rules' `by` (`may_preempt`);
- only on ready endpoints of the rules' instance `classes` (`preempts_on`);
- a running request there may be preempted when it is resumable, of a kind among the rules' `victims`,
  under `max_preemptions`, and keeps its own SLO when preempted now and resumed after the rules'
  `requeue_wait_s` (`Victims.on`). Sans-IO.
"""

from __future__ import annotations

from typing import Final

from gateway.core.slo import SloPolicy
from gateway.core.types import EndpointId
from gateway.sched.interfaces import PreemptionRules, Victim
from gateway.sched.loads import LoadCaches
from gateway.sched.predict import EndpointLoad, PredictParams, RunningState
from gateway.sched.request import SchedRequest
from gateway.sched.running import RunningRequest
from gateway.sched.snapshot import EndpointView

#: Predictions of a victim's own SLO after a resume: the default parameters (their loads are shared with
#: the policy's plugins that predict with the same).
VICTIM_PREDICT: Final = PredictParams()
_Kept = tuple[EndpointView, PreemptionRules, SloPolicy, list[RunningRequest]]
#: Endpoints whose candidates are kept at most (endpoints come and go: never grow without bound).
_MAX_KEPT: Final = 4096


def may_preempt(req: SchedRequest, rules: PreemptionRules, slo: SloPolicy) -> bool:
    """Whether `req` is of a kind that may take a victim's seat."""
    return slo.class_of(req.slo.slo_class).kind in rules.by


def preempts_on(view: EndpointView, rules: PreemptionRules) -> bool:
    """Whether running requests on `view` may be preempted (its instance class is allowed)."""
    return view.instance_class in rules.classes


def resume_feasible(state: RunningState, load: EndpointLoad, rules: PreemptionRules) -> bool:
    """Whether a running request keeps its own SLO when preempted now and resumed after the rules'
    requeue wait, at its endpoint's current pace: its first token (when not out yet), its last token by
    its deadline, and its average inter-token time from its first token within its target (the tokens of
    earlier, preempted runs counted at the target pace: the scheduler keeps no earlier first token)."""
    r = state.req
    now = load.now
    margin = rules.margin
    restart = now + rules.requeue_wait_s + load.coef.prefill_s(r.prompt_tokens + state.produced)
    if (
        not state.prefilled
        and r.ttft_deadline is not None
        and restart > now + (r.ttft_deadline - now) * margin
    ):
        return False
    end = restart + state.remaining * load.tpot_now
    if r.e2e_deadline is not None and end - now > (r.e2e_deadline - now) * margin:
        return False
    if r.itl_s is not None:
        produced = r.produced_before + state.produced
        tokens = produced + state.remaining
        if r.produced_before:
            start = r.dispatched_at if r.first_token_at is None else r.first_token_at  # see the docstring
            start = min(start, now) - r.produced_before * r.itl_s
        elif state.prefilled:
            start = r.first_token_at if r.first_token_at is not None else now + state.first_s
        else:
            start = restart
        if tokens > 1 and (end - start) / (tokens - 1) > r.itl_s * margin:
            return False
    return True


def candidates(view: EndpointView, rules: PreemptionRules, slo: SloPolicy) -> list[RunningRequest]:
    """The running requests on `view` the rules let be preempted (resumable, of a kind that may be
    preempted, under the preemption limit), before their own SLO is looked at."""
    kinds: dict[str, bool] = {}  # class name -> of a kind that may be preempted
    out = []
    for r in view.running:
        if not r.resumable or r.preemptions >= rules.max_preemptions:
            continue
        ok = kinds.get(r.slo_class)
        if ok is None:
            ok = kinds[r.slo_class] = slo.class_of(r.slo_class).kind in rules.victims
        if ok:
            out.append(r)
    return out


class Victims:
    """The running requests of an endpoint that may be preempted now (`on`). A waiting request of a kind
    that may preempt asks every endpoint on each submit and serve, and admission asks too, so the
    candidates are kept per view, and the victims among them on the endpoint's load (`LoadCache`: while
    its view is the same and the clock moved less than 100-200 ms), in the load's memo under this
    finder (the scheduler and admission each keep their own: the candidates of each are of the view it
    was asked about)."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        # Per endpoint: (view, rules, SLO policy, the running requests those let be preempted).
        self._kept: dict[EndpointId, _Kept] = {}

    def on(
        self, e: EndpointView, now: float, rules: PreemptionRules, slo: SloPolicy, loads: LoadCaches
    ) -> list[Victim]:
        """The running requests on `e` that may be preempted now: resumable, of a kind that may be
        preempted, under the preemption limit, and their own SLO still feasible after a resume (on the
        load of `loads` for `VICTIM_PREDICT`). Does not look at `e`'s instance class (`preempts_on`)."""
        cands = self._candidates(e, rules, slo)
        if not cands:
            return []
        load = loads.get(VICTIM_PREDICT).load(e, now)
        key = (self, rules)
        got: tuple[list[RunningRequest], list[Victim]] | None = load.memo.get(key)
        if got is None or got[0] is not cands:
            # by id: the load may stand for an earlier view, whose copies differ in progress only
            states = {s.req.id: s for s in load.running}
            victims = [Victim(r, e) for r in cands if resume_feasible(states[r.id], load, rules)]
            got = load.memo[key] = (cands, victims)
        return got[1]

    def _candidates(self, e: EndpointView, rules: PreemptionRules, slo: SloPolicy) -> list[RunningRequest]:
        """`candidates` of `e`, kept per view."""
        kept = self._kept.get(e.id)
        if kept is None or kept[0] is not e or kept[1] is not rules or kept[2] is not slo:
            if len(self._kept) >= _MAX_KEPT:
                self._kept = {}
            kept = self._kept[e.id] = (e, rules, slo, candidates(e, rules, slo))
        return kept[3]

    def any_on(self, e: EndpointView, rules: PreemptionRules, slo: SloPolicy) -> bool:
        """Whether `e` is of an instance class the rules preempt on and runs a candidate (`candidates`):
        where `on` may find a victim at all (`on` answers [] elsewhere, whatever the time)."""
        return preempts_on(e, rules) and bool(self._candidates(e, rules, slo))
