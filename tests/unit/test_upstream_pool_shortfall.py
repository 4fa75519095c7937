"""The engine-call pool's limits against the fleet's seats (`pool_shortfalls`)."""

from __future__ import annotations

import pytest

from gateway.upstream.client import PoolShortfall, UpstreamSettings, pool_shortfalls

# B is behind the same origin as A (a proxy in front of two engines): they share its per-host limit.
A, B, C = "http://gpu-1:8000/a", "http://gpu-1:8000/b", "http://gpu-2:8000"


@pytest.mark.parametrize(
    ("per_host", "total", "seats", "want"),
    [
        pytest.param(256, 1024, [(A, 64), (C, 64)], [], id="fits"),
        pytest.param(256, 128, [(A, 64), (C, 64)], [], id="exactly-the-pool"),
        pytest.param(
            256,
            1024,
            [(f"http://gpu-{i}:8000", 100) for i in range(16)],
            [PoolShortfall("upstream.pool_total", 1024, 1600)],
            id="total-below-the-fleet",
        ),
        pytest.param(
            96,
            1024,
            [(A, 64), (B, 64), (C, 64)],
            [PoolShortfall("upstream.pool_per_host", 96, 128, "gpu-1:8000")],
            id="per-host-below-one-origin",
        ),
        pytest.param(
            48,
            100,
            [(A, 64), (C, 64)],
            [
                PoolShortfall("upstream.pool_total", 100, 128),
                PoolShortfall("upstream.pool_per_host", 48, 64, "gpu-1:8000"),
                PoolShortfall("upstream.pool_per_host", 48, 64, "gpu-2:8000"),
            ],
            id="both",
        ),
        pytest.param(
            256,
            1024,
            [("http://user:secret@gpu-1:8000/v1", 64)],
            [],
            id="credentials-in-the-url-are-not-the-origin",
        ),
    ],
)
def test_pool_shortfalls(
    per_host: int, total: int, seats: list[tuple[str, int]], want: list[PoolShortfall]
) -> None:
    settings = UpstreamSettings(pool_per_host=per_host, pool_total=total)
    assert pool_shortfalls(settings, seats) == want


def test_a_shortfall_names_the_host_never_credentials() -> None:
    settings = UpstreamSettings(pool_per_host=8, pool_total=1024)
    [short] = pool_shortfalls(settings, [("http://user:secret@gpu-1:8000", 64)])
    assert short.host == "gpu-1:8000"
