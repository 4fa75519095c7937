"""MaaSO's placer on constructed throughput-decay curves: a tight mix gets small-batch (and wide)
configurations, a relaxed one large-batch; the devices are split between the sub-clusters by the mix;
`next_config` answers the scaler; `MixWindow` builds a mix from observed requests."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sched.heterogeneous import (
    RELAXED,
    STRICT,
    ConfigProfile,
    Placer,
    RequestKind,
    TrafficMix,
)
from gateway.sched.mix_window import MixWindow
from gateway.sched.perf import default_prior

# Per-request decode tokens/s: 100 alone on one device, 160 alone on two (tensor parallel); falling
# logarithmically with the batch.
TP1_B4 = ConfigProfile("tp1-b4", 1, 4, 100.0, 20.0, 0.5)
TP1_B32 = ConfigProfile("tp1-b32", 1, 32, 100.0, 20.0, 0.5)
TP2_B4 = ConfigProfile("tp2-b4", 2, 4, 160.0, 32.0, 0.5)
PLACER = Placer((TP1_B4, TP1_B32, TP2_B4), strict_below=1.1, strict_max_batch=8)
T_SLOT = 0.01  # 1 / tp1 alone, roughly


def mix(rate: float, *kinds: tuple[float, float]) -> TrafficMix:
    return TrafficMix(rate=rate, t_slot_s=T_SLOT, kinds=tuple(RequestKind(s, f, 500.0) for s, f in kinds))


def test_a_tight_mix_gets_small_batches_and_a_relaxed_one_large_batches() -> None:
    tight = PLACER.place(mix(2.0, (1.0, 0.8)), 16)
    assert tight.instances[RELAXED] == ()
    assert set(tight.instances[STRICT]) == {"tp2-b4"}  # factor 0.8 is beyond one device alone
    assert tight.estimate[STRICT].attained > 0.8
    # At a rate small batches cannot carry (16 devices of tp2-b4 finish 8 requests/s).
    relaxed = PLACER.place(mix(12.0, (1.0, 2.5)), 16)
    assert relaxed.instances[STRICT] == ()
    assert set(relaxed.instances[RELAXED]) == {"tp1-b32"}
    assert relaxed.devices[RELAXED] <= 16


def test_the_devices_follow_the_share_of_tight_requests() -> None:
    strict_devices = [
        PLACER.place(mix(10.0, (share, 0.8), (1.0 - share, 2.5)), 24).devices[STRICT]
        for share in (0.2, 0.5, 0.8)
    ]
    assert strict_devices == sorted(strict_devices)
    assert strict_devices[0] < strict_devices[-1]
    both = PLACER.place(mix(10.0, (0.5, 0.8), (0.5, 2.5)), 24)
    assert both.instances[STRICT]
    assert both.instances[RELAXED]
    assert sum(both.devices.values()) <= 24


def test_more_devices_never_lower_the_score() -> None:
    m = mix(4.0, (0.4, 0.9), (0.6, 1.4))
    scores = [PLACER.place(m, d).score for d in range(0, 20, 2)]
    assert scores == sorted(scores)


def test_next_config_is_the_one_that_raises_the_score_most() -> None:
    m = mix(1.5, (0.5, 0.8), (0.5, 2.5))
    first = PLACER.next_config(m, [], 8)
    assert first is not None
    assert first.config == "tp1-b32"  # nothing runs: the most requests served first
    # With large batches running every request (the filter does not split), a two-device small batch
    # takes the tight half: the factor-0.8 requests they miss.
    after_relaxed = PLACER.next_config(m, ["tp1-b32"] * 2, 8)
    assert after_relaxed is not None
    assert (after_relaxed.config, after_relaxed.sub_cluster) == ("tp2-b4", STRICT)
    only_one = PLACER.next_config(m, ["tp1-b32"] * 2, 1)  # only one-device configurations fit
    assert only_one is not None
    assert only_one.config != "tp2-b4"
    assert PLACER.next_config(m, [], 0) is None
    # Enough of everything: nothing raises the score any more.
    assert PLACER.next_config(mix(0.1, (1.0, 2.5)), ["tp1-b32"] * 6, 8, min_gain=0.01) is None


def test_one_sided_candidates_serve_every_request() -> None:
    only_big = Placer((TP1_B32,), strict_below=1.1, strict_max_batch=8)
    placed = only_big.place(mix(2.0, (0.5, 0.8), (0.5, 2.5)), 4)
    assert placed.instances[STRICT] == ()
    assert placed.instances[RELAXED] == ("tp1-b32",) * 4


def test_from_perf_uses_the_fitted_curve() -> None:
    prior = default_prior()
    c = ConfigProfile.from_perf("x", 1, 16, prior, prompt_tokens=400)
    assert (c.thr1, c.alpha, c.beta) == (prior.thr1, prior.alpha, prior.beta)
    assert c.prefill_s == pytest.approx(prior.prefill_s(400))
    assert c.tps(64) == c.tps(16)  # truncated at the max batch


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda: ConfigProfile("x", 0, 4, 1.0, 0.0, 0.0), id="devices"),
        pytest.param(lambda: ConfigProfile("x", 1, 4, 0.0, 0.0, 0.0), id="thr1"),
        pytest.param(lambda: Placer(()), id="no-configs"),
        pytest.param(lambda: Placer((TP1_B4, TP1_B4)), id="duplicate"),
        pytest.param(lambda: PLACER.place(mix(1.0, (1.0, 1.0)), -1), id="devices-budget"),
    ],
)
def test_bad_inputs(bad: object) -> None:
    with pytest.raises(ValueError, match=r"must|needs|no candidate|named twice"):
        bad()  # type: ignore[operator]


@settings(max_examples=40, deadline=None)
@given(
    rate=st.floats(0.0, 20.0),
    share=st.floats(0.0, 1.0),
    devices=st.integers(0, 32),
    cv=st.floats(0.1, 4.0),
)
def test_placements_stay_in_budget_and_scores_in_range(
    rate: float, share: float, devices: int, cv: float
) -> None:
    m = TrafficMix(
        rate=rate,
        t_slot_s=T_SLOT,
        kinds=(RequestKind(share, 0.8, 300.0), RequestKind(1.0 - share, 1.5, 1000.0)),
        cv=cv,
    )
    p = PLACER.place(m, devices)
    assert sum(p.devices.values()) <= devices
    assert -1e-9 <= p.score <= 1.0 + 1e-9
    for e in p.estimate.values():
        assert 0.0 <= e.attained <= e.share + 1e-9


def test_mix_window_buckets_and_decays() -> None:
    w = MixWindow(window_s=10.0, bucket=0.1)
    for i in range(10):
        w.observe(float(i), 0.82, 310.0)
        w.observe(float(i), 1.48, 990.0)
    m = w.mix(10.0, T_SLOT)
    assert [(round(k.factor, 1), round(k.decode_tokens)) for k in m.kinds] == [(0.8, 310), (1.5, 990)]
    assert sum(k.share for k in m.kinds) == pytest.approx(1.0)
    assert m.rate == pytest.approx(2.0, rel=0.1)  # 2 requests/s over the first window
    later = w.mix(200.0, T_SLOT)  # long after: everything decayed away
    assert later.kinds == ()
    w.observe(200.0, float("nan"), 10.0)  # ignored
    assert w.mix(200.0, T_SLOT).kinds == ()


def test_one_sub_cluster_alone_serves_every_request_when_that_scores_higher() -> None:
    # Light relaxed traffic: fast two-device instances meet every deadline with lower latency; the
    # distributor does not split a model whose endpoints are all alike, so they serve everything.
    placed = PLACER.place(mix(2.0, (1.0, 2.5)), 16)
    sides = [s for s in (STRICT, RELAXED) if placed.instances[s]]
    assert len(sides) == 1
    assert placed.estimate[sides[0]].share == pytest.approx(1.0)
    assert placed.score == pytest.approx(
        PLACER.estimate(
            mix(2.0, (1.0, 2.5)),
            mix(2.0, (1.0, 2.5)).kinds,
            [c for c in PLACER.configs for name in placed.all_instances if c.name == name],
        ).score(PLACER.weights)
    )
