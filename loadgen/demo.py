"""`berth demo`: the embedded default a new user runs first (a `berth.commands` entry point: the daemon
package does not import the simulator).

First (unless `--no-compare`) the comparison that shows why berth (`loadgen.demo_compare`): berth's
chat-and-batch preset beside a plain least-outstanding router on the same simulated fleet and trace, on
the offline fleet simulator (seconds), side by side, and a PNG of the latency distributions. Then, live,
in one process and one event loop: a simulated fleet (two models, four endpoints across instance classes,
sped up 10x), berth in front of it with the default policy, and the `chat-batch` workload (interactive
chat plus a batch queue) for `duration_s` with a live view. Then the per-class results table, and berth
keeps serving on http://127.0.0.1:PORT with ready-to-paste snippets until Ctrl-C.

`berth demo --autoscale` is the autoscaler's demo instead (`loadgen.demo_autoscale`): a real node agent
starts and stops simulated engines as a burst comes and goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.app import Gateway, ServeOptions, build_app
from gateway.config import apply_overrides, default_config, load_runtime, parse_endpoint_flag
from gateway.core.logging import configure_logging
from gateway.core.runloop import run
from gateway.sched.plugins import default_registry
from loadgen import demo_compare
from loadgen.demo_autoscale import run_demo
from loadgen.engine_sim.fleet import SimFleet
from loadgen.engine_sim.spec import EndpointSpec as SimSpec
from loadgen.progress import ProgressBar
from loadgen.render import format_report
from loadgen.runner import LiveSnapshot, RunOptions, run_workload

SPEED = 10.0  # simulated engines run this many times faster than real GPUs; SLOs are scaled to match
DEFAULT_RATE = 4.0  # workload arrivals per second
AUTOSCALE_DURATION_S = 90.0
FLEET: tuple[tuple[str, str], ...] = (  # (model, instance class)
    ("chat-7b", "interactive"),
    ("chat-7b", "mixed"),
    ("code-13b", "mixed"),
    ("code-13b", "batch"),
)
_PROFILE = {"chat-7b": "fleet-7b", "code-13b": "fleet-13b"}


def main(argv: Sequence[str]) -> int:
    """`berth demo [--duration S] [--port N] [--no-serve] [--rate R] [--no-compare] [--out DIR]
    [--autoscale]`."""
    p = argparse.ArgumentParser(
        prog="berth demo", description="a simulated fleet with berth in front of it and a mixed workload"
    )
    p.add_argument(
        "--duration", type=float, default=None, help="seconds of workload (default 60; 90 with --autoscale)"
    )
    p.add_argument("--port", type=int, default=8080, help="berth's port (default 8080)")
    p.add_argument("--no-serve", action="store_true", help="exit after the results instead of serving on")
    p.add_argument("--rate", type=float, default=None, help="requests/s of the demo workload")
    p.add_argument(
        "--no-compare",
        action="store_true",
        help="skip the first act: berth beside a plain router on the fleet simulator",
    )
    p.add_argument(
        "--out", default="berth-demo", help="where the comparison's PNG goes (default ./berth-demo)"
    )
    p.add_argument(
        "--autoscale",
        action="store_true",
        help="a real node agent starts and stops engines as a burst comes and goes (default duration 90)",
    )
    args = p.parse_args(argv)
    configure_logging("warning")
    if args.autoscale:
        run(
            run_demo(
                duration_s=args.duration if args.duration is not None else AUTOSCALE_DURATION_S,
                port=args.port,
                serve_after=not args.no_serve,
                say=_say,
                until_signal=_until_signal,
            )
        )
        return 0
    if not args.no_compare:
        _compare(Path(args.out))
    run(
        _demo(
            duration_s=args.duration if args.duration is not None else 60.0,
            port=args.port,
            serve_after=not args.no_serve,
            rate=args.rate or DEFAULT_RATE,
        )
    )
    return 0


def _compare(out: Path) -> None:
    """The first act (`loadgen.demo_compare`): berth's chat-and-batch preset beside least outstanding."""
    _say(
        f"1/2 why berth: the same fleet and trace under a plain router and under berth, on the fleet "
        f"simulator (interactive chat at {demo_compare.RATE:g} req/s beside {demo_compare.BACKLOG} "
        "queued batch requests, 8 endpoints)"
    )
    out.mkdir(parents=True, exist_ok=True)
    sides = demo_compare.run(log=_say)
    print(demo_compare.table(sides), flush=True)
    png = out / "latency.png"
    why_not = demo_compare.plot(sides, png)
    _say(why_not or f"latency distributions: {png}")
    _say("2/2 berth live, in front of simulated engines:")


