"""Chiron's local autoscaler, berth's variant (`chiron`) and the paper's (`chiron-paper`), driven directly:
endpoint views in (as the scheduler builds them on each change of an endpoint's running set), caps out.
The clock is the `now` passed in; token counters move as a dispatcher's progress reports would."""

from __future__ import annotations

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

    def stream(self, seconds: float, per_token_s: float, streams: int) -> None:
        """`streams` requests stream for `seconds` at `per_token_s` each (the clock moves on)."""
        per_stream = int(seconds / per_token_s)
        self.now += seconds
        self.tokens += per_stream * streams
        self.gap_s += per_stream * per_token_s * streams
        self.gap_tokens += per_stream * streams

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
