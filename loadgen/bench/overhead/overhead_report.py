"""Turns the overhead benchmark's measurements into per-configuration figures, ratios and verdicts.

Pure functions over plain data, so a saved JSON report can be summarised again without rerunning, and
the same figures come out whether the built-in load generator or the peer harness
(`../shared/perf-peers`, see `loadgen.bench.overhead.overhead_harness`) measured them. Every figure is the
median over rounds; ratios and added latencies are computed within a round first (configurations run
back to back in each round) and then the median is taken, which cancels slow drifts of a shared
machine. The targets are ratios of berth to the bare aiohttp proxy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

# Phases, named as the peer harness names its tests.
SATURATION: Final = "sat"  # non-streamed, 64 connections: requests/s and CPU per request
LAT8: Final = "lat8"  # non-streamed, 8 connections: latency
LAT1: Final = "lat1"  # non-streamed, 1 connection: latency and CPU per request without batching
STREAM: Final = "stream"  # waves of streams (64 at once): CPU per chunk, time to first chunk
FLEET: Final = "fleet"  # in front of a 100-endpoint simulated fleet (berth scrapes it): event-loop lag
# ... with every seat taken and a standing queue in berth (an SLO preset deciding): lag, decision times
QUEUE: Final = "queue"
PHASES: Final = (SATURATION, LAT8, LAT1, STREAM)

CONFIGS: Final = ("direct", "bare", "berth")
PROXIES: Final = ("bare", "berth")

ADDED_P99_C8_MAX_RATIO: Final = 2.0
# berth's event-loop lag p99 may exceed the bare proxy's in the same run by this much: an absolute limit
# (1 ms) was at or below what the bare proxy itself reads on a shared 2-core machine in front of the
# simulated fleet (1.2-1.8 ms), so the limit is relative to the floor measured beside it.
LOOP_LAG_P99_MARGIN_MS: Final = 0.5
CPU_PER_REQUEST_MAX_RATIO: Final = 1.3
CPU_PER_CHUNK_MAX_RATIO: Final = 1.2
ADDED_TTFC_MAX_RATIO: Final = 1.5


@dataclass(frozen=True, slots=True)
class Measurement:
    """One phase of one configuration in one round."""

    round: int
    phase: str
    config: str
    concurrency: int
    max_tokens: int
    completed: int
    errors: int
    window_s: float
    rps: float
    lat_ms: dict[str, float]  # p50, p99 (and more from the built-in client)
    ttft_ms: dict[str, float]  # streams only: time to first chunk
    chunks: int
    proxy_cpu_s: float | None  # None for "direct": there is no proxy
    upstream_cpu_s: float | None
    # The proxy's event-loop lag samples over the phase, seconds (gateway.core.looplag, the same monitor
    # in both proxies); () when none were read.
    lag_s: tuple[float, ...] = ()
    # berth's scheduler calls over the phase (the queue phase: `queue_window.decision_window`), by call.
    decisions: dict[str, dict[str, float]] = field(default_factory=dict)

    def proxy_cpu_us_per_request(self) -> float | None:
        if self.proxy_cpu_s is None or self.completed == 0:
            return None
        return self.proxy_cpu_s * 1e6 / self.completed

    def lag_ms(self) -> dict[str, float]:
        """p50, p99 and max of this phase's lag samples, ms."""
        return lag_figures(self.lag_s)

    def proxy_cpu_us_per_chunk(self) -> float | None:
        if self.proxy_cpu_s is None or self.chunks == 0:
            return None
        return self.proxy_cpu_s * 1e6 / self.chunks


