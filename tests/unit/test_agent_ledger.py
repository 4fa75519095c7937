"""The memory ledger: admission per device, one load per device, best fit, eviction; never over-commits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.agent.ledger import DeviceSlot, Holding, books, choose, plan_eviction

G = 1 << 30


def _slots(*gib: int) -> list[DeviceSlot]:
    return [DeviceSlot(f"gpu{i}", i, g * G) for i, g in enumerate(gib)]


def test_admits_exactly_up_to_capacity() -> None:
    slots = _slots(10)
    book = books(slots, [Holding("a", ("gpu0",), 6 * G)])
    assert choose(book, 4 * G, 1) == ["gpu0"]
    assert choose(book, 4 * G + 1, 1) is None
    assert book["gpu0"].free_bytes == 4 * G


def test_measured_memory_counts_when_above_admitted() -> None:
    slots = _slots(10)
    grown = Holding("a", ("gpu0",), 4 * G, measured_bytes={"gpu0": 7 * G})
    shrunk = Holding("b", ("gpu0",), 2 * G, measured_bytes={"gpu0": 1 * G})
    book = books(slots, [grown, shrunk])
    assert book["gpu0"].reserved_bytes == 9 * G
    assert choose(book, 1 * G + 1, 1) is None


def test_one_load_per_device() -> None:
    slots = _slots(80, 80)
    book = books(slots, [Holding("loading", ("gpu0",), 1 * G, loading=True)])
    assert choose(book, 1 * G, 1) == ["gpu1"]
    assert choose(book, 1 * G, 2) is None
    assert book["gpu0"].loading == "loading"


@pytest.mark.parametrize(
    ("held", "required", "needed", "expected"),
    [
        pytest.param({"gpu0": 2, "gpu1": 6}, 3, 1, ["gpu1"], id="tightest-hole"),
        pytest.param({"gpu0": 2, "gpu1": 6}, 5, 1, ["gpu0"], id="only-room"),
        pytest.param({"gpu0": 0, "gpu1": 0, "gpu2": 5}, 4, 2, ["gpu0", "gpu2"], id="tensor-parallel"),
        pytest.param({"gpu0": 9, "gpu1": 9}, 2, 1, None, id="no-room"),
    ],
)
def test_best_fit(held: dict[str, int], required: int, needed: int, expected: list[str] | None) -> None:
    slots = _slots(*([10] * len(held)))
    holdings = [Holding(f"h-{d}", (d,), g * G) for d, g in held.items() if g]
    assert choose(books(slots, holdings), required * G, needed) == expected


def test_eviction_prefers_fewest_then_smallest() -> None:
    slots = _slots(10)
    holdings = [
        Holding("big", ("gpu0",), 6 * G),
        Holding("small-1", ("gpu0",), 2 * G),
        Holding("small-2", ("gpu0",), 2 * G),
    ]
    e = plan_eviction(slots, holdings, 2 * G, 1)
    assert e is not None
    assert e.victims in (("small-1",), ("small-2",))
    assert e.freed_bytes == 2 * G
    e = plan_eviction(slots, holdings, 6 * G, 1)
    assert e is not None
    assert e.victims == ("big",)  # one victim beats two small ones
    assert e.devices == ["gpu0"]


def test_eviction_never_picks_loading_or_stopping_instances() -> None:
    slots = _slots(10)
    holdings = [Holding("loading", ("gpu0",), 8 * G, loading=True, evictable=False)]
    assert plan_eviction(slots, holdings, 4 * G, 1) is None


def test_eviction_impossible_when_the_model_is_larger_than_a_device() -> None:
    assert plan_eviction(_slots(10, 10), [], 11 * G, 1) is None
    assert plan_eviction(_slots(10), [], 1 * G, 2) is None


def test_eviction_of_a_tensor_parallel_victim_frees_both_devices() -> None:
    slots = _slots(10, 10)
    holdings = [Holding("tp2", ("gpu0", "gpu1"), 8 * G), Holding("one", ("gpu1",), 1 * G)]
    e = plan_eviction(slots, holdings, 8 * G, 2)
    assert e is not None
    assert e.victims == ("tp2",)
    e = plan_eviction(slots, holdings, 9 * G + 1, 2)
    assert e is not None
    assert e.victims == ("one", "tp2")
    assert e.devices == ["gpu0", "gpu1"]


# ---------------------------------------------------------------------------------- property

_op = st.one_of(
    st.tuples(st.just("start"), st.integers(1, 40), st.integers(1, 3), st.integers(0, 30)),
    st.tuples(st.just("stop"), st.integers(0, 50), st.just(0), st.just(0)),
    st.tuples(st.just("grow"), st.integers(0, 50), st.integers(0, 40), st.just(0)),
    st.tuples(st.just("evict-start"), st.integers(1, 40), st.integers(1, 3), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(capacities=st.lists(st.integers(8, 80), min_size=1, max_size=4), ops=st.lists(_op, max_size=40))
def test_never_over_commits(capacities: list[int], ops: list[tuple[str, int, int, int]]) -> None:
    """Whatever runs, every start and eviction the ledger admits keeps each device within capacity.

    `grow` is NVML measuring an instance above its admission (the engine grew on its own): that may put a
    device over by itself, but then no start is admitted there, and a device the ledger admitted a start
    on is within capacity right after it.
    """
    slots = _slots(*capacities)
    cap = {s.name: s.capacity_bytes for s in slots}
    held: list[Holding] = []
    grown = False
    for n, (kind, a, b, _) in enumerate(ops):
        if kind in {"start", "evict-start"}:
            required, needed = a * G, b
            devices = choose(books(slots, held), required, needed)
            if devices is None and kind == "evict-start":
                e = plan_eviction(slots, held, required, needed)
                if e is not None:
                    held = [h for h in held if h.id not in e.victims]
                    devices = choose(books(slots, held), required, needed)
                    assert devices == e.devices
            if devices is not None:
                held.append(Holding(f"i{n}", tuple(devices), required))
                after = books(slots, held)
                assert all(after[d].reserved_bytes <= cap[d] for d in devices)
        elif kind == "stop" and held:
            held.pop(a % len(held))
        elif kind == "grow" and held:
            h = held[a % len(held)]
            held[a % len(held)] = Holding(h.id, h.devices, h.admitted_bytes, {h.devices[0]: b * G})
            grown = True
        if not grown:
            assert all(bk.reserved_bytes <= cap[d] for d, bk in books(slots, held).items())
