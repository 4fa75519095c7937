"""Aladdin's question in Aladdin's own setting (papers/ALGORITHMS.md §2): at each arrival rate, the fewest
endpoints that keep goodput >= 0.95 under berth's best-fit preset, least outstanding (join the shortest
queue) and power of two; and the worker-count model ``N = ceil(k5·rate + c5)`` fitted to each policy's
answers.

    berth-loadgen bench aladdin --out DIR               # rates 10, 20, 40, ... until every policy needs > 50
    berth-loadgen bench aladdin --quick --out DIR       # rates 10 and 20, one seed, 60 simulated s
    berth-loadgen bench aladdin --rates 20,60 --seeds 3 --out DIR

Setup (every run on the offline fleet simulator, `loadgen.fleetsim`):
- one model on `a100-llama2-7b` endpoints (Llama-2 7B on an A100-80GB: 256 seats, 110k KV tokens);
- the `sharegpt-like:aladdin-7b` workload: ShareGPT-shaped lengths, Poisson arrivals, every request with
  Aladdin's A100 7B targets, TTFT 400 ms and ATGT 15 ms, sent as ``x-berth-ttft-ms`` /
  ``x-berth-itl-ms``; goodput is the share of requests that met both;
- engines run FCFS, as vLLM does by default and as Aladdin's workers did: every request has the same
  targets, so there is no urgency for an engine to act on;
- every endpoint's cap is the engine's max_num_seqs (256): the baselines send every request straight to
  an engine (Aladdin's JSQ baseline), best fit sizes each batch itself, within the seats;
- ``[telemetry.prior]`` is the profile's latency model (an operator's profiling step, as the scheduling
  benchmark does), so the fitted models are right from the first request.

Policies: `berth` is `policies/aladdin.toml` (best fit, fewest outstanding requests first on this fixed
fleet; its comments say where it departs from the paper); the baselines are the shipped
`policies/baseline-least-outstanding.toml` and `policies/baseline-power-of-two.toml` as they are (they
take the targets from the headers). `--policies` may add `aladdin-paper`: the preset with best fit in
the paper's order (most loaded first, endpoints running long last).

Search (`fewest`): goodput falls as endpoints go, so the fewest endpoints is found by galloping from a
guess (the policy's fitted model at the rates so far, at first 1.25 × the floor below) and bisecting, a
handful of probes per rate. A probe runs every seed (default two, 90 simulated s each) and pools their
requests; the report gives each seed's goodput at the answer and one endpoint below it, so one can see
whether a seed alone would have answered differently. Rates rise until every policy needs more than
`--stop-above` endpoints (50).

The floor (`slo_floor`): the fewest endpoints any router could use under the ATGT target. On the
simulator's iteration model a decode iteration takes ``c3 + Σ(c2 + k2·context)`` over the batch and a
prefill pauses every decode, so a request meets an ATGT target T only if, on average over its tokens,
``c3 + Σ_running(c2 + k2·context) <= T · (1 − prefill share)``. Over a whole endpoint that is
``rate × E[cost] <= 1 − c3/T`` per endpoint, with the cost of a call ``Σ_tokens(c2 + k2·context) +
k1·prompt + c1/m`` (m prompts share a prefill iteration, at most as many as fit the TTFT target). A
constant batch at exactly T is the best case (a batch that varies pays more for the same tokens:
iteration time is linear in the batch and each token waits for its iteration), so no router can do
better. With goodput 0.95 the costliest 5 % of calls may be given up, which only a router that knows
each call's output length ahead could choose; the report gives both. KV never binds here (a batch that
keeps 15 ms holds ~10k of 110k tokens), and the full-batch floor of `loadgen.bench.scheduling.capacity`, which
ignores the ATGT target, is far lower than either.

Output: `DIR/report.md` and `DIR/report.json` (the simulator's "left out" list first), progress on stdout.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import orjson

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.entry import say
from loadgen.bench.scheduling import capacity
from loadgen.bench.scheduling.scheduling_types import VARIANTS as PRESET_VARIANTS
from loadgen.bench.skeleton import run_bench
from loadgen.client import RequestResult
from loadgen.engine_sim.profiles import EngineProfile, get_profile
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim import SimOptions, simulate
from loadgen.fleetsim.sim import LEFT_OUT
from loadgen.workloads import get_workload
from loadgen.workloads.base import TaskMix, TaskSpec

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


# --------------------------------------------------------------------- the floor
def call_cost_s(profile: EngineProfile, prompt: int, output: int, *, ttft_s: float) -> float:
    """Seconds of per-request engine work a call costs at the least (see the module doc): its decode
    tokens' ``c2 + k2·context``, its prefill, and its share of the prefill iteration's fixed cost."""
    lat = profile.latency
    p = max(1, prompt)
    by_ttft = int((ttft_s - lat.c1) / (lat.k1 * p)) if lat.k1 > 0 else profile.max_num_seqs
    share = max(1, min(profile.max_num_seqs, profile.max_prefill_tokens // p, by_ttft))
    n = max(0, output - 1)
    decode = n * (lat.k2 * p + lat.c2) + lat.k2 * n * (n + 1) / 2
    return lat.k1 * p + lat.c1 / share + decode


@dataclass(frozen=True, slots=True)
class SloFloor:
    rate: float
    per_endpoint: float  # cost-seconds one endpoint can spend per second: 1 − c3 / ATGT
    cost_all: float  # mean cost per call, every call served
    cost_kept: float  # the same with the costliest (1 − goodput) share given up (summed over kept / all)

    @property
    def endpoints_all(self) -> float:
        return self.rate * self.cost_all / self.per_endpoint

    @property
    def endpoints_kept(self) -> float:
        return self.rate * self.cost_kept / self.per_endpoint


def slo_floor(
    profile: EngineProfile,
    tasks: Sequence[TaskSpec],
    rate: float,
    *,
    ttft_s: float = TTFT_S,
    atgt_s: float = ATGT_S,
    goodput: float = GOODPUT_TARGET,
) -> SloFloor:
    """The fewest endpoints (fractional) that can serve `tasks` at `rate` calls/s within the ATGT target."""
    c3 = profile.latency.c3
    if atgt_s <= c3:
        raise ValueError(f"an ATGT target of {atgt_s * 1000:g} ms is below one decode iteration's fixed cost")
    if not tasks:
        raise ValueError("no tasks to size")
    costs = sorted(
        call_cost_s(profile, c.prompt_tokens, c.output_tokens, ttft_s=ttft_s) for t in tasks for c in t.calls
    )
    keep = math.ceil(len(costs) * goodput - 1e-9)
    calls_per_task = len(costs) / len(tasks)
    return SloFloor(
        rate=rate * calls_per_task,
        per_endpoint=1.0 - c3 / atgt_s,
        cost_all=sum(costs) / len(costs),
        cost_kept=sum(costs[:keep]) / len(costs),
    )


# --------------------------------------------------------------------- the search
@dataclass(slots=True)
class Search:
    fewest: int | None  # None: not even `hi` endpoints were enough
    probes: dict[int, bool] = field(default_factory=dict)  # endpoints -> passed, in probe order


def fewest(ok: Callable[[int], bool], *, lo: int, hi: int, guess: int) -> Search:
    """The smallest n in [lo, hi] with ok(n), for ok monotone in n (false up to some n, true from it):
    gallop from `guess` (down while it passes, up while it fails, doubling the step), then bisect. About
    2·log2(|answer − guess|) + 2 probes; each n is probed at most once; n − 1 is probed whenever the
    answer n > lo."""
    if lo > hi:
        raise ValueError("empty search range")
    out = Search(None)

    def test(n: int) -> bool:
        if n not in out.probes:
            out.probes[n] = ok(n)
        return out.probes[n]

    g = min(hi, max(lo, guess))
    bad = lo - 1  # the largest n known to fail (lo - 1: none below lo)
    if test(g):
        good, step = g, 1
        while good - step >= lo:
            n = good - step
            if not test(n):
                bad = n
                break
            good, step = n, step * 2
    else:
        bad, step = g, 1
        while True:
            if bad >= hi:
                return out
            n = min(hi, bad + step)
            if test(n):
                good = n
                break
            bad, step = n, step * 2
    while good - bad > 1:
        mid = (good + bad) // 2
        if test(mid):
            good = mid
        else:
            bad = mid
    out.fewest = good
    return out


# --------------------------------------------------------------------- the worker-count model
@dataclass(frozen=True, slots=True)
class WorkerModel:
    """Aladdin's ``N = ceil(k5·rate + c5)``, least squares over (rate, fewest endpoints) points."""

    k5: float
    c5: float
    points: int
    max_residual: float  # the largest |N − (k5·rate + c5)| over the points

    def workers(self, rate: float) -> int:
        return max(1, math.ceil(self.k5 * rate + self.c5 - 1e-9))


