"""The KV-event subscriber of one endpoint: a ZMQ SUB socket on the engine's publisher, and a DEALER
socket on its replay endpoint when a gap needs filling.

Wire (vLLM `vllm/distributed/kv_events.py`, SGLang `sglang/srt/disaggregation/kv_events.py`): the
engine's PUB socket sends three frames per batch, `[topic, seq, payload]`, `seq` an 8-byte big-endian
counter from 0 and `payload` a msgpack batch (`gateway.upstream.kv_decode`). Its ROUTER replay socket
takes `[b"", start_seq]` from a DEALER and answers every buffered batch from `start_seq` on, then an
end marker whose sequence number is -1; vLLM answers `[b"", topic, seq, payload]`, SGLang
`[b"", seq, payload]`: both are read.

What the frames mean is the sink's business (`gateway.telemetry.prefix_precise.PreciseStore`): this
module only moves bytes, tells the sink when the connection comes up or goes down (a ZMQ socket
monitor; heartbeats make a silent peer count as gone), and runs the replay or the rebuild the sink
asks for. On every connection it replays the engine's buffer from its first batch, so a store that
starts after its engine (or reconnects) learns what the engine cached meanwhile. A live batch that
arrives during a replay waits in the SUB socket (at most `RCVHWM` messages; past that ZMQ drops,
which is one more gap).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

import structlog
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from gateway.core.clock import Clock
from gateway.core.kvevents import KvBatch
from gateway.upstream.kv_decode import KvDecodeError, decode_batch

log = structlog.get_logger("berth.kv_events")

END_SEQ: Final = -1  # the replay's end marker
RCVHWM: Final = 10_000  # live batches the SUB socket keeps while a replay runs (vLLM buffers as many)
HEARTBEAT_MS: Final = 2_000  # a peer silent for 3 heartbeats is disconnected
RECONNECT_MS: Final = 500
RECONNECT_MAX_MS: Final = 5_000
REPLAY_IDLE_S: Final = 2.0  # a replay that sends nothing for this long has ended


@dataclass(frozen=True, slots=True)
class KvEventsTarget:
    """Where an endpoint's engine publishes: its PUB address, its replay (ROUTER) address if any, and
    the topic it sends on."""

    endpoint: str
    replay: str | None = None
    topic: str = ""


class KvEventSink(Protocol):
    """What the subscriber tells (the per-endpoint store, `PreciseStore`)."""

    def connected(self, now: float) -> None: ...
    def disconnected(self, now: float) -> None: ...
    def on_live(self, seq: int, batch: KvBatch, now: float, wall: float) -> int | None: ...
    def begin_replay(self, now: float, reason: str = "gap") -> None: ...
    def on_replayed(self, seq: int, batch: KvBatch, now: float, wall: float) -> None: ...
    def end_replay(self, now: float, upto: int) -> bool: ...
    def rebuild(self, now: float, seq: int) -> None: ...


def seq_of(frame: bytes) -> int:
    return int.from_bytes(frame, "big", signed=True)


class KvEventSubscriber:
    def __init__(
        self,
        endpoint: str,
        target: KvEventsTarget,
        sink: KvEventSink,
        clock: Clock,
        *,
        context: zmq.asyncio.Context | None = None,
        wall: Callable[[], float] = time.time,
        replay_idle_s: float = REPLAY_IDLE_S,
    ) -> None:
        self.endpoint = endpoint
        self.target = target
        self._sink = sink
        self._clock = clock
        self._ctx = context if context is not None else zmq.asyncio.Context.instance()
        self._wall = wall
        self._replay_idle_s = replay_idle_s
        self.decode_errors = 0

    async def run(self) -> None:
        """Subscribe and feed the sink until cancelled."""
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, RCVHWM)
        sub.setsockopt(zmq.RECONNECT_IVL, RECONNECT_MS)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_MAX_MS)
        sub.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
        sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * HEARTBEAT_MS)
        sub.setsockopt(zmq.SUBSCRIBE, self.target.topic.encode())
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        sub.connect(self.target.endpoint)
        log.info("kv_events_subscribing", endpoint=self.endpoint, publisher=self.target.endpoint)
        try:
            while True:
                ready = dict(await poller.poll())
                if sub in ready:
                    await self._on_frames(await sub.recv_multipart())
                if monitor in ready:
                    await self._on_monitor(await monitor.recv_multipart())
        finally:
            poller.unregister(sub)
            poller.unregister(monitor)
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _on_monitor(self, frames: list[bytes]) -> None:
        event = parse_monitor_message(frames)["event"]
        now = self._clock.now()
        if event == zmq.EVENT_CONNECTED:
            self._sink.connected(now)
            if self.target.replay is not None:
                # What the engine cached before this connection (berth started after it, or the
                # connection came back): its replay buffer from the first batch on. A buffer that no
                # longer begins there makes the store rebuild; an empty one leaves it as it is.
                await self._replay(0, 0, "connected")
        elif event == zmq.EVENT_DISCONNECTED:
            self._sink.disconnected(now)

    def _decode(self, seq: int, payload: bytes) -> KvBatch | None:
        try:
            return decode_batch(payload)
        except KvDecodeError as e:
            self.decode_errors += 1
            log.warning("kv_events_undecodable", endpoint=self.endpoint, seq=seq, error=str(e))
            return None

    async def _on_frames(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            return
        seq = seq_of(frames[-2])
        batch = self._decode(seq, frames[-1])
        sink = self._sink
        if batch is None:  # a batch lost: what it changed is unknown
            sink.rebuild(self._clock.now(), seq + 1)
            return
        gap = sink.on_live(seq, batch, self._clock.now(), self._wall())
        if gap is None:
            return
        filled = self.target.replay is not None and await self._replay(gap, seq)
        if not filled:
            sink.rebuild(self._clock.now(), seq)
        sink.on_live(seq, batch, self._clock.now(), self._wall())

    async def _replay(self, start: int, upto: int, reason: str = "gap") -> bool:
        """Ask the engine for its buffered batches from `start` and feed them; True when the gap up
        to `upto` is filled."""
        assert self.target.replay is not None
        sink = self._sink
        sink.begin_replay(self._clock.now(), reason)
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.target.replay)
        received = 0
        try:
            async with asyncio.timeout(self._replay_idle_s) as deadline:
                await dealer.send_multipart([b"", start.to_bytes(8, "big")])
                while True:
                    frames = await dealer.recv_multipart()
                    deadline.reschedule(asyncio.get_running_loop().time() + self._replay_idle_s)
                    if len(frames) < 2:
                        continue
                    seq = seq_of(frames[-2])
                    if seq == END_SEQ:
                        break
                    batch = self._decode(seq, frames[-1])
                    if batch is None:
                        break  # the rest cannot be applied in order
                    received += 1
                    sink.on_replayed(seq, batch, self._clock.now(), self._wall())
        except TimeoutError:
            log.warning("kv_events_replay_timeout", endpoint=self.endpoint, start=start, received=received)
        finally:
            dealer.close(linger=0)
        filled = sink.end_replay(self._clock.now(), upto)
        log.info(
            "kv_events_replayed",
            endpoint=self.endpoint,
            start=start,
            upto=upto,
            received=received,
            filled=filled,
        )
        return filled
