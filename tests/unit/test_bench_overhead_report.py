"""The overhead benchmark's arithmetic: lag percentiles from the samples of a phase, ratios of added
figures, the targets, the peer harness's records read as measurements, and `--tests` choosing the phases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loadgen.bench.overhead.overhead_harness import _RESULT_LINE, _measurement, harness_argv
from loadgen.bench.overhead.overhead_report import (
    LAT1,
    LAT8,
    SATURATION,
    STREAM,
    Load,
    Measurement,
    checks,
    fleet_lag,
    lag_figures,
    ratios,
    render_table,
    summarise,
    verdict,
)
from loadgen.bench.overhead.proxy import parse_args, phases


@pytest.mark.parametrize(
    ("samples_ms", "expected"),
    [
        pytest.param([], {}, id="none"),
        pytest.param([0.2], {"p50": 0.2, "p99": 0.2, "max": 0.2}, id="one"),
        pytest.param(
            [0.1 * i for i in range(1, 101)], {"p50": 5.0, "p99": 9.9, "max": 10.0}, id="nearest-rank-of-100"
        ),
        pytest.param(
            [0.3] * 198 + [7.0, 40.0], {"p50": 0.3, "p99": 0.3, "max": 40.0}, id="two-stalls-in-200"
        ),
        pytest.param(
            [0.3] * 197 + [5.0, 7.0, 40.0], {"p50": 0.3, "p99": 5.0, "max": 40.0}, id="three-in-200"
        ),
    ],
)
def test_lag_figures_are_samples_not_bucket_edges(
    samples_ms: list[float], expected: dict[str, float]
) -> None:
    got = lag_figures([v / 1000.0 for v in samples_ms])
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        assert got[k] == pytest.approx(v)


def _m(phase: str, config: str, *, rnd: int = 0, **kw: Any) -> Measurement:
    base: dict[str, Any] = {
        "round": rnd, "phase": phase, "config": config, "concurrency": 8, "max_tokens": 16,
        "completed": 1000, "errors": 0, "window_s": 1.0, "rps": 1000.0, "lat_ms": {}, "ttft_ms": {},
        "chunks": 0, "proxy_cpu_s": None if config == "direct" else 0.1, "upstream_cpu_s": 0.05,
    }  # fmt: skip
    base.update(kw)
    return Measurement(**base)


def _lag(p99_ms: float) -> tuple[float, ...]:
    """100 samples (s) whose p50, p99 and max are p99_ms / 4, p99_ms and 3 p99_ms."""
    return (p99_ms / 4000,) * 98 + (p99_ms / 1000, 3 * p99_ms / 1000)


def _run(berth_cpu: float, berth_p99: float, *, lag: float = 0.5, ttfc: float = 2.4) -> list[Measurement]:
    ms: list[Measurement] = []
    runs = (("direct", None, 1.0, 1.0), ("bare", 0.1, 2.0, 2.0), ("berth", berth_cpu, berth_p99, ttfc))
    for config, cpu, p99, first in runs:
        lag_s = () if config == "direct" else _lag(lag if config == "berth" else 0.4)
        ms += [
            _m(SATURATION, config, proxy_cpu_s=cpu, lag_s=lag_s),
            _m(LAT8, config, lat_ms={"p50": p99 / 2, "p99": p99}, lag_s=lag_s),
            _m(LAT1, config, proxy_cpu_s=cpu, lat_ms={"p50": p99 / 4, "p99": p99 / 2}, lag_s=lag_s),
            _m(STREAM, config, proxy_cpu_s=cpu, chunks=10_000, ttft_ms={"p50": first}, lag_s=lag_s),
        ]
    return ms


def test_ratios_compare_what_each_proxy_adds_to_direct() -> None:
    ms = _run(berth_cpu=0.12, berth_p99=3.0)
    r = ratios(ms)
    assert r.cpu_per_req == pytest.approx(1.2)
    assert r.cpu_per_chunk == pytest.approx(1.2)
    # (3 - 1) / (2 - 1): the added p99, not the p99
    assert r.added_p99_c8 == pytest.approx(2.0)
    assert r.added_ttfc == pytest.approx(1.4)
    berth = summarise(ms, "berth")
    assert berth.added_p99_c8_ms == pytest.approx(2.0)
    assert berth.cpu_us_per_req == pytest.approx(120.0)
    assert (berth.lag_p50_c8_ms, berth.lag_p99_c8_ms, berth.lag_max_c8_ms) == pytest.approx((0.125, 0.5, 1.5))
    assert summarise(ms, "bare").lag_p99_c1_ms == pytest.approx(0.4)
    assert summarise(ms, "direct").lag_p99_c8_ms is None


def test_the_lag_pools_the_samples_of_every_round() -> None:
    """Three rounds of 100 samples, one stall (5, 30 and 2 ms) in each: the figures are those of the 300
    samples together, so the p99 stays below the three stalls and the max is the largest of them."""
    ms = [
        _m(LAT8, "berth", rnd=r, lag_s=(0.0002,) * 99 + (stall,))
        for r, stall in enumerate((0.005, 0.03, 0.002))
    ]
    ms.append(_m("fleet", "bare", lag_s=_lag(0.4)))
    ms.append(_m("fleet", "berth", lag_s=_lag(2.0)))
    assert ms[0].lag_ms()["p99"] == pytest.approx(0.2)
    berth = summarise(ms, "berth")
    assert berth.lag_p99_c8_ms == pytest.approx(0.2)
    assert berth.lag_max_c8_ms == pytest.approx(30.0)
    assert berth.lag_p99_fleet_ms == pytest.approx(2.0)
    assert summarise(ms, "bare").lag_p99_fleet_ms == pytest.approx(0.4)
    assert fleet_lag(ms) == pytest.approx(2.0)  # the target is berth's


def test_a_round_where_the_bare_proxy_added_nothing_gives_no_ratio() -> None:
    ms = [m for m in _run(0.1, 2.0) if m.phase == LAT8]
    ms = [_m(LAT8, m.config, lat_ms={"p50": 1.0, "p99": 1.0}) if m.config == "bare" else m for m in ms]
    assert ratios(ms).added_p99_c8 is None


@pytest.mark.parametrize(
    ("berth", "expected"),
    [
        pytest.param((0.12, 2.9, 0.5, 0.8, 2.4), "PASS", id="within"),
        pytest.param((0.14, 2.9, 0.5, 0.8, 2.4), "FAIL", id="cpu"),
        pytest.param((0.12, 3.5, 0.5, 0.8, 2.4), "FAIL", id="added-p99"),
        pytest.param((0.12, 2.9, 2.0, 0.8, 2.4), "FAIL", id="lag"),
        pytest.param((0.12, 2.9, 0.5, 2.0, 2.4), "FAIL", id="fleet-lag"),
        pytest.param((0.12, 2.9, 0.5, 0.8, 2.6), "FAIL", id="ttfc"),
    ],
)
def test_targets(berth: tuple[float, float, float, float, float], expected: str) -> None:
    """berth: CPU seconds, p99 at 8 connections, lag p99, the fleet's lag p99, time to first chunk."""
    cpu, p99, lag, fleet, ttfc = berth
    ms = _run(cpu, p99, lag=lag, ttfc=ttfc)
    ms.append(_m("fleet", "bare", lag_s=_lag(0.4)))
    ms.append(_m("fleet", "berth", lag_s=_lag(fleet)))
    summaries = {c: summarise(ms, c) for c in ("direct", "bare", "berth")}
    cs = checks(summaries, ratios(ms), Load(), fleet_lag(ms), fleet_lag(ms, "bare"))
    assert len(cs) == 8
    assert verdict(cs) == expected


