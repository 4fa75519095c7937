"""The simulator's vLLM /metrics has the same names, types and label sets as a real vLLM's.

The reference is the page the engine tier recorded from a real vLLM CPU server
(`tests/engine/data/`, re-recorded by `BERTH_RECORD_VLLM_METRICS=1` in that tier). Every family the
simulator exports must exist in real vLLM with the same shape, and every family berth reads must be
exported by both. Info gauges (`*_info`) may carry a subset of real vLLM's config labels.
"""

from __future__ import annotations

from gateway.telemetry.engine_metrics import VLLM_METRICS
from loadgen.engine_sim import metrics
from loadgen.engine_sim.flavors import FLAVORS
from tests.engine.promtext import RECORDED_VLLM_METRICS, MetricShape, metric_shapes
from tests.unit.test_sim_metrics import busy_engine


def _sim_text() -> str:
    fl = FLAVORS["vllm"]
    return metrics.render(fl, busy_engine(fl), "tiny-llama", started_unix=1.7e9)


def test_every_simulated_family_matches_real_vllm() -> None:
    real = metric_shapes(RECORDED_VLLM_METRICS.read_text())
    sim = metric_shapes(_sim_text())
    missing = sorted(set(sim) - set(real))
    assert missing == [], f"the simulator exports families real vLLM does not: {missing}"
    mismatched = {
        name: (shape, real[name]) for name, shape in sim.items() if not _same(name, shape, real[name])
    }
    assert mismatched == {}


def _same(name: str, sim: MetricShape, real: MetricShape) -> bool:
    if name.endswith("_info"):
        # An info gauge's labels are the engine's whole config, which changes from release to release;
        # the simulator must carry a subset of them (the ones berth reads: block_size, num_gpu_blocks).
        return sim.type == real.type and sim.label_names <= real.label_names
    return sim == real


def test_every_family_berth_reads_is_in_both() -> None:
    real = metric_shapes(RECORDED_VLLM_METRICS.read_text())
    sim = metric_shapes(_sim_text())
    for names in (
        VLLM_METRICS.running,
        VLLM_METRICS.waiting,
        VLLM_METRICS.kv_usage,
        VLLM_METRICS.ttft,
        VLLM_METRICS.itl,
    ):
        current = names[0]
        assert current in real, current
        assert current in sim, current
