"""Turns the overhead benchmark's measurements into per-configuration figures, ratios and verdicts.

Pure functions over plain data, so a saved JSON report can be summarised again without rerunning.
Every figure is the median over rounds; ratios and added latencies are computed within a round first
(configurations run back to back in each round) and then the median is taken, which cancels slow
drifts of a shared machine.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

SATURATION: Final = "saturation"
LATENCY: Final = "latency"
STREAM: Final = "stream"

CONFIGS: Final = ("direct", "bare", "berth")
PROXIES: Final = ("bare", "berth")

CPU_PER_REQUEST_MAX_RATIO: Final = 1.5
CPU_PER_CHUNK_MAX_RATIO: Final = 1.5
ADDED_P99_MAX_MS: Final = 2.0


@dataclass(frozen=True, slots=True)
class Measurement:
    """One phase of one configuration in one round, as the client measured it."""

    round: int
    phase: str  # SATURATION | LATENCY | STREAM
    config: str
    concurrency: int
    max_tokens: int
    completed: int
    errors: int
    window_s: float
    rps: float
    lat_ms: dict[str, float]
    ttft_ms: dict[str, float]
    chunks: int
    proxy_cpu_s: float | None  # None for "direct": there is no proxy
    upstream_cpu_s: float

    def proxy_cpu_us_per_request(self) -> float | None:
        if self.proxy_cpu_s is None or self.completed == 0:
            return None
        return self.proxy_cpu_s * 1e6 / self.completed

    def upstream_cpu_us_per_request(self) -> float | None:
        return self.upstream_cpu_s * 1e6 / self.completed if self.completed else None


@dataclass(frozen=True, slots=True)
class Summary:
    config: str
    rounds: int
    sat_rps: float | None
    lat_p50_ms: float | None
    lat_p99_ms: float | None
    added_p50_ms: float | None  # minus direct's, same round
    added_p99_ms: float | None
    over_bare_p50_ms: float | None  # minus the bare proxy's, same round (berth only)
    over_bare_p99_ms: float | None
    cpu_us_per_req: float | None  # at saturation
    cpu_us_per_req_c8: float | None  # in the latency phase
    cpu_us_per_stream: float | None
    cpu_us_per_chunk: float | None  # CPU of a whole stream / chunks
    cpu_us_per_chunk_net: float | None  # (CPU of a stream - CPU of a plain request) / chunks
    stream_ttft_p50_ms: float | None
    stream_ttft_p99_ms: float | None
    upstream_cpu_us_per_req: float | None
    errors: int


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    value: float | None
    limit: float
    unit: str

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


def _per_chunk(stream: Measurement, plain: Measurement | None, *, net: bool) -> float | None:
    if stream.proxy_cpu_s is None or stream.chunks == 0:
        return None
    cpu_us = stream.proxy_cpu_s * 1e6
    if net:
        per_request = plain.proxy_cpu_us_per_request() if plain is not None else None
        if per_request is None:
            return None
        cpu_us -= per_request * stream.completed
    return cpu_us / stream.chunks


def summarise(ms: Sequence[Measurement], config: str) -> Summary:
    sat = _by_round(ms, SATURATION, config)
    lat = _by_round(ms, LATENCY, config)
    stream = _by_round(ms, STREAM, config)

    def added(q: str, base: str) -> float | None:
        if config == base or (base == "bare" and config != "berth"):
            return None
        base_lat = _by_round(ms, LATENCY, base)
        return _median(
            [
                m.lat_ms[q] - base_lat[r].lat_ms[q]
                for r, m in lat.items()
                if r in base_lat and q in m.lat_ms and q in base_lat[r].lat_ms
            ]
        )

    return Summary(
        config=config,
        rounds=len({m.round for m in ms if m.config == config}),
        sat_rps=_median([m.rps for m in sat.values()]),
        lat_p50_ms=_median([m.lat_ms.get("p50") for m in lat.values()]),
        lat_p99_ms=_median([m.lat_ms.get("p99") for m in lat.values()]),
        added_p50_ms=added("p50", "direct"),
        added_p99_ms=added("p99", "direct"),
        over_bare_p50_ms=added("p50", "bare"),
        over_bare_p99_ms=added("p99", "bare"),
        cpu_us_per_req=_median([m.proxy_cpu_us_per_request() for m in sat.values()]),
        cpu_us_per_req_c8=_median([m.proxy_cpu_us_per_request() for m in lat.values()]),
        cpu_us_per_stream=_median([m.proxy_cpu_us_per_request() for m in stream.values()]),
        cpu_us_per_chunk=_median([_per_chunk(m, None, net=False) for m in stream.values()]),
        cpu_us_per_chunk_net=_median([_per_chunk(m, lat.get(r), net=True) for r, m in stream.items()]),
        stream_ttft_p50_ms=_median([m.ttft_ms.get("p50") for m in stream.values()]),
        stream_ttft_p99_ms=_median([m.ttft_ms.get("p99") for m in stream.values()]),
        upstream_cpu_us_per_req=_median([m.upstream_cpu_us_per_request() for m in sat.values()]),
        errors=sum(m.errors for m in ms if m.config == config),
    )


def round_ratio(
    ms: Sequence[Measurement], phase: str, figure: Callable[[Measurement], float | None]
) -> float | None:
    """Median over rounds of figure(berth) / figure(bare) within the same round."""
    bare, berth = _by_round(ms, phase, "bare"), _by_round(ms, phase, "berth")
    ratios: list[float | None] = []
    for r, m in berth.items():
        if r not in bare:
            continue
        num, den = figure(m), figure(bare[r])
        ratios.append(num / den if num is not None and den else None)
    return _median(ratios)


@dataclass(frozen=True, slots=True)
class Ratios:
    """berth / bare, median of the per-round ratios."""

    sat_rps: float | None
    cpu_per_req: float | None
    cpu_per_req_c8: float | None
    cpu_per_chunk: float | None
    cpu_per_chunk_net: float | None


def ratios(ms: Sequence[Measurement]) -> Ratios:
    by_round_lat = {(m.round, m.config): m for m in ms if m.phase == LATENCY}

    def net(m: Measurement) -> float | None:
        return _per_chunk(m, by_round_lat.get((m.round, m.config)), net=True)

    return Ratios(
        sat_rps=round_ratio(ms, SATURATION, lambda m: m.rps),
        cpu_per_req=round_ratio(ms, SATURATION, Measurement.proxy_cpu_us_per_request),
        cpu_per_req_c8=round_ratio(ms, LATENCY, Measurement.proxy_cpu_us_per_request),
        cpu_per_chunk=round_ratio(ms, STREAM, lambda m: _per_chunk(m, None, net=False)),
        cpu_per_chunk_net=round_ratio(ms, STREAM, net),
    )


def checks(summaries: dict[str, Summary], r: Ratios, load: Load) -> list[Check]:
    """berth's targets; empty when berth was not measured."""
    berth = summaries.get("berth")
    if berth is None:
        return []
    return [
        Check(
            f"CPU per request, berth/bare (c={load.saturation})",
            r.cpu_per_req,
            CPU_PER_REQUEST_MAX_RATIO,
            "x",
        ),
        Check("CPU per streamed chunk, berth/bare", r.cpu_per_chunk, CPU_PER_CHUNK_MAX_RATIO, "x"),
        Check(f"added latency p99 (c={load.latency})", berth.added_p99_ms, ADDED_P99_MAX_MS, "ms"),
        Check("errors", float(berth.errors), 0.0, ""),
    ]


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