def test_the_lag_targets_show_the_bare_proxys_figure_and_each_rounds_p99() -> None:
    """A lag's limit is the bare proxy's own p99 in the same run plus 0.5 ms: the check reads berth minus
    bare, the bare figure is shown beside the verdict, and each round's p99 beside the pooled one."""
    ms = [m for m in _run(0.12, 2.9, lag=1.2) if m.phase != LAT8]
    for rnd, (bare, berth) in enumerate(((0.4, 1.2), (1.5, 0.9), (0.7, 1.1))):
        ms += [_m(LAT8, "bare", rnd=rnd, lag_s=_lag(bare)), _m(LAT8, "berth", rnd=rnd, lag_s=_lag(berth))]
    ms += [_m("fleet", "bare", lag_s=_lag(1.6)), _m("fleet", "berth", lag_s=_lag(1.8))]
    summaries = {c: summarise(ms, c) for c in ("direct", "bare", "berth")}
    assert summaries["berth"].lag_p99_c8_rounds_ms == pytest.approx((1.2, 0.9, 1.1))
    assert summaries["bare"].lag_p99_fleet_rounds_ms == pytest.approx((1.6,))
    assert summaries["direct"].lag_p99_c8_rounds_ms == ()
    cs = checks(summaries, ratios(ms), Load(), fleet_lag(ms), fleet_lag(ms, "bare"))
    lags = {c.name: c for c in cs if "lag" in c.name}
    berth_c8, bare_c8 = summaries["berth"].lag_p99_c8_ms, summaries["bare"].lag_p99_c8_ms
    assert berth_c8 is not None
    assert bare_c8 is not None
    got: dict[str, tuple[object, object]] = {name: (c.value, c.bare) for name, c in lags.items()}
    assert got == {
        "event-loop lag p99 (c=8) - bare": (pytest.approx(berth_c8 - bare_c8), bare_c8),
        "event-loop lag p99, 100 endpoints scraped - bare": (pytest.approx(0.2), pytest.approx(1.6)),
    }
    assert all(c.passed for c in lags.values())  # 0.2 ms over the bare proxy: within the margin
    text = render_table(summaries, ratios(ms), cs, Load())
    assert "(bare proxy: 1.60ms)" in text
    assert "berth 1.200 / 0.900 / 1.100" in text
    assert all(c.bare is None for c in cs if "lag" not in c.name)


