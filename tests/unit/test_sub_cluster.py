"""sub-cluster: MaaSO's distributor. Requests go by deadline factor to the endpoints whose max batch
suits them, and spill when their own sub-cluster cannot meet the deadline (fake clock, hand-built views).

The views' model (slo_fixtures.COEF): a decode iteration takes 1 ms per request + 10 ms; the tests set
t_slot to 11 ms (one request alone), so a 100-token request alone (about 1.2 s: prefill, 99 tokens at
12.1 ms) meets factors from about 1.1."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from gateway.core.errors import ConfigError
from gateway.core.types import ModelName
from gateway.sched.heterogeneous import RELAXED, STRICT
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.placement.overflow_guard import OverflowGuardFilter, OverflowGuardParams
from gateway.sched.plugins.placement.sub_cluster import SubClusterFilter, SubClusterParams
from gateway.sched.profile import SchedulerProfile
from gateway.sched.registry import BuildContext, PluginKind
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot
from tests.unit.slo_fixtures import req, running, snap, view

T_SLOT_MS = 11.0
M = ModelName("m")


def ep(eid: str, max_batch: int | None, *, busy: int = 0, cap: int = 8) -> EndpointView:
    runs = [running(f"{eid}-run{i}", out=2000.0) for i in range(busy)]
    return dataclasses.replace(view(eid, cap=cap, runs=runs), max_batch=max_batch)


def deadline_req(rid: str, factor: float, *, out: int = 100):  # type: ignore[no-untyped-def]
    r = req(rid, out=float(out), e2e_ms=factor * out * T_SLOT_MS)
    return dataclasses.replace(r, max_tokens=out)


def flt(**kw: object) -> SubClusterFilter:
    params = {"strict_below": 1.5, "strict_max_batch": 8, "t_slot_ms": T_SLOT_MS, **kw}
    return SubClusterFilter(SubClusterParams(**params))  # type: ignore[arg-type]


class FirstPicker:
    name = "first"

    def pick(
        self, req: SchedRequest, scored: Sequence[tuple[EndpointView, float]], snap: FleetSnapshot
    ) -> EndpointView:
        return scored[0][0]


def ids(views: object) -> list[str]:
    return sorted(str(v.id) for v in views)  # type: ignore[attr-defined]


FLEET = [ep("s1", 4), ep("s2", 8), ep("r1", 32), ep("r2", None)]


@pytest.mark.parametrize(
    ("factor", "expected", "sub"),
    [
        pytest.param(1.3, ["s1", "s2"], STRICT, id="strict-to-small-batches"),
        pytest.param(3.0, ["r1", "r2"], RELAXED, id="relaxed-to-large-batches"),
    ],
)
def test_requests_go_to_the_sub_cluster_of_their_deadline_factor(
    factor: float, expected: list[str], sub: str
) -> None:
    f = flt()
    r = deadline_req("a", factor)
    assert f.factor(r, FLEET) == pytest.approx(factor)
    assert f.request_sub_cluster(r, FLEET) == sub
    assert ids(f.filter(r, FLEET, snap(*FLEET))) == expected


def test_t_slot_by_default_is_a_full_batch_of_the_slowest_endpoint() -> None:
    f = SubClusterFilter(SubClusterParams())
    # cap 8 (max batch 32 does not fill it) and cap 8 at max batch 4: 8 x 1 ms + 10 ms is the slowest
    assert f.t_slot_s(req("a"), [ep("x", 32), ep("y", 4)]) == pytest.approx(0.018)
    assert f.t_slot_s(req("a"), [ep("y", 4)]) == pytest.approx(0.014)


def test_t_slot_may_be_configured_and_requests_without_a_deadline_are_relaxed() -> None:
    f = flt(t_slot_ms=2 * T_SLOT_MS)  # each factor halves: 2.0 becomes 1.0, strict
    assert ids(f.filter(deadline_req("a", 2.0), FLEET, snap(*FLEET))) == ["s1", "s2"]
    assert ids(f.filter(req("b", out=100.0), FLEET, snap(*FLEET))) == ["r1", "r2"]
    assert f.factor(req("b"), FLEET) is None


def test_a_strict_request_spills_when_its_own_cannot_meet_the_deadline() -> None:
    # Every small-batch seat is taken by long requests: the wait alone misses the deadline.
    fleet = [ep("s1", 4, busy=4, cap=4), ep("r1", 32)]
    f = flt()
    tiers = f.tiers(deadline_req("a", 1.3), fleet, snap(*fleet))
    assert [ids(t) for t in tiers] == [[], ["r1"], ["s1"], []]
    assert ids(f.filter(deadline_req("a", 1.3), fleet, snap(*fleet))) == ["r1"]


def test_a_request_of_a_starved_sub_cluster_goes_home_then_to_the_other_one() -> None:
    # s1's 4 seats of 12 against every request seen so far (this one): starved
    fleet = [ep("s1", 4), ep("r1", 32)]
    f = flt()
    hopeless = deadline_req("a", 0.5)  # half the time one request alone needs
    assert [ids(t) for t in f.tiers(hopeless, fleet, snap(*fleet))] == [[], [], ["s1"], ["r1"]]
    assert ids(f.filter(hopeless, fleet, snap(*fleet))) == ["s1"]


def test_a_sub_cluster_with_its_share_of_the_seats_keeps_a_hopeless_request_home() -> None:
    # s1's 4 seats of 12 against a third of the requests: not starved (starved_below 0.5)
    fleet = [ep("s1", 4), ep("r1", 32)]
    f = flt()
    for i in range(2):
        f.filter(deadline_req(f"relaxed{i}", 3.0), fleet, snap(*fleet))
    hopeless = deadline_req("a", 0.5)
    assert [ids(t) for t in f.tiers(hopeless, fleet, snap(*fleet))] == [[], [], ["s1"]]
    assert not f.starved(M, STRICT, fleet)
    assert flt(starved_below=1.5).starved(M, STRICT, fleet) is False  # nothing seen by that one yet


def test_behind_the_overflow_guard_a_request_its_own_sub_cluster_cannot_take_spills() -> None:
    """One small-batch endpoint (starved: a third of the seats, every request seen strict) running requests
    the new one would push past their deadlines: the guard holds it there, so it goes to the large batches
    (where it harms no one) rather than waiting for a seat at home behind every other strict request."""
    guard = OverflowGuardFilter(OverflowGuardParams())
    busy = [running(f"s1-run{i}", out=100.0, e2e_deadline=1.4) for i in range(2)]
    strict = dataclasses.replace(view("s1", cap=4, runs=busy), max_batch=4)
    fleet = [strict, ep("r1", 32)]
    s = snap(*fleet)
    hopeless = deadline_req("a", 0.5)
    assert guard.filter(hopeless, [strict], s) == []  # home cannot take it without harm
    profile = SchedulerProfile((flt(), guard), (), FirstPicker())
    chosen = profile.place(hopeless, s)
    assert chosen is not None
    assert chosen.id == "r1"


@pytest.mark.parametrize(
    ("spill", "expected"),
    [
        pytest.param("never", [["s1"]], id="never"),
        pytest.param("when-full", [["s1"]], id="when-full"),
        pytest.param({"strict": "never"}, [["s1"]], id="table"),
    ],
)
def test_spill_modes(spill: object, expected: list[list[str]]) -> None:
    fleet = [ep("s1", 4, busy=4, cap=8), ep("r1", 32)]
    f = flt(spill=spill)
    assert [ids(t) for t in f.tiers(deadline_req("a", 1.3), fleet, snap(*fleet))] == expected


def test_when_full_spills_only_without_a_free_seat_and_never_narrows_admission() -> None:
    fleet = [ep("s1", 4), ep("r1", 32)]
    f = flt(spill="when-full")
    s = snap(*fleet)
    # The candidates a filter gets have room: s1 missing from them means it is full.
    assert ids(f.filter(deadline_req("a", 1.3), [fleet[1]], s)) == ["r1"]
    never = flt(spill="never")
    assert ids(never.scope(deadline_req("b", 1.3), fleet, s)) == ["s1"]
    assert ids(f.scope(deadline_req("c", 1.3), fleet, s)) == ["r1", "s1"]


def test_endpoints_all_on_one_side_are_not_split() -> None:
    fleet = [ep("a", None), ep("b", 64)]
    f = flt()
    assert ids(f.filter(deadline_req("a", 1.3), fleet, snap(*fleet))) == ["a", "b"]


def test_the_filter_records_the_mix_and_shows_the_split() -> None:
    f = flt()
    s = snap(*FLEET)
    for i in range(3):
        f.filter(deadline_req(f"t{i}", 1.3), FLEET, s)
    f.filter(deadline_req("r", 3.0, out=400), FLEET, s)
    f.filter(deadline_req("r", 3.0, out=400), FLEET, s)  # seen again while queued: counted once
    mix = f.mix(M, 0.0, t_slot_s=T_SLOT_MS / 1000.0)
    assert [(round(k.factor, 1), k.decode_tokens, k.share) for k in mix.kinds] == [
        (1.3, 100.0, 0.75),
        (3.0, 400.0, 0.25),
    ]
    assert f.groups(M) == {STRICT: (0.75, ["s1", "s2"]), RELAXED: (0.25, ["r1", "r2"])}
    assert f.mix(ModelName("other"), 0.0, t_slot_s=0.01).kinds == ()


def test_the_split_shares_decay_over_the_window() -> None:
    f = flt(window_s=10.0)
    for i in range(30):  # strict traffic long ago
        f.filter(deadline_req(f"t{i}", 1.3), FLEET, snap(*FLEET, now=0.0))
    for i in range(10):  # relaxed traffic ten windows later
        f.filter(deadline_req(f"r{i}", 3.0), FLEET, snap(*FLEET, now=100.0))
    share = f.groups(M)[RELAXED][0]
    assert share is not None
    assert share > 0.99
    assert f.mix(M, 100.0, t_slot_s=T_SLOT_MS / 1000.0).kinds[-1].share > 0.99


def test_built_from_a_policy_with_checked_params() -> None:
    reg = default_registry()
    built = reg.build(
        PluginKind.FILTER, "sub-cluster", {"strict_below": 1.2, "t_slot_ms": 30}, path="p", ctx=BuildContext()
    )
    assert isinstance(built, SubClusterFilter)
    with pytest.raises(ConfigError, match="spill names 'tight'"):
        reg.build(
            PluginKind.FILTER, "sub-cluster", {"spill": {"tight": "never"}}, path="p", ctx=BuildContext()
        )
    with pytest.raises(ConfigError, match="strict_max_batch"):
        reg.build(PluginKind.FILTER, "sub-cluster", {"strict_max_batch": 0}, path="p", ctx=BuildContext())