@dataclass(frozen=True, slots=True)
class Summary:
    config: str
    rounds: int
    sat_rps: float | None
    cpu_us_per_req: float | None  # at saturation
    cpu_us_per_req_c1: float | None
    p50_c8_ms: float | None
    p99_c8_ms: float | None
    p50_c1_ms: float | None
    p99_c1_ms: float | None
    added_p50_c8_ms: float | None  # minus direct's, same round
    added_p99_c8_ms: float | None
    added_p50_c1_ms: float | None
    added_p99_c1_ms: float | None
    cpu_us_per_chunk: float | None
    ttfc_p50_ms: float | None
    added_ttfc_p50_ms: float | None
    cpu_us_per_req_c8: float | None
    # Event-loop lag, ms, of the samples of every round together.
    lag_p50_c8_ms: float | None
    lag_p99_c8_ms: float | None
    lag_max_c8_ms: float | None
    lag_p50_c1_ms: float | None
    lag_p99_c1_ms: float | None
    lag_max_c1_ms: float | None
    lag_p99_max_ms: float | None  # the worst phase's p99 (of sat, lat8, lat1, stream)
    lag_p50_fleet_ms: float | None  # in front of the simulated fleet (berth scraping it)
    lag_p99_fleet_ms: float | None
    lag_max_fleet_ms: float | None
    errors: int
    # The lag p99 of each round alone (c=8 and the fleet), in round order: how much it moves between
    # rounds of the same run.
    lag_p99_c8_rounds_ms: tuple[float, ...] = ()
    lag_p99_fleet_rounds_ms: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    value: float | None
    limit: float
    unit: str
    # The bare proxy's own figure in the same run, for a target that is not a ratio to it (the lag's
    # limit is the bare proxy's p99 plus a margin): shown beside the verdict.
    bare: float | None = None

    @property
    def passed(self) -> bool:
        return self.value is not None and self.value <= self.limit

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "N/A"
        return "PASS" if self.passed else "FAIL"


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _by_round(ms: Sequence[Measurement], phase: str, config: str) -> dict[int, Measurement]:
    return {m.round: m for m in ms if m.phase == phase and m.config == config}


Figure = Callable[[Measurement], float | None]


def _lat(q: str) -> Figure:
    return lambda m: m.lat_ms.get(q)


def _ttfc(m: Measurement) -> float | None:
    return m.ttft_ms.get("p50")


def _added(ms: Sequence[Measurement], phase: str, config: str, figure: Figure) -> dict[int, float]:
    """Per round: `figure` of `config` minus direct's."""
    direct = _by_round(ms, phase, "direct")
    out: dict[int, float] = {}
    for r, m in _by_round(ms, phase, config).items():
        d = direct.get(r)
        a, b = figure(m), figure(d) if d is not None else None
        if a is not None and b is not None:
            out[r] = a - b
    return out


def summarise(ms: Sequence[Measurement], config: str) -> Summary:
    sat = _by_round(ms, SATURATION, config)
    lat8, lat1 = _by_round(ms, LAT8, config), _by_round(ms, LAT1, config)
    stream = _by_round(ms, STREAM, config)
    proxy = config != "direct"

    def added(phase: str, figure: Figure) -> float | None:
        return _median(list(_added(ms, phase, config, figure).values())) if proxy else None

    lag8, lag1, fleet = (_lag(ms, p, config) for p in (LAT8, LAT1, FLEET))
    lags = [_lag(ms, p, config)["p99"] for p in PHASES]
    return Summary(
        config=config,
        rounds=len({m.round for m in ms if m.config == config}),
        sat_rps=_median([m.rps for m in sat.values()]),
        cpu_us_per_req=_median([m.proxy_cpu_us_per_request() for m in sat.values()]),
        cpu_us_per_req_c1=_median([m.proxy_cpu_us_per_request() for m in lat1.values()]),
        p50_c8_ms=_median([m.lat_ms.get("p50") for m in lat8.values()]),
        p99_c8_ms=_median([m.lat_ms.get("p99") for m in lat8.values()]),
        p50_c1_ms=_median([m.lat_ms.get("p50") for m in lat1.values()]),
        p99_c1_ms=_median([m.lat_ms.get("p99") for m in lat1.values()]),
        added_p50_c8_ms=added(LAT8, _lat("p50")),
        added_p99_c8_ms=added(LAT8, _lat("p99")),
        added_p50_c1_ms=added(LAT1, _lat("p50")),
        added_p99_c1_ms=added(LAT1, _lat("p99")),
        cpu_us_per_chunk=_median([m.proxy_cpu_us_per_chunk() for m in stream.values()]),
        ttfc_p50_ms=_median([_ttfc(m) for m in stream.values()]),
        added_ttfc_p50_ms=added(STREAM, _ttfc),
        cpu_us_per_req_c8=_median([m.proxy_cpu_us_per_request() for m in lat8.values()]),
        lag_p50_c8_ms=lag8["p50"],
        lag_p99_c8_ms=lag8["p99"],
        lag_max_c8_ms=lag8["max"],
        lag_p50_c1_ms=lag1["p50"],
        lag_p99_c1_ms=lag1["p99"],
        lag_max_c1_ms=lag1["max"],
        lag_p99_max_ms=max((v for v in lags if v is not None), default=None),
        lag_p50_fleet_ms=fleet["p50"],
        lag_p99_fleet_ms=fleet["p99"],
        lag_max_fleet_ms=fleet["max"],
        errors=sum(m.errors for m in ms if m.config == config and m.phase in PHASES),
        lag_p99_c8_rounds_ms=_round_lags(ms, LAT8, config),
        lag_p99_fleet_rounds_ms=_round_lags(ms, FLEET, config),
    )


