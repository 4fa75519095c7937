"""The prefix index benchmark runs (a few repetitions; its figures come from the module itself)."""

from __future__ import annotations

from loadgen.diag.prefix_index import bytes_per_block, timings


def test_the_benchmark_times_every_case_and_measures_memory() -> None:
    got = timings(repeat=3)
    assert len(got) == 9
    assert all(us > 0 for us in got.values())
    assert 50 < bytes_per_block(endpoints=2, blocks=1_000) < 1_000
