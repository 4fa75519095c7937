"""The KV-event decoder: both wire forms, built here with msgspec structs declared the way the engines
declare theirs (positional: vLLM before mid-2026 and SGLang; maps tagged by `type`: vLLM and SGLang
since), plus a stream recorded from a real vLLM (tests/unit/data/kv_events_vllm.msgpack)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.core.blockhash import token_chain
from gateway.core.kvevents import AllBlocksCleared, BlockRemoved, BlockStored
from gateway.telemetry.prefix_precise import PreciseStore
from gateway.upstream.kv_decode import KvDecodeError, decode_batch

DATA = Path(__file__).parent / "data"


# ---- the engines' declarations, as they encode (positional) -------------------------------------
class _Event(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    pass


class VllmOldStored(_Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class VllmOldRemoved(_Event, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class OldCleared(_Event, tag="AllBlocksCleared"):
    pass


class SglangStored(_Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class SglangRemoved(_Event, tag="BlockRemoved"):
    block_hashes: list[int]


class Batch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[Any]
    dp_rank: int | None = None


class SglangFirstBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[Any]


# ---- the newer form: maps tagged by `type` --------------------------------------------------------
class _MapEvent(msgspec.Struct, omit_defaults=True, tag=True):
    pass


class MapStored(_MapEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    session_id: str | None = None  # a field this decoder does not know


class MapRemoved(_MapEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class MapCleared(_MapEvent, tag="AllBlocksCleared"):
    pass


class MapFuture(_MapEvent, tag="BlockPinned"):  # an event kind this decoder does not know
    block_hashes: list[int]


TOKENS = list(range(32))


def test_positional_vllm() -> None:
    payload = msgspec.msgpack.encode(
        Batch(
            1.5,
            [VllmOldStored([1, 2], None, TOKENS, 16, None, "GPU"), VllmOldRemoved([2], "GPU"), OldCleared()],
            0,
        )
    )
    b = decode_batch(payload)
    assert (b.ts, b.dp_rank, b.unknown) == (1.5, 0, 0)
    assert b.events == (
        BlockStored((1, 2), None, tuple(TOKENS), 16, medium="GPU"),
        BlockRemoved((2,), medium="GPU"),
        AllBlocksCleared(),
    )


@pytest.mark.parametrize("with_rank", [True, False], ids=["attn_dp_rank", "two-field batch"])
def test_positional_sglang(with_rank: bool) -> None:
    events = [SglangStored([5], 4, TOKENS[:16], 16, None), SglangRemoved([5])]
    payload = msgspec.msgpack.encode(Batch(2.0, events, 1) if with_rank else SglangFirstBatch(2.0, events))
    b = decode_batch(payload)
    assert b.events == (BlockStored((5,), 4, tuple(TOKENS[:16]), 16), BlockRemoved((5,)))
    assert b.dp_rank == (1 if with_rank else None)


def test_map_form_ignores_unknown_keys_and_events() -> None:
    events: list[Any] = [
        MapStored([b"\x01" * 32], None, TOKENS[:16], 16, None, "GPU", None, [None], 0, "s1"),
        MapFuture([1]),
        MapRemoved([b"\x01" * 32], "GPU", 0),
        MapCleared(),
    ]
    b = decode_batch(msgspec.msgpack.encode(Batch(3.0, events, 0)))
    assert b.unknown == 1
    assert b.events == (
        BlockStored((b"\x01" * 32,), None, tuple(TOKENS[:16]), 16, medium="GPU"),
        BlockRemoved((b"\x01" * 32,), medium="GPU"),
        AllBlocksCleared(),
    )


@pytest.mark.parametrize(
    ("lora_name", "extra"),
    [("adapter", [None]), (None, [["salt"]])],
    ids=["lora", "cache salt"],
)
def test_blocks_keyed_by_more_than_tokens_are_not_plain(lora_name: str | None, extra: list[Any]) -> None:
    event = MapStored([1], None, TOKENS[:16], 16, None, "GPU", lora_name, extra)
    (decoded,) = decode_batch(msgspec.msgpack.encode(Batch(3.0, [event]))).events
    assert isinstance(decoded, BlockStored)
    assert not decoded.plain


@pytest.mark.parametrize(
    "payload",
    [b"\xc1", msgspec.msgpack.encode({"x": 1}), msgspec.msgpack.encode([1.0, [["BlockStored", "nope"]]])],
    ids=["not msgpack", "not a batch", "a malformed known event"],
)
def test_undecodable(payload: bytes) -> None:
    with pytest.raises(KvDecodeError):
        decode_batch(payload)


def test_a_recorded_real_vllm_stream() -> None:
    """Recorded from vLLM 0.32 (CPU) serving the engine tier's tiny model with prefix caching on: a
    1,100-token prompt (8 full blocks of 128), then one sharing it and 200 tokens more (2 new blocks,
    chained to the first prompt's last). The events are maps tagged by `type`, the hashes ints."""
    frames = msgspec.msgpack.decode((DATA / "kv_events_vllm.msgpack").read_bytes())
    store = PreciseStore("vllm", now=0.0)
    store.connected(0.0)
    tokens: list[int] = []
    for seq_bytes, payload in frames:
        batch = decode_batch(payload)
        for e in batch.events:
            assert isinstance(e, BlockStored)
            tokens.extend(e.token_ids)
        assert store.on_live(int.from_bytes(seq_bytes, "big"), batch, 0.0, batch.ts) is None
    assert store.block_tokens == 128
    assert store.cached_blocks() == 10
    assert store.matched(token_chain(tokens, 128)) == 10
    assert store.status(0.0).orphans == 0
