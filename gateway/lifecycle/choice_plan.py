"""The configuration choice's computation (`gateway.lifecycle.config_choice`), apart from the state it
reads: from immutable inputs (`ChoiceInputs`) to the configuration of each next instance, in order
(`ChoicePlan`). Pure, so that the live daemon can run it in a worker thread (`gateway.lifecycle.placements`)
while the simulator runs it where it is asked for.

- first the placement MaaSO's placer makes for the mix on the model's whole room (`Placer.place`, the
  devices of what runs + the free ones): the target;
- then one instance at a time: the configuration furthest behind its share of that placement, if
  `Placer.next_config` still gains by it, else the best next step among all configurations; each chosen
  one joins the running ones and takes its devices;
- it stops when there is no request with a deadline in the mix, no configuration fits the free devices,
  or none raises the serving score (`ChoicePlan.tail` says which: the instances beyond the plan start
  the default configuration), or after `limit` instances.

A plan for `count` instances is the first `count` steps of a longer plan from the same inputs (a step
depends only on those before it), so one plan, computed ahead for as many instances as the model has
room for, answers any scale-out on the state it was computed from.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from gateway.sched.heterogeneous import ConfigProfile, Placer, TrafficMix

#: `ChoicePlan.tail` when the plan ends at `ChoiceInputs.limit`.
AT_LIMIT = "the model has no room for more instances"


@dataclass(frozen=True, slots=True)
class ChoiceInputs:
    """What one choice is computed from (immutable: a worker thread may compute it)."""

    placer: Placer  # over the modelled configurations' profiles
    mix: TrafficMix | None  # the model's recent SLO mix; None: no request with a deadline seen yet
    names: tuple[str, ...]  # the configurations of the instances serving it (and started this round)
    free: int  # free devices
    limit: int  # instances to plan at most

    @property
    def profiles(self) -> tuple[ConfigProfile, ...]:
        return self.placer.configs


@dataclass(frozen=True, slots=True)
class ChoiceStep:
    config: str
    why: str  # "config tp1-b16 (+0.004 serving score, strict; 24 devices place 10, 2 run)"


@dataclass(frozen=True, slots=True)
class ChoicePlan:
    """The configuration of each next instance from `inputs`, in order; those beyond `steps` start the
    default configuration because of `tail`."""

    inputs: ChoiceInputs
    steps: tuple[ChoiceStep, ...]
    tail: str

    def devices(self, config: str) -> int:
        for p in self.inputs.profiles:
            if p.name == config:
                return p.devices
        raise KeyError(config)


def plan_choice(inputs: ChoiceInputs) -> ChoicePlan:
    """The plan (module docstring). Costs the placement search (~20 ms for 24 devices of five
    configurations, ~0.1 s for 48) and one `next_config` per step (~0.5 ms)."""
    placer, mix, free = inputs.placer, inputs.mix, inputs.free
    profiles = inputs.profiles
    by_name = {p.name: p for p in profiles}
    names = list(inputs.names)
    target: Counter[str] = Counter()
    budget = sum(by_name[n].devices for n in names if n in by_name) + free
    if mix is not None and mix.kinds and any(p.devices <= free for p in profiles):
        placement = placer.place(mix, budget)
        # (a configuration the placement names that is not modelled any more is not followed)
        target = Counter(n for n in placement.all_instances if n in by_name)
    steps: list[ChoiceStep] = []
    while True:
        if len(steps) >= inputs.limit:
            return ChoicePlan(inputs, tuple(steps), AT_LIMIT)
        if mix is None or not mix.kinds:
            return ChoicePlan(inputs, tuple(steps), "no request with a deadline seen yet")
        if not any(p.devices <= free for p in profiles):
            return ChoicePlan(inputs, tuple(steps), "no configuration fits the free devices")
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
            return ChoicePlan(inputs, tuple(steps), "no configuration raises the serving score")
        names.append(nxt.config)
        free -= by_name[nxt.config].devices
        with_ = "" if nxt.instances == 1 else f" with {nxt.instances} of it"
        plan = f"; {budget} devices place {target[nxt.config]}, {have[nxt.config]} run" if toward else ""
        steps.append(
            ChoiceStep(
                nxt.config,
                f"config {nxt.config} (+{nxt.gain:.3f} serving score{with_}, {nxt.sub_cluster}{plan})",
            )
        )
