"""The autoscale runner's rules (gateway.sched.autoscale), whatever the scaler decides: scripted scalers on
hand-built views."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from gateway.core.types import InstanceClass, ModelName
from gateway.sched.autoscale import AutoscaleRunner, AutoscaleSettings, ModelBounds
from gateway.sched.plugins.autoscale.interface import (
    InstanceConfig,
    ModelScaleView,
    Reclass,
    ScaleDecision,
    ScaleIn,
    ScaleOut,
    ScaleState,
    ScaleView,
)
from tests.autoscale_views import M, inst, model, view

MIXED, BATCH = InstanceClass.MIXED, InstanceClass.BATCH


class Scripted:
    """Returns the decisions it is given, every round."""

    name = "scripted"

    def __init__(self, *decisions: object) -> None:
        self.decisions = list(decisions)
        self.seen: list[ScaleView] = []

    def decide(self, view: ScaleView) -> Sequence[ScaleDecision]:
        self.seen.append(view)
        return self.decisions  # type: ignore[return-value]  # the tests also hand it non-decisions


class Raising:
    name = "raising"

    def decide(self, view: ScaleView) -> Sequence[ScaleDecision]:
        raise RuntimeError("bug")


def runner(scaler: object, **kw: object) -> AutoscaleRunner:
    return AutoscaleRunner(scaler, AutoscaleSettings(**kw))  # type: ignore[arg-type]


def test_scale_out_is_clipped_to_max_instances_counting_starting_ones() -> None:
    r = runner(Scripted(ScaleOut(M, MIXED, 5)), default_bounds=ModelBounds(0, 4))
    v = view(model([inst("a"), inst("b", state=ScaleState.STARTING)]))
    assert r.step(v) == [ScaleOut(M, MIXED, 2)]
    rec = r.take_records()
    assert [(x.outcome, x.note) for x in rec] == [("clipped", "max_instances")]
    assert r.counters.started == 2


def test_draining_instances_do_not_count_against_max() -> None:
    r = runner(Scripted(ScaleOut(M, MIXED, 1)), default_bounds=ModelBounds(0, 1))
    assert r.step(view(model([inst("a", state=ScaleState.DRAINING)]))) == [ScaleOut(M, MIXED, 1)]


def test_scale_out_is_clipped_to_free_devices_and_refused_without_any() -> None:
    r = runner(Scripted(ScaleOut(M, BATCH, 10)))
    assert r.step(view(model([]), free=3)) == [ScaleOut(M, BATCH, 3)]
    r2 = runner(Scripted(ScaleOut(M, BATCH, 10)))
    assert r2.step(view(model([]), free=0)) == []
    assert [(x.outcome, x.note) for x in r2.take_records()] == [("refused", "no_free_devices")]


def test_min_instances_are_topped_up_by_the_runner() -> None:
    r = runner(Scripted(), bounds={M: ModelBounds(3, 10)})
    assert r.step(view(model([inst("a")]))) == [ScaleOut(M, MIXED, 2, None, "min_instances")]


def test_scale_in_never_goes_below_min_and_only_takes_ready_instances() -> None:
    r = runner(
        Scripted(ScaleIn("a"), ScaleIn("b"), ScaleIn("s")),
        default_bounds=ModelBounds(1, 10),
        scale_in_cooldown_s=0.0,
    )
    v = view(model([inst("a"), inst("b"), inst("s", state=ScaleState.STARTING)]))
    # serving: a, b, s (3); min 1: a and b may go, s is starting (scale-in only by draining)
    assert r.step(v) == [ScaleIn("a"), ScaleIn("b")]
    notes = [x.note for x in r.take_records()]
    assert notes[2] == "instance is starting (only a ready one)"


def test_min_holds_within_a_round() -> None:
    r = runner(
        Scripted(ScaleIn("a"), ScaleIn("b")), default_bounds=ModelBounds(1, 10), scale_in_cooldown_s=0.0
    )
    assert r.step(view(model([inst("a"), inst("b")]))) == [ScaleIn("a")]
    assert r.take_records()[1].note == "min_instances"


def test_scale_out_cooldown_refuses_the_next_rounds_then_allows() -> None:
    r = runner(Scripted(ScaleOut(M, MIXED, 1)), scale_out_cooldown_s=30.0)
    assert r.step(view(model([]), now=100.0)) == [ScaleOut(M, MIXED, 1)]
    assert r.step(view(model([]), now=120.0)) == []
    assert r.take_records()[-1].note == "scale_out_cooldown"
    assert r.step(view(model([]), now=130.0)) == [ScaleOut(M, MIXED, 1)]


def test_scale_in_waits_after_a_scale_out_of_the_model() -> None:
    r = runner(Scripted(ScaleOut(M, MIXED, 1)), scale_in_cooldown_s=60.0)
    r.step(view(model([inst("a"), inst("b")]), now=100.0))
    r.scaler = Scripted(ScaleIn("a"))
    assert r.step(view(model([inst("a"), inst("b")]), now=150.0)) == []
    assert r.take_records()[-1].note == "scale_in_cooldown"
    assert r.step(view(model([inst("a"), inst("b")]), now=160.0)) == [ScaleIn("a")]


def test_decisions_of_one_round_share_the_cooldowns_of_earlier_rounds() -> None:
    r = runner(Scripted(ScaleIn("a"), ScaleIn("b"), ScaleIn("c")), scale_in_cooldown_s=60.0)
    assert r.step(view(model([inst("a"), inst("b"), inst("c")]))) == [
        ScaleIn("a"),
        ScaleIn("b"),
        ScaleIn("c"),
    ]


def test_reclass_cooldown_is_per_instance() -> None:
    r = runner(Scripted(Reclass("a", BATCH)), reclass_cooldown_s=30.0)
    assert r.step(view(model([inst("a"), inst("b")]), now=100.0)) == [Reclass("a", BATCH)]
    r.scaler = Scripted(Reclass("a", MIXED), Reclass("b", BATCH))
    v = view(model([inst("a", cls=BATCH), inst("b")]), now=110.0)
    assert r.step(v) == [Reclass("b", BATCH)]
    assert r.take_records()[1].note == "reclass_cooldown"


def test_reclass_to_the_same_class_and_twice_in_a_round_are_refused() -> None:
    r = runner(Scripted(Reclass("a", MIXED), Reclass("b", BATCH), ScaleIn("b")), scale_in_cooldown_s=0.0)
    assert r.step(view(model([inst("a"), inst("b")]))) == [Reclass("b", BATCH)]
    notes = [x.note for x in r.take_records()]
    assert notes == ["already of that class", "", "instance already decided on this round"]


def test_dry_run_acts_on_nothing_but_records_and_counts_what_it_would_do() -> None:
    r = runner(Scripted(ScaleOut(M, MIXED, 2), ScaleIn("a")), dry_run=True, scale_in_cooldown_s=0.0)
    assert r.step(view(model([inst("a"), inst("b")]))) == []
    assert [x.outcome for x in r.take_records()] == ["dry_run", "dry_run"]
    assert r.counters.actions == 0
    assert (r.dry_counters.started, r.dry_counters.retired) == (2, 1)


def test_dry_run_advances_cooldowns_as_if_it_acted() -> None:
    r = runner(Scripted(ScaleOut(M, MIXED, 1)), dry_run=True, scale_out_cooldown_s=30.0)
    r.step(view(model([]), now=0.0))
    r.step(view(model([]), now=10.0))
    assert [x.outcome for x in r.take_records()] == ["dry_run", "refused"]


@pytest.mark.parametrize(
    ("decision", "note"),
    [
        (ScaleOut(ModelName("nope"), MIXED, 1), "unknown model"),
        (ScaleOut(M, MIXED, 0), "count must be ≥ 1"),
        (ScaleOut(M, MIXED, 1, "big"), "unknown configuration 'big'"),
        (ScaleIn("ghost"), "unknown instance"),
        ("not a decision", "not a scale decision: str"),
    ],
    ids=["unknown-model", "zero-count", "unknown-config", "unknown-instance", "garbage"],
)
def test_faulty_decisions_are_recorded_and_acted_on_never(decision: object, note: str) -> None:
    r = runner(Scripted(decision))
    assert r.step(view(model([inst("a")]))) == []
    rec = r.take_records()
    assert (rec[0].outcome, rec[0].note) == ("fault", note)
    assert r.counters.faults == 1


def test_a_raising_scaler_costs_one_round() -> None:
    r = runner(Raising())
    assert r.step(view(model([inst("a")]))) == []
    rec = r.take_records()
    assert rec[0].outcome == "fault"
    assert "bug" in rec[0].note


def test_hysteresis_is_actions_over_scale_ups() -> None:
    r = runner(Scripted(ScaleOut(M, MIXED, 2)), scale_in_cooldown_s=0.0)
    assert r.counters.hysteresis is None
    r.step(view(model([inst("a")]), now=0.0))
    r.scaler = Scripted(ScaleIn("a"), Reclass("b", BATCH))
    r.step(view(model([inst("a"), inst("b"), inst("c")]), now=10.0))
    assert (r.counters.started, r.counters.retired, r.counters.reclassed) == (2, 1, 1)
    assert r.counters.hysteresis == pytest.approx(4 / 2)


def test_the_scaler_sees_the_bounds_and_the_interval_is_kept() -> None:
    s = Scripted()
    r = runner(s, interval_s=5.0, bounds={M: ModelBounds(1, 7)})
    assert r.due(0.0)
    r.step(view(model([inst("a")]), now=0.0))
    assert (s.seen[0].models[M].min_instances, s.seen[0].models[M].max_instances) == (1, 7)
    assert not r.due(4.9)
    assert r.due(5.0)


def test_a_scaler_that_plans_up_to_the_minimum_does_not_start_it_twice() -> None:
    # the live side's case: min 1, an empty fleet, a scaler whose plan already includes the minimum
    r = runner(Scripted(ScaleOut(M, MIXED, 1, None, "desired 1")), bounds={M: ModelBounds(1, 2)})
    assert r.step(view(model([]))) == [ScaleOut(M, MIXED, 1, None, "desired 1")]
    assert r.counters.started == 1


def test_the_minimum_tops_up_what_the_scalers_scale_out_left_short() -> None:
    r = runner(Scripted(ScaleOut(M, BATCH, 1)), bounds={M: ModelBounds(3, 10)})
    assert r.step(view(model([]))) == [ScaleOut(M, BATCH, 1), ScaleOut(M, MIXED, 2, None, "min_instances")]


def test_the_minimum_is_restored_even_within_the_scale_out_cooldown() -> None:
    r = runner(Scripted(ScaleOut(M, MIXED, 1)), scale_out_cooldown_s=60.0, bounds={M: ModelBounds(1, 5)})
    r.step(view(model([]), now=0.0))
    r.scaler = Scripted()
    # the instance it started crashed: the model is below its minimum again 10 s later
    assert r.step(view(model([]), now=10.0)) == [ScaleOut(M, MIXED, 1, None, "min_instances")]


# ----------------------------------------------------------------------------- a choice not ready yet
class Pending:
    """A `ConfigChoice` whose answer is not ready for the first `rounds` questions, then `big`."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds
        self.asked = 0

    def choose(
        self, view: ScaleView, decision: ScaleOut, free_devices: int, started: Sequence[str | None]
    ) -> Sequence[ScaleOut]:
        self.asked += 1
        if self.asked <= self.rounds:
            return []
        return [dataclasses.replace(decision, config="big", reason=f"{decision.reason}; config big")]


