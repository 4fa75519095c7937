"""Each scaler's decisions on hand-built views (sans-IO; the runner's rules are tested apart)."""

from __future__ import annotations

import pytest

from gateway.core.slo import SloKind
from gateway.core.types import InstanceClass, RequestId
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.autoscale.aladdin_workers import (
    AladdinWorkersParams,
    AladdinWorkersScaler,
    fit_line,
)
from gateway.sched.plugins.autoscale.cato_sla import CatoSlaParams, CatoSlaScaler
from gateway.sched.plugins.autoscale.chiron import ChironScaler, ChironScalerParams, request_groups
from gateway.sched.plugins.autoscale.interface import (
    FinishedCall,
    Reclass,
    ScaleIn,
    ScaleOut,
    Scaler,
    ScaleState,
)
from gateway.sched.plugins.autoscale.queue_length import QueueLengthParams, QueueLengthScaler
from gateway.sched.plugins.autoscale.utilization_band import UtilizationBandParams, UtilizationBandScaler
from gateway.sched.registry import PluginKind
from tests.autoscale_views import M, inst, model, open_call, queued, view

MIXED, BATCH = InstanceClass.MIXED, InstanceClass.BATCH
IA, B = SloKind.INTERACTIVE, SloKind.BATCH


@pytest.mark.parametrize(
    "name", ["chiron", "cato-sla", "aladdin-workers", "utilization-band", "queue-length"]
)
def test_every_scaler_is_registered_and_a_scaler(name: str) -> None:
    s = default_registry().build(PluginKind.SCALER, name, {}, path="autoscale")
    assert isinstance(s, Scaler)
    assert s.name == name


# ----------------------------------------------------------------------------- chiron
def chiron(**kw: object) -> ChironScaler:
    return ChironScaler(ChironScalerParams(**kw))  # type: ignore[arg-type]


def test_chiron_adds_interactive_instances_above_the_band() -> None:
    # 2 mixed instances of 16 seats, 24 interactive running + 8 queued: IBP = 32 / 32 = 1 > 0.65;
    # wanted = ceil(32 / (0.5 · 16)) = 4 → 2 more
    mv = model([inst("a", interactive=12), inst("b", interactive=12)], queued(IA, 8))
    out = chiron().decide(view(mv))
    assert len(out) == 1
    assert isinstance(out[0], ScaleOut)
    assert (out[0].instance_class, out[0].count) == (MIXED, 2)


def test_chiron_counts_starting_instances_as_coming_capacity() -> None:
    mv = model(
        [inst("a", interactive=12), inst("b", interactive=12), inst("c", state=ScaleState.STARTING)],
        queued(IA, 8),
    )
    out = chiron().decide(view(mv))
    assert [(d.instance_class, d.count) for d in out if isinstance(d, ScaleOut)] == [(MIXED, 1)]


def test_chiron_does_nothing_inside_the_band() -> None:
    mv = model([inst("a", interactive=8), inst("b", interactive=8)])  # IBP 0.5
    assert chiron().decide(view(mv)) == []


def test_chiron_retires_idle_interactive_instances_below_the_band_keeping_its_minimum() -> None:
    mv = model(
        [
            inst("a", interactive=1),
            inst("b", idle_since=50.0),
            inst("c", idle_since=10.0),
            inst("d", idle_since=90.0),
        ]
    )
    out = chiron(max_retire=2, min_interactive=1).decide(view(mv))
    # work 1 → wanted 1; 3 surplus, at most 2 a round, longest idle first
    assert out == [ScaleIn("c", out[0].reason), ScaleIn("b", out[1].reason)]


def test_request_groups_split_by_deadline_and_accumulate_tokens() -> None:
    q = [
        *queued(B, 2, deadline=100.0),
        *queued(B, 1, deadline=150.0),
        *queued(B, 3, deadline=500.0),
        *queued(IA, 4),
    ]
    gs = request_groups(q, span_s=60.0)
    assert [(g.deadline, g.tokens_mean) for g in gs] == [(100.0, 300.0), (500.0, 600.0)]


