"""A real ZMQ KV-event publisher for tests: an XPUB socket (so the test knows when a subscriber's
subscription has arrived, instead of sleeping) and a ROUTER replay socket, shaped as vLLM's (replies
`[b"", topic, seq, payload]`) or SGLang's (`[b"", seq, payload]`). The test decides which batches are
sent live and which only enter the replay buffer (a gap), and where the buffer begins (a gap too old)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Literal

import msgspec
import zmq
import zmq.asyncio

END = (-1).to_bytes(8, "big", signed=True)


def stored(hashes: list[int], tokens: list[int], parent: int | None, block_size: int) -> list[Any]:
    """A positional vLLM BlockStored."""
    return ["BlockStored", hashes, parent, tokens, block_size, None, "GPU"]


def removed(hashes: list[int]) -> list[Any]:
    return ["BlockRemoved", hashes, "GPU"]


CLEARED: list[Any] = ["AllBlocksCleared"]


class TestPublisher:
    __test__ = False  # not a test class

    def __init__(self, ctx: zmq.asyncio.Context, *, replay_form: Literal["vllm", "sglang"] = "vllm") -> None:
        self._ctx = ctx
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.replay_form = replay_form
        self.buffer: list[tuple[int, bytes]] = []
        self.seq = 0
        self.replay_requests: list[int] = []
        self._server: asyncio.Task[None] | None = None

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    async def wait_subscriber(self, timeout_s: float = 5.0) -> None:
        """Until a subscription arrives (XPUB passes it up as `\\x01` + topic)."""
        async with asyncio.timeout(timeout_s):
            while True:
                msg = await self.pub.recv()
                if msg[:1] == b"\x01":
                    return

    def publish(self, events: list[Any], *, send: bool = True, ts: float = 1.0e9) -> int:
        """Number the batch, keep it for replay, and (unless `send` is False: a lost batch) send it."""
        seq = self.seq
        self.seq += 1
        payload = msgspec.msgpack.encode([ts, events, 0])
        self.buffer.append((seq, payload))
        if send:
            self.pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
        return seq

    def forget_before(self, seq: int) -> None:
        """The replay buffer no longer holds batches before `seq`."""
        self.buffer = [(s, p) for s, p in self.buffer if s >= seq]

    def serve_replay(self) -> None:
        self._server = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            client, _, start = await self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            self.replay_requests.append(first)
            for seq, payload in self.buffer:
                if seq >= first:
                    frames = [seq.to_bytes(8, "big"), payload]
                    if self.replay_form == "vllm":
                        frames.insert(0, b"")
                    await self.router.send_multipart([client, b"", *frames])
            tail = [b"", END, b""] if self.replay_form == "vllm" else [END, b""]
            await self.router.send_multipart([client, b"", *tail])

    async def close(self) -> None:
        if self._server is not None:
            self._server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._server
        self.pub.close(linger=0)
        self.router.close(linger=0)