def _round_lags(ms: Sequence[Measurement], phase: str, config: str) -> tuple[float, ...]:
    """The lag p99 of each round of `phase` alone, in round order (rounds without samples left out)."""
    return tuple(
        p99
        for _, m in sorted(_by_round(ms, phase, config).items())
        if (p99 := m.lag_ms().get("p99")) is not None
    )


def _lag(ms: Sequence[Measurement], phase: str, config: str) -> dict[str, float | None]:
    """One configuration's lag in one phase, the samples of every round together (a round of 15 s has
    150: its own p99 would be its second largest)."""
    figures = lag_figures([lag for m in ms if m.phase == phase and m.config == config for lag in m.lag_s])
    return {k: figures.get(k) for k in ("p50", "p99", "max")}


def lag_figures(samples_s: Sequence[float]) -> dict[str, float]:
    """p50, p99 and max in ms of lag samples in seconds (nearest rank: each is a sample); {} for none."""
    if not samples_s:
        return {}
    ordered = sorted(samples_s)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1000.0

    return {"p50": rank(0.50), "p99": rank(0.99), "max": ordered[-1] * 1000.0}


def round_ratio(ms: Sequence[Measurement], phase: str, figure: Figure) -> float | None:
    """Median over rounds of figure(berth) / figure(bare) within the same round."""
    bare, berth = _by_round(ms, phase, "bare"), _by_round(ms, phase, "berth")
    ratios: list[float | None] = []
    for r, m in berth.items():
        if r not in bare:
            continue
        num, den = figure(m), figure(bare[r])
        ratios.append(num / den if num is not None and den else None)
    return _median(ratios)


def added_ratio(ms: Sequence[Measurement], phase: str, figure: Figure) -> float | None:
    """Median over rounds of (berth - direct) / (bare - direct) within the same round; a round whose
    bare proxy added nothing measurable (<= 0) gives no ratio."""
    bare, berth = _added(ms, phase, "bare", figure), _added(ms, phase, "berth", figure)
    return _median([berth[r] / bare[r] for r in berth if r in bare and bare[r] > 0])


@dataclass(frozen=True, slots=True)
class Ratios:
    """berth / bare, median of the per-round ratios (added figures: both minus direct first)."""

    sat_rps: float | None
    cpu_per_req: float | None
    cpu_per_req_c1: float | None
    cpu_per_chunk: float | None
    added_p50_c8: float | None
    added_p99_c8: float | None
    added_p50_c1: float | None
    added_p99_c1: float | None
    added_ttfc: float | None


def ratios(ms: Sequence[Measurement]) -> Ratios:
    return Ratios(
        sat_rps=round_ratio(ms, SATURATION, lambda m: m.rps),
        cpu_per_req=round_ratio(ms, SATURATION, Measurement.proxy_cpu_us_per_request),
        cpu_per_req_c1=round_ratio(ms, LAT1, Measurement.proxy_cpu_us_per_request),
        cpu_per_chunk=round_ratio(ms, STREAM, Measurement.proxy_cpu_us_per_chunk),
        added_p50_c8=added_ratio(ms, LAT8, _lat("p50")),
        added_p99_c8=added_ratio(ms, LAT8, _lat("p99")),
        added_p50_c1=added_ratio(ms, LAT1, _lat("p50")),
        added_p99_c1=added_ratio(ms, LAT1, _lat("p99")),
        added_ttfc=added_ratio(ms, STREAM, _ttfc),
    )