def test_chiron_starts_just_enough_batch_instances_at_once() -> None:
    # 100 requests × 1000 tokens due in 130 s; a new instance serves 100 s at 300 tokens/s = 30k tokens:
    # 4 instances (3 would make 90k)
    mv = model([inst("a", interactive=4)], queued(B, 100, deadline=230.0, tokens=1000.0))
    out = chiron(default_tokens_per_s=300.0).decide(view(mv, now=100.0))
    assert [(d.instance_class, d.count) for d in out if isinstance(d, ScaleOut)] == [(BATCH, 4)]


def test_chiron_counts_ready_batch_instances_at_their_measured_rate() -> None:
    # one ready batch instance at 600 tokens/s (past its warm-up) serves 78k of the 100k in 130 s
    b = inst("b", cls=BATCH, batch=16, tokens_per_s=600.0, ready_at=0.0)
    mv = model([inst("a", interactive=4), b], queued(B, 100, deadline=230.0, tokens=1000.0))
    out = chiron(default_tokens_per_s=300.0, warmup_s=60.0).decide(view(mv, now=100.0))
    # left: 100k − 78k = 22k; a new one serves 100 s × 600 = 60k → 1
    assert [(d.instance_class, d.count) for d in out if isinstance(d, ScaleOut)] == [(BATCH, 1)]


def test_a_group_no_new_instance_could_save_does_not_drive_the_count() -> None:
    mv = model(
        [inst("a", interactive=4)], queued(B, 100, deadline=120.0, tokens=1000.0)
    )  # due in 20 s < load
    assert [d for d in chiron().decide(view(mv, now=100.0)) if isinstance(d, ScaleOut)] == []


def test_chiron_retires_every_batch_instance_when_no_batch_work_is_left() -> None:
    mv = model(
        [
            inst("a", interactive=8),
            inst("b", cls=BATCH),
            inst("c", cls=BATCH),
            inst("d", cls=BATCH, state=ScaleState.STARTING),
        ]
    )
    out = chiron(reclass=False).decide(view(mv))
    assert [d.instance for d in out if isinstance(d, ScaleIn)] == ["b", "c"]


def test_chiron_reclasses_spare_batch_instances_before_starting_interactive_ones() -> None:
    mv = model([inst("a", interactive=16), inst("b", cls=BATCH)], queued(IA, 8))
    out = chiron().decide(view(mv))
    # wanted ceil(24 / 8) = 3 interactive+mixed: b is re-classed (free), 1 more is started
    assert isinstance(out[0], Reclass)
    assert (out[0].instance, out[0].to_class) == ("b", MIXED)
    assert [(d.instance_class, d.count) for d in out if isinstance(d, ScaleOut)] == [(MIXED, 1)]


def test_chiron_reclasses_surplus_mixed_instances_for_batch_work() -> None:
    mixed = [inst("a", interactive=1), inst("b"), inst("c")]
    mv = model(mixed, queued(B, 100, deadline=230.0, tokens=1000.0))
    out = chiron(default_tokens_per_s=300.0).decide(view(mv, now=100.0))
    moved = [d.instance for d in out if isinstance(d, Reclass)]
    assert len(moved) == 2
    assert all(d.to_class is BATCH for d in out if isinstance(d, Reclass))
    assert [(d.instance_class, d.count) for d in out if isinstance(d, ScaleOut)] == [(BATCH, 2)]


# ----------------------------------------------------------------------------- cato-sla
def call(took: float, allotted: float = 1.0, rid: str | None = None) -> FinishedCall:
    return FinishedCall(IA, 0.0, took, allotted, took, False, None if rid is None else RequestId(rid))


