"""MaaSO's placement of new instances in the autoscale loop (papers/ALGORITHMS.md §4): the
configuration of each instance a scaler asks for without naming one, chosen by the SLO mix of the
model's traffic. The runner calls it (`gateway.sched.autoscale.ConfigChoice`) for a scale-out of a model
with more than one configuration; sans-IO, like the loop that owns it (`gateway.lifecycle.scaling`).

- **The mix**: a `MixWindow` per model, fed with every request the driver reports (`arrived`; read into
  the window at the loop's next round): its deadline factor and decode length as the policy's
  `sub-cluster` filter computes them (its `t_slot`, `strict_below`, `strict_max_batch`; without one in
  the policy, that filter's defaults), so the split the placer plans for is the one the distributor
  makes. Requests without an end-to-end deadline are not in the mix (the filter's own mix leaves them
  out too). Burstiness: the coefficient of variation of the model's recent arrival gaps.
- **The profiles**: per configuration, the throughput-decay curve telemetry fitted on a ready instance of
  that configuration (the one fitted on the most observations), else the configuration's prior
  (`priors`: e.g. a benchmark's profiled curve), else the gateway's telemetry prior (`[telemetry.prior]`,
  the prior every endpoint's model starts from; the live daemon hands it in and a reload changes it),
  else the generic prior; prefill at the mean prompt of the mix. A configuration without a max batch
  cannot be modelled and is never chosen.
- **The choice** (`gateway.lifecycle.choice_plan.plan_choice`, a pure function of the inputs): first
  the placement MaaSO's placer makes for the mix on every device the model could hold
  (`Placer.place(mix, devices of what runs + free devices)`: its dynamic program over both
  sub-clusters); then `Placer.next_config(mix, running, free devices)` one instance at a time, among the
  configurations that placement has more of than run (else among all), each chosen one joining the
  running ones (instances of the default configuration count as it). Growing toward the placement for
  the whole room, not by the best next step alone: a fleet that grows under a load it cannot carry yet
  gains most from large batches at every step and would end all large, where the full fleet is best
  split (the benchmark's 9 req/s: all tp1-b32 up to 12 devices, 11 strict + 12 relaxed at 24). When
  no configuration raises the serving score (no request with a deadline seen yet, or none gains) or none
  fits the free devices, the rest start the default configuration and the reason says why. Every part's
  reason is the scaler's, then the choice (`"backlog; config tp1-b16 (+0.004 serving score, strict;
  24 devices place 10, 2 run)"`).
- **Where it is computed**: the placement search costs ~20 ms for 24 devices of five configurations and
  ~0.1 s for 48 (the estimate groups alike instances; it grows with the room and the kinds in the mix),
  and `next_config` ~0.5 ms per instance. The simulator computes the choice where it is asked for (a
  virtual clock). The live daemon (`ahead`: `gateway.lifecycle.placements.ThreadPlans`) never computes
  it on its event loop: after each round the loop takes the model's inputs (the mix, the profiles, the
  configurations serving and the free devices as the round left them) and a worker thread plans, from
  them, the configuration of every instance the model has room for (one plan per model at a time;
  again when the fleet changed, or `REPLAN_S` after the last). The next round's scale-out follows that
  plan from the instances of it started since (a plan for `n` instances is the first `n` steps of a
  longer one); on a fleet the plan was not computed for (none yet, or an instance came or went
  otherwise) the choice is not ready and the runner holds the scale-out one round
  (`gateway.sched.autoscale`), while the plan for the fleet as it is now is computed. A live choice is
  the one the simulator makes on the same fleet, with the mix and fitted curves of the round before.
  What a `choose` of 4 instances costs the loop (`berth-loadgen diag choice-cost`, MaaSO's
  setting; medians): ~0.02 ms following a ready plan and ~0.14 ms asking for the next one after a
  round, at 24 and 48 devices (before: 1.8 / 6.2 ms with the placement ready, 10.5 / 22.7 ms before it
  was; computed in place, as the simulator does, 58 / 138 ms).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final, Protocol

from gateway.core.types import ModelName
from gateway.lifecycle.choice_plan import ChoiceInputs, ChoicePlan, plan_choice
from gateway.lifecycle.instances import InstanceState, Lifecycle
from gateway.sched.heterogeneous import ConfigProfile, Placer, TrafficMix
from gateway.sched.mix_window import MixWindow
from gateway.sched.perf import PerfCoefficients, default_prior
from gateway.sched.plugins.autoscale.interface import ModelScaleView, ScaleOut, ScaleState, ScaleView
from gateway.sched.plugins.placement.sub_cluster import SubClusterFilter, SubClusterParams
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.sched.snapshot import EndpointView

#: Arrival gaps the burstiness is measured over, and the fewest that measure it (else cv 1: Poisson).
_GAPS: Final = 256
_MIN_GAPS: Final = 10
#: Weight of a new request in the mean prompt length.
_PROMPT_EWMA: Final = 0.05
#: Live: a model's plan is computed again after this long even when its fleet has not changed (its mix
#: has: the window is a minute). Not every round: a plan takes the worker thread ~70 ms at 24 devices and
#: ~0.2 s at 48, and while it runs the event loop waits for the GIL (measured: lags of ~8 ms, up to 27).
REPLAN_S: Final = 30.0
#: The lifecycle's states of an instance that serves (or will): what the scaler's view calls serving.
_SERVING: Final = frozenset({InstanceState.PENDING, InstanceState.STARTING, InstanceState.READY})


class PlanAhead(Protocol):
    """Where the live daemon computes choice plans, off its event loop, ahead of the rounds that use them
    (`gateway.lifecycle.placements.ThreadPlans`)."""

    def compute(self, model: ModelName, inputs: ChoiceInputs) -> bool:
        """Start computing `model`'s plan from `inputs` unless one is being computed for it (False)."""
        ...

    def latest(self, model: ModelName) -> ChoicePlan | None:
        """The latest plan completed for `model` (None: none yet)."""
        ...


