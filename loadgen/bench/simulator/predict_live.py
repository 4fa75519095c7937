"""How close a live berth's fitted performance model gets to the engine simulator's (a benchmark).

    berth-loadgen bench predict-live --out DIR                      # about 2 minutes on 2 cores
    berth-loadgen bench predict-live --berth-dir OTHER --out DIR    # berth from another checkout

Setup: one `SimFleet` endpoint (``--profile``, its max_num_seqs, ``--speed``) in this process, and berth
as a subprocess in front of it (``python -m gateway.cli serve --endpoint URL,engine=vllm`` with
``[telemetry] refit_interval_s`` = ``--refit-s``; from ``--berth-dir`` when given, e.g. an export of the
commit before a change). This process sends ``--requests`` streaming chat requests through berth,
shaped like the ``sharegpt-like`` workload (output pinned with min_tokens = max_tokens), with Poisson
arrivals whose rate ramps from ``--rate-lo`` to ``--rate-hi`` requests/s (profile time): the engine goes
from one request at a time to saturated, with a queue inside it. After the last response it waits for
berth's next refit and reads ``/admin/fleet``.

Berth fits from what it sees live; the figures compare its coefficients (times the speed-up, so they
are in profile seconds) with the profile's true latency model:
- prefill MAPE over prompts of 16..4096 tokens and at the run's operating points (each prefill
  iteration's prompt tokens, derived from this client's own token receipts by berth's own token
  timeline, as `loadgen.bench.simulator.predict_accuracy` does);
- decode-iteration MAPE over batch 1..max_num_seqs x context 100..2000 and at the run's operating
  points (each stream's mean batch and context);
- for information, the fit error berth reports (``mape`` of each part: how well its coefficients explain
  its own observations) and its observation counts.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import aiohttp
import orjson

from gateway.sched.perf import PerfCoefficients
from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.simulator.predict_client import (
    Stream,
    draw_requests,
    open_stream,
    ramp_arrivals,
    read_stream,
)
from loadgen.bench.simulator.predict_figures import decode_mape, grid_mape, prefill_mape
from loadgen.bench.simulator.predict_telemetry import BerthTelemetry
from loadgen.bench.skeleton import run_bench
from loadgen.engine_sim.fleet import SimFleet
from loadgen.engine_sim.profiles import get_profile
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.harness import REPO_ROOT, RunningServer, ServerStartError, start_berth

MODEL: Final = "bench-model"  # what predict_accuracy's requests ask for
REFIT_WAIT_S: Final = 60.0
_clock = time.perf_counter
COEFFICIENT_NAMES: Final = ("k1", "c1", "k2", "c2", "c3")


def fleet_document(berth: RunningServer) -> dict[str, Any]:
    status, body = berth.get("/admin/fleet")
    if status != 200:
        raise RuntimeError(f"berth /admin/fleet answered {status}: {body[:200]}")
    doc: dict[str, Any] = orjson.loads(body)
    return doc


def wait_for_refit(berth: RunningServer, after_s: float) -> dict[str, Any]:
    """/admin/fleet once berth has refitted at least `after_s` seconds after the wall clock's now."""
    start = _clock()
    while True:
        doc = fleet_document(berth)
        age = doc["telemetry"]["last_refit_age_s"]
        if age is not None and age < _clock() - start - after_s:
            return doc
        if _clock() - start > REFIT_WAIT_S:
            raise RuntimeError(f"berth did not refit within {REFIT_WAIT_S:.0f} s of the last response")
        time.sleep(0.25)


def coefficients(perf: dict[str, Any], speed: float) -> PerfCoefficients:
    """The fitted coefficients in profile seconds (the engine ran `speed` times faster)."""
    pre, dec, kv, tput = perf["prefill"], perf["decode"], perf["kv"], perf["throughput"]
    return PerfCoefficients(
        k1=pre["k1"] * speed,
        c1=pre["c1"] * speed,
        k2=dec["k2"] * speed,
        c2=dec["c2"] * speed,
        c3=dec["c3"] * speed,
        h=kv["h"],
        j=kv["j"],
        thr1=tput["thr1"] / speed,
        alpha=tput["alpha"] / speed,
        beta=tput["beta"],
        prefill_mape=pre["mape"],
        decode_mape=dec["mape"],
        kv_mape=kv["mape"],
        n_prefill=pre["n"],
        n_decode=dec["n"],
        n_kv=kv["n"],
    )


