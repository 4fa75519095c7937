"""Random fleets and their changes for the tests of the loads as arrays and of placement over columns:
endpoints with running requests (targets, progress reports, max_tokens, two kinds of hardware), a step
of a changing fleet (time passing, a progress report, a dispatch, a completion) with its columns updated,
and the shipped SLO presets placing over columns whatever the number of candidates; new requests to
place, with targets and prefix holders."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import strategies as st

from gateway.core.types import EndpointId
from gateway.sched.columns import columns_of, updated
from gateway.sched.fleet_loads import fleet_loads
from gateway.sched.loads import REUSE_S
from gateway.sched.perf import PerfCoefficients
from gateway.sched.prefix import PrefixHits
from gateway.sched.profile import Policy
from gateway.sched.request import SchedRequest
from gateway.sched.running import RunningRequest, with_progress
from gateway.sched.snapshot import EndpointView, FleetColumns, FleetSnapshot
from tests.unit.slo_fixtures import COEF, SLOW, columnar_preset, req, running, view

NOW = 10.0

#: A new request's targets: (TTFT ms, E2E ms, ITL ms), each of them absent or not.
TARGETS = st.tuples(
    st.one_of(st.none(), st.floats(min_value=10.0, max_value=2000.0)),
    st.one_of(st.none(), st.floats(min_value=100.0, max_value=20000.0)),
    st.one_of(st.none(), st.floats(min_value=5.0, max_value=60.0)),
)
#: The endpoints (by number, `e00`...) holding part of a new request's prompt, and how many tokens.
CACHED = st.dictionaries(st.integers(min_value=0, max_value=7), st.integers(min_value=1, max_value=3000))
#: `new_request`'s arguments but best effort and the clock, as `given` takes them (`@given(**NEW_REQUEST)`).
NEW_REQUEST: dict[str, st.SearchStrategy[Any]] = {
    "prompt": st.integers(min_value=1, max_value=4000),
    "out": st.floats(min_value=1.0, max_value=400.0),
    "targets": TARGETS,
    "cached": CACHED,
}


def new_request(
    prompt: int,
    out: float,
    targets: tuple[float | None, float | None, float | None],
    cached: dict[int, int],
    *,
    best_effort: bool = False,
    now: float = NOW,
    name: str = "new",
    cls: str = "c",
) -> SchedRequest:
    """A request (`name`, of class `cls`) to place at `now`, arrived 0.1 s before, with `targets`
    (`TARGETS`) and the prefix holders `cached` (`CACHED`)."""
    ttft_ms, e2e_ms, itl_ms = targets
    r = req(
        name,
        arrival=now - 0.1,
        prompt=prompt,
        out=out,
        ttft_ms=ttft_ms,
        e2e_ms=e2e_ms,
        itl_ms=itl_ms,
        cls=cls,
        best_effort=best_effort,
    )
    return dataclasses.replace(r, cached=PrefixHits({EndpointId(f"e{k:02d}"): t for k, t in cached.items()}))


RUN = st.tuples(
    st.integers(min_value=1, max_value=3000),  # prompt
    st.floats(min_value=1.0, max_value=300.0),  # predicted output
    st.floats(min_value=0.0, max_value=5.0),  # age
    st.one_of(st.none(), st.floats(min_value=-1.0, max_value=10.0)),  # first-token deadline from now
    st.one_of(st.none(), st.floats(min_value=-1.0, max_value=30.0)),  # last-token deadline from now
    st.one_of(st.none(), st.floats(min_value=0.005, max_value=0.2)),  # inter-token target
    st.one_of(st.none(), st.integers(min_value=0, max_value=400)),  # tokens reported
    st.one_of(st.none(), st.integers(min_value=1, max_value=500)),  # max_tokens
    st.booleans(),  # best effort
)
COEFS = st.sampled_from((COEF, SLOW))
ENDPOINT = st.tuples(
    st.integers(min_value=1, max_value=24),  # cap
    st.lists(RUN, min_size=0, max_size=24),
    COEFS,
)

Run = tuple[int, float, float, float | None, float | None, float | None, int | None, int | None, bool]
Endpoint = tuple[int, list[Run], PerfCoefficients]


def running_of(name: str, run: Run, now: float) -> RunningRequest:
    p, o, age, ttft, e2e, itl, reported, max_tokens, best_effort = run
    r = running(
        name,
        prompt=p,
        out=o,
        std=o / 4,
        dispatched_at=now - age,
        ttft_deadline=None if ttft is None else now + ttft,
        e2e_deadline=None if e2e is None else now + e2e,
        itl_s=itl,
        best_effort=best_effort,
    )
    r = dataclasses.replace(r, max_tokens=max_tokens)
    if reported is not None and age > 0.05:
        r = with_progress(r, reported, now - age + 0.05, now - age / 2)
    return r


def view_of(k: int, endpoint: Endpoint, now: float = NOW) -> EndpointView:
    cap, runs, coef = endpoint
    rs = [running_of(f"e{k}-x{j}", run, now) for j, run in enumerate(runs[:cap])]
    return view(f"e{k:02d}", cap=cap, runs=rs, coef=coef)


# A step of the fleet: (clock advance in ms, up to three times the shortest reuse time of a load, endpoint,
# what happens there: 0 nothing, 1 a progress report, 2 a dispatch, 3 a completion).
STEP = st.tuples(
    st.integers(min_value=0, max_value=round(3000 * REUSE_S)),
    st.integers(min_value=0, max_value=7),
    st.integers(min_value=0, max_value=3),
)


def changed(v: EndpointView, what: int, now: float, serial: int) -> EndpointView | None:
    rs = list(v.running)
    if what == 1 and rs:
        r = rs[serial % len(rs)]
        done = (r.produced or 0) + 16
        rs[serial % len(rs)] = with_progress(r, done, r.first_token_at or now - 0.01, now)
    elif what == 2 and len(rs) < v.cap:
        name = f"{v.id}-n{serial}"
        rs.append(running(name, prompt=300 + serial, out=80.0, dispatched_at=now, e2e_deadline=now + 4))
    elif what == 3 and rs:
        rs.pop(serial % len(rs))
    else:
        return None
    return dataclasses.replace(v, running=tuple(rs), inflight=len(rs))


def advance(
    views: tuple[EndpointView, ...], cols: FleetColumns, now: float, *, at: int, what: int, serial: int
) -> tuple[tuple[EndpointView, ...], FleetColumns, float]:
    """The fleet at `now` after `what` happened on endpoint `at` (`changed`), its columns updated."""
    k = at % len(views)
    new = changed(views[k], what, now, serial)
    if new is not None:
        views = (*views[:k], new, *views[k + 1 :])
        cols = updated(cols, views, [k])
    return views, cols, now


def columnar_policy(name: str) -> Policy:
    """The shipped preset, placing over columns whatever the number of candidates, busy endpoints over
    the loads' rows however few."""
    policy = columnar_preset(name)
    for cache in policy.loads._caches.values():
        fleet_loads(cache).least = 1
    return policy


