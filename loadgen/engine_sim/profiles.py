"""Named engine presets (``--profile``), derived from the figures in papers/ALGORITHMS.md.

Aladdin's A100 SLOs anchor the single-GPU presets: Llama-2 7B prefill 400 ms / decode 15 ms, 13B
600 ms / 30 ms, 70B 1600 ms / 75 ms. The coefficients are chosen so that a lone request decodes well
inside the decode SLO, a full batch with long contexts exceeds it (so placement matters), and a
prompt of a few thousand tokens prefills inside the prefill SLO:

| preset          | prefill k1, c1     | decode k2, c2, c3       | t_dec 1 / 32 reqs @ 500 ctx | KV tokens |
| --------------- | ------------------ | ----------------------- | --------------------------- | --------- |
| a100-llama2-7b  | 0.10 ms/tok, 15 ms | 0.38 us, 0.15 ms, 11 ms | 11 ms / 22 ms               | 110 000   |
| a100-llama2-13b | 0.20 ms/tok, 25 ms | 0.60 us, 0.25 ms, 20 ms | 20 ms / 38 ms               |  56 000   |
| a100-llama2-70b | 0.45 ms/tok, 60 ms | 1.40 us, 0.60 ms, 45 ms | 46 ms / 87 ms               | 400 000   |

KV capacities: fp16 KV of Llama-2 7B is ~0.5 MB/token (80 GB A100, 90 % utilisation, 13.5 GB of
weights → ~110k tokens); 13B ~0.8 MB/token → ~56k; 70B (GQA, TP=4 on four A100-80GB) ~0.33 MB/token →
~400k. Load times are typical cold starts from local NVMe.

**Fleet-benchmark presets** (``fleet-*``): a 12-endpoint fleet on a 2-core machine must reach
saturation at a token rate the machine can stream (a few thousand chunks/s in total), so these have a
modest ``max_num_seqs`` and per-token decode times in the tens of ms: ``fleet-7b`` saturates at roughly
16 / 0.06 s ≈ 270 tokens/s per endpoint (≈ 3 200 chunks/s for 12 endpoints); ``fleet-13b`` at ≈ 110.
Use them (not the a100-* presets, which saturate only at many thousands of tokens/s per endpoint) for
fleet-level experiments on small machines. ``test-fast`` is for unit and HTTP tests.

**Long-context GQA presets** (prefix caching on, as vLLM V1 enables it by default; 16-token blocks):

- ``h100-llama3-8b``: Llama-3.1-8B on one H100-80GB, 128k context. KV per token: 32 layers x 8 KV heads x
  128 dims x 2 (K, V) x 2 bytes = 128 KiB; 80 GB x 0.9 utilisation - 16 GB of weights - ~4 GB of
  activations and CUDA graphs leaves ~52 GB, about 420k tokens (vLLM logs 27-32k blocks of 16 for this
  setup): 450,000. Prefill ~16 GFLOP per token at ~40 % of the H100's 989 dense bf16 TFLOPS, about
  25k tokens/s (k1 = 40 us); decode reads 16 GB of weights per iteration at 3.35 TB/s (~5 ms, c3 = 7 ms
  with overheads) and 128 KiB per context token (k2 = 40 ns).
- ``h100x4-llama3-70b``: Llama-3.1-70B, TP=4 on four H100-80GB, 128k context. KV per token: 80 layers x
  8 x 128 x 2 x 2 bytes = 320 KiB; 4 x 72 GB - 140 GB of weights - ~12 GB leaves ~136 GB, about 415k
  tokens: 400,000. Prefill ~140 GFLOP per token on four GPUs at ~45 %, about 13k tokens/s (k1 = 80 us);
  decode reads 35 GB of weights per GPU (~10.5 ms, c3 = 15 ms with the all-reduces) and 80 KiB per
  context token per GPU (k2 = 25 ns).
- ``fleet-8b-long``: a fleet-benchmark preset for long prompts (the Mooncake traces: inputs p50 ~7k,
  p90 ~27k tokens, up to 126k; outputs p50 ~350): the 8B model's 128k context and KV sized for a few
  long prompts plus their cached prefixes (262,144 tokens), 16 sequences and decode iterations of
  25-70 ms at 8k-token contexts (so 12 endpoints stream a few thousand chunks/s at saturation on 2
  cores), prefill slowed to 10k tokens/s (k1 = 100 us: a 7k-token prompt takes 0.7 s, comparable to its
  decode), so what the cache saves shows in TTFT and in capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

from loadgen.engine_sim.latency import LatencyModel
from loadgen.engine_sim.lengths import DEFAULT_OUTPUT_LEN, LengthDist


@dataclass(frozen=True, slots=True)
class EngineProfile:
    latency: LatencyModel
    max_num_seqs: int
    kv_capacity_tokens: int
    max_model_len: int = 4096
    max_prefill_tokens: int = 8192
    load_time_s: float = 0.0
    output_len: LengthDist = DEFAULT_OUTPUT_LEN
    fleet_bench: bool = False  # sized so a 12-endpoint fleet saturates at a rate 2 cores can stream
    prefix_caching: bool = False  # automatic prefix caching (vLLM V1's default is on)
    block_size: int = 16  # KV block size in tokens (vLLM: 16 on GPU, 128 on CPU)
    description: str = ""


PROFILES: dict[str, EngineProfile] = {
    "a100-llama2-7b": EngineProfile(
        latency=LatencyModel(k1=1.0e-4, c1=0.015, k2=3.8e-7, c2=1.5e-4, c3=0.011),
        max_num_seqs=256,
        kv_capacity_tokens=110_000,
        load_time_s=20.0,
        description="Llama-2 7B on one A100-80GB (Aladdin SLO: prefill 400 ms, decode 15 ms)",
    ),
    "a100-llama2-13b": EngineProfile(
        latency=LatencyModel(k1=2.0e-4, c1=0.025, k2=6.0e-7, c2=2.5e-4, c3=0.020),
        max_num_seqs=256,
        kv_capacity_tokens=56_000,
        load_time_s=35.0,
        description="Llama-2 13B on one A100-80GB (Aladdin SLO: prefill 600 ms, decode 30 ms)",
    ),
    "a100-llama2-70b": EngineProfile(
        latency=LatencyModel(k1=4.5e-4, c1=0.060, k2=1.4e-6, c2=6.0e-4, c3=0.045),
        max_num_seqs=256,
        kv_capacity_tokens=400_000,
        load_time_s=120.0,
        description="Llama-2 70B, TP=4 on four A100-80GB (Aladdin SLO: prefill 1600 ms, decode 75 ms)",
    ),
    "fleet-7b": EngineProfile(
        latency=LatencyModel(k1=2.0e-4, c1=0.020, k2=2.0e-6, c2=1.0e-3, c3=0.025),
        max_num_seqs=16,
        kv_capacity_tokens=16_384,
        load_time_s=5.0,
        fleet_bench=True,
        description="fleet-benchmark 7B: 16 seqs, ~25-60 ms per decode iteration",
    ),
    "fleet-13b": EngineProfile(
        latency=LatencyModel(k1=3.0e-4, c1=0.030, k2=3.0e-6, c2=2.0e-3, c3=0.045),
        max_num_seqs=8,
        kv_capacity_tokens=8_192,
        load_time_s=8.0,
        fleet_bench=True,
        description="fleet-benchmark 13B: 8 seqs, ~45-75 ms per decode iteration",
    ),
    "h100-llama3-8b": EngineProfile(
        latency=LatencyModel(k1=4.0e-5, c1=0.010, k2=4.0e-8, c2=5.0e-5, c3=0.007),
        max_num_seqs=256,
        kv_capacity_tokens=450_000,
        max_model_len=131_072,
        load_time_s=25.0,
        prefix_caching=True,
        description="Llama-3.1-8B (GQA) on one H100-80GB: 128k context, 450k KV tokens, prefix caching",
    ),
    "h100x4-llama3-70b": EngineProfile(
        latency=LatencyModel(k1=8.0e-5, c1=0.030, k2=2.5e-8, c2=1.0e-4, c3=0.015),
        max_num_seqs=256,
        kv_capacity_tokens=400_000,
        max_model_len=131_072,
        load_time_s=150.0,
        prefix_caching=True,
        description="Llama-3.1-70B (GQA), TP=4 on 4 H100-80GB: 128k context, 400k KV tokens, prefix caching",
    ),
    "fleet-8b-long": EngineProfile(
        latency=LatencyModel(k1=1.0e-4, c1=0.020, k2=2.0e-7, c2=1.0e-3, c3=0.025),
        max_num_seqs=16,
        kv_capacity_tokens=262_144,
        max_model_len=131_072,
        max_prefill_tokens=16_384,
        load_time_s=5.0,
        fleet_bench=True,
        prefix_caching=True,
        description="fleet-benchmark long-context 8B: 128k context, 262k KV tokens, prefix caching",
    ),
    "fleet-8b-trace": EngineProfile(
        latency=LatencyModel(k1=1.0e-4, c1=0.020, k2=2.0e-7, c2=1.0e-3, c3=0.025),
        max_num_seqs=16,
        kv_capacity_tokens=1_048_576,
        max_model_len=131_072,
        max_prefill_tokens=16_384,
        load_time_s=5.0,
        fleet_bench=True,
        prefix_caching=True,
        description="fleet-8b-long with 1M KV tokens: the Mooncake traces' long prompts leave room to cache",
    ),
    "test-fast": EngineProfile(
        latency=LatencyModel(k1=1.0e-5, c1=0.002, k2=0.0, c2=1.0e-4, c3=0.002),
        max_num_seqs=8,
        kv_capacity_tokens=8_192,
        load_time_s=0.0,
        output_len=LengthDist("uniform", 4.0, 16.0),
        description="tiny, fast engine for tests (a few ms per iteration)",
    ),
}

DEFAULT_PROFILE = "fleet-7b"


def get_profile(name: str) -> EngineProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None
