"""The eviction benchmark's confidence: figures pooled over seeds, and the paired bootstrap of one
evictor's figures over another's that decides "worse" and "better"."""

from __future__ import annotations

import numpy as np
import pytest

from loadgen.bench.lifecycle.eviction_stats import JUDGED, RunSample, pooled, ratio, ratio_cis


def _run(seed: int, *, slow: float = 1.0, evictions: int = 10, errors: int = 0) -> RunSample:
    """A run whose latencies vary with the seed (as runs on different traces do), times `slow`."""
    rng = np.random.default_rng(seed)
    return RunSample(
        requests=100,
        errors=errors,
        evictions=evictions,
        loads=evictions + 4,
        load_seconds=20.0 * evictions,
        hits=80.0,
        ttft_completion=rng.exponential(1.0, 50) * slow,
        ttft_reasoning=rng.exponential(5.0, 50) * slow,
        e2e=rng.exponential(10.0, 100) * slow,
    )


def test_pooled_figures_are_over_every_request_of_every_run() -> None:
    a, b = _run(0), _run(1)
    p = pooled([a, b])
    both = np.concatenate([a.ttft_completion, b.ttft_completion])
    assert p["ttft_completion_mean_ms"] == pytest.approx(both.mean() * 1000.0)
    assert p["ttft_completion_p99_ms"] == pytest.approx(np.percentile(both, 99) * 1000.0)
    assert (p["requests"], p["evictions"], p["hit_rate"]) == (200.0, 20.0, 0.8)


def test_ratio_of_zeros_is_the_same_and_of_unknowns_unknown() -> None:
    assert ratio(0.0, 0.0) == 1.0
    assert ratio(1.0, 0.0) == float("inf")
    assert ratio(None, 1.0) is None


def test_identical_runs_are_the_same_on_every_figure() -> None:
    runs = [_run(s) for s in range(6)]
    cis = ratio_cis(runs, runs)
    assert set(cis) == set(JUDGED)
    for c in cis.values():
        assert (c.ratio, c.lo, c.hi, c.verdict) == (1.0, 1.0, 1.0, "same")


def test_a_clearly_slower_evictor_is_worse_and_a_faster_better() -> None:
    base = [_run(s) for s in range(8)]
    slower = ratio_cis([_run(s, slow=1.5, evictions=15) for s in range(8)], base)
    assert slower["ttft_reasoning_mean_ms"].verdict == "worse"
    assert slower["evictions"].verdict == "worse"
    assert slower["hit_rate"].verdict == "same"  # hits unchanged
    faster = ratio_cis([_run(s, slow=0.5) for s in range(8)], base)
    assert faster["e2e_p99_ms"].verdict == "better"


def test_seed_to_seed_noise_is_not_called_worse() -> None:
    # Each "evictor" ran other traces (seeds 0-7 against 100-107): the same law, different draws. The
    # pooled point ratio differs from 1 on some figure; no figure's interval excludes 1.
    base = [_run(s) for s in range(8)]
    other = [_run(100 + s) for s in range(8)]
    cis = ratio_cis(other, base)
    assert any(c.ratio != pytest.approx(1.0, abs=0.02) for c in cis.values())
    assert [k for k, c in cis.items() if c.verdict != "same"] == []


def test_deterministic_and_paired_seeds_are_required() -> None:
    base = [_run(s) for s in range(5)]
    other = [_run(s, slow=1.1) for s in range(5)]
    assert ratio_cis(other, base) == ratio_cis(other, base)
    with pytest.raises(ValueError, match="same seeds"):
        ratio_cis(other[:4], base)


def test_a_single_seed_has_no_interval() -> None:
    c = ratio_cis([_run(0, slow=2.0)], [_run(0)])["ttft_mean_ms"]
    assert c.ratio == pytest.approx(2.0)
    assert (c.lo, c.hi, c.verdict) == (None, None, "same")
