"""MaaSO's placement of new instances in the autoscale loop (papers/ALGORITHMS.md §4, issue 16): the
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
- **The choice**: first the placement MaaSO's placer makes for the mix on every device the model could
  hold (`Placer.place(mix, devices of what runs + free devices)`: its dynamic program over both
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
- **Where the search runs** (`placements`, `gateway.lifecycle.placements`): the placer's search costs
  ~20 ms for 24 devices of five configurations and ~0.1 s for 48 (the estimate groups alike
  instances; it grows with the room and the kinds in the mix). The simulator computes it where it is
  asked for (`InlinePlacements`, a virtual clock); the live daemon in a worker thread
  (`ThreadPlacements`), one search per model at a time, and the choice follows the latest completed
  placement of the model, or, before the first completes, takes the best next step alone (the reason
  says `placement not ready yet`). What stays on the caller is `next_config`, once per instance chosen:
  measured by `python -m loadgen.bench.choice_micro` (4 instances of MaaSO's setting, medians: 2.0 ms
  at 24 devices and 2.4 ms at 48 with a placement ready, 6.5 / 15 ms before one is; inline, with the
  search: 27 / 61 ms, and 239 / 1154 ms before the estimate grouped alike instances).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from gateway.core.types import ModelName
from gateway.lifecycle.instances import Lifecycle
from gateway.lifecycle.placements import InlinePlacements, Placements
from gateway.sched.heterogeneous import ConfigProfile, MixWindow, Placer, TrafficMix
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
        placements: Placements | None = None,
    ) -> None:
        """`priors`: per model and configuration, the curve to plan with until telemetry fitted one;
        `prior`: the gateway's telemetry prior (`[telemetry.prior]`, read at each choice: it reloads)
        for the configurations `priors` does not give, else the generic prior. `placements`: where the
        placement search runs (default: at once; the live daemon hands it to a worker thread,
        `gateway.lifecycle.placements`)."""
        self._life = lifecycle
        self._placements: Placements = placements or InlinePlacements()
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
    def choose(
        self, view: ScaleView, decision: ScaleOut, free_devices: int, started: Sequence[str | None]
    ) -> Sequence[ScaleOut]:
        self.observe()
        mv = view.models[decision.model]
        spec = self._life.models().get(decision.model)
        default = None if spec is None else spec.default_config
        profiles, fitted = self.profiles(mv)
        if not profiles:
            return [_default(decision, decision.count, "no configuration has a max batch to model")]
        flt = self._filter().params
        placer = Placer(profiles, strict_below=flt.strict_below, strict_max_batch=flt.strict_max_batch)
        mix = self.mix(decision.model, view.now)
        if mix is not None:
            self.last[decision.model] = Choice(mix, profiles, fitted)
        running = [i.config or default for i in mv.serving()] + [c or default for c in started]
        by_name = {p.name: p for p in profiles}
        names = [n for n in running if n is not None]
        parts: list[ScaleOut] = []
        free = free_devices
        target: Counter[str] = Counter()
        budget = sum(by_name[n].devices for n in names if n in by_name) + free
        unplaced = ""  # why the placement is not followed
        if mix is not None and mix.kinds and any(p.devices <= free for p in profiles):
            placement = self._placements.placement(decision.model, placer, mix, budget)
            if placement is None:
                unplaced = "; placement not ready yet"
            else:  # (a placement of an earlier round may name a configuration since dropped)
                target = Counter(n for n in placement.all_instances if n in by_name)
        for i in range(decision.count):
            left = decision.count - i
            if mix is None or not mix.kinds:
                parts.append(_default(decision, left, "no request with a deadline seen yet"))
                break
            if not any(p.devices <= free for p in profiles):
                parts.append(_default(decision, left, "no configuration fits the free devices"))
                break
            have = Counter(names)
            short = [c for c, n in target.items() if n > have[c] and by_name[c].devices <= free]
            nxt = None
            if short:  # the configuration furthest behind its share of the placement
                pick = max(short, key=lambda c: ((target[c] - have[c]) / target[c], c))
                nxt = placer.next_config(mix, names, free, among=(pick,))
            toward = nxt is not None
            if nxt is None:
                nxt = placer.next_config(mix, names, free)
            if nxt is None:
                parts.append(_default(decision, left, "no configuration raises the serving score"))
                break
            names.append(nxt.config)
            free -= by_name[nxt.config].devices
            with_ = "" if nxt.instances == 1 else f" with {nxt.instances} of it"
            plan = (
                f"; {budget} devices place {target[nxt.config]}, {have[nxt.config]} run"
                if toward
                else unplaced
            )
            why = f"config {nxt.config} (+{nxt.gain:.3f} serving score{with_}, {nxt.sub_cluster}{plan})"
            prev = parts[-1] if parts else None
            if prev is not None and prev.config == nxt.config:
                parts[-1] = replace(prev, count=prev.count + 1)
            else:
                parts.append(
                    replace(decision, count=1, config=nxt.config, reason=f"{decision.reason}; {why}")
                )
        return parts


def _default(d: ScaleOut, count: int, why: str) -> ScaleOut:
    return replace(d, count=count, config=None, reason=f"{d.reason}; default configuration: {why}")