def test_cato_adds_violations_minus_idle_instances_and_resets() -> None:
    s = CatoSlaScaler(CatoSlaParams(max_exceeded_proportion=0.2, max_exceeded_times=3))
    calls = [call(1.3)] * 5 + [call(1.1)] * 4  # five over 1.2 × allotted
    mv = model([inst("a", interactive=3), inst("b", idle_since=99.0)], finished=calls, hi=10)
    out = s.decide(view(mv))
    assert [(d.count, d.instance_class) for d in out if isinstance(d, ScaleOut)] == [(4, MIXED)]
    assert s.violations[M] == 0


def test_cato_waits_while_idle_instances_outnumber_violations() -> None:
    s = CatoSlaScaler(CatoSlaParams(max_exceeded_times=3))
    idle = [inst(f"i{k}", idle_since=99.0) for k in range(5)]
    assert s.decide(view(model(idle, finished=[call(2.0)] * 4))) == []
    assert s.violations[M] == 4  # kept for the next round


def test_cato_removes_instances_idle_past_the_timeout() -> None:
    s = CatoSlaScaler(CatoSlaParams(idle_timeout_s=60.0))
    mv = model([inst("a", idle_since=10.0), inst("b", idle_since=80.0), inst("c", interactive=1)])
    assert [d.instance for d in s.decide(view(mv, now=100.0)) if isinstance(d, ScaleIn)] == ["a"]


def test_cato_clips_to_the_models_maximum() -> None:
    s = CatoSlaScaler(CatoSlaParams(max_exceeded_times=0))
    mv = model([inst("a", interactive=1)], finished=[call(5.0)] * 9, hi=3)
    assert [d.count for d in s.decide(view(mv)) if isinstance(d, ScaleOut)] == [2]


def counting(*, in_flight: bool = True) -> CatoSlaScaler:
    """A cato-sla scaler that only counts here (its threshold is never passed)."""
    return CatoSlaScaler(CatoSlaParams(max_exceeded_times=1000, count_in_flight=in_flight))


def test_cato_counts_an_open_call_over_its_limit_once_and_not_again_at_its_finish() -> None:
    s = counting()
    busy = [inst("a", interactive=2)]
    rounds = [
        model(busy, open_calls=[open_call("late", 1.3), open_call("ok", 1.1)]),  # 1.3 > 1.2 · 1.0
        model(busy, open_calls=[open_call("late", 3.3), open_call("ok", 3.1)]),  # "ok" passes it now
        model(busy, finished=[call(4.0, rid="late"), call(4.0, rid="ok")]),  # both counted already
        model(busy, finished=[call(4.0, rid="never-seen-open")]),  # a finish counts as ever
    ]
    counts = []
    for mv in rounds:
        s.decide(view(mv))
        counts.append(s.violations[M])
    assert counts == [1, 2, 2, 3]


def test_cato_open_calls_without_a_measure_or_a_target_never_count() -> None:
    s = counting()
    mv = model([inst("a", interactive=2)], open_calls=[open_call("r", None), open_call("t", 9.0, None)])
    s.decide(view(mv))
    assert s.violations[M] == 0


def test_cato_literal_variant_counts_a_call_only_when_it_finishes() -> None:
    s = counting(in_flight=False)
    busy = [inst("a", interactive=1)]
    s.decide(view(model(busy, open_calls=[open_call("late", 5.0)])))
    assert s.violations[M] == 0
    s.decide(view(model(busy, finished=[call(6.0, rid="late")])))
    assert s.violations[M] == 1


def test_cato_scales_out_on_open_calls_before_any_finishes() -> None:
    s = CatoSlaScaler(CatoSlaParams(max_exceeded_proportion=0.2, max_exceeded_times=3))
    late = [open_call(f"r{k}", 2.0) for k in range(5)]
    mv = model([inst("a", interactive=3), inst("b", interactive=2)], open_calls=late, hi=10)
    out = s.decide(view(mv))
    assert [d.count for d in out if isinstance(d, ScaleOut)] == [5]


