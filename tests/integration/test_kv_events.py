"""The KV-event subscriber against a real pyzmq publisher over loopback: live batches, a gap filled by
replay (vLLM's and SGLang's reply shapes), a gap too old for the buffer, no replay endpoint,
AllBlocksCleared, and the publisher going away. Every wait is on a condition, bounded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Literal

import pytest
import zmq.asyncio

from gateway.core.blockhash import token_chain
from gateway.core.clock import SystemClock
from gateway.telemetry.prefix_precise import SourceState
from gateway.upstream.kv_events import KvEventsTarget, KvEventSubscriber
from tests.integration.kv_publisher import CLEARED, TestPublisher, removed, stored
from tests.kv_watch import WatchedStore

BS = 4
TIMEOUT_S = 10.0


class Rig:
    def __init__(self, ctx: zmq.asyncio.Context, pub: TestPublisher, store: WatchedStore) -> None:
        self.ctx, self.pub, self.store = ctx, pub, store
        self.task: asyncio.Task[None] | None = None

    async def start(self, *, replay: bool = True, state: SourceState = SourceState.LIVE) -> None:
        target = KvEventsTarget(self.pub.endpoint, self.pub.replay_endpoint if replay else None)
        sub = KvEventSubscriber("e1", target, self.store, SystemClock(), context=self.ctx, replay_idle_s=2.0)
        self.task = asyncio.get_running_loop().create_task(sub.run())
        await self.pub.wait_subscriber()
        # connected, and (with a replay socket) the replay of the engine's buffer on connecting done
        replays = 1 if replay else 0
        await self.store.until(lambda: self.store.state is state and self.store.status(0).replays == replays)

    async def applied(self, seq: int) -> None:
        """Until batch `seq` is applied and any replay that applied it has ended."""
        await self.store.until(
            lambda: self.store.status(0).last_seq == seq and self.store.state is not SourceState.REPLAYING
        )


@pytest.fixture
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    form: Literal["vllm", "sglang"] = getattr(request, "param", "vllm")
    ctx = zmq.asyncio.Context()
    pub = TestPublisher(ctx, replay_form=form)
    pub.serve_replay()
    r = Rig(ctx, pub, WatchedStore("e1"))
    yield r
    if r.task is not None:
        r.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await r.task
    await pub.close()
    ctx.term()


PROMPT = list(range(16))
KEYS = token_chain(PROMPT, BS)


async def test_live_batches_fill_the_store(rig: Rig) -> None:
    await rig.start()
    rig.pub.publish([stored([1, 2], PROMPT[:8], None, BS)])
    rig.pub.publish([stored([3, 4], PROMPT[8:], 2, BS)])
    await rig.applied(1)
    assert rig.store.matched(KEYS) == 4
    rig.pub.publish([removed([4])])
    await rig.applied(2)
    assert rig.store.matched(KEYS) == 3
    assert rig.store.status(0).lag_s is not None


@pytest.mark.parametrize("rig", ["vllm", "sglang"], indirect=True)
async def test_a_gap_is_filled_by_replay(rig: Rig) -> None:
    await rig.start()
    rig.pub.publish([stored([1], PROMPT[:4], None, BS)])
    rig.pub.publish([stored([2], PROMPT[4:8], 1, BS)], send=False)  # lost on the way
    rig.pub.publish([stored([3], PROMPT[8:12], 2, BS)], send=False)
    rig.pub.publish([stored([4], PROMPT[12:], 3, BS)])
    await rig.applied(3)
    assert rig.pub.replay_requests == [0, 1]  # on connecting, then for the gap
    assert rig.store.matched(KEYS) == 4
    status = rig.store.status(0)
    assert (status.state, status.gaps, status.replays, status.rebuilds) == (SourceState.LIVE, 1, 2, 0)


async def test_a_gap_older_than_the_buffer_rebuilds(rig: Rig) -> None:
    await rig.start()
    rig.pub.publish([stored([1], PROMPT[:4], None, BS)])
    rig.pub.publish([removed([1])], send=False)  # lost, and gone from the buffer: block 1 would go stale
    rig.pub.publish([stored([7], [9] * 4, None, BS)], send=False)
    rig.pub.forget_before(2)
    rig.pub.publish([stored([8], [9] * 4, 7, BS)])
    await rig.applied(3)
    status = rig.store.status(0)
    assert (status.state, status.rebuilds) == (SourceState.REBUILDING, 1)
    assert rig.store.matched(KEYS) == 0  # the stale block is gone
    assert rig.store.matched(token_chain([9] * 8, BS)) == 2  # what the buffer still had is applied


async def test_without_a_replay_endpoint_a_gap_rebuilds(rig: Rig) -> None:
    await rig.start(replay=False)
    rig.pub.publish([stored([1], PROMPT[:4], None, BS)])
    rig.pub.publish([], send=False)
    rig.pub.publish([stored([5], [5] * 4, None, BS)])
    await rig.applied(2)
    assert rig.store.keys() == frozenset(token_chain([5] * 4, BS))
    assert rig.pub.replay_requests == []
    assert rig.store.state is SourceState.REBUILDING


async def test_a_subscriber_that_starts_late_learns_the_buffer(rig: Rig) -> None:
    rig.pub.publish([stored([1, 2], PROMPT[:8], None, BS)], send=False)  # before anyone subscribed
    rig.pub.publish([stored([3, 4], PROMPT[8:], 2, BS)], send=False)
    await rig.start()
    assert rig.store.matched(KEYS) == 4
    assert rig.store.status(0).last_seq == 1


async def test_a_late_subscriber_whose_buffer_was_cut_rebuilds(rig: Rig) -> None:
    rig.pub.publish([stored([1, 2], PROMPT[:8], None, BS)], send=False)
    rig.pub.publish([stored([3], [3] * 4, None, BS)], send=False)
    rig.pub.forget_before(1)
    await rig.start(state=SourceState.REBUILDING)  # from the oldest batch the buffer kept
    assert rig.store.keys() == frozenset(token_chain([3] * 4, BS))


async def test_all_blocks_cleared_empties_the_store(rig: Rig) -> None:
    await rig.start()
    rig.pub.publish([stored([1, 2], PROMPT[:8], None, BS)])
    rig.pub.publish([CLEARED])
    await rig.applied(1)
    assert rig.store.cached_blocks() == 0
    assert rig.store.state is SourceState.LIVE


async def test_publisher_gone_falls_back_and_drops(rig: Rig) -> None:
    await rig.start()
    rig.pub.publish([stored([1, 2], PROMPT[:8], None, BS)])
    await rig.applied(0)
    rig.pub.pub.close(linger=0)
    await rig.store.until(lambda: rig.store.state is SourceState.FALLEN_BACK)
    assert rig.store.cached_blocks() == 0


async def test_an_undecodable_batch_rebuilds(rig: Rig) -> None:
    await rig.start()
    rig.pub.publish([stored([1], PROMPT[:4], None, BS)])
    rig.pub.pub.send_multipart([b"", (1).to_bytes(8, "big"), b"\xc1"])  # 0xc1: never valid msgpack
    rig.pub.seq = 2
    rig.pub.publish([stored([2], [2] * 4, None, BS)])
    await rig.applied(2)
    assert rig.store.keys() == frozenset(token_chain([2] * 4, BS))
