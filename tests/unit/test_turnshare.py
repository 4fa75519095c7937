"""A background worker's slices of the event loop (`TurnShare`): the floor on a quiet loop, a share of
the last turn on a busy one, measured on a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from gateway.core.clock import FakeClock
from gateway.core.turnshare import FLOOR_S, SHARE, TurnShare


async def test_a_slice_is_the_floor_on_a_quiet_loop_and_a_share_of_the_turn_on_a_busy_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    turns = iter([0.0001, 0.005, 0.0])

    async def fake_sleep(seconds: float) -> None:
        assert seconds == 0
        clock.advance(next(turns))  # the rest of the loop's turn, until the worker's next step

    monkeypatch.setattr("gateway.core.turnshare.asyncio.sleep", fake_sleep)
    share = TurnShare(clock)
    share.begin()
    clock.advance(FLOOR_S / 2)
    assert not share.over()
    clock.advance(FLOOR_S)
    assert share.over()
    await share.pause()  # a short turn: the floor
    assert share.budget_s == FLOOR_S
    assert not share.over()  # a new slice begins when the loop comes back
    await share.pause()  # a turn of 5 ms: a fifth of it
    assert share.budget_s == pytest.approx(SHARE * 0.005)
    clock.advance(SHARE * 0.005 * 0.99)
    assert not share.over()
    await share.pause()  # quiet again
    assert share.budget_s == FLOOR_S


@pytest.mark.parametrize(("floor_s", "share"), [(0.0, 0.2), (0.001, 0.0), (0.001, 1.5)])
def test_nonsense_settings_are_refused(floor_s: float, share: float) -> None:
    with pytest.raises(ValueError, match="floor_s"):
        TurnShare(FakeClock(), floor_s=floor_s, share=share)


def test_pause_really_yields_to_the_loop() -> None:
    async def main() -> list[str]:
        order: list[str] = []
        share = TurnShare(FakeClock())

        async def worker() -> None:
            order.append("worker")
            await share.pause()
            order.append("worker again")

        async def other() -> None:
            order.append("other")

        await asyncio.gather(worker(), other())
        return order

    assert asyncio.run(main()) == ["worker", "other", "worker again"]
