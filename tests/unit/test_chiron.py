"""Chiron's local autoscaler, berth's variant (`chiron`) and the paper's (`chiron-paper`), driven directly:
endpoint views in (as the scheduler builds them on each change of an endpoint's running set), caps out.
The clock is the `now` passed in; token counters move as a dispatcher's progress reports would."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import pytest

from gateway.core.types import EndpointHealth, EndpointId, EngineKind, InstanceClass, ModelName, RequestId
from gateway.sched.plugins.concurrency.chiron import ChironController, ChironParams
from gateway.sched.plugins.concurrency.chiron_paper import ChironPaperController, ChironPaperParams
from gateway.sched.running import RunningRequest
from gateway.sched.snapshot import EndpointView

E = EndpointId("e")


def running(n: int, itl_s: float, *, fresh: int = 0, at: float = 0.0) -> tuple[RunningRequest, ...]:
    """`n` running requests; the last `fresh` of them dispatched at `at` and still without a first token
    (the others dispatched at 0 and streaming)."""
    return tuple(
        RunningRequest(
            id=RequestId(f"r{k}"),
            slo_class="c",
            prompt_tokens=100,
            output_mean=200.0,
            output_std=0.0,
            max_tokens=None,
            dispatched_at=at if k >= n - fresh else 0.0,
            ttft_deadline=None,
            e2e_deadline=None,
            itl_s=itl_s,
            first_token_at=None if k >= n - fresh else 0.0,
        )
        for k in range(n)
    )


@dataclass
class Endpoint:
    """An endpoint's counters as the scheduler keeps them; `stream` moves them on."""

    max_cap: int
    tokens: int = 0
    gap_s: float = 0.0
    gap_tokens: int = 0
    now: float = 0.0
    caps: list[int] = field(default_factory=list)
    cut_at: float = -math.inf
    after_cut_s: float = 0.0
    after_cut_tokens: int = 0

    def stream(
        self, seconds: float, per_token_s: float, streams: int, *, begun_before_cut: bool = False
    ) -> None:
        """`streams` requests stream for `seconds` at `per_token_s` each (the clock moves on); with
        `begun_before_cut` their reports' gaps began before the last cut (`cut`)."""
        per_stream = int(seconds / per_token_s)
        self.now += seconds
        self.tokens += per_stream * streams
        self.gap_s += per_stream * per_token_s * streams
        self.gap_tokens += per_stream * streams
        if not begun_before_cut:
            self.after_cut_s += per_stream * per_token_s * streams
            self.after_cut_tokens += per_stream * streams

    def cut(self) -> None:
        """The scheduler put a lower cap in force now."""
        self.cut_at = self.now

    def view(
        self, inflight: int, target_s: float, cap: int, *, fresh: int = 0, at: float = 0.0
    ) -> EndpointView:
        return EndpointView(
            id=E,
            url="http://e",
            engine=EngineKind.VLLM,
            models=frozenset({ModelName("m")}),
            instance_class=InstanceClass.MIXED,
            health=EndpointHealth.READY,
            cap=cap,
            inflight=inflight,
            running=running(inflight, target_s, fresh=fresh, at=at),
            max_cap=self.max_cap,
            streamed_tokens=self.tokens,
            gap_s=self.gap_s,
            gap_tokens=self.gap_tokens,
            cut_at=self.cut_at,
            gap_after_cut_s=self.after_cut_s,
            gap_after_cut_tokens=self.after_cut_tokens,
        )


def test_margin_cut_follows_the_observed_itl_margin_and_halving_bounds_it() -> None:
    """At 250 ms per token against a 200 ms target (LBP 1.25) `cut = "margin"` cuts 80 -> 64 (B / LBP)
    where the paper halves; at LBP 3 both halve (B / 2 is the deepest cut)."""
    for lbp, berth_cap, paper_cap in ((1.25, 64, 40), (3.0, 40, 40)):
        caps = []
        for ctl in (
            ChironController(ChironParams(interval_s=1.0, start=80, cut="margin")),
            ChironPaperController(ChironPaperParams(interval_s=1.0, start=80)),
        ):
            ep = Endpoint(max_cap=128)
            assert ctl.cap(ep.view(80, 0.2, 80), ep.now) == 80
            ep.stream(3.0, 0.2 * lbp, 80)
            caps.append(ctl.cap(ep.view(80, 0.2, 80), ep.now))
        assert caps == [berth_cap, paper_cap], lbp


def test_halving_is_the_default_cut() -> None:
    ctl = ChironController(ChironParams(interval_s=1.0, start=80))
    ep = Endpoint(max_cap=128)
    ctl.cap(ep.view(80, 0.2, 80), ep.now)
    ep.stream(3.0, 0.25, 80)
    assert ctl.cap(ep.view(80, 0.2, 80), ep.now) == 40


def test_berth_does_not_halve_on_a_throughput_dip_the_paper_does() -> None:
    """Both grow while the latency is low; a throughput dip of 30 % (no latency trouble): the paper halves
    (TBP > 1), berth takes back only its last growth once it has judged it."""
    paper = ChironPaperController(ChironPaperParams(interval_s=1.0, start=32))
    ep = Endpoint(max_cap=128)
    paper.cap(ep.view(32, 2.0, 32), ep.now)
    ep.stream(2.0, 0.05, 32)
    assert paper.cap(ep.view(32, 2.0, 32), ep.now) == 64  # bp = LBP = 0.025 -> at most x2
    ep.stream(2.0, 0.05 / 0.7, 32)  # 30 % fewer tokens per second
    assert paper.cap(ep.view(32, 2.0, 64), ep.now) == 32  # TBP = 1.43: halved

    berth = ChironController(ChironParams(interval_s=1.0, start=32))
    ep = Endpoint(max_cap=128)
    berth.cap(ep.view(32, 2.0, 32), ep.now)
    ep.stream(2.0, 0.05, 32)
    assert berth.cap(ep.view(32, 2.0, 32), ep.now) == 64
    ep.stream(2.0, 0.05, 64)  # right after the growth: skipped
    assert berth.cap(ep.view(64, 2.0, 64), ep.now) == 64
    ep.stream(2.0, 0.05 / 0.35, 64)  # the grown batch streams less than the old one did: undo it
    assert berth.cap(ep.view(64, 2.0, 64), ep.now) == 32


