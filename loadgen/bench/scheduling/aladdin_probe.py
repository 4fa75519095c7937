"""Aladdin's benchmark setting and one probe: the targets, the fleet, berth's settings and the policies,
and a probe (every seed run on the fleet simulator at one rate and endpoint count, its goodput pooled).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from loadgen.bench.scheduling.scheduling_types import VARIANTS as PRESET_VARIANTS
from loadgen.client import RequestResult
from loadgen.engine_sim.profiles import get_profile
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim import SimOptions, simulate

REPO_ROOT: Final = Path(__file__).resolve().parents[3]
POLICY_DIR: Final = REPO_ROOT / "policies"
BERTH: Final = "berth"
JSQ: Final = "least-outstanding"
POLICIES: Final[dict[str, str]] = {
    BERTH: "aladdin.toml",
    JSQ: "baseline-least-outstanding.toml",
    "power-of-two": "baseline-power-of-two.toml",
}
#: Variants of berth's preset `--policies` may name (not run by default): `aladdin-paper` is
#: policies/aladdin.toml with best fit in the paper's order (most loaded first, endpoints whose requests
#: run long last, the prefill-pause bound for ITL targets only), where the preset departs from it.
VARIANTS: Final = {"aladdin-paper": PRESET_VARIANTS["aladdin-paper"]}
PROFILE: Final = "a100-llama2-7b"
WORKLOAD: Final = "sharegpt-like:aladdin-7b"
MODEL: Final = "llama-2-7b"
TTFT_S: Final = 0.400
ATGT_S: Final = 0.015
GOODPUT_TARGET: Final = 0.95
# berth's endpoints / the ATGT capacity floor at the highest rate. Aladdin reports 0.6x the endpoints of
# join-shortest-queue; here least outstanding already runs at about 1.3x the floor, so a ratio to it left
# no room (0.75x of it was below the floor): the target is measured against the floor, and the report
# prints least outstanding's ratio beside berth's.
FLOOR_RATIO_TARGET: Final = 1.2
DEFAULT_RATES: Final = (10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 120.0, 140.0)
QUICK_RATES: Final = (10.0, 20.0)
DEFAULT_SEEDS: Final = 2
DEFAULT_DURATION_S: Final = 90.0
QUICK_DURATION_S: Final = 60.0
STOP_ABOVE: Final = 50
MAX_ENDPOINTS: Final = 80
DRAIN_S: Final = 60.0  # simulated seconds for requests still running after the last arrival
FLOOR_SAMPLE: Final = 20_000


# --------------------------------------------------------------------- one run
@dataclass(frozen=True, slots=True)
class SeedRun:
    seed: int
    count: int
    met: int
    rejected: int  # refused by berth (any status), so never served
    ttft_miss: int  # served, first token past the TTFT target
    atgt_miss: int  # served in time for the first token, ATGT past its target
    ttft_p95_ms: float | None
    atgt_p95_ms: float | None
    utilization: float | None
    wall_s: float
    events: int

    @property
    def goodput(self) -> float:
        return self.met / self.count if self.count else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "count": self.count,
            "met": self.met,
            "goodput": round(self.goodput, 4),
            "rejected": self.rejected,
            "ttft_miss": self.ttft_miss,
            "atgt_miss": self.atgt_miss,
            "ttft_p95_ms": self.ttft_p95_ms,
            "atgt_p95_ms": self.atgt_p95_ms,
            "utilization": self.utilization,
            "wall_s": round(self.wall_s, 2),
            "events": self.events,
        }


@dataclass(frozen=True, slots=True)
class Probe:
    policy: str
    rate: float
    endpoints: int
    runs: tuple[SeedRun, ...]

    @property
    def goodput(self) -> float:
        """Pooled over the seeds: requests that met their SLO / requests."""
        n = sum(r.count for r in self.runs)
        return sum(r.met for r in self.runs) / n if n else 0.0

    @property
    def passed(self) -> bool:
        return self.goodput >= GOODPUT_TARGET

    @property
    def wall_s(self) -> float:
        return sum(r.wall_s for r in self.runs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "rate": self.rate,
            "endpoints": self.endpoints,
            "goodput": round(self.goodput, 4),
            "passed": self.passed,
            "runs": [r.to_dict() for r in self.runs],
        }


def _pct_ms(values: Sequence[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000.0, 1) if values else None


def seed_run(seed: int, requests: Sequence[RequestResult], data: dict[str, Any], wall_s: float) -> SeedRun:
    ok = [r for r in requests if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    atgt = [r.atgt_s for r in ok if r.atgt_s is not None]
    ttft_miss = sum(1 for r in ok if r.ttft_s is not None and r.ttft_s > TTFT_S)
    atgt_miss = sum(
        1
        for r in ok
        if r.ttft_s is not None and r.ttft_s <= TTFT_S and r.atgt_s is not None and r.atgt_s > ATGT_S
    )
    return SeedRun(
        seed=seed,
        count=len(requests),
        met=sum(1 for r in requests if r.slo_met),
        rejected=sum(1 for r in requests if not r.ok and r.status is not None and r.status >= 400),
        ttft_miss=ttft_miss,
        atgt_miss=atgt_miss,
        ttft_p95_ms=_pct_ms(ttft, 95),
        atgt_p95_ms=_pct_ms(atgt, 95),
        utilization=data["fleet"]["utilization"],
        wall_s=wall_s,
        events=int(data["simulation"]["events"]),
    )


@dataclass(frozen=True, slots=True)
class AladdinConfig:
    out: Path
    rates: tuple[float, ...] = DEFAULT_RATES
    policies: tuple[str, ...] = tuple(POLICIES)
    seed: int = 1
    seeds: int = DEFAULT_SEEDS
    duration_s: float = DEFAULT_DURATION_S
    stop_above: int = STOP_ABOVE
    max_endpoints: int = MAX_ENDPOINTS

    def seed_list(self) -> tuple[int, ...]:
        return tuple(range(self.seed, self.seed + max(1, self.seeds)))


def fleet(n: int, profile: str = PROFILE) -> tuple[EndpointSpec, ...]:
    """`n` endpoints of the one model: FCFS engines, berth's cap at the engine's seats."""
    seats = get_profile(profile).max_num_seqs
    return tuple(
        EndpointSpec(models=(MODEL,), profile=profile, seed=i, id=f"a{i:03d}", cap=seats) for i in range(n)
    )


def gateway_toml(profile: str = PROFILE) -> str:
    """berth's settings for every run: the engine's seats as the cap, a queue that never overflows, the
    profile's latency model and KV size as the telemetry prior; the rest at its defaults."""
    prof = get_profile(profile)
    lat = prof.latency
    return "\n".join(
        [
            "# berth-loadgen bench aladdin: berth's settings (its [[endpoints]] come from the fleet)",
            "[limits]",
            "max_queue_per_model = 100000",
            f"default_endpoint_cap = {prof.max_num_seqs}",
            "[telemetry]",
            f"kv_capacity_tokens = {prof.kv_capacity_tokens}",
            *lat.prior_toml("the profile's latency model: an operator's profiling step"),
            "",
        ]
    )


