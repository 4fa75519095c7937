"""KV events published the way vLLM publishes them (``--kv-events-config``, `vllm/distributed/kv_events.py`).

**Sockets.** A ZMQ PUB socket bound at ``--kv-events tcp://HOST:PORT`` (the simulator always binds; vLLM
binds when the host is ``*`` and connects otherwise) sends one message per engine step that changed the
cache: three frames ``[topic, seq, payload]``, the topic empty (vLLM's default), ``seq`` a counter from 0
as 8 bytes big-endian, the payload a msgpack batch (msgspec). With ``--kv-events-replay tcp://HOST:PORT``
a ROUTER socket answers a replay request ``[b"", start_seq as 8 bytes big-endian]`` (a REQ socket sends
the empty delimiter itself, a DEALER must add it) with every buffered message from ``start_seq`` on, then
an end marker whose seq is -1 (8 bytes, signed) and whose payload is empty; it keeps the last 10,000
messages (vLLM's ``buffer_steps``). A request of any other shape is ignored, as vLLM does. Current vLLM
(format ``map``) sends each replayed message as the PUB socket does, ``[b"", topic, seq, payload]``, and
ends with ``[b"", b"", END, b""]``; older vLLM and SGLang (format ``array``) leave the topic out:
``[b"", seq, payload]``, ``[b"", END, b""]``. Port 0 binds a free port (`KVEventPublisher.endpoint`).

**Encodings** (``--kv-events-format``):

- ``map``, what current vLLM sends (its ``KVCacheEvent`` structs are no longer ``array_like``, its
  ``EventBatch`` still is): the batch ``[ts, events, data_parallel_rank]``, each event a map tagged by
  ``type``: ``{"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids", "block_size",
  "lora_id", "medium", "lora_name"}``, ``{"type": "BlockRemoved", "block_hashes", "medium"}``,
  ``{"type": "AllBlocksCleared"}``;
- ``array``, what vLLM sent before (and SGLang's publisher, without ``medium``): the batch
  ``[ts, events, data_parallel_rank]``, each event ``["BlockStored", block_hashes, parent_block_hash,
  token_ids, block_size, lora_id, medium]``, ``["BlockRemoved", block_hashes, medium]``,
  ``["AllBlocksCleared"]``.

Block hashes are unsigned 64-bit ints (vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``) from a chain seeded
at random per process: a consumer must key blocks by their ``token_ids``, not by these hashes.
``medium`` is ``"GPU"``, ``data_parallel_rank`` 0, ``lora_id``/``lora_name`` null.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Sequence
from typing import Final

import msgspec
import zmq
import zmq.asyncio

from gateway.core.tasks import TaskSupervisor
from loadgen.engine_sim.prefix_cache import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from loadgen.engine_sim.spec import KVEventsFormat, tcp_port

MEDIUM: Final = "GPU"
END_SEQ: Final = (-1).to_bytes(8, "big", signed=True)
BUFFER_STEPS: Final = 10_000


# ---- current vLLM: maps tagged by "type" -------------------------------------------------------------
class _MapEvent(msgspec.Struct, tag_field="type"):
    pass


class MapBlockStored(_MapEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class MapBlockRemoved(_MapEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class MapAllBlocksCleared(_MapEvent, tag="AllBlocksCleared"):
    pass


class MapBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[MapBlockStored | MapBlockRemoved | MapAllBlocksCleared]
    data_parallel_rank: int | None = None


# ---- older vLLM (and SGLang): positional arrays, the tag first ---------------------------------------
class _ArrayEvent(msgspec.Struct, array_like=True, tag=True):
    pass


class ArrayBlockStored(_ArrayEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class ArrayBlockRemoved(_ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class ArrayAllBlocksCleared(_ArrayEvent, tag="AllBlocksCleared"):
    pass


class ArrayBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[ArrayBlockStored | ArrayBlockRemoved | ArrayAllBlocksCleared]
    data_parallel_rank: int | None = None


_ENCODER = msgspec.msgpack.Encoder()


def encode_batch(events: Sequence[KVEvent], ts: float, fmt: KVEventsFormat) -> bytes:
    """One message's payload."""
    if fmt == "map":
        mapped: list[MapBlockStored | MapBlockRemoved | MapAllBlocksCleared] = []
        for e in events:
            if isinstance(e, BlockStored):
                mapped.append(
                    MapBlockStored(
                        e.block_hashes, e.parent_block_hash, e.token_ids, e.block_size, None, MEDIUM, None
                    )
                )
            elif isinstance(e, BlockRemoved):
                mapped.append(MapBlockRemoved(e.block_hashes, MEDIUM))
            else:
                mapped.append(MapAllBlocksCleared())
        return _ENCODER.encode(MapBatch(ts, mapped, 0))
    arrays: list[ArrayBlockStored | ArrayBlockRemoved | ArrayAllBlocksCleared] = []
    for e in events:
        if isinstance(e, BlockStored):
            arrays.append(
                ArrayBlockStored(e.block_hashes, e.parent_block_hash, e.token_ids, e.block_size, None, MEDIUM)
            )
        elif isinstance(e, BlockRemoved):
            arrays.append(ArrayBlockRemoved(e.block_hashes, MEDIUM))
        else:
            arrays.append(ArrayAllBlocksCleared())
    return _ENCODER.encode(ArrayBatch(ts, arrays, 0))


def _bind_address(endpoint: str) -> str:
    port = tcp_port(endpoint)
    return endpoint if port else endpoint[: endpoint.rindex(":")] + ":*"


class KVEventPublisher:
    """The PUB socket (and the replay ROUTER) of one simulated endpoint; `publish` never blocks (a PUB
    socket drops what a slow subscriber cannot take, past its high-water mark)."""

    def __init__(
        self,
        endpoint: str,
        *,
        replay: str | None = None,
        fmt: KVEventsFormat = "map",
        topic: str = "",
        buffer_steps: int = BUFFER_STEPS,
    ) -> None:
        self._fmt: KVEventsFormat = fmt
        self._topic = topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._tasks = TaskSupervisor(restart_delay_s=0.1)
        self._pub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.set_hwm(100_000)
        self._replay: zmq.asyncio.Socket | None = None
        try:
            self._pub.bind(_bind_address(endpoint))
            self.endpoint: str = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
            self.replay_endpoint: str | None = None
            if replay is not None:
                self._replay = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(_bind_address(replay))
                self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
                self._tasks.spawn(f"kv-events-replay:{self.replay_endpoint}", self._serve_replay)
        except BaseException:
            self._close_sockets()
            raise

    @property
    def next_seq(self) -> int:
        return self._seq

    def publish(self, events: Sequence[KVEvent], ts: float | None = None) -> None:
        if not events:
            return
        payload = encode_batch(events, time.time() if ts is None else ts, self._fmt)
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        with contextlib.suppress(zmq.Again):  # a PUB socket drops rather than block; replay still has it
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK)

    def all_blocks_cleared(self) -> None:
        self.publish([AllBlocksCleared()])

    async def _serve_replay(self) -> None:
        sock = self._replay
        assert sock is not None
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 3:
                continue  # vLLM logs "Invalid replay request" and ignores it
            client, _, start_bytes = frames
            start = int.from_bytes(start_bytes, "big")
            topic = (self._topic,) if self._fmt == "map" else ()
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await sock.send_multipart((client, b"", *topic, seq.to_bytes(8, "big"), payload))
            await sock.send_multipart((client, b"", *topic, END_SEQ, b""))

    async def close(self) -> None:
        await self._tasks.close()
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
