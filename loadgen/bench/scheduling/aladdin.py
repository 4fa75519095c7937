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
from pathlib import Path
from typing import Any

import orjson

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.entry import say
from loadgen.bench.scheduling import capacity
from loadgen.bench.scheduling.aladdin_probe import (
    ATGT_S,
    BERTH,
    DEFAULT_DURATION_S,
    DEFAULT_RATES,
    DEFAULT_SEEDS,
    FLOOR_RATIO_TARGET,
    FLOOR_SAMPLE,
    GOODPUT_TARGET,
    JSQ,
    MAX_ENDPOINTS,
    MODEL,
    POLICIES,
    PROFILE,
    QUICK_DURATION_S,
    QUICK_RATES,
    STOP_ABOVE,
    TTFT_S,
    VARIANTS,
    WORKLOAD,
    AladdinConfig,
    Probe,
    gateway_toml,
    policy_source,
    run_probe,
)
from loadgen.bench.scheduling.aladdin_report import floor_verdict, markdown
from loadgen.bench.scheduling.aladdin_search import SloFloor, fewest, fit_workers, slo_floor
from loadgen.bench.skeleton import run_bench
from loadgen.engine_sim.profiles import get_profile
from loadgen.fleetsim.sim import LEFT_OUT
from loadgen.workloads import get_workload
from loadgen.workloads.base import TaskMix


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