def policy_path(cfg: AladdinConfig, policy: str) -> Path:
    """The policy file of `policy`: a shipped one, or a variant of berth's written into the output."""
    variant = VARIANTS.get(policy)
    if variant is None:
        return POLICY_DIR / POLICIES[policy]
    path = cfg.out / f"{policy}.toml"
    path.write_text(variant.apply((POLICY_DIR / POLICIES[BERTH]).read_text()))
    return path


def policy_source(policy: str) -> str:
    if policy in POLICIES:
        return f"policies/{POLICIES[policy]}"
    return f"policies/{POLICIES[BERTH]} ({VARIANTS[policy].about})"


def run_probe(cfg: AladdinConfig, gateway: Path, policy: str, rate: float, n: int) -> Probe:
    runs: list[SeedRun] = []
    path = policy_path(cfg, policy)
    for seed in cfg.seed_list():
        opts = SimOptions(
            policy=path,
            fleet=fleet(n),
            gateway=gateway,
            workload=WORKLOAD,
            rate=rate,
            duration_s=cfg.duration_s,
            seed=seed,
            slo_headers=True,
            drain_timeout_s=DRAIN_S,
        )
        t0 = time.perf_counter()
        report = simulate(opts)
        runs.append(seed_run(seed, report.requests, report.data, time.perf_counter() - t0))
    return Probe(policy, rate, n, tuple(runs))
