"""KV-cache events as berth reads them from an engine: the vocabulary shared by the decoder
(`gateway.upstream.kv_decode`, bytes in) and the per-endpoint store (`gateway.telemetry.prefix_precise`,
blocks out).

Only what the store acts on is kept: an engine's block hashes are opaque (an int, or bytes in some
vLLM configurations) and only ever compared; the token ids and the parent's hash let berth key each
block in its own key space (`gateway.core.blockhash`). `plain` is False for a block whose engine hash
covers more than its tokens (a LoRA adapter, multimodal inputs, a cache salt): berth's token key
would claim a match the engine would not make, so such a block is not keyed.
"""

from __future__ import annotations

from dataclasses import dataclass

EngineHash = int | bytes  # an engine's own block hash: opaque, compared only


@dataclass(frozen=True, slots=True)
class BlockStored:
    """`block_hashes` became cached: their tokens are `token_ids`, `block_size` tokens per block, the
    first chained to `parent` (None: the first block of a prompt)."""

    block_hashes: tuple[EngineHash, ...]
    parent: EngineHash | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = None  # where the blocks live ("GPU", "CPU", ...); None: unspecified (GPU)
    group: int = 0  # the KV-cache group (hybrid models have several)
    plain: bool = True  # keyed by tokens alone (no LoRA, multimodal inputs or cache salt)


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[EngineHash, ...]
    medium: str | None = None
    group: int = 0


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine dropped its whole prefix cache (a reset, or a restart)."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class KvBatch:
    """One published message: the events of one engine step, stamped with the engine's wall time."""

    ts: float  # the engine's time.time() when it published the batch
    events: tuple[KvEvent, ...]
    dp_rank: int | None = None  # the data-parallel rank that published it, when the engine says
    unknown: int = 0  # events of kinds this decoder does not know (skipped)
