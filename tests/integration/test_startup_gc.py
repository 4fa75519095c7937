"""The collector's settings (`gateway.core.heap.GcSchedule.settle`) are applied once startup is done:
after every endpoint's first scrape round, before systemd hears READY=1; and what they are."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from collections.abc import Iterator

import pytest

from gateway.app import Gateway, ServeOptions, serve
from gateway.config import apply_overrides, default_config, load_runtime, parse_endpoint_flag
from gateway.core.gcpauses import GcPauses
from gateway.core.heap import BACKSTOP, YOUNG_THRESHOLD, GcSchedule
from gateway.core.sdnotify import Notifier
from gateway.sched.plugins import default_registry
from loadgen.harness import free_port
from tests.integration.conftest import EngineServer
from tests.integration.fake_engine import FakeEngine


@pytest.fixture
def collector_restored() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.usefixtures("collector_restored")
def test_settle_freezes_what_exists_and_raises_the_young_threshold() -> None:
    _, older, oldest = gc.get_threshold()
    pauses = GcPauses()
    schedule = GcSchedule(pauses)
    schedule.settle()
    try:
        assert gc.get_threshold() == (YOUNG_THRESHOLD * BACKSTOP, older, oldest)
        assert gc.get_freeze_count() > 0
        assert gc.get_count()[0] < 100  # collected just before the freeze
        assert schedule.step()  # a young collection, its survivors frozen
        assert pauses.gens["0"].count == 1  # the callback is installed
        assert gc.get_count() == (0, 0, 0)
    finally:
        schedule.close()
    gc.collect(0)
    assert pauses.gens["0"].count == 1  # and removed


async def test_serve_settles_the_collector_after_the_first_round_and_before_ready(
    engine_server: EngineServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = await engine_server(FakeEngine())
    flags = (parse_endpoint_flag(url),)
    cfg = apply_overrides(default_config(), listen=f"127.0.0.1:{free_port()}", endpoints=flags)
    registry = default_registry()
    runtime = load_runtime(None, cfg, registry, endpoints=flags, seed=1)
    seen: list[str] = []

    class Told(Notifier):
        def ready(self) -> bool:
            seen.append("ready")
            return True

    options = ServeOptions(config_path=None, endpoints=flags)
    gw = Gateway(runtime, cfg, options, registry=registry, notifier=Told(None))

    def settled(_: GcSchedule) -> None:
        rounds = all(s.round_done.is_set() for s in gw.endpoints.scrapers())
        seen.append(f"settle after the first round: {rounds}")
        # serve's own handler drains and returns; were it not installed yet, SIGTERM would end the
        # test run itself: fail the test instead
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(GcSchedule, "settle", settled)
    await asyncio.wait_for(serve(gw), 30)
    assert seen == ["settle after the first round: True", "ready"]