def test_a_target_without_a_figure_is_incomplete() -> None:
    ms = [m for m in _run(0.12, 2.9) if m.phase != STREAM]
    summaries = {c: summarise(ms, c) for c in ("direct", "bare", "berth")}
    cs = checks(summaries, ratios(ms), Load(), None)
    assert len(cs) == 7  # no fleet phase: its target is not judged
    assert verdict(cs) == "INCOMPLETE"


def test_the_harness_records_read_as_measurements() -> None:
    line = '02:10:01 r1 berth          lat8     {"rps": 4000.0, "p50_us": 1500}'
    m = _RESULT_LINE.search(line)
    assert m is not None
    assert (m.group(1), m.group(2), m.group(3)) == ("1", "berth", "lat8")
    wrk = {
        "type": "result", "round": 1, "peer": "berth", "test": "lat8", "requests": 8000, "rps": 4000.0,
        "p50_us": 1500, "p90_us": 2000, "p99_us": 2500, "errors": 0, "proxy_cpu_s": 1.6,
        "upstream_cpu_s": 0.4, "wall_s": 2.0,
    }  # fmt: skip
    got = _measurement(wrk, {(1, LAT8, "berth"): (0.0002, 0.0004, 0.003)})
    assert got is not None
    assert (got.phase, got.config, got.completed) == (LAT8, "berth", 8000)
    assert got.lat_ms == {"p50": 1.5, "p90": 2.0, "p99": 2.5}
    assert got.proxy_cpu_us_per_request() == pytest.approx(200.0)
    assert got.lag_ms() == pytest.approx({"p50": 0.4, "p99": 3.0, "max": 3.0})
    stream = {
        "type": "result", "round": 0, "peer": "aiohttp", "test": "s10_k64", "streams": 128,
        "chunks_total": 25_600, "ttfc_ms_p50": 3.9, "errors": 0, "proxy_cpu_s": 0.4, "wall_s": 4.0,
    }  # fmt: skip
    got = _measurement(stream, {})
    assert got is not None
    assert (got.phase, got.config, got.chunks) == (STREAM, "bare", 25_600)
    assert got.lag_s == ()
    assert got.ttft_ms == {"p50": 3.9}
    assert got.proxy_cpu_us_per_chunk() == pytest.approx(15.625)
    assert _measurement({**stream, "peer": "nginx"}, {}) is None
    assert _measurement({"type": "idle"}, {}) is None


@pytest.mark.parametrize(
    ("tests", "builtin", "harness"),
    [
        pytest.param(None, ["sat", "lat8", "lat1", "stream"], "sat,lat8,lat1,s10_k64", id="all"),
        pytest.param("lat8,fleet", ["lat8"], "lat8", id="lag"),
        pytest.param("stream,sat", ["sat", "stream"], "sat,s10_k64", id="own-order"),
    ],
)
def test_tests_narrows_the_phases_of_both_loads(tests: str | None, builtin: list[str], harness: str) -> None:
    args = parse_args([] if tests is None else ["--tests", tests])
    assert [p.name for p in phases(args)] == builtin
    argv = harness_argv(Path("/h"), args, Path("/out"))
    assert argv[argv.index("--tests") + 1] == harness


def test_tests_refuses_a_phase_it_does_not_know(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--tests", "lat8,lat64"])
    assert "choose from sat,lat8,lat1,stream,fleet" in capsys.readouterr().err
