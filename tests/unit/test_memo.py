"""`gateway.sched.memo.make_room`: a memo by request stays bounded and forgets its oldest entries first,
a few at a time (never emptied whole: that frees thousands of requests in one scheduler call)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.sched.memo import make_room


@given(
    keys=st.lists(st.integers(0, 200), max_size=400),
    bound=st.integers(1, 64),
    batch=st.integers(1, 16),
)
def test_bounded_and_oldest_first(keys: list[int], bound: int, batch: int) -> None:
    memo: dict[int, int] = {}
    order: list[int] = []  # the keys in insertion order, as the memo should hold them
    for k in keys:
        if k not in memo:
            make_room(memo, bound, batch)
            forgotten = len(order) - len(memo)
            assert forgotten in (0, min(batch, len(order)))
            assert list(memo) == order[forgotten:]  # the oldest went
            order = [*order[forgotten:], k]
        memo[k] = k
        assert len(memo) <= bound
    assert list(memo) == order


def test_untouched_below_the_bound() -> None:
    memo = {i: i for i in range(10)}
    make_room(memo, 11)
    assert list(memo) == list(range(10))
    make_room(memo, 10, 3)
    assert list(memo) == list(range(3, 10))
