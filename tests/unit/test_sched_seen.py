"""`SeenRequests` against the plain form it replaces: a dict in insertion order whose oldest key is
deleted once it holds more than the bound."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.types import RequestId
from gateway.sched.seen import SeenRequests


@given(
    limit=st.integers(min_value=1, max_value=6),
    ids=st.lists(st.integers(min_value=0, max_value=9), max_size=60),
)
def test_seen_requests_is_a_bounded_first_in_first_out_memory(limit: int, ids: list[int]) -> None:
    seen = SeenRequests(limit)
    plain: dict[RequestId, None] = {}
    for i in ids:
        rid = RequestId(f"r{i}")
        want = rid not in plain
        if want:
            plain[rid] = None
            if len(plain) > limit:
                del plain[next(iter(plain))]
        assert seen.first(rid) is want
        assert len(seen) == len(plain)
        assert all((RequestId(f"r{j}") in seen) == (RequestId(f"r{j}") in plain) for j in range(10))


def test_a_request_seen_again_while_remembered_is_not_first() -> None:
    seen = SeenRequests(2)
    assert seen.first(RequestId("a"))
    assert not seen.first(RequestId("a"))
    assert seen.first(RequestId("b"))
    assert seen.first(RequestId("c"))  # "a" is forgotten: the oldest
    assert RequestId("a") not in seen
    assert seen.first(RequestId("a"))


def test_the_bound_is_at_least_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SeenRequests(0)
