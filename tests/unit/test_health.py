"""HealthTracker: tables of check results in, states and transitions out."""

from __future__ import annotations

import pytest

from gateway.core.types import EndpointHealth
from gateway.telemetry.health import HealthTracker

S = EndpointHealth.STARTING
R = EndpointHealth.READY
U = EndpointHealth.UNHEALTHY


def replay(tracker: HealthTracker, events: str) -> list[EndpointHealth | None]:
    """Feed `events` ("+" success, "-" failure); the transition each one returned."""
    return [tracker.success() if e == "+" else tracker.failure() for e in events]


@pytest.mark.parametrize(
    ("n", "events", "transitions", "final"),
    [
        pytest.param(3, "", [], S, id="fresh-is-starting"),
        pytest.param(3, "+", [R], R, id="first-success-ready"),
        pytest.param(3, "++", [R, None], R, id="success-again-no-change"),
        pytest.param(3, "--", [None, None], S, id="starting-below-n-stays"),
        pytest.param(3, "---", [None, None, U], U, id="starting-n-failures-unhealthy"),
        pytest.param(3, "----", [None, None, U, None], U, id="unhealthy-stays-quiet"),
        pytest.param(3, "--+", [None, None, R], R, id="starting-recovers"),
        pytest.param(3, "+--", [R, None, None], R, id="ready-below-n-stays"),
        pytest.param(3, "+---", [R, None, None, U], U, id="ready-n-failures-unhealthy"),
        pytest.param(3, "+---+", [R, None, None, U, R], R, id="one-success-recovers"),
        pytest.param(3, "+--+--", [R, None, None, None, None, None], R, id="success-resets-count"),
        pytest.param(3, "+---+---", [R, None, None, U, R, None, None, U], U, id="flapping"),
        pytest.param(1, "-", [U], U, id="n1-first-failure"),
        pytest.param(1, "+-+", [R, U, R], R, id="n1-every-event-counts"),
    ],
)
def test_transitions(
    n: int, events: str, transitions: list[EndpointHealth | None], final: EndpointHealth
) -> None:
    tracker = HealthTracker(unhealthy_after=n)
    assert replay(tracker, events) == transitions
    assert tracker.state is final


def test_counts_consecutive_failures() -> None:
    tracker = HealthTracker(unhealthy_after=5)
    replay(tracker, "+--")
    assert tracker.consecutive_failures == 2
    tracker.success()
    assert tracker.consecutive_failures == 0


@pytest.mark.parametrize(
    ("events", "new_n", "transition", "final"),
    [
        pytest.param("+--", 2, U, U, id="lowering-n-below-count"),
        pytest.param("+--", 5, None, R, id="raising-n"),
        pytest.param("+---", 5, None, U, id="raising-n-does-not-heal"),
        pytest.param("", 1, None, S, id="no-failures-yet"),
    ],
)
def test_reload_changes_n(
    events: str, new_n: int, transition: EndpointHealth | None, final: EndpointHealth
) -> None:
    tracker = HealthTracker(unhealthy_after=3)
    replay(tracker, events)
    assert tracker.set_unhealthy_after(new_n) is transition
    assert tracker.state is final
    assert tracker.unhealthy_after == new_n


@pytest.mark.parametrize("n", [0, -1])
def test_n_must_be_positive(n: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        HealthTracker(unhealthy_after=n)
    with pytest.raises(ValueError, match="at least 1"):
        HealthTracker(unhealthy_after=3).set_unhealthy_after(n)
