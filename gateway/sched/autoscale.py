"""The autoscale runner: the rules every `Scaler` is held to, applied to whatever it decides.

Each step the runner asks the scaler and checks every decision in order, against a running count that
includes the decisions it already accepted this step; then it adds what the bounds still demand (a model
below `min_instances` after the scaler's scale-outs gets the rest, reason `min_instances`; last, so a
scaler that plans up to the minimum itself does not start it twice):

- `ScaleOut`: clipped to `max_instances − serving` (serving = starting + ready; draining instances do
  not count) and to the free devices; refused within `scale_out_cooldown_s` of the model's last
  scale-out (but the runner's own top-up to the minimum); a count < 1 after clipping is refused;
- `ScaleIn`: only a ready instance (never a starting one: scale-in is by draining only), refused when it
  would take the model below `min_instances`, or within `scale_in_cooldown_s` of the model's last
  scale-out or scale-in (capacity just added is not taken away on the next reading);
- `Reclass`: only a ready instance whose class differs, refused within `reclass_cooldown_s` of the
  instance's own last re-class (an instance does not flip back and forth; a re-class costs no load, so
  a just-started instance may be re-classed at once); not counted against the bounds (the instance
  stays);
- cool-downs count from the rounds before this one: the decisions of one round (start three batch
  instances, retire four) all pass or fail together;
- anything naming an unknown model or instance, a decision the scaler raised on, or an invalid count is
  refused and counted as a fault.

Configurations: with a `ConfigChoice` (the autoscale loop gives one: MaaSO's placement by the SLO mix,
`gateway.lifecycle.config_choice`), a scale-out that names no configuration, of a model with more than
one, is first split into scale-outs that each name the configuration of their instances (or none: the
default, the reason says why), chosen one instance at a time knowing the free devices and what this
round already started; each part is then checked and recorded as a decision of its own (so the record
names the configuration, and the free devices are counted by its devices). A choice that raises leaves
the scale-out as it was (counted as a fault, its reason says so). A choice not ready yet (the live
daemon computes it off its event loop, ahead of the rounds, for the fleet as a round leaves it; a fleet
that changed since has none) holds the scale-out: recorded as refused (`config_choice_pending`), asked
again at the next round unless the scaler proposes a scale-out of that model again then (its own word
wins), and, not ready again, started in the default configuration (the reason says so). Nothing is lost
but one round: a scaler that proposed once (cato-sla resets its count) still gets its instances.

Dry-run: every decision is checked and recorded (outcome `dry_run`, cool-downs advance as if acted), and
nothing is returned to act on. Every decision, accepted or not, is a `DecisionRecord` (what, why, what
the runner did and why), kept for the driver to log and export (`take_records`).

Counters: scaling actions (instances started, instances retired, re-classes) and scale-ups (instances
started); hysteresis = actions / scale-ups (Chiron): 1 for a fleet that only grows, 2 when every
instance started is also retired, more when the scaler thrashes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol

from gateway.core.types import InstanceClass, ModelName
from gateway.sched.plugins.autoscale.interface import (
    InstanceView,
    ModelScaleView,
    Reclass,
    ScaleDecision,
    ScaleIn,
    ScaleOut,
    Scaler,
    ScaleState,
    ScaleView,
)

#: No per-model maximum configured.
UNBOUNDED: Final = 1 << 20

Outcome = Literal["acted", "clipped", "dry_run", "refused", "fault"]


@dataclass(frozen=True, slots=True)
class ModelBounds:
    min_instances: int = 0
    max_instances: int = UNBOUNDED


@dataclass(frozen=True, slots=True)
class AutoscaleSettings:
    interval_s: float = 5.0  # between two steps
    scale_out_cooldown_s: float = 0.0  # after a model's scale-out, before its next one
    scale_in_cooldown_s: float = 60.0  # after a model's scale-out or scale-in, before its next scale-in
    reclass_cooldown_s: float = 30.0  # after an instance's re-class, before its next one
    dry_run: bool = False
    default_bounds: ModelBounds = ModelBounds()
    bounds: Mapping[ModelName, ModelBounds] = field(default_factory=dict)

    def bounds_of(self, model: ModelName) -> ModelBounds:
        return self.bounds.get(model, self.default_bounds)


class ConfigChoice(Protocol):
    """Chooses the configurations of the instances a scale-out asks for without naming one.

    Called by the runner for a `ScaleOut` whose `config` is None, of a model with more than one
    configuration, before the rules are applied. `free_devices` are the devices free at that point of the
    round and `started` the configurations (None: the default) of the model's instances this round has
    already accepted. Returns scale-outs of the same model and class, in order, whose counts sum to
    `decision.count`, each naming a configuration or None (the default; its reason should say why);
    the runner checks each like any decision. Returns none when the choice is not ready yet (computed
    off the caller, for the fleet as it is now): the runner holds the scale-out for one round (see the
    module docstring). Must not mutate its arguments.
    """

    def choose(
        self, view: ScaleView, decision: ScaleOut, free_devices: int, started: Sequence[str | None]
    ) -> Sequence[ScaleOut]: ...


@dataclass(frozen=True, slots=True)
class Autoscale:
    """A policy's autoscaling: the scaler and the runner's settings."""

    scaler: Scaler
    settings: AutoscaleSettings


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    at: float
    scaler: str
    decision: ScaleDecision | None  # None: the scaler raised (the note says what)
    outcome: Outcome
    note: str = ""  # why the runner clipped or refused it ("" when acted as asked)


@dataclass(slots=True)
class ScaleCounters:
    started: int = 0  # instances (scale-ups)
    retired: int = 0  # instances
    reclassed: int = 0
    refused: int = 0
    faults: int = 0

    @property
    def actions(self) -> int:
        return self.started + self.retired + self.reclassed

    @property
    def hysteresis(self) -> float | None:
        """Scaling actions / scale-up actions (None before the first scale-up)."""
        return self.actions / self.started if self.started else None


class AutoscaleRunner:
    def __init__(
        self, scaler: Scaler, settings: AutoscaleSettings, *, configs: ConfigChoice | None = None
    ) -> None:
        self.scaler = scaler
        self.settings = settings
        self.configs = configs
        self.counters = ScaleCounters()
        self.dry_counters = ScaleCounters()  # what dry-run would have done
        self._records: list[DecisionRecord] = []
        self._last_out: dict[ModelName, float] = {}
        self._last_change: dict[ModelName, float] = {}
        self._last_reclass: dict[str, float] = {}
        self._next_at = -math.inf
        # Scale-outs held for a configuration choice not ready yet, by model: asked again next round.
        self._held: dict[ModelName, ScaleOut] = {}

    def adopt(self, old: AutoscaleRunner) -> None:
        """Carry a previous runner's counters, cool-downs and schedule over (a policy reload)."""
        self.counters = old.counters
        self.dry_counters = old.dry_counters
        self._records = old._records
        self._last_out = old._last_out
        self._last_change = old._last_change
        self._last_reclass = old._last_reclass
        self._next_at = old._next_at
        self._held = old._held

    def bounds_view(self, view: ScaleView) -> ScaleView:
        """`view` with each model's min/max set from the settings (what the scaler is shown)."""
        models = {
            m: dataclasses.replace(
                mv,
                min_instances=self.settings.bounds_of(m).min_instances,
                max_instances=self.settings.bounds_of(m).max_instances,
            )
            for m, mv in view.models.items()
        }
        return dataclasses.replace(view, models=models)

    def due(self, now: float) -> bool:
        return now >= self._next_at

    def step(self, view: ScaleView) -> list[ScaleDecision]:
        """One autoscale round: the decisions to carry out now (none in dry-run), each recorded."""
        self._next_at = view.now + self.settings.interval_s
        view = self.bounds_view(view)
        proposed: list[object] = []
        try:
            proposed += list(self.scaler.decide(view))
        except Exception as e:  # a plugin bug fails this round only
            self.counters.faults += 1
            self._records.append(DecisionRecord(view.now, self.scaler.name, None, "fault", repr(e)))
        # A scale-out held last round for its configuration choice, unless the scaler proposes a scale-out
        # of that model again (its word now wins); held once only: not ready again, the default.
        held, self._held = self._held, {}
        again = {d.model for d in proposed if isinstance(d, ScaleOut)}
        retried = [d for m, d in sorted(held.items()) if m not in again and m in view.models]
        rnd = _Round(view, dict(self._last_out), dict(self._last_change))
        out = self._check(rnd, [*retried, *proposed], retried=frozenset(map(id, retried)))
        # The minimum last, for what the scaler's own scale-outs (which may plan up to it) left short.
        top_up: list[object] = []
        for m, mv in sorted(view.models.items()):
            short = mv.min_instances - rnd.serving[m]
            if short > 0:
                top_up.append(ScaleOut(m, _default_class(mv), short, None, "min_instances"))
        return out + self._check(rnd, top_up, minimum=True)

    def take_records(self) -> list[DecisionRecord]:
        out, self._records = self._records, []
        return out

    # ----------------------------------------------------------------- the rules
    def _check(
        self,
        rnd: _Round,
        proposed: Sequence[object],
        *,
        minimum: bool = False,
        retried: frozenset[int] = frozenset(),
    ) -> list[ScaleDecision]:
        """The rules, decision by decision (`proposed` is typed loosely: a plugin may return anything).
        With `minimum` (the runner's own top-up to `min_instances`) the scale-out cool-down does not
        apply. `retried`: the ids of held scale-outs asked again (not held twice)."""
        s = self.settings
        view = rnd.view
        now = view.now
        serving = rnd.serving
        by_id = rnd.by_id
        touched = rnd.touched
        counters = self.dry_counters if s.dry_run else self.counters
        last_out = rnd.last_out  # cool-downs count from earlier rounds only
        last_change = rnd.last_change
        out: list[ScaleDecision] = []
        # (decision, its configurations already chosen), in order; a split scale-out's parts go first.
        todo: list[tuple[object, bool]] = [(d, False) for d in reversed(proposed)]
        while todo:
            d, chosen = todo.pop()
            outcome: Outcome = "dry_run" if s.dry_run else "acted"
            note = ""
            accepted: ScaleDecision | None = None
            if isinstance(d, ScaleOut):
                mv = view.models.get(d.model)
                if mv is None or not isinstance(d.count, int) or d.count < 1:
                    self._refuse(now, d, "fault", "unknown model" if mv is None else "count must be ≥ 1")
                    continue
                b = s.bounds_of(d.model)
                if not minimum and now - last_out.get(d.model, -math.inf) < s.scale_out_cooldown_s:
                    self._refuse(now, d, "refused", "scale_out_cooldown")
                    continue
                if not chosen and d.config is None and self.configs is not None and len(mv.configs) > 1:
                    parts = self._choose(rnd, d, again=id(d) in retried)
                    if parts is None:  # its configurations are not chosen yet: held for the next round
                        self._held[d.model] = d
                        self._refuse(now, d, "refused", "config_choice_pending")
                        continue
                    todo += [(part, True) for part in reversed(parts)]
                    continue
                devs = _devices(mv, d.config)
                if devs is None:
                    self._refuse(now, d, "fault", f"unknown configuration {d.config!r}")
                    continue
                n = min(d.count, b.max_instances - serving[d.model], rnd.free // max(1, devs))
                if n < 1:
                    why = "max_instances" if b.max_instances - serving[d.model] < 1 else "no_free_devices"
                    self._refuse(now, d, "refused", why)
                    continue
                if n < d.count:
                    note = "max_instances" if n == b.max_instances - serving[d.model] else "no_free_devices"
                    if not s.dry_run:
                        outcome = "clipped"
                accepted = dataclasses.replace(d, count=n)
                serving[d.model] += n
                rnd.free -= n * devs
                rnd.started.setdefault(d.model, []).extend([d.config] * n)
                counters.started += n
                self._last_out[d.model] = now
                self._last_change[d.model] = now
            elif isinstance(d, (ScaleIn, Reclass)):
                inst = by_id.get(d.instance)
                if inst is None:
                    self._refuse(now, d, "fault", "unknown instance")
                    continue
                if inst.id in touched:
                    self._refuse(now, d, "refused", "instance already decided on this round")
                    continue
                if inst.state is not ScaleState.READY:
                    self._refuse(now, d, "refused", f"instance is {inst.state} (only a ready one)")
                    continue
                if isinstance(d, ScaleIn):
                    if now - last_change.get(inst.model, -math.inf) < s.scale_in_cooldown_s:
                        self._refuse(now, d, "refused", "scale_in_cooldown")
                        continue
                    if serving[inst.model] - 1 < s.bounds_of(inst.model).min_instances:
                        self._refuse(now, d, "refused", "min_instances")
                        continue
                    serving[inst.model] -= 1
                    counters.retired += 1
                    self._last_change[inst.model] = now
                else:
                    if d.to_class == inst.instance_class:
                        self._refuse(now, d, "refused", "already of that class")
                        continue
                    if now - self._last_reclass.get(inst.id, -math.inf) < s.reclass_cooldown_s:
                        self._refuse(now, d, "refused", "reclass_cooldown")
                        continue
                    counters.reclassed += 1
                    self._last_reclass[inst.id] = now
                touched.add(inst.id)
                accepted = d
            else:
                self._refuse(now, None, "fault", f"not a scale decision: {type(d).__name__}")
                continue
            self._records.append(DecisionRecord(now, self.scaler.name, accepted, outcome, note))
            if not s.dry_run:
                out.append(accepted)
        return out

    def _choose(self, rnd: _Round, d: ScaleOut, *, again: bool) -> list[ScaleOut] | None:
        """`d` split by configuration (`ConfigChoice`); `d` itself, its reason saying so, when the choice
        raises or breaks its contract; None when the choice is not ready (`again`: held once already,
        then `d` itself)."""
        assert self.configs is not None
        try:
            parts = list(self.configs.choose(rnd.view, d, rnd.free, tuple(rnd.started.get(d.model, ()))))
        except Exception as e:  # a bug in the choice leaves the scale-out to the default configuration
            self.counters.faults += 1
            return [
                dataclasses.replace(d, reason=f"{d.reason}; default configuration: the choice raised {e!r}")
            ]
        if not parts:
            if not again:
                return None
            return [
                dataclasses.replace(d, reason=f"{d.reason}; default configuration: the choice is not ready")
            ]
        if (
            not parts
            or not all(isinstance(p, ScaleOut) and p.count >= 1 for p in parts)
            or sum(p.count for p in parts) != d.count
            or any(p.model != d.model or p.instance_class != d.instance_class for p in parts)
        ):
            self.counters.faults += 1
            return [
                dataclasses.replace(
                    d, reason=f"{d.reason}; default configuration: the choice broke its contract"
                )
            ]
        return parts

    def _refuse(self, now: float, d: ScaleDecision | None, outcome: Outcome, note: str) -> None:
        if outcome == "fault":
            self.counters.faults += 1
        else:
            self.counters.refused += 1
        self._records.append(DecisionRecord(now, self.scaler.name, d, outcome, note))


class _Round:
    """What one round's checks share: the counts its accepted decisions have moved so far."""

    def __init__(
        self, view: ScaleView, last_out: dict[ModelName, float], last_change: dict[ModelName, float]
    ) -> None:
        self.view = view
        self.serving = {m: len(mv.serving()) for m, mv in view.models.items()}
        self.by_id: dict[str, InstanceView] = {i.id: i for mv in view.models.values() for i in mv.instances}
        self.touched: set[str] = set()
        self.free = view.free_devices
        self.started: dict[ModelName, list[str | None]] = {}  # configurations accepted this round
        self.last_out = last_out
        self.last_change = last_change


def _devices(mv: ModelScaleView, config: str | None) -> int | None:
    if config is None:
        return mv.devices_per_instance
    for c in mv.configs:
        if c.name == config:
            return c.devices
    return None


def _default_class(mv: ModelScaleView) -> InstanceClass:
    """The class of the instances a model's minimum is made up with: mixed (serves both kinds)."""
    return InstanceClass.MIXED
