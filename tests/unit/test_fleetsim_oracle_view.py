"""The fleet simulator's oracle over the engine simulator's own cache keys: berth's token-id keys are
translated through the token ids the simulation hands the index (`KeyBridge`), so the oracle answers
exactly what the engine's cache holds."""

from __future__ import annotations

import numpy as np

from gateway.core.blockhash import token_chain
from gateway.core.types import ApiKind
from loadgen.engine_sim.prefix_cache import PrefixCache
from loadgen.engine_sim.protocol import prompt_token_ids
from loadgen.engine_sim.tokens import TokenIds
from loadgen.fleetsim.prefix_oracle import KeyBridge, ViewHolder, cache_view


class _Req:
    def __init__(self, ids: list[int], cache: PrefixCache) -> None:
        arr = np.asarray(ids, dtype=np.int64)
        self.token_ids: TokenIds | None = arr
        self.block_keys: list[int] | None = cache.block_keys(arr)
        self.blocks_held = 0
        self.cached_tokens = 0
        self.kv_held = 0
        self.generated = 0


def test_the_view_holder_answers_what_the_engine_holds() -> None:
    cache = PrefixCache(16)
    bridge = KeyBridge()
    holder = ViewHolder(cache, bridge)
    assert cache_view(type("E", (), {"prefix_cache": cache})()) is cache
    body = {"prompt": "the cat sat " * 40}  # 120 words: 30 full 16-token blocks... of 4-char tokens
    ids = bridge.token_ids(ApiKind.COMPLETION, body)
    assert ids is not None
    expected = prompt_token_ids("completion", body)
    assert expected is not None
    assert ids == expected.tolist()
    keys = token_chain(ids, 16)
    assert holder.matched(keys) == 0  # nothing cached yet
    req = _Req(ids, cache)
    plan = cache.plan(req, len(ids))
    cache.admit(req, len(ids), plan, at=0.0)
    assert holder.matched(keys) == len(ids) // 16  # every full block, by the engine's own keys
    assert holder.matched(keys[:3]) == 3
    assert holder.matched([123, *keys]) == 0  # a key it never learned: nothing
    assert holder.block_tokens == 16
    assert holder.cached_blocks() == len(cache)