async def _demo(*, duration_s: float, port: int, serve_after: bool, rate: float) -> None:
    specs = [
        SimSpec(models=(model,), profile=_PROFILE[model], speed=SPEED, seed=i)
        for i, (model, _) in enumerate(FLEET)
    ]
    say = _say
    async with SimFleet(specs) as fleet:
        say(f"simulated fleet: {len(fleet)} endpoints (speed x{SPEED:g})")
        flags = tuple(
            parse_endpoint_flag(f"{url},engine=vllm,class={cls},id={model}-{cls}")
            for url, (model, cls) in zip(fleet.urls, FLEET, strict=True)
        )
        cfg = apply_overrides(default_config(), listen=f"127.0.0.1:{port}", endpoints=flags)
        registry = default_registry()
        runtime = load_runtime(None, cfg, registry, listen=cfg.server.listen, endpoints=flags)
        gw = Gateway(
            runtime,
            cfg,
            ServeOptions(config_path=None, listen=cfg.server.listen, endpoints=flags),
            registry=registry,
        )
        runner = web.AppRunner(
            build_app(gw),
            handle_signals=False,
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=5.0,
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", port).start()
            await gw.endpoints.first_round(timeout_s=10.0)
            if not await gw.endpoints.wait_all_ready(timeout_s=60.0):
                say("warning: not every simulated endpoint became ready within 60s")
            base = f"http://127.0.0.1:{port}"
            say(
                f"berth: {base} (policy {runtime.policy.name!r}); models: "
                f"{', '.join(sorted(gw.scheduler.models(ready_only=True)))}"
            )
            say(f"workload: chat-batch at {rate:g} req/s for {duration_s:g}s (SLOs scaled 1/{SPEED:g})")
            bar = ProgressBar(sys.stdout) if sys.stdout.isatty() else None

            def tick(snap: LiveSnapshot) -> None:
                if bar is not None:
                    bar.update(snap)
                elif int(snap.elapsed_s) % 10 == 0:
                    say(
                        f"  {snap.elapsed_s:5.0f}s  done {snap.requests_done}  in flight {snap.in_flight}"
                        f"  errors {snap.errors}"
                    )

            report = await run_workload(
                RunOptions(
                    target=base,
                    workload="chat-batch",
                    rate=rate,
                    duration_s=duration_s,
                    seed=1,
                    slo_scale=1.0 / SPEED,
                ),
                on_tick=tick,
            )
            if bar is not None:
                bar.close()
            print(format_report(report.data), flush=True)
            if serve_after:
                say(_snippets(base, sorted(gw.scheduler.models(ready_only=True))))
                await _until_signal()
        finally:
            gw.services.draining = True
            await runner.cleanup()
    say("demo stopped")


def _say(text: str) -> None:
    print(text, flush=True)


def _snippets(base: str, models: list[Any]) -> str:
    model = models[0] if models else "chat-7b"
    return f"""
berth keeps serving on {base} — try it (Ctrl-C to stop):

  curl -s {base}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "hello"}}], "max_tokens": 16}}'

  python -c 'from openai import OpenAI; c = OpenAI(base_url="{base}/v1", api_key="x"); \\
r = c.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": "hi"}}]); \\
print(r.choices[0].message.content)'

  metrics: {base}/metrics
"""


async def _until_signal() -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