class Once:
    """Proposes its decisions in its first round only (as cato-sla, which resets its count)."""

    name = "once"

    def __init__(self, *decisions: ScaleDecision) -> None:
        self.decisions: list[ScaleDecision] = list(decisions)

    def decide(self, view: ScaleView) -> Sequence[ScaleDecision]:
        out, self.decisions = self.decisions, []
        return out


def configured(*configs: InstanceConfig) -> ModelScaleView:
    return dataclasses.replace(model([inst("a")]), configs=configs)


TWO = (InstanceConfig("small", 1, 8), InstanceConfig("big", 2, 64))


def test_a_scale_out_whose_choice_is_not_ready_is_held_one_round_and_not_lost() -> None:
    r = AutoscaleRunner(Once(ScaleOut(M, MIXED, 2, None, "late")), AutoscaleSettings(), configs=Pending(1))
    v = view(configured(*TWO))
    assert r.step(v) == []
    [held] = r.take_records()
    assert (held.outcome, held.note) == ("refused", "config_choice_pending")
    assert r.counters.started == 0
    # the scaler proposes nothing more: the held scale-out is asked again, its choice is ready now
    assert r.step(dataclasses.replace(v, now=110.0)) == [ScaleOut(M, MIXED, 2, "big", "late; config big")]
    assert r.counters.started == 2


def test_the_scalers_new_proposal_replaces_a_held_scale_out() -> None:
    r = AutoscaleRunner(
        Scripted(ScaleOut(M, MIXED, 1, None, "again")), AutoscaleSettings(), configs=Pending(1)
    )
    v = view(configured(*TWO))
    assert r.step(v) == []
    assert r.step(dataclasses.replace(v, now=110.0)) == [ScaleOut(M, MIXED, 1, "big", "again; config big")]
    assert r.counters.started == 1  # not the held one as well


def test_a_choice_not_ready_twice_starts_the_default_configuration() -> None:
    r = AutoscaleRunner(Once(ScaleOut(M, MIXED, 1, None, "late")), AutoscaleSettings(), configs=Pending(5))
    v = view(configured(*TWO))
    assert r.step(v) == []
    out = r.step(dataclasses.replace(v, now=110.0))
    assert out == [ScaleOut(M, MIXED, 1, None, "late; default configuration: the choice is not ready")]
