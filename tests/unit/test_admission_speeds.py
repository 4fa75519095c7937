"""SLO admission's ready endpoints fastest first (`ReadySpeeds`), kept across tuples of views whose changed
entries have the same speed: over a sequence of fleets that change entry by entry (the same object, a
copy apart in what no speed reads, new estimates of the same or another speed, health, models, an
endpoint come or gone, a scope's part), every answer is the plain one (`fastest_first` and the fastest
`fleet_bound`), the very view objects of the new tuple (hypothesis)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.types import EndpointHealth, ModelName
from gateway.sched.idle import KeptBounds, fleet_bound
from gateway.sched.plugins.admission.speeds import KEPT, ReadySpeeds, fastest_first
from gateway.sched.snapshot import EndpointEstimates, EndpointView, FleetSnapshot, ViewsMemo, same_speed
from tests.unit.sched_builders import view
from tests.unit.test_sched_ticks import M, perf

OTHER = ModelName("other")
SPEEDS = (0.5, 1.0, 1.0, 2.0)  # a tie on purpose: ties keep the views' order

#: What happens to one place of the fleet between two snapshots.
KEEP, COPY, SAME_SPEED, NEW_SPEED, HEALTH, MODELS = range(6)
steps = st.lists(
    st.tuples(
        st.lists(st.integers(KEEP, MODELS), min_size=1, max_size=10),  # per place
        st.lists(st.sampled_from(SPEEDS), min_size=10, max_size=10),  # the new speeds
        st.sampled_from(("same", "grow", "shrink", "swap")),  # the fleet's size and places
        st.booleans(),  # also asked about a part of it (a scope's cut)
    ),
    min_size=1,
    max_size=12,
)


def first_views(speeds: list[float]) -> list[EndpointView]:
    return [
        dataclasses.replace(view(f"e{i}"), estimates=EndpointEstimates(perf=perf(s)))
        for i, s in enumerate(speeds)
    ]


def changed(v: EndpointView, what: int, speed: float) -> EndpointView:
    if what == KEEP:
        return v
    if what == COPY:  # a dispatch or a progress report: nothing a speed reads
        return dataclasses.replace(v, inflight=v.inflight + 1)
    if what == SAME_SPEED:  # new estimates with the same coefficients
        assert v.estimates is not None
        return dataclasses.replace(v, estimates=dataclasses.replace(v.estimates))
    if what == NEW_SPEED:
        return dataclasses.replace(v, estimates=EndpointEstimates(perf=perf(speed)))
    if what == HEALTH:
        up = v.health is not EndpointHealth.READY
        return dataclasses.replace(v, health=EndpointHealth.READY if up else EndpointHealth.UNHEALTHY)
    models = frozenset({OTHER}) if M in v.models else frozenset({M})
    return dataclasses.replace(v, models=models)


def check(speeds: ReadySpeeds, snap: FleetSnapshot) -> None:
    views, ready, bound = speeds.of(M, snap)
    assert views is snap.endpoints
    plain = fastest_first(M, snap.endpoints)
    assert len(ready) == len(plain)
    assert all(a is b for a, b in zip(ready, plain, strict=True))
    assert bound == fleet_bound(snap, M, slowest=False)


def next_views(
    views: list[EndpointView], what: list[int], new_speeds: list[float], size: str
) -> list[EndpointView]:
    """One step of `steps`: each view changed (`changed`, by `what` and `new_speeds` in turn), then the
    fleet grown by a view, shrunk by its first, or its first and last swapped (`size`)."""
    out = [changed(v, what[i % len(what)], new_speeds[i % len(new_speeds)]) for i, v in enumerate(views)]
    if size == "grow":
        out.append(first_views([new_speeds[0]] * (len(out) + 1))[-1])
    elif size == "shrink" and len(out) > 1:
        out.pop(0)
    elif size == "swap" and len(out) > 1:
        out[0], out[-1] = out[-1], out[0]
    return out


def memo_snaps(
    start: list[float], script: list[tuple[list[int], list[float], str, bool]]
) -> Iterator[tuple[int, FleetSnapshot, bool]]:
    """The fleets of `steps` from `first_views(start)`, each snapshot (at 0.1 s a step) with the memo of
    its views carried over from the last one at the places replaced, as the scheduler's snapshots are;
    with each, its step and whether the script asks for a part of it too."""
    views = first_views(start)
    memo = ViewsMemo.of(tuple(views), None)
    for step, (what, new_speeds, size, part) in enumerate(script):
        old = tuple(views)
        views = next_views(views, what, new_speeds, size)
        new = tuple(views)
        replaced = {i for i, v in enumerate(new) if i >= len(old) or v is not old[i]}
        memo = ViewsMemo.of(new, memo, replaced)
        yield step, FleetSnapshot(now=0.1 * step, endpoints=new, memo=memo), part


@settings(max_examples=300, deadline=None)
@given(
    start=st.lists(st.sampled_from(SPEEDS), min_size=1, max_size=8),
    script=steps,
)
def test_kept_orders_are_the_plain_sort(
    start: list[float], script: list[tuple[list[int], list[float], str, bool]]
) -> None:
    speeds = ReadySpeeds(KeptBounds())
    views = first_views(start)
    now = 0.0
    check(speeds, FleetSnapshot(now=now, endpoints=tuple(views)))
    for what, new_speeds, size, part in script:
        now += 0.1
        views = next_views(views, what, new_speeds, size)
        snap = FleetSnapshot(now=now, endpoints=tuple(views))
        check(speeds, snap)
        if part:
            check(speeds, dataclasses.replace(snap, endpoints=snap.endpoints[: max(1, len(views) // 2)]))
        check(speeds, snap)  # asked again: the kept answer


def test_at_most_kept_tuples_are_held_and_the_oldest_goes_first() -> None:
    speeds = ReadySpeeds(KeptBounds())
    snaps = [FleetSnapshot(now=float(i), endpoints=tuple(first_views([1.0, 2.0]))) for i in range(KEPT + 3)]
    for s in snaps:
        speeds.of(M, s)
    held = [entry[0] for entry in speeds._kept.values()]
    assert len(held) == KEPT
    assert held == [s.endpoints for s in snaps[3:]]


@settings(max_examples=300, deadline=None)
@given(
    start=st.lists(st.sampled_from(SPEEDS), min_size=1, max_size=8),
    script=steps,
    asked=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_kept_orders_and_bounds_with_the_memos_speed_token_are_the_plain_ones(
    start: list[float], script: list[tuple[list[int], list[float], str, bool]], asked: list[bool]
) -> None:
    """The same fleets, each snapshot with the memo of its views carried over from the last one at the
    places replaced (as the scheduler's snapshots are): the kept orders and bounds, which skip the walk
    when the memo's speed token is the last one's, are the plain ones; and two memos with the same token
    have views of the same speed at every place (the token asked on some snapshots only)."""
    speeds, bounds = ReadySpeeds(KeptBounds()), KeptBounds()
    tokens: list[tuple[object, tuple[EndpointView, ...]]] = []
    for step, snap, part in memo_snaps(start, script):
        memo, new = snap.memo, snap.endpoints
        assert memo is not None
        if asked[step % len(asked)]:
            check(speeds, snap)
            for slowest in (False, True):
                assert bounds.bound(snap, M, slowest=slowest) == fleet_bound(snap, M, slowest=slowest)
            tokens.append((memo.speeds(), new))
        if part:
            check(speeds, dataclasses.replace(snap, endpoints=snap.endpoints[: max(1, len(new) // 2)]))
    for i, (token, a) in enumerate(tokens):
        for other, b in tokens[i + 1 :]:
            if other is token:
                assert len(a) == len(b)
                assert all(same_speed(x, y) for x, y in zip(a, b, strict=True))
