"""What differs between a simulated vLLM and a simulated SGLang endpoint (besides metric names,
which `metrics` renders): id prefixes, ``owned_by``, priority direction and histogram buckets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from loadgen.engine_sim.stats import HistogramBuckets

FlavorName = Literal["vllm", "sglang"]

VLLM_BUCKETS = HistogramBuckets(
    # vLLM V1 (vllm/v1/metrics/loggers.py)
    ttft=(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
          20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
    itl=(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
         40.0, 80.0),
    e2e=(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
         480.0, 960.0, 1920.0, 7680.0),
    queue=(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
           480.0, 960.0, 1920.0, 7680.0),
)  # fmt: skip

SGLANG_BUCKETS = HistogramBuckets(
    # SGLang python/sglang/srt/metrics/collector.py defaults
    ttft=(0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
          400.0),
    itl=(0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
         0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0),
    e2e=(0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
         600.0, 1200.0, 1800.0, 2400.0),
    queue=(0.0, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0,
           90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0, 900.0, 1000.0, 1200.0, 1400.0,
           1600.0, 1800.0, 2000.0, 2500.0, 3000.0),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Flavor:
    name: FlavorName
    owned_by: str
    chat_id_prefix: str
    completion_id_prefix: str
    higher_priority_first: bool  # vLLM: lower `priority` runs first; SGLang: higher runs first
    buckets: HistogramBuckets


VLLM = Flavor("vllm", "vllm", "chatcmpl-", "cmpl-", False, VLLM_BUCKETS)
SGLANG = Flavor("sglang", "sglang", "", "", True, SGLANG_BUCKETS)
FLAVORS: dict[str, Flavor] = {"vllm": VLLM, "sglang": SGLANG}


def get_flavor(name: str) -> Flavor:
    try:
        return FLAVORS[name]
    except KeyError:
        raise ValueError(f"unknown flavor {name!r} (vllm | sglang)") from None