@dataclass(frozen=True, slots=True)
class Load:
    """The concurrency of each phase, the chunks per stream and the fleet's size, for labels."""

    saturation: int = 64
    latency: int = 8
    stream: int = 64
    chunks: int = 200
    fleet: int = 100


def fleet_lag(ms: Sequence[Measurement], config: str = "berth") -> float | None:
    """A proxy's event-loop lag p99 in front of the scraped fleet (the target is berth's)."""
    return _lag(ms, FLEET, config)["p99"]


def checks(
    summaries: dict[str, Summary],
    r: Ratios,
    load: Load,
    fleet_lag_ms: float | None,
    bare_fleet_lag_ms: float | None = None,
) -> list[Check]:
    """berth's targets; empty when berth was not measured. The fleet's lag is checked when that phase
    ran. A lag's limit is the bare proxy's p99 in the same run plus `LOOP_LAG_P99_MARGIN_MS` (no bare
    figure: not judged, N/A); the bare proxy's figure goes beside it."""
    berth = summaries.get("berth")
    if berth is None:
        return []
    bare = summaries.get("bare")
    bare_lag = None if bare is None else bare.lag_p99_c8_ms
    out = [
        Check(f"added p99, berth ÷ bare (c={load.latency})", r.added_p99_c8, ADDED_P99_C8_MAX_RATIO, "x"),
        lag_check(f"event-loop lag p99 (c={load.latency})", berth.lag_p99_c8_ms, bare_lag),
        Check(
            f"CPU/request, berth ÷ bare (c={load.saturation})", r.cpu_per_req, CPU_PER_REQUEST_MAX_RATIO, "x"
        ),
        Check("CPU/request, berth ÷ bare (c=1)", r.cpu_per_req_c1, CPU_PER_REQUEST_MAX_RATIO, "x"),
        Check("CPU/streamed chunk, berth ÷ bare", r.cpu_per_chunk, CPU_PER_CHUNK_MAX_RATIO, "x"),
        Check(f"added TTFC, berth ÷ bare ({load.stream} streams)", r.added_ttfc, ADDED_TTFC_MAX_RATIO, "x"),
        Check("errors", float(berth.errors), 0.0, ""),
    ]
    if fleet_lag_ms is not None:
        out.insert(
            2,
            lag_check(f"event-loop lag p99, {load.fleet} endpoints scraped", fleet_lag_ms, bare_fleet_lag_ms),
        )
    return out


