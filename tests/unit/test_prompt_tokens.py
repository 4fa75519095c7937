"""Which endpoint counts a prompt (`pick_endpoint`, sans-IO): a ready one serving the model, the least
busy, never one passed over after a 404 / 405 until its time is up; and why there is none."""

from __future__ import annotations

import pytest

from gateway.admission.prompt_tokens import pick_endpoint
from gateway.core.types import EndpointHealth, EndpointId, ModelName
from gateway.sched.snapshot import EndpointView
from gateway.upstream.tokenize import TokenizeResult
from tests.unit.sched_builders import view

M = ModelName("m")
NOW = 100.0


def _skip(*eids: str, until: float = NOW + 1) -> dict[tuple[EndpointId, ModelName], float]:
    return {(EndpointId(e), M): until for e in eids}


@pytest.mark.parametrize(
    ("endpoints", "passed_over", "picked", "result"),
    [
        pytest.param((), {}, None, TokenizeResult.NO_ENDPOINT, id="no-endpoints"),
        pytest.param((view("a", models=("other",)),), {}, None, TokenizeResult.NO_ENDPOINT, id="other-model"),
        pytest.param(
            (view("a", health=EndpointHealth.UNHEALTHY), view("b", health=EndpointHealth.STARTING)),
            {},
            None,
            TokenizeResult.NO_ENDPOINT,
            id="none-ready",
        ),
        pytest.param(
            (view("a", inflight=3), view("b", inflight=1), view("c", inflight=2)),
            {},
            "b",
            TokenizeResult.OK,
            id="least-busy",
        ),
        pytest.param(
            (view("a", inflight=1), view("b", inflight=1)), {}, "a", TokenizeResult.OK, id="tie-first"
        ),
        pytest.param(
            (view("a", inflight=0), view("b", inflight=5)),
            _skip("a"),
            "b",
            TokenizeResult.OK,
            id="passed-over",
        ),
        pytest.param(
            (view("a"), view("b", health=EndpointHealth.UNHEALTHY)),
            _skip("a"),
            None,
            TokenizeResult.UNSUPPORTED,
            id="every-ready-one-passed-over",
        ),
        pytest.param((view("a"),), _skip("a", until=NOW), "a", TokenizeResult.OK, id="passed-over-until-now"),
        pytest.param(
            (view("a"),),
            {(EndpointId("a"), ModelName("other")): NOW + 1},
            "a",
            TokenizeResult.OK,
            id="passed-over-for-another-model",
        ),
    ],
)
def test_pick_endpoint(
    endpoints: tuple[EndpointView, ...],
    passed_over: dict[tuple[EndpointId, ModelName], float],
    picked: str | None,
    result: TokenizeResult,
) -> None:
    ep, why = pick_endpoint(endpoints, M, passed_over, NOW)

    assert (None if ep is None else ep.id, why) == (picked, result)