def place_run(
    policy: Policy, endpoints: list[Endpoint], steps: list[tuple[int, int, int]], *, columns: bool = True
) -> list[str | None]:
    """A run of `policy` on a fleet of its own: per step the fleet changes (`advance`), a request is
    placed (over the columns, or without them), and dispatched where it was placed (so the run goes on
    from its own choices). The endpoint chosen at each step (None: none)."""
    views = tuple(view_of(k, e) for k, e in enumerate(endpoints))
    cols = columns_of(views)
    now = NOW
    chosen: list[str | None] = []
    for serial, (dt_ms, at, what) in enumerate(steps):
        views, cols, now = advance(views, cols, now + dt_ms / 1000.0, at=at, what=what, serial=serial)
        r = req(
            f"r{serial}", arrival=now - 0.1, prompt=200 + 37 * serial, out=60.0, ttft_ms=800.0, e2e_ms=6000.0
        )
        got = policy.profile.place(
            r, FleetSnapshot(now=now, endpoints=views, columns=cols if columns else None)
        )
        chosen.append(None if got is None else got.id)
        if got is not None:
            k = views.index(got)
            new = running(
                f"{r.id}", prompt=r.prompt_tokens, out=60.0, dispatched_at=now, e2e_deadline=now + 6
            )
            views = (
                *views[:k],
                dataclasses.replace(got, running=(*got.running, new), inflight=got.inflight + 1),
                *views[k + 1 :],
            )
            cols = updated(cols, views, [k])
    return chosen
