"""demand-split: endpoint groups per set of SLO classes, sized by measured demand (fake clock)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.errors import ConfigError
from gateway.core.slo import SloClass, SloPolicy
from gateway.core.types import EndpointHealth, ModelName
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.placement.demand_split import (
    DemandSplitFilter,
    DemandSplitParams,
    block_sizes,
    request_work,
)
from gateway.sched.profile import SchedulerProfile
from gateway.sched.registry import BuildContext, PluginKind
from gateway.sched.snapshot import EndpointView
from tests.unit.slo_fixtures import COEF, req, running, snap, view

GROUPS = {"decode": ["gen"], "context": ["long", "summ"]}
M = ModelName("m")
CTX = BuildContext(
    slo=SloPolicy(classes={c: SloClass(c) for c in ("gen", "long", "summ", "x")}, default_class="x")
)


def split(**kw: object) -> DemandSplitFilter:
    return DemandSplitFilter(DemandSplitParams(groups=GROUPS, **kw))  # type: ignore[arg-type]


def ids(views: object) -> list[str]:
    return sorted(str(v.id) for v in views)  # type: ignore[attr-defined]


FLEET = [view(f"e{i}") for i in range(6)]


def test_before_any_demand_the_groups_get_equal_blocks_in_id_order() -> None:
    f = split()
    s = snap(*FLEET)
    # the first request is counted before the blocks are cut, so use a class in no group first
    assert ids(f.filter(req("u", cls="other"), FLEET, s)) == ids(FLEET)
    assert f.blocks(M) == {}
    assert f.shares(M) == (0.5, 0.5)


def test_blocks_follow_each_groups_share_of_engine_time() -> None:
    f = split()
    s = snap(*FLEET)
    # one long-context request costs (prefill + decode of 400 tokens) about 3x a short one
    long_req = req("l1", cls="long", prompt=2000, out=400)
    short = req("g1", cls="gen", prompt=100, out=400)
    w_long, w_short = request_work(long_req, COEF, 8), request_work(short, COEF, 8)
    assert w_long > w_short
    f.filter(long_req, FLEET, s)
    got = f.filter(short, FLEET, s)
    share = w_short / (w_long + w_short)
    assert f.shares(M) == pytest.approx((share, 1 - share))
    counts = block_sizes(f.shares(M), 6, 1)
    groups = f.blocks(M)
    assert sorted(groups.values()).count("decode") == counts[0]
    # a request keeps to its group's endpoints, the first ones by id for the first group
    assert ids(got) == [f"e{i}" for i in range(counts[0])]
    assert all(groups[v.id] == "decode" for v in got)


def test_a_class_in_no_group_may_use_every_endpoint() -> None:
    f = split()
    s = snap(*FLEET)
    f.filter(req("g", cls="gen"), FLEET, s)
    assert ids(f.filter(req("x", cls="completion"), FLEET, s)) == ids(FLEET)


@pytest.mark.parametrize(
    ("spill", "expected"),
    [("when-full", ["e3", "e4", "e5"]), ("never", []), ("when-no-fit", ["e3", "e4", "e5"])],
    ids=["when-full spills to the other group", "never waits for its own", "when-no-fit spills"],
)
def test_a_group_without_a_free_seat(spill: str, expected: list[str]) -> None:
    f = split(spill=spill)
    s = snap(*FLEET)
    f.filter(req("u", cls="other"), FLEET, s)  # no demand yet: 3 + 3
    f.filter(req("g0", cls="gen"), FLEET, s)
    f.filter(req("l0", cls="long", prompt=100), FLEET, s)  # the same work as g0: still 3 + 3
    assert sorted(f.blocks(M).values()).count("decode") == 3
    # candidates have room under their cap: the decode block (e0..e2) is full
    free = [v for v in FLEET if str(v.id) >= "e3"]
    assert ids(f.filter(req("g0", cls="gen"), free, s)) == expected  # tried again: counted once


def test_demand_decays_with_the_window_so_the_split_follows_traffic() -> None:
    f = split(window_s=10.0)
    f.filter(req("l", cls="long", prompt=2000, out=400), FLEET, snap(*FLEET, now=0.0))
    assert sorted(f.blocks(M).values()).count("context") == 5
    # a minute later the long request has decayed away; short ones now make the demand
    for i in range(3):
        f.filter(req(f"g{i}", cls="gen"), FLEET, snap(*FLEET, now=60.0))
    assert sorted(f.blocks(M).values()).count("decode") == 5


def test_each_request_counts_once_however_often_it_is_tried() -> None:
    f = split()
    s = snap(*FLEET)
    r = req("g", cls="gen")
    for _ in range(5):
        f.filter(r, FLEET, s)
    f.filter(req("l", cls="long", prompt=100), FLEET, s)
    assert f.shares(M) == pytest.approx((0.5, 0.5))


def test_hysteresis_keeps_the_blocks_while_the_ideal_is_near() -> None:
    f = split(hysteresis=0.5)
    s = snap(*FLEET)
    f.filter(req("g0", cls="gen"), FLEET, s)
    f.filter(req("l0", cls="long", prompt=100), FLEET, s)
    before = f.blocks(M)
    # decode's share moves between 1/2 and 2/3 (3 to 4 of 6 endpoints): within 1.0 of its 3, kept
    f.filter(req("g1", cls="gen"), FLEET, s)
    f.filter(req("l1", cls="long", prompt=100), FLEET, s)
    f.filter(req("g2", cls="gen"), FLEET, s)
    assert f.blocks(M) == before


def test_too_few_ready_endpoints_for_a_split_use_all() -> None:
    f = split(min_endpoints=2)
    fleet = [view("a"), view("b"), view("c", health=EndpointHealth.UNHEALTHY), view("d")]
    ready = fleet[:2] + fleet[3:]
    assert ids(f.filter(req("g", cls="gen"), ready, snap(*fleet))) == ["a", "b", "d"]
    assert f.blocks(M) == {}


def test_endpoints_of_other_models_and_unready_ones_are_not_cut_into_blocks() -> None:
    f = split()
    fleet = [view("a"), view("b"), view("c", model="other"), view("d", health=EndpointHealth.STARTING)]
    f.filter(req("g", cls="gen"), fleet[:2], snap(*fleet))
    assert set(f.blocks(M)) == {"a", "b"}


@given(
    shares=st.lists(st.floats(min_value=0.0, max_value=100.0), min_size=2, max_size=5),
    n=st.integers(min_value=0, max_value=40),
    least=st.integers(min_value=1, max_value=3),
)
@settings(max_examples=200, deadline=None)
def test_block_sizes_cover_the_endpoints_and_give_each_group_its_floor(
    shares: list[float], n: int, least: int
) -> None:
    if n < least * len(shares):
        return
    counts = block_sizes(shares, n, least)
    assert sum(counts) == n
    assert min(counts) >= least
    total = sum(shares)
    if total > 0:
        spare = n - least * len(shares)
        for c, s in zip(counts, shares, strict=True):
            assert abs((c - least) - spare * s / total) < 1.0


@given(
    events=st.lists(
        st.tuples(st.sampled_from(["gen", "long", "summ", "other"]), st.integers(1, 4000), st.floats(0, 30)),
        min_size=1,
        max_size=40,
    ),
    full=st.sets(st.integers(0, 5)),
)
@settings(max_examples=100, deadline=None)
def test_a_request_of_a_group_with_room_is_never_left_without_candidates(
    events: list[tuple[str, int, float]], full: set[int]
) -> None:
    f = split()
    now = 0.0
    for i, (cls, prompt, dt) in enumerate(events):
        now += dt
        s = snap(*FLEET, now=now)
        free = [v for j, v in enumerate(FLEET) if j not in full]
        got = f.filter(req(f"r{i}", cls=cls, prompt=prompt), free, s)
        assert set(ids(got)) <= set(ids(free))
        if free:
            assert got  # spill "when-full": never empty while any endpoint has room


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"groups": {"a": ["gen"]}}, "at least two groups"),
        ({"groups": {"a": ["gen"], "b": []}}, "names no SLO class"),
        ({"groups": {"a": ["gen"], "b": ["gen"]}}, "is in groups"),
        ({"groups": {"a": ["gen"], "b": ["long"]}, "spill": "sometimes"}, "Invalid enum value"),
        ({"groups": {"a": ["gen"], "b": ["long"]}, "window_s": 0}, ">"),
    ],
    ids=["one group", "empty group", "class twice", "bad spill", "zero window"],
)
def test_bad_params_are_config_errors(params: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as e:
        default_registry().build(
            PluginKind.FILTER, "demand-split", params, path="placement.filters[0]", ctx=CTX
        )
    assert e.value.path.startswith("placement.filters[0].params")


def test_an_unknown_class_names_the_policy_classes() -> None:
    with pytest.raises(ConfigError, match=r"unknown SLO class 'nope' \(known: gen, long, summ, x\)"):
        default_registry().build(
            PluginKind.FILTER,
            "demand-split",
            {"groups": {"a": ["nope"], "b": ["gen"]}},
            path="placement.filters[0]",
            ctx=CTX,
        )


def test_the_shipped_groups_build() -> None:
    f = default_registry().build(
        PluginKind.FILTER, "demand-split", {"groups": GROUPS}, path="placement.filters[0]", ctx=CTX
    )
    assert isinstance(f, DemandSplitFilter)
    assert f.group_names == ("decode", "context")


def test_running_requests_do_not_count_as_demand() -> None:
    # the filter counts what it places, not what already runs: a busy endpoint changes nothing
    f = split()
    busy = [view("e0", runs=[running("x", cls="long", prompt=3000, out=500)]), *FLEET[1:]]
    f.filter(req("g", cls="gen"), busy, snap(*busy))
    assert f.shares(M) == (1.0, 0.0)


class _Keep:
    """A later filter that keeps only the endpoints named (best-fit's constraints, say)."""

    name = "keep"

    def __init__(self, keep: set[str]) -> None:
        self.keep = keep

    def filter(self, req: object, candidates: Sequence[EndpointView], snap: object) -> list[EndpointView]:
        return [e for e in candidates if str(e.id) in self.keep]


class _First:
    name = "first"

    def pick(self, req: object, scored: Sequence[tuple[EndpointView, float]], snap: object) -> EndpointView:
        return min((e for e, _ in scored), key=lambda e: str(e.id))


@pytest.mark.parametrize(
    ("spill", "later_keeps", "placed"),
    [
        ("when-no-fit", {"e1", "e4"}, "e1"),  # its own group first
        ("when-no-fit", {"e4"}, "e4"),  # none of its own passes the later filter: the others
        ("when-full", {"e4"}, None),  # its own have seats, so it waits for them
        ("never", {"e4"}, None),
    ],
    ids=["own-first", "no-fit-spills", "when-full-waits", "never-waits"],
)
def test_spill_through_the_profile(spill: str, later_keeps: set[str], placed: str | None) -> None:
    f = split(spill=spill)
    s = snap(*FLEET)
    f.filter(req("g0", cls="gen"), FLEET, s)
    f.filter(req("l0", cls="long", prompt=100), FLEET, s)  # 3 + 3: decode e0..e2, context e3..e5
    profile = SchedulerProfile(filters=(f, _Keep(later_keeps)), scorers=(), picker=_First())
    got = profile.place(req("g0", cls="gen"), s)
    assert (None if got is None else str(got.id)) == placed


@pytest.mark.parametrize(
    ("spill", "expected"),
    [("never", ["e0", "e1", "e2"]), ("when-full", [f"e{i}" for i in range(6)])],
    ids=["never: its own block, full or not", "may spill: every endpoint"],
)
def test_scope_is_what_admission_may_count(spill: str, expected: list[str]) -> None:
    f = split(spill=spill)
    s = snap(*FLEET)
    f.filter(req("u", cls="other"), FLEET, s)
    f.filter(req("g0", cls="gen"), FLEET, s)
    f.filter(req("l0", cls="long", prompt=100), FLEET, s)  # 3 + 3
    full = [view("e0", cap=1, runs=[running("x", cls="gen")]), *FLEET[1:]]
    assert ids(f.scope(req("g0", cls="gen"), full, snap(*full))) == expected  # counted already
    assert ids(f.scope(req("x", cls="other"), full, snap(*full))) == ids(FLEET)  # in no group


def test_a_request_counted_at_admission_is_not_counted_again_when_placed() -> None:
    f = split()
    s = snap(*FLEET)
    f.scope(req("g", cls="gen"), FLEET, s)
    f.scope(req("refused", cls="gen"), FLEET, s)  # turned away after admission asked: still demand
    f.filter(req("g", cls="gen"), FLEET, s)
    for i in range(2):
        f.filter(req(f"l{i}", cls="long", prompt=100), FLEET, s)
    assert f.shares(M) == pytest.approx((0.5, 0.5))


def test_groups_name_each_groups_share_and_endpoints_for_the_admin_view() -> None:
    f = split()
    assert f.groups(M) == {"decode": (0.5, []), "context": (0.5, [])}  # nothing seen yet: no split
    s = snap(*FLEET)
    f.filter(req("u", cls="other"), FLEET, s)
    f.filter(req("g0", cls="gen"), FLEET, s)
    f.filter(req("l0", cls="long", prompt=100), FLEET, s)  # 3 + 3
    groups = f.groups(M)
    assert {name: ids_ for name, (_, ids_) in groups.items()} == {
        "decode": ["e0", "e1", "e2"],
        "context": ["e3", "e4", "e5"],
    }
    assert [share for share, _ in groups.values()] == pytest.approx([0.5, 0.5])
    profile = SchedulerProfile(filters=(_Keep(set()), f), scorers=(), picker=_First())
    assert profile.groups(M) == f.groups(M)
    assert SchedulerProfile(filters=(_Keep(set()),), scorers=(), picker=_First()).groups(M) == {}