# ----------------------------------------------------------------------------- aladdin-workers
def test_fit_line_recovers_a_line_and_falls_back_through_the_origin() -> None:
    pts = [(r, 0.5 * r + 2.0) for r in (1.0, 2.0, 3.0, 4.0)]
    k, c = fit_line(pts, 0.05)
    assert k == pytest.approx(0.5)
    assert c == pytest.approx(2.0)
    k0, c0 = fit_line([(2.0, 4.0), (2.0, 4.0)], 0.05)  # one rate: no intercept can be told apart
    assert k0 == pytest.approx(2.0)
    assert c0 == 0.0


def test_aladdin_moves_the_fleet_to_its_fitted_count() -> None:
    s = AladdinWorkersScaler(AladdinWorkersParams(seats=10))
    for r, run in ((1.0, 10), (2.0, 20), (3.0, 30)):  # n* = running / 10 = r
        s.decide(view(model([inst("a", interactive=run, cap=10)], rate=r)))
    # 50 running over 1 instance of 10 seats at 5 req/s: the point (5, 5) keeps the line n = r
    out = s.decide(view(model([inst("a", interactive=50, cap=10)], rate=5.0)))
    k, c = s.fit(M)
    assert k == pytest.approx(1.0)
    assert c == pytest.approx(0.0, abs=1e-9)
    assert [d.count for d in out if isinstance(d, ScaleOut)] == [4]  # ceil(1 · 5 + 0) = 5: 4 more


def test_aladdin_retires_one_instance_a_round_above_its_count() -> None:
    s = AladdinWorkersScaler(AladdinWorkersParams(seats=10))
    mv = model([inst("a", interactive=10, cap=10), inst("b"), inst("c")], rate=1.0)
    out = s.decide(view(mv))
    assert len(out) == 1
    assert isinstance(out[0], ScaleIn)


# ----------------------------------------------------------------------------- baselines
def test_queue_length_scales_up_after_its_delay_and_down_after_its_own() -> None:
    s = QueueLengthScaler(
        QueueLengthParams(target_per_instance=2.0, upscale_delay_s=30.0, downscale_delay_s=60.0)
    )
    busy = model([inst("a", interactive=4)], queued(IA, 4))  # 8 ongoing → 4 instances
    assert s.decide(view(busy, now=0.0)) == []
    out = s.decide(view(busy, now=30.0))
    assert [d.count for d in out if isinstance(d, ScaleOut)] == [3]
    quiet = model([inst("a", interactive=1), inst("b", idle_since=0.0), inst("c", idle_since=0.0)])
    assert s.decide(view(quiet, now=40.0)) == []
    out = s.decide(view(quiet, now=100.0))
    assert [d.instance for d in out if isinstance(d, ScaleIn)] == ["b"]


def test_utilization_band_scales_out_at_once_on_queued_work() -> None:
    s = UtilizationBandScaler(UtilizationBandParams())
    out = s.decide(view(model([inst("a", interactive=16)], queued(IA, 40))))
    assert [d.count for d in out if isinstance(d, ScaleOut)] == [3]  # ceil(40 / 16)


@pytest.mark.parametrize(
    ("running", "expect"),
    [(15, "out"), (10, "none"), (2, "in")],
    ids=["above-band", "inside", "below-band"],
)
def test_utilization_band_keeps_mean_utilization_inside_the_band(running: int, expect: str) -> None:
    s = UtilizationBandScaler(UtilizationBandParams(low=0.4, high=0.8))
    mv = model([inst("a", interactive=running), inst("b", interactive=running)])
    out = s.decide(view(mv))
    kinds = {"out": [ScaleOut], "none": [], "in": [ScaleIn]}[expect]
    assert [type(d) for d in out] == kinds


def test_utilization_band_params_need_low_below_high() -> None:
    with pytest.raises(ValueError, match="must be below high"):
        UtilizationBandParams(low=0.8, high=0.5)