@dataclass(frozen=True, slots=True)
class Load:
    """The concurrency of each phase and the chunks per stream, for labels."""

    saturation: int = 64
    latency: int = 8
    stream: int = 16
    chunks: int = 200


def render_table(summaries: dict[str, Summary], r: Ratios, cs: Sequence[Check], load: Load) -> str:
    configs = [c for c in CONFIGS if c in summaries]
    sat, lat = f"(c={load.saturation})", f"(c={load.latency})"
    rows: list[tuple[str, Callable[[Summary], float | None], int, float | None]] = [
        (f"requests/s at saturation {sat}", lambda s: s.sat_rps, 0, r.sat_rps),
        (f"latency p50 ms {lat}", lambda s: s.lat_p50_ms, 2, None),
        (f"latency p99 ms {lat}", lambda s: s.lat_p99_ms, 2, None),
        (f"added latency p50 ms {lat}", lambda s: s.added_p50_ms, 2, None),
        (f"added latency p99 ms {lat}", lambda s: s.added_p99_ms, 2, None),
        (f"latency over bare proxy p50 ms {lat}", lambda s: s.over_bare_p50_ms, 2, None),
        (f"latency over bare proxy p99 ms {lat}", lambda s: s.over_bare_p99_ms, 2, None),
        (f"proxy CPU µs/request {sat}", lambda s: s.cpu_us_per_req, 1, r.cpu_per_req),
        (f"proxy CPU µs/request {lat}", lambda s: s.cpu_us_per_req_c8, 1, r.cpu_per_req_c8),
        (
            f"proxy CPU µs/stream ({load.chunks} chunks, c={load.stream})",
            lambda s: s.cpu_us_per_stream,
            0,
            None,
        ),
        ("proxy CPU µs/chunk (stream CPU / chunks)", lambda s: s.cpu_us_per_chunk, 2, r.cpu_per_chunk),
        ("proxy CPU µs/chunk (net of a request)", lambda s: s.cpu_us_per_chunk_net, 2, r.cpu_per_chunk_net),
        ("stream TTFT p50 ms", lambda s: s.stream_ttft_p50_ms, 2, None),
        ("stream TTFT p99 ms", lambda s: s.stream_ttft_p99_ms, 2, None),
        (f"upstream CPU µs/request {sat}", lambda s: s.upstream_cpu_us_per_req, 1, None),
        ("errors", lambda s: float(s.errors), 0, None),
    ]
    show_ratio = "bare" in summaries and "berth" in summaries
    header = f"{'':42}" + "".join(f"{c:>11}" for c in configs) + (f"{'berth/bare':>12}" if show_ratio else "")
    lines = [header, "-" * len(header)]
    for label, get, digits, ratio in rows:
        line = f"{label:42}" + "".join(f"{_fmt(get(summaries[c]), digits):>11}" for c in configs)
        if show_ratio:
            line += f"{_fmt(ratio, 2):>12}" if ratio is not None else f"{'':>12}"
        lines.append(line)
    if cs:
        lines.append("")
        lines.append("targets (berth)")
        for c in cs:
            value = "-" if c.value is None else f"{c.value:.2f}{c.unit}"
            lines.append(f"  {c.name:40} {value:>10}  <= {c.limit:g}{c.unit:<3} {c.verdict}")
        lines.append(f"  verdict: {verdict(cs)}")
    return "\n".join(lines)


def verdict(cs: Sequence[Check]) -> str:
    if not cs:
        return "N/A"
    if any(c.value is None for c in cs):
        return "INCOMPLETE"
    return "PASS" if all(c.passed for c in cs) else "FAIL"
