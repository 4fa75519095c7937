"""Decode the payload of one KV-event message (vLLM's and SGLang's ZMQ publishers) into a `KvBatch`.

The payload is msgpack: a batch `[ts, events, dp_rank]` (SGLang's first releases send `[ts, events]`),
each event in one of two forms, both decoded:
- positional (vLLM until mid-2026, SGLang): a tagged array `["BlockStored", block_hashes,
  parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx, ...]`,
  `["BlockRemoved", block_hashes, medium, group_idx, ...]`, `["AllBlocksCleared"]`; fields were only
  ever appended, so an older engine sends a prefix of these (SGLang: `BlockStored` up to `lora_id`,
  `BlockRemoved` with `block_hashes` only) and a newer one more (ignored);
- a map tagged by `type` (vLLM and SGLang since mid-2026): `{"type": "BlockStored", "block_hashes":
  ..., ...}` with the same field names; unknown keys are ignored.
An event of a kind not listed here is skipped and counted (`KvBatch.unknown`); a listed kind that does
not decode makes the whole batch fail (`KvDecodeError`): skipping a removal would leave a stale block.

Read from vLLM's `vllm/distributed/kv_events.py` and SGLang's `python/sglang/srt/disaggregation/
kv_events.py` (msgspec structs: the batch `array_like`, the events `tag=True`, positional while they
were `array_like` too).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from gateway.core.kvevents import AllBlocksCleared, BlockRemoved, BlockStored, EngineHash, KvBatch, KvEvent

_KINDS: Final = frozenset({"BlockStored", "BlockRemoved", "AllBlocksCleared"})


class KvDecodeError(ValueError):
    """A payload that is not a KV-event batch, or a known event that does not decode."""


# ------------------------------------------------------------------ the wire forms (decode only)
class _StoredFields(msgspec.Struct, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None = None
    token_ids: list[int] = []
    block_size: int = 0
    lora_id: Any = None  # only checked for None
    medium: str | None = None
    lora_name: Any = None
    extra_keys: Any = None  # one entry per block, None for a plain block
    group_idx: int | None = None


class _RemovedFields(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None = None
    group_idx: int | None = None


class _ClearedFields(msgspec.Struct, tag="AllBlocksCleared"):
    pass


class _StoredArray(_StoredFields, array_like=True, tag="BlockStored"):
    pass


class _RemovedArray(_RemovedFields, array_like=True, tag="BlockRemoved"):
    pass


class _ClearedArray(_ClearedFields, array_like=True, tag="AllBlocksCleared"):
    pass


class _BatchArray(msgspec.Struct, array_like=True):
    ts: float
    events: list[msgspec.Raw]
    dp_rank: int | None = None


class _BatchMap(msgspec.Struct):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None
    attn_dp_rank: int | None = None  # SGLang's name


_Wire = _StoredFields | _RemovedFields | _ClearedFields

_BATCH_ARRAY: Final = msgspec.msgpack.Decoder(_BatchArray)
_BATCH_MAP: Final = msgspec.msgpack.Decoder(_BatchMap)
_EVENT_ARRAY: Final = msgspec.msgpack.Decoder(_StoredArray | _RemovedArray | _ClearedArray)
_EVENT_MAP: Final = msgspec.msgpack.Decoder(_StoredFields | _RemovedFields | _ClearedFields)
_ANY: Final = msgspec.msgpack.Decoder()


def _is_map(raw: bytes | memoryview) -> bool:
    """Whether a msgpack value is a map (fixmap 0x80-0x8f, map16 0xde, map32 0xdf)."""
    first = raw[0] if len(raw) else 0
    return 0x80 <= first <= 0x8F or first in (0xDE, 0xDF)


def decode_batch(payload: bytes) -> KvBatch:
    """The batch in `payload` (the third frame of a message). Raises KvDecodeError."""
    try:
        if _is_map(payload):
            m = _BATCH_MAP.decode(payload)
            ts, raws = m.ts, m.events
            rank = m.data_parallel_rank if m.data_parallel_rank is not None else m.attn_dp_rank
        else:
            a = _BATCH_ARRAY.decode(payload)
            ts, raws, rank = a.ts, a.events, a.dp_rank
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise KvDecodeError(f"not a KV-event batch: {e}") from None
    events: list[KvEvent] = []
    unknown = 0
    for raw in raws:
        event = _decode_event(raw)
        if event is None:
            unknown += 1
        else:
            events.append(event)
    return KvBatch(ts=ts, events=tuple(events), dp_rank=rank, unknown=unknown)


def _decode_event(raw: msgspec.Raw) -> KvEvent | None:
    as_map = _is_map(memoryview(raw))
    try:
        wire: _Wire = (_EVENT_MAP if as_map else _EVENT_ARRAY).decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        if _kind_of(raw, as_map) in _KINDS:
            raise KvDecodeError(f"a malformed KV event: {e}") from None
        return None  # a kind this decoder does not know
    return _event_of(wire)


def _kind_of(raw: msgspec.Raw, as_map: bool) -> object:
    try:
        value = _ANY.decode(raw)
    except msgspec.DecodeError:
        return None
    if as_map:
        return value.get("type") if isinstance(value, dict) else None
    return value[0] if isinstance(value, list) and value else None


def _hashes(values: list[int | bytes]) -> tuple[EngineHash, ...]:
    return tuple(values)


def _event_of(wire: _Wire) -> KvEvent:
    if isinstance(wire, _StoredFields):
        extra = wire.extra_keys
        plain = (
            wire.lora_id is None
            and wire.lora_name is None
            and (not extra or all(e is None for e in extra) if isinstance(extra, list) else extra is None)
        )
        return BlockStored(
            block_hashes=_hashes(wire.block_hashes),
            parent=wire.parent_block_hash,
            token_ids=tuple(wire.token_ids),
            block_size=wire.block_size,
            medium=wire.medium,
            group=wire.group_idx or 0,
            plain=plain,
        )
    if isinstance(wire, _RemovedFields):
        return BlockRemoved(
            block_hashes=_hashes(wire.block_hashes), medium=wire.medium, group=wire.group_idx or 0
        )
    return AllBlocksCleared()
