"""A prefill group's derivation (`EndpointTimeline._group`, with its gap checks inline) gives the same
observations, number for number, as its plain form (`tests/unit/timeline_reference.py`) on simulated
engines' streams settled as the daemon settles them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.telemetry.timeline import DecodeObservation, EndpointTimeline, PrefillObservation
from loadgen.engine_sim.latency import LatencyModel
from tests.unit.engine_trace import engine_trace
from tests.unit.timeline_reference import PlainTimeline

TRUE = LatencyModel(k1=2.0e-4, c1=0.02, k2=2.0e-6, c2=1.0e-3, c3=0.025)


def settled(
    tl: EndpointTimeline,
    *,
    seed: int,
    jitter_s: float,
    every_s: float,
    untracked: list[tuple[float, float]],
    max_num_seqs: int,
) -> tuple[list[PrefillObservation], list[DecodeObservation], float, int]:
    """Every observation of one engine's trace, streams added as they finish (some untracked) and the
    timeline settled every `every_s` up to the oldest running dispatch; then its `known_from` and size."""
    streams = engine_trace(
        TRUE, n=60, rate_lo=0.5, rate_hi=6.0, seed=seed, jitter_s=jitter_s, max_num_seqs=max_num_seqs
    )
    order = sorted(streams, key=lambda s: s.finished_at)
    spans = sorted(untracked)
    pre: list[PrefillObservation] = []
    dec: list[DecodeObservation] = []
    added = 0
    now = 0.0
    end = order[-1].finished_at
    while now < end + every_s:
        now += every_s
        while spans and spans[0][0] + spans[0][1] <= now:
            a, d = spans.pop(0)
            tl.add_untracked(a, a + d)
        while added < len(order) and order[added].finished_at <= now:
            s = order[added]
            tl.add_stream(
                dispatched_at=None if s.index % 7 == 3 else s.dispatched_at,
                first_token_at=s.times[0],
                gaps=s.gaps,
                prompt_tokens=s.prompt,
                clean=s.index % 5 != 2,
            )
            added += 1
        running = [s.dispatched_at for s in streams if s.dispatched_at <= now < s.finished_at]
        got = tl.settle(min(running, default=now))
        pre += got.prefill
        dec += got.decode
    return pre, dec, tl.known_from, len(tl)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 10_000),
    st.sampled_from([0.0, 0.0005, 0.002, 0.01]),
    st.sampled_from([0.3, 1.0, 2.5]),
    st.lists(st.tuples(st.floats(0.0, 20.0), st.floats(0.0, 0.3)), max_size=3),
    st.sampled_from([4, 16]),
)
def test_inline_group_is_the_plain_derivation(
    seed: int, jitter_s: float, every_s: float, untracked: list[tuple[float, float]], seats: int
) -> None:
    got, want = (
        settled(tl, seed=seed, jitter_s=jitter_s, every_s=every_s, untracked=untracked, max_num_seqs=seats)
        for tl in (EndpointTimeline(), PlainTimeline())
    )
    assert got == want
    assert len(got[0]) > 0
