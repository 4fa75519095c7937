"""The simulator's /metrics text parses with berth's own parser and carries every name berth reads."""

from __future__ import annotations

import math

import pytest

from gateway.core.clock import FakeClock
from gateway.core.types import EngineKind
from gateway.telemetry.engine_metrics import SGLANG_METRICS, VLLM_METRICS, EngineMetrics, detect_engine
from gateway.telemetry.promtext import parse
from loadgen.engine_sim import metrics
from loadgen.engine_sim.engine import EngineConfig, SimEngine
from loadgen.engine_sim.flavors import FLAVORS, Flavor
from loadgen.engine_sim.latency import LatencyModel
from loadgen.engine_sim.stats import EngineStats

DIALECTS: dict[str, EngineMetrics] = {"vllm": VLLM_METRICS, "sglang": SGLANG_METRICS}


def busy_engine(flavor: Flavor) -> SimEngine:
    """An engine with a finished request, two running and two waiting."""
    clock = FakeClock()
    eng = SimEngine(
        EngineConfig(
            latency=LatencyModel(k1=1e-4, c1=0.01, k2=1e-6, c2=1e-3, c3=0.02),
            max_num_seqs=2,
            kv_capacity_tokens=1000,
        ),
        stats=EngineStats(flavor.buckets),
    )
    eng.submit("done", prompt_tokens=50, output_tokens=3, now=clock.now())
    res = eng.step(clock.now())
    while res.next_wake is not None:
        clock.set(res.next_wake)
        res = eng.step(clock.now())
    for i in range(4):
        eng.submit(f"r{i}", prompt_tokens=300, output_tokens=200, now=clock.now())
    for _ in range(40):
        res = eng.step(clock.now())
        assert res.next_wake is not None
        clock.set(res.next_wake)
    return eng


@pytest.mark.parametrize("flavor", sorted(FLAVORS), ids=sorted(FLAVORS))
def test_metrics_parse_and_carry_every_name_berth_reads(flavor: str) -> None:
    fl = FLAVORS[flavor]
    eng = busy_engine(fl)
    text = metrics.render(fl, eng, "my-model", started_unix=1.7e9, gen_throughput=12.5)
    expo = parse(text)
    assert expo.bad_lines == 0
    dialect = DIALECTS[flavor]
    # the first (current) spelling of every name the dialect reads is on the page
    for names in (
        dialect.running,
        dialect.waiting,
        dialect.kv_usage,
        dialect.prompt_tokens,
        dialect.generation_tokens,
    ):
        assert expo.has(names[0]), names[0]
    for names in (dialect.ttft, dialect.itl, dialect.e2e):
        assert expo.has(names[0] + "_bucket"), names[0]
        assert expo.has(names[0] + "_count"), names[0]
    for name in metrics.VLLM_NAMES if flavor == "vllm" else metrics.SGLANG_NAMES:
        assert expo.has(name) or expo.has(name + "_bucket"), name
    assert detect_engine(expo) is EngineKind(flavor)

    gauges = dialect.gauges(expo)
    assert gauges.running == eng.num_running == 2
    assert gauges.waiting == eng.num_waiting
    assert gauges.kv_usage == pytest.approx(eng.kv_usage)
    assert 0.0 < eng.kv_usage <= 1.0
    assert dialect.prompt_tokens_total(expo) == eng.stats.prompt_tokens
    assert dialect.generation_tokens_total(expo) == eng.stats.generation_tokens
    ttft = dialect.ttft_histogram(expo)
    assert ttft is not None
    assert ttft.count == eng.stats.ttft.count
    assert ttft.sum == pytest.approx(eng.stats.ttft.sum)
    itl = dialect.itl_histogram(expo)
    assert itl is not None
    assert itl.count == eng.stats.itl.count > 0
    assert math.isinf(itl.buckets[-1][0])
    assert itl.buckets[-1][1] == itl.count


def test_vllm_types_and_labels() -> None:
    fl = FLAVORS["vllm"]
    expo = parse(metrics.render(fl, busy_engine(fl), "m", started_unix=1.7e9))
    kinds = {name: fam.type for name, fam in expo.families.items()}
    assert kinds["vllm:num_requests_running"] == "gauge"
    assert kinds["vllm:kv_cache_usage_perc"] == "gauge"
    assert kinds["vllm:time_to_first_token_seconds"] == "histogram"
    assert kinds["vllm:e2e_request_latency_seconds"] == "histogram"
    counters = [n for n, t in kinds.items() if t == "counter"]
    assert any(n.startswith("vllm:prompt_tokens") for n in counters)
    assert any(n.startswith("vllm:num_preemptions") for n in counters)
    assert expo.value("vllm:num_requests_running", model_name="m", engine="0") == 2
    assert expo.value("vllm:num_preemptions_total", model_name="m") is not None
    assert expo.value("vllm:request_success_total", finished_reason="length") == 1
    # the buckets are vLLM's own
    h = expo.histogram("vllm:time_to_first_token_seconds")
    assert h is not None
    assert [b for b, _ in h.buckets][:3] == [0.001, 0.005, 0.01]


def test_sglang_labels() -> None:
    fl = FLAVORS["sglang"]
    eng = busy_engine(fl)
    expo = parse(metrics.render(fl, eng, "m", started_unix=0.0))
    assert expo.value("sglang:num_running_reqs", model_name="m", tp_rank="0") == 2
    assert expo.value("sglang:num_retracted_requests_total", model_name="m") == eng.stats.preemptions
    assert expo.value("sglang:max_total_num_tokens") == 1000


def test_garbage_is_not_a_page() -> None:
    expo = parse(metrics.GARBAGE)
    assert detect_engine(expo) is None or expo.bad_lines > 0
    assert VLLM_METRICS.gauges(expo).running is None


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.0, "0.0"), (7, "7.0"), (0.25, "0.25"), (1.7953069924762025e9, "1.7953069924762025e+09"),
     (1_000_000.0, "1e+06"), (math.inf, "+Inf"), (1e-05, "1e-05")],
)  # fmt: skip
def test_go_style_floats(value: float, text: str) -> None:
    assert metrics.fmt_float(value) == text