def lag_check(name: str, berth_ms: float | None, bare_ms: float | None) -> Check:
    """berth's lag p99 against the bare proxy's in the same run plus the margin."""
    if bare_ms is None:
        return Check(f"{name} - bare", None, LOOP_LAG_P99_MARGIN_MS, "ms")
    return Check(
        f"{name} - bare",
        None if berth_ms is None else berth_ms - bare_ms,
        LOOP_LAG_P99_MARGIN_MS,
        "ms",
        bare_ms,
    )


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def render_table(
    summaries: dict[str, Summary], r: Ratios, cs: Sequence[Check], load: Load, extra: Sequence[str] = ()
) -> str:
    """The figures per configuration, then `extra` lines (another phase's table), then the targets."""
    configs = [c for c in CONFIGS if c in summaries]
    sat, c8 = f"(c={load.saturation})", f"(c={load.latency})"
    rows: list[tuple[str, Callable[[Summary], float | None], int, float | None]] = [
        (f"requests/s {sat}", lambda s: s.sat_rps, 0, r.sat_rps),
        (f"proxy CPU µs/request {sat}", lambda s: s.cpu_us_per_req, 1, r.cpu_per_req),
        ("proxy CPU µs/request (c=1)", lambda s: s.cpu_us_per_req_c1, 1, r.cpu_per_req_c1),
        (f"latency p50 ms {c8}", lambda s: s.p50_c8_ms, 2, None),
        (f"latency p99 ms {c8}", lambda s: s.p99_c8_ms, 2, None),
        (f"added p50 ms {c8}", lambda s: s.added_p50_c8_ms, 2, r.added_p50_c8),
        (f"added p99 ms {c8}", lambda s: s.added_p99_c8_ms, 2, r.added_p99_c8),
        ("added p50 ms (c=1)", lambda s: s.added_p50_c1_ms, 2, r.added_p50_c1),
        ("added p99 ms (c=1)", lambda s: s.added_p99_c1_ms, 2, r.added_p99_c1),
        (f"proxy CPU µs/chunk ({load.stream} streams)", lambda s: s.cpu_us_per_chunk, 2, r.cpu_per_chunk),
        (f"TTFC p50 ms ({load.stream} streams)", lambda s: s.ttfc_p50_ms, 2, None),
        (f"added TTFC p50 ms ({load.stream} streams)", lambda s: s.added_ttfc_p50_ms, 2, r.added_ttfc),
        (f"proxy CPU µs/request {c8}", lambda s: s.cpu_us_per_req_c8, 1, None),
        (f"event-loop lag p50 ms {c8}", lambda s: s.lag_p50_c8_ms, 3, None),
        (f"event-loop lag p99 ms {c8}", lambda s: s.lag_p99_c8_ms, 3, None),
        (f"event-loop lag max ms {c8}", lambda s: s.lag_max_c8_ms, 2, None),
        ("event-loop lag p50 ms (c=1)", lambda s: s.lag_p50_c1_ms, 3, None),
        ("event-loop lag p99 ms (c=1)", lambda s: s.lag_p99_c1_ms, 3, None),
        ("event-loop lag max ms (c=1)", lambda s: s.lag_max_c1_ms, 2, None),
        ("event-loop lag p99 ms (worst phase)", lambda s: s.lag_p99_max_ms, 3, None),
        (f"lag p50 ms, {load.fleet}-endpoint fleet {c8}", lambda s: s.lag_p50_fleet_ms, 3, None),
        (f"lag p99 ms, {load.fleet}-endpoint fleet {c8}", lambda s: s.lag_p99_fleet_ms, 3, None),
        (f"lag max ms, {load.fleet}-endpoint fleet {c8}", lambda s: s.lag_max_fleet_ms, 2, None),
        ("errors", lambda s: float(s.errors), 0, None),
    ]
    per_round: list[tuple[str, Callable[[Summary], tuple[float, ...]]]] = [
        (f"lag p99 ms by round {c8}", lambda s: s.lag_p99_c8_rounds_ms),
        (f"lag p99 ms by round, fleet {c8}", lambda s: s.lag_p99_fleet_rounds_ms),
    ]
    show_ratio = "bare" in summaries and "berth" in summaries
    header = f"{'':42}" + "".join(f"{c:>11}" for c in configs) + (f"{'berth/bare':>12}" if show_ratio else "")
    lines = [header, "-" * len(header)] if configs else []  # none: only the standing queue ran
    for label, get, digits, ratio in rows if configs else ():
        line = f"{label:42}" + "".join(f"{_fmt(get(summaries[c]), digits):>11}" for c in configs)
        if show_ratio:
            line += f"{_fmt(ratio, 2):>12}" if ratio is not None else f"{'':>12}"
        lines.append(line)
    for label, rounds in per_round:
        if any(rounds(summaries[c]) for c in configs):
            shown = "  ".join(
                f"{c} " + " / ".join(f"{v:.3f}" for v in rounds(summaries[c]))
                for c in configs
                if rounds(summaries[c])
            )
            lines.append(f"{label:42}{shown}")
    lines.extend(extra)
    if cs:
        lines.append("")
        lines.append("targets (berth; ratios to the bare aiohttp proxy, added figures minus direct's first)")
        for c in cs:
            value = "-" if c.value is None else f"{c.value:.2f}{c.unit}"
            beside = "" if c.bare is None else f"  (bare proxy: {c.bare:.2f}{c.unit})"
            lines.append(f"  {c.name:44} {value:>10}  <= {c.limit:g}{c.unit:<3} {c.verdict}{beside}")
        lines.append(f"  verdict: {verdict(cs)}")
    return "\n".join(lines)


def verdict(cs: Sequence[Check]) -> str:
    if not cs:
        return "N/A"
    if any(c.value is None for c in cs):
        return "INCOMPLETE"
    return "PASS" if all(c.passed for c in cs) else "FAIL"
