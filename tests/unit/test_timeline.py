"""EndpointTimeline: token receipts in, prefill and decode observations out (sans-IO, explicit times).

The scripted cases use one running stream R with 30 ms decode iterations, into which a new request's
prefill (50 ms) cuts; the tolerance is a quarter of the median gap (7.5 ms)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.telemetry.robust_regression import median
from gateway.telemetry.timeline import (
    MIN_KEPT_GAPS,
    DecodeObservation,
    EndpointTimeline,
    PrefillObservation,
    _over_tolerance,
)
from gateway.telemetry.timeline_store import TOLERANCE, SpanColumns, StreamArrays, TimedStream
from loadgen.engine_sim.latency import LatencyModel
from tests.unit.engine_trace import TracedStream, engine_trace


@dataclass(frozen=True)
class S:
    """A stream as the relay saw it."""

    times: Sequence[float]
    dispatched_at: float | None = 0.0
    prompt: float = 100.0
    clean: bool = True


def regular(start: float, n: int, gap: float = 0.03) -> list[float]:
    return [start + k * gap for k in range(n)]


# R: first token at 0.10, then every 30 ms, except the gap 0.19 -> 0.27 that a 50 ms prefill lengthened
R = S(regular(0.10, 4) + regular(0.27, 6))
# N: dispatched at 0.17, its first token from the prefill that ended at 0.24, then decoding beside R
N = S([0.24, 0.27, 0.30], dispatched_at=0.17, prompt=50.0)


def timeline(streams: Sequence[S], untracked: Sequence[tuple[float, float]] = ()) -> EndpointTimeline:
    tl = EndpointTimeline()
    for s in streams:
        t = list(s.times)
        tl.add_stream(
            dispatched_at=s.dispatched_at,
            first_token_at=t[0],
            gaps=[b - a for a, b in pairwise(t)],
            prompt_tokens=s.prompt,
            clean=s.clean,
        )
    for a, b in untracked:
        tl.add_untracked(a, b)
    return tl


def rows(obs: Sequence[PrefillObservation]) -> list[tuple[float, float, bool]]:
    return [(p.prompt_tokens, round(p.seconds, 9), p.idle) for p in obs]  # receipts are summed gaps


IDLE_R = (100.0, 0.10, True)  # R's own first token: TTFT from dispatch on an idle endpoint

PREFILL_CASES = [
    pytest.param([S([0.12, 0.15], dispatched_at=0.02, prompt=7.0)], (), [(7.0, 0.10, True)], id="idle-ttft"),
    pytest.param([R, N], (), [IDLE_R, (50.0, 0.05, False)], id="busy-interrupted-gap"),
    pytest.param(
        # vLLM's chunked prefill: the first token comes with R's token of the lengthened iteration
        [R, S([0.27, 0.30, 0.33], dispatched_at=0.17, prompt=50.0)],
        (),
        [IDLE_R, (50.0, 0.05, False)],
        id="busy-mixed-iteration",
    ),
    pytest.param(
        [R, N, S([0.241, 0.27], dispatched_at=0.18, prompt=30.0)],
        (),
        [IDLE_R, (80.0, 0.05, False)],
        id="one-group-of-two",
    ),
    pytest.param(
        [R, S([0.215, 0.27], dispatched_at=0.17), S([0.24, 0.27], dispatched_at=0.18)],
        (),
        [IDLE_R],
        id="two-prefills-in-one-gap",
    ),
    pytest.param(
        # the gap before the interrupted one is stretched (a stalled event loop): R cannot time it
        [S([*regular(0.10, 3), 0.25, *regular(0.33, 6)]), S([0.30, 0.33], dispatched_at=0.17)],
        (),
        [IDLE_R],
        id="irregular-neighbours",
    ),
    pytest.param(
        # B queued behind A's prefill: its TTFT counts A's prefill too; A's first gap cannot time it
        [S([0.10, 0.23, 0.26]), S([0.20, 0.23], dispatched_at=0.01)],
        (),
        [IDLE_R],
        id="queued-behind-another-prefill",
    ),
    pytest.param([S([0.12, 0.15], dispatched_at=0.02)], [(0.0, 0.05)], [], id="untracked-request-ran"),
    pytest.param(
        # its first token came in one read with the next ones: held back on the way, not the prefill's end
        [S([0.30, 0.3001, 0.3002, 0.33, 0.36])],
        (),
        [],
        id="idle-first-token-held-back",
    ),
    pytest.param([S([0.12, 0.15], dispatched_at=None)], (), [], id="retried-dispatch-unknown"),
]


@pytest.mark.parametrize(("streams", "untracked", "expected"), PREFILL_CASES)
def test_prefill_observations(
    streams: Sequence[S], untracked: Sequence[tuple[float, float]], expected: list[tuple[float, float, bool]]
) -> None:
    tl = timeline(streams, untracked)
    assert rows(tl.settle(math.inf).prefill) == expected


def test_decode_leaves_out_gaps_with_a_first_token_and_samples_the_batch() -> None:
    [r] = timeline([R, N]).settle(math.inf).decode  # N is too short for a decode observation
    # kept gaps: all but 0.19 -> 0.27 (N's first token came in it); N ran beside R in 0.27 -> 0.30
    batch = 9 / 8
    contexts = [101, 102, 103, (100 + 5) + (50 + 2), 106, 107, 108, 109]
    expected = DecodeObservation(
        batch=batch,
        avg_context=sum(contexts) / 8 / batch,
        seconds=0.03,
        concurrency=10 / 9,  # every gap counts here, N's first one too (it was waiting)
        tokens_per_s=9 / 0.32,
    )
    assert tuple(r) == pytest.approx(tuple(expected))


DECODE_CASES = [
    pytest.param([S(regular(0.1, 10), prompt=40.0)], (), (1.0, 45.0, 0.03), id="alone"),
    pytest.param([S(regular(0.1, 8))], (), None, id="too-few-gaps"),
    pytest.param([S(regular(0.1, 20), clean=False)], (), None, id="cut-short"),
    pytest.param(
        [S([t for k in range(4) for t in regular(0.1 + 0.2 * k, 5, 0.0)])],  # four reads of five each
        (),
        None,
        id="receipts-held-back-in-bursts",
    ),
    pytest.param(
        [S(regular(0.1, 11) + regular(0.4 + 0.05, 9, 0.05), prompt=0.0)],
        [(0.0, 0.39)],  # an untracked request ran during the first ten gaps: only the 50 ms ones count
        (1.0, 15.0, 0.05),  # 11..19 tokens received at the kept gaps' middles
        id="untracked-overlap",
    ),
]


@pytest.mark.parametrize(("streams", "untracked", "expected"), DECODE_CASES)
def test_decode_observations(
    streams: Sequence[S],
    untracked: Sequence[tuple[float, float]],
    expected: tuple[float, float, float] | None,
) -> None:
    got = timeline(streams, untracked).settle(math.inf).decode
    if expected is None:
        assert got == []
    else:
        [d] = got
        assert (d.batch, d.avg_context, d.seconds) == pytest.approx(expected)


def test_nothing_is_derived_before_every_stream_it_needs_has_been_added() -> None:
    tl = timeline([N])  # N finished; R (dispatched at 0.0) still runs: the daemon settles before 0.0
    assert tl.settle(0.0) == ([], [])
    tl.add_stream(
        dispatched_at=0.0,
        first_token_at=0.10,
        gaps=np.diff(R.times).tolist(),
        prompt_tokens=100.0,
        clean=True,
    )
    first = tl.settle(0.2)  # R's first token is settled; N's group lies later
    assert rows(first.prefill) == [IDLE_R]
    assert first.decode == []
    late = tl.settle(0.3)  # N's group, but R's gaps after it run past 0.3: it waits
    assert late == ([], [])
    rest = tl.settle(math.inf)
    assert rows(rest.prefill) == [(50.0, 0.05, False)]
    assert len(rest.decode) == 1
    assert tl.settle(math.inf) == ([], [])  # nothing twice
    assert (len(tl), tl.tokens) == (0, 0)  # and nothing kept once nothing is left to derive


def test_the_bound_drops_the_oldest_streams_and_what_needed_them() -> None:
    tl = EndpointTimeline(max_tokens=25)
    for k in range(3):  # three 10-token streams, none settled (a request older than all still runs)
        t = regular(10.0 * k, 10)
        tl.add_stream(
            dispatched_at=10.0 * k - 1,
            first_token_at=t[0],
            gaps=np.diff(t).tolist(),
            prompt_tokens=5,
            clean=True,
        )
    assert tl.settle(-1.0) == ([], [])
    assert (len(tl), tl.tokens, tl.dropped) == (2, 20, 1)
    assert tl.known_from == pytest.approx(0.27)
    got = tl.settle(math.inf)
    assert len(got.decode) == 2
    assert [p.idle for p in got.prefill] == [True, True]


def test_forget_drops_everything_before() -> None:
    tl = timeline([R])
    tl.forget(1.0)
    assert (len(tl), tl.dropped, tl.known_from) == (0, 1, 1.0)
    tl.add_stream(dispatched_at=0.5, first_token_at=1.5, gaps=[0.03] * 9, prompt_tokens=10.0, clean=True)
    got = tl.settle(math.inf)
    assert got.prefill == []  # dispatched before what is known
    assert len(got.decode) == 1


def merged_by_walk(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint intervals, one span at a time in start order (the reference for `SpanColumns.merged`)."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


_time = st.integers(0, 60).map(lambda k: k / 4)  # few distinct values: ties and touching spans


@given(
    spans=st.lists(st.tuples(_time, _time).map(lambda ab: (ab[0], max(ab))), max_size=40),
    horizons=st.lists(_time, max_size=4),
)
def test_untracked_spans_merge_and_evict_as_a_walk_over_tuples(
    spans: list[tuple[float, float]], horizons: list[float]
) -> None:
    """The columns of floats answer what a list of (start, end) tuples walked one by one answers:
    the merged intervals, and at each eviction which spans are let go and the latest end among them."""
    store = SpanColumns()
    for a, b in spans:
        store.add(a, b)
    kept = list(spans)
    for h in horizons:
        starts, ends = store.merged()
        assert list(zip(starts.tolist(), ends.tolist(), strict=True)) == merged_by_walk(kept)
        gone = [b for _, b in kept if b < h]
        assert store.evict(h) == (max(gone) if gone else None)
        kept = [(a, b) for a, b in kept if b >= h]
        assert len(store) == len(kept)
        assert list(zip(*store.columns(), strict=True)) == kept
    store.clear()
    assert len(store) == 0
    assert [len(c) for c in store.merged()] == [0, 0]


TRUE = LatencyModel(k1=2.0e-4, c1=0.02, k2=2.0e-6, c2=1.0e-3, c3=0.025)


def settle_live(
    tl: EndpointTimeline, streams: Sequence[TracedStream], every_s: float
) -> tuple[list[PrefillObservation], list[DecodeObservation]]:
    """Add each stream once it finished and settle every `every_s` up to the oldest running dispatch,
    as the daemon does."""
    order = sorted(streams, key=lambda s: s.finished_at)
    end = order[-1].finished_at
    pre: list[PrefillObservation] = []
    dec: list[DecodeObservation] = []
    added = 0
    now = 0.0
    while now < end + every_s:
        now += every_s
        while added < len(order) and order[added].finished_at <= now:
            s = order[added]
            tl.add_stream(
                dispatched_at=s.dispatched_at,
                first_token_at=s.times[0],
                gaps=s.gaps,
                prompt_tokens=s.prompt,
                clean=True,
            )
            added += 1
        running = [s.dispatched_at for s in streams if s.dispatched_at <= now < s.finished_at]
        got = tl.settle(min(running, default=now))
        pre += got.prefill
        dec += got.decode
    return pre, dec


def true_decode_s(d: DecodeObservation) -> float:
    return (TRUE.k2 * d.avg_context + TRUE.c2) * d.batch + TRUE.c3


@pytest.mark.parametrize("jitter_s", [0.0, 0.002], ids=["exact", "2ms-jitter"])
def test_observations_of_a_simulated_engine_match_its_latency_model(jitter_s: float) -> None:
    streams = engine_trace(TRUE, n=150, rate_lo=0.3, rate_hi=1.5, seed=5, jitter_s=jitter_s)
    pre, dec = settle_live(EndpointTimeline(), streams, every_s=2.0)
    assert len(dec) == sum(1 for s in streams if len(s.times) > 8)
    assert len(pre) > 100
    assert sum(p.idle for p in pre) >= 1
    pre_err = [abs(p.seconds - TRUE.prefill_s(int(p.prompt_tokens))) / p.seconds for p in pre]
    dec_err = [abs(d.seconds - true_decode_s(d)) / d.seconds for d in dec]
    # Exact receipts: exact decode observations; a prefill is off by how much the decode iterations after
    # it differ from the one that shared its gap (contexts grew, a stream may have ended). With jitter,
    # each prefill is timed to a few milliseconds.
    assert float(np.median(pre_err)) <= (0.002 if jitter_s == 0 else 0.05)
    assert float(np.median(dec_err)) <= (1e-9 if jitter_s == 0 else 0.01)


@given(
    st.lists(
        st.lists(st.floats(0.0, 0.2), max_size=12).map(lambda g: [round(x, 3) for x in g]),
        min_size=1,
        max_size=8,
    ),
    st.lists(st.floats(0.0, 50.0), min_size=8, max_size=8),
)
def test_stream_arrays_tolerance_is_the_median_of_every_streams_own_gaps(
    gaps: list[list[float]], firsts: list[float]
) -> None:
    """The tolerance comes from the streams' own positive gaps only (never from one stream's last receipt
    to the next stream's first), as the median of each stream's differences taken one by one."""
    streams = [
        TimedStream(None, first + np.cumsum([0.0, *g]), 10.0, True, 10.0)
        for g, first in zip(gaps, firsts, strict=False)
    ]
    own = np.concatenate([np.diff(s.times) for s in streams])
    own = own[own > 0]
    want = TOLERANCE * float(np.median(own)) if len(own) else 0.0
    assert StreamArrays(streams, SpanColumns()).tol == want


def decode_stream_by_stream(
    tl: EndpointTimeline, arr: StreamArrays, before: float, out: list[DecodeObservation]
) -> None:
    """The decode derivation one stream at a time (each stream's gaps their own numpy pass): what
    `EndpointTimeline._decode` computes over every ready stream's gaps at once."""
    tol = arr.tol
    for s in tl._streams:
        if not s.pending or s.last + tol >= before:
            continue
        s.pending = False
        t = s.times
        if len(t) < MIN_KEPT_GAPS + 1 or s.first <= tl.known_from:
            continue
        lo, hi = t[:-1], t[1:]
        keep = (arr.firsts_in(lo, hi) == 0) & ~arr.untracked_in(lo, hi)
        if int(np.count_nonzero(keep)) < MIN_KEPT_GAPS:
            continue
        gaps = (hi - lo)[keep]
        if not median(gaps) > tol:
            continue
        count, context = arr.running((lo + hi) / 2.0)
        batch = float(count[keep].mean())
        out.append(
            DecodeObservation(
                batch=batch,
                avg_context=float(context[keep].mean()) / batch,
                seconds=float(gaps.mean()),
                concurrency=float(count.mean()),
                tokens_per_s=(len(t) - 1) / float(t[-1] - t[0]),
            )
        )


@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 5.0),  # first token
            st.lists(st.sampled_from([0.0, 0.01, 0.02, 0.03, 0.05, 0.2]), min_size=0, max_size=40),
            st.floats(1.0, 500.0),  # prompt
        ),
        min_size=1,
        max_size=10,
    ),
    st.lists(st.tuples(st.floats(0.0, 6.0), st.floats(0.0, 0.5)), max_size=3),
    st.floats(0.5, 12.0),
)
def test_decode_over_every_ready_stream_at_once_is_the_stream_by_stream_derivation(
    streams: list[tuple[float, list[float], float]], spans: list[tuple[float, float]], before: float
) -> None:
    """The same decode observations, number for number, as deriving each stream from its own gaps."""

    def build() -> EndpointTimeline:
        tl = EndpointTimeline()
        for first, gaps, prompt in streams:
            tl.add_stream(
                dispatched_at=None, first_token_at=first, gaps=gaps, prompt_tokens=prompt, clean=True
            )
        for a, d in spans:
            tl.add_untracked(a, a + d)
        return tl

    new, old = build(), build()
    got: list[DecodeObservation] = []
    want: list[DecodeObservation] = []
    new._decode(StreamArrays(new._streams, new._dirty), before, got)
    decode_stream_by_stream(old, StreamArrays(old._streams, old._dirty), before, want)
    assert got == want
    assert [s.pending for s in new._streams] == [s.pending for s in old._streams]


