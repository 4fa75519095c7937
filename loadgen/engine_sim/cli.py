"""``berth-engine-sim``: serve one or many simulated vLLM/SGLang endpoints from one process.

    berth-engine-sim --flavor vllm --model codellama-7b --port 8001 --profile fleet-7b
    berth-engine-sim --count 12 --port 9001 --profile fleet-7b --speed 10
    berth-engine-sim --fleet conf/sim-fleet.toml --port 9001

All endpoints share one uvloop event loop. With a single endpoint the ``die_after_tokens`` fault exits
the process (status 1); in a multi-endpoint process it resets that endpoint's connections and stops its
listener.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
from collections.abc import Sequence

from loadgen.engine_sim.faults import Faults
from loadgen.engine_sim.fleet import FleetFileError, SimFleet, load_fleet_file, replicate
from loadgen.engine_sim.latency import LatencyModel
from loadgen.engine_sim.lengths import LengthDist
from loadgen.engine_sim.profiles import DEFAULT_PROFILE, PROFILES, get_profile
from loadgen.engine_sim.server import SimEndpoint
from loadgen.engine_sim.spec import EndpointSpec


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="berth-engine-sim",
        description="Simulated vLLM/SGLang endpoints (continuous batching, real metrics).",
    )
    p.add_argument("--flavor", choices=("vllm", "sglang"), default="vllm")
    p.add_argument(
        "--model",
        action="append",
        default=None,
        help="served model name; repeat or give a comma-separated alias list (default: sim-model)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="port of the first endpoint (0: free ports)")
    p.add_argument("--count", type=int, default=1, help="serve N endpoints on ports PORT .. PORT+N-1")
    p.add_argument(
        "--fleet", metavar="FILE", help="TOML fleet file (mixed fleets); see loadgen/engine_sim/fleet.py"
    )
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=f"preset ({', '.join(sorted(PROFILES))})")
    p.add_argument("--list-profiles", action="store_true", help="print the presets and exit")
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--kv-capacity-tokens", type=int)
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--max-prefill-tokens", type=int)
    for name, what in (
        ("k1", "prefill seconds per prompt token"),
        ("c1", "prefill seconds per iteration"),
        ("k2", "decode seconds per context token per request"),
        ("c2", "decode seconds per request"),
        ("c3", "decode seconds per iteration"),
    ):
        p.add_argument(f"--{name}", type=float, help=f"latency model: {what} (overrides the profile)")
    p.add_argument(
        "--output-len", type=LengthDist.parse, help="fixed:N | uniform:LO:HI | lognormal:MEAN:SIGMA"
    )
    p.add_argument("--load-time-s", type=float, help="health answers 503 for this long after start")
    p.add_argument("--speed", type=float, default=1.0, help="time scale: 10 runs everything ten times faster")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default="fcfs")
    c = p.add_argument_group("prefix cache and KV events (docs/engine-simulator.md)")
    c.add_argument(
        "--prefix-cache",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="automatic prefix caching (default: the profile's setting)",
    )
    c.add_argument("--block-size", type=int, help="KV block size in tokens (default: the profile's, 16)")
    c.add_argument(
        "--kv-events",
        metavar="tcp://HOST:PORT",
        help="publish KV events as vLLM does (ZMQ PUB); with --count each endpoint takes the next port",
    )
    c.add_argument(
        "--kv-events-replay",
        metavar="tcp://HOST:PORT",
        help="the replay (ROUTER) socket, vLLM's replay_endpoint (default: none); next ports with --count",
    )
    c.add_argument(
        "--kv-events-format",
        choices=("map", "array"),
        default="map",
        help="map: tagged maps (current vLLM); array: positional arrays (older vLLM, SGLang)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="like vLLM's --api-key: engine routes answer 401 without 'Authorization: Bearer KEY' "
        "(default: $BERTH_SIM_API_KEY, else none)",
    )
    f = p.add_argument_group("faults (also settable at run time: POST /sim/faults)")
    f.add_argument("--fail-fraction", type=float, default=0.0)
    f.add_argument("--die-after-tokens", type=int)
    f.add_argument("--stall-after-tokens", type=int)
    f.add_argument("--stall-fraction", type=float, default=1.0)
    f.add_argument("--metrics-delay-s", type=float, default=0.0)
    f.add_argument("--metrics-garbage", action="store_true")
    f.add_argument("--health-503", action="store_true")
    return p


def _models(values: Sequence[str] | None) -> tuple[str, ...]:
    if not values:
        return ("sim-model",)
    out: list[str] = []
    for v in values:
        out.extend(m.strip() for m in v.split(",") if m.strip())
    return tuple(out)


def specs_from_args(args: argparse.Namespace) -> list[EndpointSpec]:
    if args.fleet:
        return load_fleet_file(args.fleet, host=args.host, base_port=args.port)
    latency: LatencyModel | None = None
    overrides = {k: getattr(args, k) for k in ("k1", "c1", "k2", "c2", "c3") if getattr(args, k) is not None}
    if overrides:
        latency = dataclasses.replace(get_profile(args.profile).latency, **overrides)
    faults = Faults(
        fail_fraction=args.fail_fraction,
        die_after_tokens=args.die_after_tokens,
        stall_after_tokens=args.stall_after_tokens,
        stall_fraction=args.stall_fraction,
        metrics_delay_s=args.metrics_delay_s,
        metrics_garbage=args.metrics_garbage,
        health_503=args.health_503,
    )
    spec = EndpointSpec(
        flavor=args.flavor,
        models=_models(args.model),
        host=args.host,
        port=args.port,
        profile=args.profile,
        latency=latency,
        max_num_seqs=args.max_num_seqs,
        kv_capacity_tokens=args.kv_capacity_tokens,
        max_model_len=args.max_model_len,
        max_prefill_tokens=args.max_prefill_tokens,
        load_time_s=args.load_time_s,
        output_len=args.output_len,
        speed=args.speed,
        seed=args.seed,
        scheduling_policy=args.scheduling_policy,
        faults=faults,
        api_key=args.api_key or os.environ.get("BERTH_SIM_API_KEY") or None,
        prefix_cache=args.prefix_cache,
        block_size=args.block_size,
        kv_events=args.kv_events,
        kv_events_replay=args.kv_events_replay,
        kv_events_format=args.kv_events_format,
    )
    if args.count < 1:
        raise ValueError("--count must be >= 1")
    return replicate(spec, args.count, base_port=args.port) if args.count > 1 else [spec]


def _exit_process(ep: SimEndpoint) -> None:
    sys.stdout.write(f"berth-engine-sim: {ep.url} dies (die_after_tokens fault)\n")
    sys.stdout.flush()
    os._exit(1)


async def serve(specs: Sequence[EndpointSpec]) -> None:
    """Serve `specs` until SIGINT/SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    async with SimFleet(specs, on_die=_exit_process if len(specs) == 1 else None) as fleet:
        for ep in fleet.endpoints:
            prof = ep.spec.profile
            cache = ""
            if ep.resolved.engine.prefix_caching:
                cache = f" prefix-cache(block={ep.resolved.engine.block_size})"
            if ep.kv_events is not None:
                cache += f" kv-events={ep.kv_events.endpoint}"
                if ep.kv_events.replay_endpoint is not None:
                    cache += f" replay={ep.kv_events.replay_endpoint}"
            print(
                f"berth-engine-sim: {ep.spec.flavor} {','.join(ep.spec.models)} profile={prof} "
                f"speed={ep.spec.speed:g}{cache} at {ep.url}",
                flush=True,
            )
        await stop.wait()


def _print_profiles() -> None:
    for name, prof in sorted(PROFILES.items()):
        lat = prof.latency
        tag = " [fleet benchmarks]" if prof.fleet_bench else ""
        print(
            f"{name:16} seqs={prof.max_num_seqs:<4} kv={prof.kv_capacity_tokens:<7} "
            f"k1={lat.k1:g} c1={lat.c1:g} k2={lat.k2:g} c2={lat.c2:g} c3={lat.c3:g}  {prof.description}{tag}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list_profiles:
        _print_profiles()
        return 0
    try:
        specs = specs_from_args(args)
    except (FleetFileError, ValueError) as e:
        print(f"berth-engine-sim: {e}", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.run(serve(specs))
    except ImportError:  # pragma: no cover - uvloop is a dependency
        asyncio.run(serve(specs))
    except OSError as e:
        print(f"berth-engine-sim: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
