"""Request ids the front makes or honours."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from gateway.front.http import request_id


def _id(headers: dict[str, str]) -> str:
    return request_id(make_mocked_request("POST", "/v1/completions", headers=CIMultiDict(headers)))


@pytest.mark.parametrize(
    "given", ["req-abc", "x" * 128, "01J9ZK3 with spaces"], ids=["plain", "longest", "printable"]
)
def test_a_sane_client_id_is_echoed(given: str) -> None:
    assert _id({"X-Request-Id": given}) == given


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"X-Request-Id": ""},
        {"X-Request-Id": "x" * 129},
        {"X-Request-Id": "caf\u00e9"},
        {"X-Request-Id": "a\tb"},
    ],
    ids=["none", "empty", "too-long", "non-ascii", "control"],
)
def test_otherwise_berth_makes_distinct_hex_ids(headers: dict[str, str]) -> None:
    made = [_id(headers) for _ in range(1000)]
    assert len(set(made)) == len(made)
    for rid in made:
        assert len(rid) == 24
        int(rid, 16)
    # one process's ids share a random prefix and count up behind it
    assert len({rid[:12] for rid in made}) == 1