@dataclass(frozen=True, slots=True)
class Choice:
    """What the last choice for a model saw (tests, diagnostics)."""

    mix: TrafficMix
    profiles: tuple[ConfigProfile, ...]
    fitted: tuple[str, ...]  # configurations whose curve came from telemetry


class _ModelMix:
    def __init__(self, window_s: float) -> None:
        self.window = MixWindow(window_s)
        self.t_slot_s: float | None = None
        self.prompt_tokens: float | None = None
        self.arrivals: deque[float] = deque(maxlen=_GAPS + 1)

    def cv(self) -> float:
        times = self.arrivals
        gaps = [b - a for a, b in itertools.pairwise(times)]
        if len(gaps) < _MIN_GAPS:
            return 1.0
        mean = sum(gaps) / len(gaps)
        if mean <= 0:
            return 1.0
        var = sum((g - mean) ** 2 for g in gaps) / len(gaps)
        return math.sqrt(var) / mean


class ConfigChooser:
    """`ConfigChoice` by MaaSO's placer on the model's recent SLO mix (see the module docstring)."""

    def __init__(
        self,
        lifecycle: Lifecycle,
        scheduler: Scheduler,
        *,
        priors: Mapping[ModelName, Mapping[str, PerfCoefficients]] | None = None,
        prior: Callable[[], PerfCoefficients] | None = None,
        window_s: float = 60.0,
        ahead: PlanAhead | None = None,
    ) -> None:
        """`priors`: per model and configuration, the curve to plan with until telemetry fitted one;
        `prior`: the gateway's telemetry prior (`[telemetry.prior]`, read at each choice: it reloads)
        for the configurations `priors` does not give, else the generic prior. `ahead`: where plans are
        computed ahead of the rounds (the live daemon: a worker thread); None: where the choice is asked
        for (the simulator on its virtual clock, tests)."""
        self._life = lifecycle
        self._ahead = ahead
        # Live: per model, the fleet (its configurations, the free devices) and time of the last plan asked
        self._asked: dict[ModelName, tuple[Counter[str], int, float]] = {}
        self._sched = scheduler
        self._priors = priors or {}
        self._prior = prior or default_prior
        self._window_s = window_s
        self._pending: list[SchedRequest] = []
        self._mix: dict[ModelName, _ModelMix] = {}
        self._fallback = SubClusterFilter(SubClusterParams())
        self.last: dict[ModelName, Choice] = {}

    # ----------------------------------------------------------------- the mix
    def arrived(self, req: SchedRequest) -> None:
        """A request was submitted (O(1): read into the mix at the next `observe`)."""
        self._pending.append(req)

    def _filter(self) -> SubClusterFilter:
        """The policy's sub-cluster filter (the distributor the placement plans for), else the defaults."""
        for f in self._sched.policy.profile.filters:
            if isinstance(f, SubClusterFilter):
                return f
        return self._fallback

    def observe(self) -> None:
        """Read the requests reported since the last call into their models' mixes."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        flt = self._filter()
        snap = self._sched.snapshot()
        serving: dict[ModelName, Sequence[EndpointView]] = {}
        for req in pending:
            m = self._mix.get(req.model)
            if m is None:
                m = self._mix[req.model] = _ModelMix(self._window_s)
            m.arrivals.append(req.arrival)
            views = serving.get(req.model)
            if views is None:
                views = serving[req.model] = snap.serving(req.model)
            factor = flt.factor(req, views)
            if factor is None or not math.isfinite(factor):
                continue
            t_slot = flt.t_slot_s(req, views)
            m.t_slot_s = t_slot if m.t_slot_s is None else 0.9 * m.t_slot_s + 0.1 * t_slot
            p = float(req.prompt_tokens)
            m.prompt_tokens = (
                p if m.prompt_tokens is None else m.prompt_tokens + _PROMPT_EWMA * (p - m.prompt_tokens)
            )
            m.window.observe(req.arrival, factor, flt.decode_tokens(req))

    def mix(self, model: ModelName, now: float) -> TrafficMix | None:
        """The model's recent SLO mix (None before any request with a deadline)."""
        m = self._mix.get(model)
        if m is None or m.t_slot_s is None:
            return None
        return m.window.mix(now, m.t_slot_s, m.cv())

    # ----------------------------------------------------------------- the profiles
    def profiles(self, mv: ModelScaleView) -> tuple[tuple[ConfigProfile, ...], tuple[str, ...]]:
        """Each modelled configuration's profile, and which of them telemetry fitted."""
        m = self._mix.get(mv.model)
        prompt = 0.0 if m is None or m.prompt_tokens is None else m.prompt_tokens
        fitted_perf: dict[str, PerfCoefficients] = {}
        spec = self._life.models().get(mv.model)
        default = None if spec is None else spec.default_config
        for inst in mv.instances:
            if inst.state is not ScaleState.READY or inst.endpoint is None:
                continue
            name = inst.config or default
            ev = self._sched.endpoint_view(inst.endpoint)
            perf = None if ev is None else ev.perf
            if name is None or perf is None or perf.n_throughput <= 0:
                continue
            best = fitted_perf.get(name)
            if best is None or perf.n_throughput > best.n_throughput:
                fitted_perf[name] = perf
        priors = self._priors.get(mv.model, {})
        prior = self._prior()
        out = []
        for c in mv.configs:
            if c.max_batch is None:
                continue
            perf = fitted_perf.get(c.name) or priors.get(c.name) or prior
            out.append(ConfigProfile.from_perf(c.name, c.devices, c.max_batch, perf, prompt_tokens=prompt))
        return tuple(out), tuple(sorted(n for n in fitted_perf if any(p.name == n for p in out)))

    # ----------------------------------------------------------------- the choice
    def inputs(
        self, mv: ModelScaleView, now: float, names: Sequence[str], free: int, limit: int
    ) -> ChoiceInputs | None:
        """What a plan for the model is computed from at `now` (None: no configuration can be
        modelled)."""
        profiles, fitted = self.profiles(mv)
        if not profiles:
            return None
        flt = self._filter().params
        placer = Placer(profiles, strict_below=flt.strict_below, strict_max_batch=flt.strict_max_batch)
        mix = self.mix(mv.model, now)
        if mix is not None:
            self.last[mv.model] = Choice(mix, profiles, fitted)
        return ChoiceInputs(placer, mix, tuple(names), free, limit)

    def choose(
        self, view: ScaleView, decision: ScaleOut, free_devices: int, started: Sequence[str | None]
    ) -> Sequence[ScaleOut]:
        self.observe()
        mv = view.models[decision.model]
        if not any(c.max_batch is not None for c in mv.configs):
            return [_default(decision, decision.count, "no configuration has a max batch to model")]
        default = self._default_config(decision.model)
        running = [i.config or default for i in mv.serving()] + [c or default for c in started]
        names = tuple(n for n in running if n is not None)
        if self._ahead is None:  # computed here (the simulator's virtual clock), for exactly this
            inputs = self.inputs(mv, view.now, names, free_devices, decision.count)
            assert inputs is not None
            return _parts(decision, plan_choice(inputs), 0)
        plan = self._ahead.latest(decision.model)
        k = None if plan is None else _continues(plan, names, free_devices)
        if plan is None or k is None:
            return []  # not ready for this state of the fleet: the runner asks again next round
        return _parts(decision, plan, k)

    def prepare(self, view: ScaleView, max_instances: Mapping[ModelName, int]) -> None:
        """After a round (live): start computing, off the caller, each model's plan for the fleet as the
        round left it (its instances in the lifecycle, the free devices), so that the next round's
        scale-out finds it ready. A model whose fleet is unchanged since its last plan is planned again
        only after `REPLAN_S` (its mix moves slowly: a minute's window)."""
        ahead = self._ahead
        if ahead is None:
            return
        self.observe()
        free = self._life.free_devices()
        serving: dict[ModelName, list[str]] = {}
        for inst in self._life.instances():
            if inst.state in _SERVING:
                name = inst.config or self._default_config(inst.model)
                if name is not None:
                    serving.setdefault(inst.model, []).append(name)
        for m, mv in view.models.items():
            if len(mv.configs) < 2:
                continue
            names = tuple(serving.get(m, ()))
            asked = self._asked.get(m)
            if asked is not None and asked[:2] == (Counter(names), free) and view.now - asked[2] < REPLAN_S:
                continue
            limit = max(0, max_instances.get(m, 0) - len(names))
            inputs = self.inputs(mv, view.now, names, free, limit)
            if inputs is not None and ahead.compute(m, inputs):
                self._asked[m] = (Counter(names), free, view.now)

    def _default_config(self, model: ModelName) -> str | None:
        spec = self._life.models().get(model)
        return None if spec is None else spec.default_config