@pytest.mark.parametrize("free", [0, 20], ids=["binding", "seats-free"])
def test_paper_grows_with_seats_free_berth_only_while_binding(free: int) -> None:
    ep_paper, ep_berth = Endpoint(max_cap=128), Endpoint(max_cap=128)
    paper = ChironPaperController(ChironPaperParams(interval_s=1.0, start=40))
    berth = ChironController(ChironParams(interval_s=1.0, start=40))
    for ctl, ep in ((paper, ep_paper), (berth, ep_berth)):
        ctl.cap(ep.view(40 - free, 0.2, 40), ep.now)
        ep.stream(2.0, 0.1, 40 - free)
    assert paper.cap(ep_paper.view(40 - free, 0.2, 40), ep_paper.now) == 60  # 0.5*40/0.5 + 0.5*40
    assert berth.cap(ep_berth.view(40 - free, 0.2, 40), ep_berth.now) == (60 if free == 0 else 40)


def test_both_stay_within_the_bound_and_min_cap() -> None:
    for ctl in (
        ChironController(ChironParams(interval_s=0.0, min_cap=3, start=8)),
        ChironPaperController(ChironPaperParams(interval_s=0.0, min_cap=3, start=8)),
    ):
        ep = Endpoint(max_cap=10)
        assert ctl.cap(ep.view(8, 0.2, 8), ep.now) == 8
        for _ in range(4):
            ep.stream(1.0, 0.01, 8)
            cap = ctl.cap(ep.view(8, 0.2, 8), ep.now)
            assert cap <= 10
        for _ in range(6):
            ep.stream(1.0, 1.0, 8)
            cap = ctl.cap(ep.view(min(cap, 8), 0.2, cap), ep.now)
            assert 3 <= cap <= 10
        assert cap == 3


def test_a_reading_does_not_count_gaps_that_began_before_a_cut() -> None:
    """Halved 80 -> 40 at 250 ms per token; the streams' next reports still cover time in the batch of
    80 (a stream reports every few tokens): the paper's reading takes them and halves again, berth's
    counts only gaps begun after the cut, holds until it has one, and judges the cut by those."""
    paper = ChironPaperController(ChironPaperParams(interval_s=1.0, start=80))
    berth = ChironController(ChironParams(interval_s=1.0, start=80))
    for ctl, second in ((paper, 20), (berth, 40)):
        ep = Endpoint(max_cap=128)
        ctl.cap(ep.view(80, 0.2, 80), ep.now)
        ep.stream(3.0, 0.25, 80)
        assert ctl.cap(ep.view(80, 0.2, 80), ep.now) == 40
        ep.cut()
        ep.stream(2.0, 0.25, 40, begun_before_cut=True)  # reports whose gaps began in the larger batch
        assert ctl.cap(ep.view(40, 0.2, 40), ep.now) == second
    ep.stream(2.0, 0.15, 40)  # the first gaps measured under the cut: within the target
    assert berth.cap(ep.view(40, 0.2, 40), ep.now) == 46  # LBP 0.75, binding: 0.5*40/0.75 + 0.5*40


def test_a_spill_is_not_latency_pressure_until_measured_under_its_target() -> None:
    """A mixed endpoint runs 100 batch streams (ITL target 2 s) at 250 ms per token; an interactive
    request (target 200 ms) is placed there. The reading that follows measured the batch before the
    interactive request ran: berth takes it as no pressure against the new target (its placement judged
    that it fits) and judges the next one; the paper halves at once. Under the tighter target still at
    250 ms per token, berth halves."""

    def mixed(ep: Endpoint, batch: int, interactive: int, cap: int) -> EndpointView:
        v = ep.view(batch + interactive, 2.0, cap)
        tight = tuple(dataclasses.replace(r, itl_s=0.2) for r in v.running[batch:])
        return dataclasses.replace(v, running=v.running[:batch] + tight)

    paper = ChironPaperController(ChironPaperParams(interval_s=1.0, start=101))
    ep = Endpoint(max_cap=128)
    paper.cap(mixed(ep, 100, 0, 101), ep.now)
    ep.stream(2.5, 0.25, 100)
    assert paper.cap(mixed(ep, 100, 1, 101), ep.now) == 50  # the interactive request is placed

    berth = ChironController(ChironParams(interval_s=1.0, start=101))
    ep = Endpoint(max_cap=128)
    berth.cap(mixed(ep, 100, 0, 101), ep.now)
    ep.stream(2.5, 0.25, 100)
    assert berth.cap(mixed(ep, 100, 1, 101), ep.now) == 101
    ep.stream(2.0, 0.25, 101)
    assert berth.cap(mixed(ep, 100, 1, 101), ep.now) == 50
    ep.cut()
    # latency over a target that did not change, measured under the cut: halved at once
    ep.stream(2.0, 0.25, 50)
    assert berth.cap(mixed(ep, 49, 1, 50), ep.now) == 25