async def send_all(url: str, streams: list[Stream], arrivals: list[float]) -> None:
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(st: Stream) -> None:
            try:
                resp = await open_stream(session, url, st)
            except aiohttp.ClientError as e:
                st.error = type(e).__name__
                return
            await read_stream(resp, st)

        origin = _clock()
        async with asyncio.TaskGroup() as tg:
            for st, at in zip(streams, arrivals, strict=True):
                delay = origin + at - _clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                tg.create_task(one(st), name=f"req-{st.index}")


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    profile = get_profile(args.profile)
    true = profile.latency
    speed = float(args.speed)
    rng = random.Random(args.seed)
    streams = draw_requests(args.requests, rng, 0)
    arrivals = [t / speed for t in ramp_arrivals(args.requests, args.rate_lo, args.rate_hi, rng)]
    spec = EndpointSpec(models=(MODEL,), profile=args.profile, speed=speed, load_time_s=0.0, seed=args.seed)
    config = workdir / "gateway.toml"
    config.write_text(f"[telemetry]\nrefit_interval_s = {args.refit_s}\n")
    berth_dir: Path = args.berth_dir or REPO_ROOT
    async with SimFleet([spec]) as fleet:
        print(f"berth from {berth_dir}", file=sys.stderr)
        berth = await asyncio.to_thread(
            start_berth,
            f"{fleet.urls[0]},engine=vllm",
            workdir / "berth.log",
            extra_args=["-c", str(config)],
            cwd=berth_dir,
        )
        try:
            print(f"{len(streams)} requests through {berth.base_url}", file=sys.stderr)
            wall0 = _clock()
            await send_all(berth.base_url, streams, arrivals)
            wall = _clock() - wall0
            doc = await asyncio.to_thread(wait_for_refit, berth, 0.0)
        finally:
            await asyncio.to_thread(berth.process.stop)
        timer_lag = fleet.endpoints[0].state()["timer_lag"]
    [ep] = doc["endpoints"]
    fit = coefficients(ep["perf"], speed)
    points = BerthTelemetry().add_phase(streams, [], speed)
    pre_points, dec_points = points.prefill, points.decode
    grid_pre, grid_dec = grid_mape(fit, true, profile.max_num_seqs)
    return {
        "command": " ".join(["berth-loadgen bench predict-live", *map(shlex.quote, sys.argv[1:])]),
        "berth_dir": str(berth_dir),
        "settings": {
            k: getattr(args, k)
            for k in ("profile", "speed", "seed", "requests", "rate_lo", "rate_hi", "refit_s")
        },
        "true": {k: getattr(true, k) for k in COEFFICIENT_NAMES},
        "fit": {k: getattr(fit, k) for k in COEFFICIENT_NAMES},
        "figures": {
            "prefill_mape_grid": grid_pre,
            "decode_mape_grid": grid_dec,
            "prefill_mape_points": prefill_mape(fit, true, pre_points),
            "decode_mape_points": decode_mape(fit, true, dec_points),
        },
        "berth": {
            "prefill_fit_mape": fit.prefill_mape,
            "decode_fit_mape": fit.decode_mape,
            "n_prefill": fit.n_prefill,
            "n_decode": fit.n_decode,
            "prediction_error": ep["prediction_error"],
        },
        "points": {"prefill": len(pre_points), "decode": len(dec_points)},
        "requests": len(streams),
        "errors": sum(1 for s in streams if not s.ok),
        "timer_lag": timer_lag,
        "wall_s": wall,
    }


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.1f} %"


def render(result: dict[str, Any]) -> str:
    true, fit, fig, b, s = (
        result["true"],
        result["fit"],
        result["figures"],
        result["berth"],
        result["settings"],
    )
    lines = [
        f"$ {result['command']}",
        f"berth from {result['berth_dir']}; profile {s['profile']} at speed {s['speed']:g}: "
        f"{result['requests']} requests ({result['errors']} errors), {s['rate_lo']:g} -> {s['rate_hi']:g} "
        f"req/s, wall {result['wall_s']:.0f} s, "
        f"engine timer lag {result['timer_lag']['mean_ms']:.2f} ms mean",
        "",
        "coefficient        true        live fit   rel. error",
        *(
            f"  {k:<4}      {true[k]:>10.4g}  {fit[k]:>10.4g}   {_pct(abs(fit[k] - true[k]) / true[k])}"
            for k in COEFFICIENT_NAMES
        ),
        "",
        f"{'MAPE vs the true model':<30} {'grid':>9} {'run points':>11}",
        *(
            f"  {part + ' iteration':<28} {_pct(fig[part + '_mape_grid']):>9} "
            f"{_pct(fig[part + '_mape_points']):>11}"
            for part in ("prefill", "decode")
        ),
        f"berth's own fit error: prefill {_pct(b['prefill_fit_mape'])} over {b['n_prefill']} observations, "
        f"decode {_pct(b['decode_fit_mape'])} over {b['n_decode']}",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="berth-loadgen bench predict-live", description=__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--profile", default="fleet-7b")
    ap.add_argument("--speed", type=float, default=2.0, help="engine speed-up")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--requests", type=int, default=180)
    ap.add_argument("--rate-lo", type=float, default=0.3, help="requests/s at the start (profile time)")
    ap.add_argument("--rate-hi", type=float, default=1.5, help="requests/s at the end (profile time)")
    ap.add_argument("--refit-s", type=float, default=2.0, help="berth's [telemetry] refit_interval_s")
    ap.add_argument(
        "--berth-dir", type=lambda s: Path(s).resolve(), default=None, help="run berth from this checkout"
    )
    ap.add_argument("--out", type=Path, default=Path("bench-out/predict-live"), help="report directory")
    args = ap.parse_args(argv)

    def measure(a: argparse.Namespace) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="berth-predict-live-") as tmp:
            result = asyncio.run(run(a, Path(tmp)))
        print(render(result))
        return result

    return run_bench(
        BENCHMARKS["predict-live"],
        args,
        measure,
        report=lambda r: (r, "```\n" + render(r) + "\n```"),
        failures=(ServerStartError,),
    )


if __name__ == "__main__":
    raise SystemExit(main())