def _continues(plan: ChoicePlan, names: Sequence[str], free: int) -> int | None:
    """How many of `plan`'s steps the fleet (`names` running, `free` devices free) has taken since it
    was computed; None when the fleet is not the plan's with some of its steps taken."""
    base, now = Counter(plan.inputs.names), Counter(names)
    if base - now:
        return None  # an instance the plan counted on is gone
    k = len(names) - len(plan.inputs.names)
    if k > len(plan.steps) or Counter(s.config for s in plan.steps[:k]) != now - base:
        return None
    if free != plan.inputs.free - sum(plan.devices(s.config) for s in plan.steps[:k]):
        return None
    return k


def _parts(decision: ScaleOut, plan: ChoicePlan, offset: int) -> list[ScaleOut]:
    """`decision` split by the plan's steps from `offset` on (alike steps in a row are one part, with
    the first one's reason), the rest the default configuration with the plan's `tail`."""
    parts: list[ScaleOut] = []
    steps = plan.steps[offset : offset + decision.count]
    for step in steps:
        prev = parts[-1] if parts else None
        if prev is not None and prev.config == step.config:
            parts[-1] = replace(prev, count=prev.count + 1)
        else:
            parts.append(
                replace(decision, count=1, config=step.config, reason=f"{decision.reason}; {step.why}")
            )
    left = decision.count - len(steps)
    if left > 0:
        parts.append(_default(decision, left, plan.tail))
    return parts


def _default(d: ScaleOut, count: int, why: str) -> ScaleOut:
    return replace(d, count=count, config=None, reason=f"{d.reason}; default configuration: {why}")
