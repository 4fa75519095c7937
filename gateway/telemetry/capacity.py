"""KV-cache capacity in tokens, read from an engine's /metrics page when the engine exports it.

- vLLM: the info gauge `vllm:cache_config_info` carries the cache config as labels; capacity is
  `num_gpu_blocks × block_size` per engine core, added over data-parallel cores (label `engine`).
  Its KV usage gauge is averaged over cores, so usage × this sum is the used total.
- SGLang: the gauge `sglang:max_total_num_tokens` is the token pool size. Every tensor/pipeline-parallel
  rank reports the same pool, so ranks of one engine count once (label sets without `tp_rank` and
  `pp_rank` are added, ranks within one take the largest).

None when the page says nothing usable; the caller falls back to the configured capacity.
"""

from __future__ import annotations

import math
from typing import Final

from gateway.telemetry.promtext import Exposition

_VLLM_INFO: Final = ("vllm:cache_config_info", "vllm_cache_config_info")
_SGLANG_POOL: Final = ("sglang:max_total_num_tokens", "sglang_max_total_num_tokens")
_RANK_LABELS: Final = frozenset({"tp_rank", "pp_rank"})
#: The sample names `kv_capacity_tokens` reads (a scraper parses them and skips what nobody reads).
CAPACITY_SAMPLES: Final = (*_VLLM_INFO, *_SGLANG_POOL)


def kv_capacity_tokens(expo: Exposition) -> float | None:
    return _vllm(expo) or _sglang(expo)


def _vllm(expo: Exposition) -> float | None:
    for name in _VLLM_INFO:
        if not expo.has(name):
            continue
        per_engine: dict[str, float] = {}
        for s in expo.samples(name):
            try:
                blocks = float(s.labels["num_gpu_blocks"])
                block_size = float(s.labels["block_size"])
            except (KeyError, ValueError):
                continue
            tokens = blocks * block_size
            if math.isfinite(tokens) and tokens > 0:
                per_engine[s.labels.get("engine", "")] = tokens
        if per_engine:
            return sum(per_engine.values())
    return None


def _sglang(expo: Exposition) -> float | None:
    for name in _SGLANG_POOL:
        if not expo.has(name):
            continue
        groups: dict[tuple[tuple[str, str], ...], float] = {}
        for s in expo.samples(name):
            if not (math.isfinite(s.value) and s.value > 0):
                continue
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k not in _RANK_LABELS))
            groups[key] = max(groups.get(key, 0.0), s.value)
        if groups:
            return sum(groups.values())
    return None