@given(
    st.lists(
        st.tuples(st.floats(0.0, 50.0), st.lists(st.floats(0.0, 0.2), max_size=30)), min_size=1, max_size=8
    )
)
def test_stream_arrays_receipts_are_every_receipt_sorted(streams: list[tuple[float, list[float]]]) -> None:
    """The receipts, merged from the streams' sorted runs, are the same array as a plain sort of them."""
    held = [TimedStream(None, first + np.cumsum([0.0, *g]), 10.0, True, 10.0) for first, g in streams]
    want = np.sort(np.concatenate([s.times for s in held]))
    assert np.array_equal(StreamArrays(held, SpanColumns()).receipts, want)


@given(
    st.lists(
        st.one_of(st.sampled_from([0.0, 0.005, 0.01, 0.02, 5e-324]), st.floats(0.0, 1.0)),
        min_size=1,
        max_size=40,
    ),
    st.one_of(st.sampled_from([0.0, 0.005, 0.01]), st.floats(0.0, 1.0)),
)
def test_median_over_the_tolerance_from_the_count_over_it_is_the_median(
    gaps: list[float], tol: float
) -> None:
    """A stream's decode check (`median(gaps) > tol`) decided from how many gaps are over `tol`, with the
    median itself only when exactly half are: the same answer, ties and equal middles included."""
    a = np.array(gaps)
    over = int(np.count_nonzero(a > tol))
    assert _over_tolerance(a, over, tol) == (median(a) > tol)
    assert a.tolist() == gaps  # not partitioned in place