def fit_workers(points: Sequence[tuple[float, int]]) -> WorkerModel | None:
    """The least-squares line through (rate, N); None with fewer than two distinct rates."""
    if len({r for r, _ in points}) < 2:
        return None
    x = np.array([r for r, _ in points], dtype=np.float64)
    y = np.array([n for _, n in points], dtype=np.float64)
    k5, c5 = np.polyfit(x, y, 1)
    resid = float(np.max(np.abs(y - (k5 * x + c5))))
    return WorkerModel(float(k5), float(c5), len(points), resid)


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


# --------------------------------------------------------------------- the benchmark
def guess_for(points: Sequence[tuple[float, int]], rate: float, floor: SloFloor) -> int:
    """Where to start a policy's search at `rate`: its fitted model through the rates so far (one
    point: scaled by the rate), else 1.25 × the floor."""
    model = fit_workers(points)
    if model is not None:
        return model.workers(rate)
    if points:
        r0, n0 = points[-1]
        return max(1, math.ceil(n0 * rate / r0))
    return max(1, math.ceil(1.25 * floor.endpoints_all))


def bench(cfg: AladdinConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    started = time.perf_counter()
    cfg.out.mkdir(parents=True, exist_ok=True)
    gateway = cfg.out / "gateway.toml"
    gateway.write_text(gateway_toml())
    workload = get_workload(WORKLOAD)
    assert isinstance(workload, TaskMix)
    tasks = capacity.sample(workload, FLOOR_SAMPLE, seed=0)
    profile = get_profile(PROFILE)
    answers: dict[str, list[tuple[float, int]]] = {p: [] for p in cfg.policies}
    rows: list[dict[str, Any]] = []
    probes: list[Probe] = []
    log(
        f"aladdin: {WORKLOAD} on {PROFILE}, {cfg.duration_s:g} simulated s x seeds {list(cfg.seed_list())}, "
        f"policies {', '.join(cfg.policies)}, out {cfg.out}"
    )
    for rate in cfg.rates:
        fl = slo_floor(profile, tasks, rate)
        row: dict[str, Any] = {
            "rate": rate,
            "floor_all": round(fl.endpoints_all, 2),
            "floor_kept": round(fl.endpoints_kept, 2),
            "fewest": {},
            "probes": {},
        }
        for policy in cfg.policies:
            done: dict[int, Probe] = {}

            def ok(n: int, policy: str = policy, rate: float = rate, done: dict[int, Probe] = done) -> bool:
                probe = run_probe(cfg, gateway, policy, rate, n)
                done[n] = probe
                probes.append(probe)
                seeds = " ".join(f"{r.goodput:.3f}" for r in probe.runs)
                log(
                    f"  rate={rate:g} {policy:18} n={n:3d} goodput={probe.goodput:.4f} "
                    f"(seeds {seeds}) {'pass' if probe.passed else 'fail'} wall={probe.wall_s:.1f}s"
                )
                return probe.passed

            guess = guess_for(answers[policy], rate, fl)
            found = fewest(ok, lo=1, hi=cfg.max_endpoints, guess=guess)
            row["fewest"][policy] = found.fewest
            row["probes"][policy] = [done[n].to_dict() for n in found.probes]
            if found.fewest is not None:
                answers[policy].append((rate, found.fewest))
            log(f"rate={rate:g} {policy}: fewest {found.fewest} ({len(found.probes)} probes)")
        rows.append(row)
        needs = [row["fewest"][p] for p in cfg.policies]
        if all(n is None or n > cfg.stop_above for n in needs):
            break
    models = {p: fit_workers(answers[p]) for p in cfg.policies}
    doc: dict[str, Any] = {
        "left_out": list(LEFT_OUT),
        "config": {
            "workload": WORKLOAD,
            "profile": PROFILE,
            "model": MODEL,
            "slo": {"ttft_ms": TTFT_S * 1000.0, "atgt_ms": ATGT_S * 1000.0},
            "goodput_target": GOODPUT_TARGET,
            "floor_ratio_target": FLOOR_RATIO_TARGET,
            "policies": {p: policy_source(p) for p in cfg.policies},
            "engine_scheduling": "fcfs",
            "cap": profile.max_num_seqs,
            "telemetry_prior": "the profile's latency model",
            "duration_sim_s": cfg.duration_s,
            "seeds": list(cfg.seed_list()),
            "rates": list(cfg.rates),
            "stop_above": cfg.stop_above,
            "max_endpoints": cfg.max_endpoints,
        },
        "rates": rows,
        "models": {
            p: None
            if m is None
            else {"k5": m.k5, "c5": m.c5, "points": m.points, "max_residual": m.max_residual}
            for p, m in models.items()
        },
        "ratio": ratio_at_top(rows),
        "wall_s": round(time.perf_counter() - started, 1),
        "sim_wall_s": round(sum(p.wall_s for p in probes), 1),
        "simulations": sum(len(p.runs) for p in probes),
    }
    (cfg.out / "report.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    text = markdown(doc)
    (cfg.out / "report.md").write_text(text)
    log(text)
    return doc


def ratio_at_top(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """berth's fewest / JSQ's at the highest rate where both have an answer."""
    for row in reversed(rows):
        b, j = row["fewest"].get(BERTH), row["fewest"].get(JSQ)
        if b is not None and j is not None:
            return {"rate": row["rate"], "berth": b, JSQ: j, "ratio": round(b / j, 3)}
    return None


# --------------------------------------------------------------------- the report
def _cell(v: Any, hi: int) -> str:
    return f"> {hi}" if v is None else str(v)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _at(row: dict[str, Any], policy: str, n: int | None) -> dict[str, Any] | None:
    if n is None:
        return None
    for p in row["probes"].get(policy, []):
        if p["endpoints"] == n:
            found: dict[str, Any] = p
            return found
    return None


def markdown(doc: dict[str, Any]) -> str:
    cfg = doc["config"]
    policies = list(cfg["policies"])
    hi = cfg["max_endpoints"]
    rows = doc["rates"]
    out = ["# Aladdin's question: the fewest endpoints for goodput >= 0.95", ""]
    out += ["What the simulator leaves out:", ""] + [f"- {x}" for x in doc["left_out"]] + [""]
    out += [
        "## Setup",
        "",
        f"- workload `{cfg['workload']}`: ShareGPT-shaped lengths, Poisson arrivals, every request with "
        f"TTFT {cfg['slo']['ttft_ms']:g} ms and ATGT {cfg['slo']['atgt_ms']:g} ms (Aladdin's A100 Llama-2 7B "
        "SLOs), sent as x-berth-ttft-ms / x-berth-itl-ms; goodput = requests that met both;",
        f"- one model on `{cfg['profile']}` endpoints; engines FCFS (one SLO for all: nothing for an engine "
        f"to prioritize); berth's cap = the engine's max_num_seqs ({cfg['cap']}); [telemetry.prior] = the "
        "profile's latency model (the operator's profiling step);",
        "- policies: " + ", ".join(f"{p} `{f}`" for p, f in cfg["policies"].items()) + ";",
        f"- each probe: {cfg['duration_sim_s']:g} simulated s of arrivals per seed, seeds {cfg['seeds']}, "
        "requests pooled; galloping + bisection over the endpoint count;",
        f"- rates rise until every policy needs more than {cfg['stop_above']} endpoints (search bound {hi}).",
        "",
        "## Fewest endpoints per rate",
        "",
    ]
    header = ["rate (req/s)", "floor: all / 95 %", *policies]
    if BERTH in policies and JSQ in policies:
        header.append("berth / JSQ")
    table = []
    for row in rows:
        f = row["fewest"]
        cells = [f"{row['rate']:g}", f"{row['floor_all']:.1f} / {row['floor_kept']:.1f}"]
        cells += [_cell(f.get(p), hi) for p in policies]
        if BERTH in policies and JSQ in policies:
            b, j = f.get(BERTH), f.get(JSQ)
            cells.append("-" if b is None or j is None else f"{b / j:.2f}")
        table.append(cells)
    out += _table(header, table)
    out += [
        "",
        "Floor: the fewest endpoints any router could use within the ATGT target (ideal engines at exactly "
        "15 ms per token, constant batches; `slo_floor`), serving every request / giving up the costliest "
        "5 % (which needs each request's output length ahead).",
        "",
        "## Worker-count model N = ceil(k5 · rate + c5), least squares",
        "",
    ]
    mrows = []
    for p in policies:
        m = doc["models"].get(p)
        if m is None:
            mrows.append([p, "-", "-", "-", "-"])
        else:
            mrows.append(
                [p, f"{m['k5']:.4f}", f"{m['c5']:.2f}", str(m["points"]), f"{m['max_residual']:.2f}"]
            )
    out += _table(["policy", "k5 (endpoints per req/s)", "c5", "points", "max |residual|"], mrows)
    out += ["", "## Target", ""]
    out += target_lines(doc)
    out += [
        "",
        "## Stability: goodput per seed at the answer N and at N - 1",
        "",
    ]
    srows = []
    for row in rows:
        for p in policies:
            n = row["fewest"].get(p)
            at, below = _at(row, p, n), _at(row, p, None if n is None else n - 1)
            srows.append([f"{row['rate']:g}", p, _cell(n, hi), _seeds(below), _seeds(at), _flips(at, below)])
    out += _table(["rate", "policy", "N", "seeds at N - 1", "seeds at N", "one seed alone"], srows)
    out += ["", "## At the answer: how each policy misses", ""]
    mrows2 = [
        miss_row(row["rate"], at)
        for row in rows
        for p in policies
        if (at := _at(row, p, row["fewest"].get(p))) is not None
    ]
    out += _table(
        [
            "rate",
            "policy",
            "N",
            "goodput",
            "refused",
            "TTFT miss",
            "ATGT miss",
            "TTFT p95 ms",
            "ATGT p95 ms",
            "busy share",
        ],
        mrows2,
    )
    out += [
        "",
        "Refused: berth answered 429 (slo_infeasible); TTFT miss: served, first token late; ATGT miss: "
        "first token in time, average token time over target (shares of all requests). Busy share: "
        "endpoints running at least one request, sampled every 2 simulated s.",
        "",
        f"{doc['simulations']} simulations, {doc['sim_wall_s']:g} s of simulation; the benchmark took "
        f"{doc['wall_s']:g} s.",
        "",
    ]
    return "\n".join(out)


def _seeds(probe: dict[str, Any] | None) -> str:
    return "-" if probe is None else " ".join(f"{r['goodput']:.3f}" for r in probe["runs"])


def miss_row(rate: float, probe: dict[str, Any]) -> list[str]:
    """One probe's goodput and misses by cause (shares of its requests), p95s and busy share (seed means)."""
    rs: list[dict[str, Any]] = probe["runs"]
    count = sum(r["count"] for r in rs)

    def share(key: str) -> str:
        return f"{sum(r[key] for r in rs) / count:.3f}" if count else "-"

    def mean(key: str, digits: int = 1) -> str:
        vals = [r[key] for r in rs if r[key] is not None]
        return f"{sum(vals) / len(vals):.{digits}f}" if vals else "-"

    return [
        f"{rate:g}",
        probe["policy"],
        str(probe["endpoints"]),
        f"{probe['goodput']:.3f}",
        share("rejected"),
        share("ttft_miss"),
        share("atgt_miss"),
        mean("ttft_p95_ms"),
        mean("atgt_p95_ms"),
        mean("utilization", 3),
    ]


def _flips(at: dict[str, Any] | None, below: dict[str, Any] | None) -> str:
    """Whether a seed alone would have answered differently: one failing at N, or one passing at N - 1."""
    notes = []
    if at is not None and any(r["goodput"] < GOODPUT_TARGET for r in at["runs"]):
        notes.append("N + 1 or more")
    if below is not None and any(r["goodput"] >= GOODPUT_TARGET for r in below["runs"]):
        notes.append("N - 1 or fewer")
    return " / ".join(notes) if notes else "same N"


def floor_verdict(doc: dict[str, Any]) -> dict[str, Any] | None:
    """berth's fewest endpoints over the floor at the highest rate where berth has an answer (with
    least outstanding's beside it); None when berth found none."""
    for row in reversed(doc["rates"]):
        b = row["fewest"].get(BERTH)
        if b is None:
            continue
        floor = row["floor_all"]
        j = row["fewest"].get(JSQ)
        return {
            "rate": row["rate"],
            "floor": floor,
            BERTH: b,
            JSQ: j,
            "berth_ratio": b / floor,
            "jsq_ratio": None if j is None else j / floor,
            "passed": b / floor <= FLOOR_RATIO_TARGET,
        }
    return None


def target_lines(doc: dict[str, Any]) -> list[str]:
    """The target at the highest rate: berth's endpoints within FLOOR_RATIO_TARGET x the floor (least
    outstanding's ratio beside it, and berth's ratio to least outstanding as Aladdin states it)."""
    v = floor_verdict(doc)
    if v is None:
        return ["No rate where berth found an answer: no verdict."]
    jsq = "no answer" if v["jsq_ratio"] is None else f"{v[JSQ]} endpoints, {v['jsq_ratio']:.2f}x the floor"
    lines = [
        f"At {v['rate']:g} req/s the floor (the fewest endpoints any router serving every request within "
        f"the ATGT target could use) is {v['floor']:.1f}; berth needs {v[BERTH]}: {v['berth_ratio']:.2f}x "
        f"the floor (target <= {FLOOR_RATIO_TARGET:g}x): **{'PASS' if v['passed'] else 'FAIL'}**. "
        f"Least outstanding: {jsq}.",
    ]
    ratio = doc.get("ratio")
    if ratio is not None:
        lines += [
            "",
            f"berth / least outstanding at {ratio['rate']:g} req/s: {ratio['ratio']:.2f} (Aladdin reports "
            "0.6 against join-shortest-queue; least outstanding here is already near the floor, so the floor "
            "is the measure).",
        ]
    return lines


# --------------------------------------------------------------------- the command
def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="berth-loadgen bench aladdin", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("bench-aladdin"), help="output directory")
    p.add_argument(
        "--rates", help=f"req/s, comma-separated (default {','.join(f'{r:g}' for r in DEFAULT_RATES)})"
    )
    p.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"subset of {', '.join(POLICIES)}, or {', '.join(VARIANTS)} (berth's preset, the paper's order)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help="seeds per probe (requests pooled)")
    p.add_argument("--duration", type=float, default=DEFAULT_DURATION_S, help="simulated s of arrivals")
    p.add_argument("--stop-above", type=int, default=STOP_ABOVE, help="stop once every policy needs more")
    p.add_argument("--max-endpoints", type=int, default=MAX_ENDPOINTS, help="the search's upper bound")
    p.add_argument("--quick", action="store_true", help="rates 10 and 20, one seed, 60 simulated s")
    return p


def config_from_args(args: argparse.Namespace) -> AladdinConfig | str:
    policies = tuple(x.strip() for x in args.policies.split(",") if x.strip())
    unknown = [x for x in policies if x not in POLICIES and x not in VARIANTS]
    if unknown or not policies:
        return f"unknown policies: {', '.join(unknown) or '(none given)'}"
    if args.seeds < 1 or args.max_endpoints < 1 or args.duration <= 0:
        return "--seeds and --max-endpoints must be >= 1 and --duration > 0"
    rates = _floats(args.rates) if args.rates else (QUICK_RATES if args.quick else DEFAULT_RATES)
    if not rates or any(r <= 0 for r in rates):
        return "--rates must be positive"
    return AladdinConfig(
        out=args.out,
        rates=tuple(sorted(rates)),
        policies=policies,
        seed=args.seed,
        seeds=1 if args.quick else args.seeds,
        duration_s=QUICK_DURATION_S if args.quick else args.duration,
        stop_above=args.stop_above,
        max_endpoints=args.max_endpoints,
    )


def main(argv: Sequence[str] | None = None) -> int:
    cfg = config_from_args(build_parser().parse_args(argv))
    return run_bench(
        BENCHMARKS["aladdin"],
        cfg,
        lambda c: bench(c, log=say),
        passed=lambda doc: bool((v := floor_verdict(doc)) is not None and v["passed"]),
    )


if __name__ == "__main__":
    sys.exit(main())
