"""The fault-matrix soak: a real `berth serve` in front of simulated engines (one process each), a client
population, every fault kind injected on a seeded schedule, and the invariants checked at the end.

    berth-loadgen bench soak --out DIR                       # >= 20,000 requests at concurrency 64
    berth-loadgen bench soak --quick --out DIR               # a few hundred requests, every fault kind
    berth-loadgen bench soak --requests 5000 --concurrency 32 --seed 3 --out DIR
    make soak                                                # the full run, into bench-out/soak

Phases: warm-up (requests that behave, no fault) -> baseline (asyncio tasks, TCP connections, RSS) ->
the load, with faults (`soak_faults`) and client behaviours (`soak_clients`)
-> recovery (faults off, dead engines started again, the full configuration reloaded) -> the counters,
tasks and connections checked -> a burst of long streams and SIGTERM while they run (berth drains; new
requests are refused or answered `shutting_down`) -> berth's log judged.

Invariants (each reported pass/fail in DIR/report.md and DIR/report.json; the exit status is 1 if any
fails):
- `requests_end_precisely`: every request ends in a complete response or a precise OpenAI error: no
  hang past the client deadline, no stream cut without an error event, no 500 (the documented
  `internal_error` included: the faults explain none), every error in the OpenAI shape, a duplicate
  X-Request-Id echoed;
- `counters_zero`: after the load, /metrics and /admin/fleet show nothing in flight, queued or awaiting a
  decision, and telemetry has nothing pending;
- `tasks_baseline`: berth's asyncio tasks (`berth_asyncio_tasks`) back to the warm-up baseline;
- `connections_baseline`: berth's TCP connections from clients (from /proc) back to the baseline; no
  connection to an engine held (`berth_upstream_connections{state="in_use"}` 0), every upstream socket
  of the process one its pool knows (in use or idle), and no engine still runs a request handler for
  berth (`live_requests` of /sim/state);
- `rss_bounded`: VmRSS growth over the second half of the load within `RSS_BOUND_KIB_PER_1K` KiB per
  1,000 requests plus `RSS_SLACK_KIB` (allocator noise; `QUICK_RSS_SLACK_KIB` for --quick), the whole
  run's growth reported per 1,000;
- `errors_explained`: no error-level log event that no injected fault explains, no non-JSON log line;
- `keys_not_logged`: none of the clients' API keys (required: `[auth] required = true`; the unknown keys
  some clients present too), nor the engines' key (`api_key_env`), nor any `Bearer` value, in berth's log;
- `drain_on_sigterm`: the streams running at SIGTERM finish or end in a precise error, and berth exits 0;
- `every_fault_kind`: every fault kind and client behaviour happened at least once.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import aiohttp
import orjson

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.reliability.soak_checks import (
    bearer_tokens_in,
    connections,
    judge_log,
    rss_kib,
    secrets_in,
)
from loadgen.bench.reliability.soak_clients import BEHAVIOURS, Outcome, Plan, Tally, run_one
from loadgen.bench.reliability.soak_faults import (
    DRAIN_TIMEOUT_S,
    READ_TIMEOUT_S,
    SERVER_FAULTS,
    Injector,
    Progress,
)
from loadgen.bench.reliability.soak_report import render_markdown
from loadgen.bench.reliability.soak_stack import Invariant, SoakConfig, SoakStack, _log
from loadgen.bench.skeleton import run_bench

RSS_BOUND_KIB_PER_1K: Final = 64.0
CLIENT_DEADLINE_S: Final = 30.0
SETTLE_TIMEOUT_S: Final = 40.0  # for counters, tasks and connections to come back after the load
TASK_SLACK: Final = 2  # tasks that come and go on their own (a scrape round, the probe's handler)
STOP_READING_S: Final = 1.5 * READ_TIMEOUT_S  # a slow reader's pause: past berth's stall timeout


class Soak(SoakStack):
    """The soak's phases on its stack: the load with faults, recovery, the checks, the drain burst, the
    report."""

    # ------------------------------------------------------------------------------------ load
    async def load(
        self,
        count: int,
        *,
        first_index: int,
        tally: Tally,
        progress: Progress | None = None,
        behave: bool = False,
        on_sample: Callable[[int], None] | None = None,
        sample_every: int = 1000,
        until: asyncio.Event | None = None,
    ) -> None:
        """`count` requests from `concurrency` clients, and more until `until` is set (the fault schedule
        is done: every fault happens under load); `behave`: every plan's behaviour is normal."""
        last = first_index + count

        def next_indices() -> Iterator[int]:
            for i in itertools.count(first_index):
                if i >= last and (until is None or until.is_set()):
                    return
                yield i

        indices = next_indices()
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as s:

            async def client() -> None:
                for i in indices:
                    plan = Plan.draw(i, self.cfg.seed, self.keys, stop_reading_s=STOP_READING_S)
                    if behave and plan.behaviour != "normal":
                        plan = Plan.draw(i + 7_777_777, self.cfg.seed, self.keys)
                        if plan.behaviour != "normal":
                            continue
                    outcome = await run_one(s, self.url, plan, CLIENT_DEADLINE_S)
                    tally.add(plan, outcome)
                    if progress is not None:
                        progress.add()
                    if on_sample is not None and i % sample_every == 0:
                        on_sample(i)

            async with asyncio.TaskGroup() as tg:
                for c in range(self.cfg.concurrency):
                    tg.create_task(client(), name=f"soak-client-{c}")

    async def drain_burst(self, http: aiohttp.ClientSession, tally: Tally) -> dict[str, Any]:
        """Long streams from every client, SIGTERM once they run, new requests meanwhile; berth must
        finish or precisely fail the running ones and exit 0."""
        assert self.berth is not None
        sent_sigterm = asyncio.Event()
        burst = Tally()
        after = Tally()
        connector = aiohttp.TCPConnector(limit=0, force_close=True)  # no pooled connection to race
        async with aiohttp.ClientSession(connector=connector) as s:

            async def long_stream(i: int) -> None:
                key = self.keys[i % len(self.keys)]
                plan = Plan(i, False, True, "normal", key, 400, None, 0, 0, 0, min_tokens=400)
                burst.add(plan, await run_one(s, self.url, plan, CLIENT_DEADLINE_S))

            async def newcomer(i: int) -> None:
                await sent_sigterm.wait()
                plan = Plan.draw(i, self.cfg.seed, self.keys)
                plan = Plan(i, plan.chat, plan.stream, "normal", plan.key, plan.max_tokens, None, 0, 0, 0)
                outcome = await run_one(s, self.url, plan, CLIENT_DEADLINE_S)
                if outcome.kind == "connection_dropped":
                    # Sent after SIGTERM: berth stopped listening, and the kernel resets the connections
                    # it had queued for accepting. Never a request berth took in, so never in flight.
                    outcome = Outcome("refused", outcome.detail)
                after.add(plan, outcome)

            async def busy() -> bool:
                return sum((await self.counters(http)).inflight.values()) >= self.cfg.concurrency // 2

            async with asyncio.TaskGroup() as tg:
                for c in range(self.cfg.concurrency):
                    tg.create_task(long_stream(10_000_000 + c), name=f"soak-drain-{c}")
                for c in range(8):
                    tg.create_task(newcomer(20_000_000 + c), name=f"soak-newcomer-{c}")
                running = await self.until("the burst's streams running", busy, 30.0)
                self.berth.process.send_signal(signal.SIGTERM)
                sent_sigterm.set()
                _log(f"SIGTERM sent ({'under load' if running else 'the burst never ran'})")
            try:
                code: int | None = await asyncio.to_thread(self.berth.process.wait, DRAIN_TIMEOUT_S + 20)
            except Exception:
                code = None
        for k, n in burst.outcomes.items():
            tally.outcomes[f"drain: {k}"] += n
        for k, n in after.outcomes.items():
            tally.outcomes[f"after SIGTERM: {k}"] += n
        return {
            "running_at_sigterm": running,
            "exit_code": code,
            "burst": dict(burst.outcomes),
            "after_sigterm": dict(after.outcomes),
            "violations": burst.violations + after.violations,
            "examples": {**burst.examples, **after.examples},
        }

    # ------------------------------------------------------------------------------------- run
    async def run(self) -> None:
        cfg = self.cfg
        tally = Tally()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            warm = Tally()
            _log(f"warm-up: {2 * cfg.concurrency} requests")
            await self.load(2 * cfg.concurrency, first_index=50_000_000, tally=warm, behave=True)
            await self.until("counters at zero after the warm-up", self._idle(http), SETTLE_TIMEOUT_S)
            base = await self.counters(http)
            base_conns = connections(self.pid, self.port)
            rss: dict[str, int] = {"start_kib": rss_kib(self.pid)}
            _log(f"baseline: tasks {base.tasks:g}, connections {base_conns}, rss {rss['start_kib']} KiB")

            progress = Progress()
            injector = Injector(
                engines=self.engines,
                keys=self.keys,
                config_path=self.config_path,
                berth_pid=self.pid,
                berth_url=self.url,
                progress=progress,
                rng=random.Random(cfg.seed + 1),
                window=cfg.window,
                min_hold_s=cfg.min_hold_s,
                total=cfg.requests,
                log=_log,
                http=http,
            )
            started = time.monotonic()
            _log(f"load: {cfg.requests} requests, concurrency {cfg.concurrency}, fault window {cfg.window}")

            samples: list[tuple[int, int]] = [(0, rss["start_kib"])]  # (requests sent, VmRSS KiB)

            def sample(i: int) -> None:
                samples.append((i, rss_kib(self.pid)))

            schedule_done = asyncio.Event()

            async def inject() -> None:
                try:
                    await injector.run(cfg.requests)
                finally:
                    schedule_done.set()

            async with asyncio.TaskGroup() as tg:
                tg.create_task(inject(), name="soak-injector")
                await self.load(
                    cfg.requests,
                    first_index=0,
                    tally=tally,
                    progress=progress,
                    on_sample=sample,
                    sample_every=max(50, cfg.requests // 20),
                    until=schedule_done,
                )
            load_s = time.monotonic() - started
            _log(f"load done in {load_s:.1f} s; recovering")
            await injector.clear_all()
            ready = await self.until("every endpoint ready", lambda: self.fleet_ready(http), 30.0)
            idle = await self.until("counters at zero", self._idle(http), SETTLE_TIMEOUT_S)
            end = await self.counters(http)
            tasks_ok = await self.until(
                "tasks back to baseline",
                self._tasks_within(http, base.tasks + TASK_SLACK),
                SETTLE_TIMEOUT_S,
            )
            tasks_end = (await self.counters(http)).tasks
            conns_ok = await self.until(
                "connections back to baseline", self._conns_settled(http, base_conns), SETTLE_TIMEOUT_S
            )
            conns_end = connections(self.pid, self.port)
            pool_end = await self.counters(http)
            live = await self.engines_live_requests(http)
            rss["end_kib"] = rss_kib(self.pid)
            main_requests = sum(tally.behaviours.values())
            samples.append((main_requests, rss["end_kib"]))
            middle = min(samples, key=lambda p: abs(p[0] - main_requests / 2))
            rss["middle_kib"] = middle[1]
            rss["middle_at_request"] = middle[0]
            injected = Counter(injector.injected)
            for b, n in tally.behaviours.items():
                if b != "normal":
                    injected[f"client_{b}"] += n
            _log("burst and SIGTERM")
            drain = await self.drain_burst(http, tally)
            injected["sigterm_under_load"] += 1 if drain["running_at_sigterm"] else 0

        log_path = self.out / "berth.log"
        verdict = judge_log(log_path, injected)
        leaked = secrets_in(log_path, [*self.keys, self.engine_key, *tally.unknown_keys])
        bearer_lines = bearer_tokens_in(log_path)
        second_half = main_requests - rss["middle_at_request"]
        rss_growth_half = rss["end_kib"] - rss["middle_kib"]
        rss_bound = cfg.rss_slack_kib + RSS_BOUND_KIB_PER_1K * second_half / 1000
        per_1k = (rss["end_kib"] - rss["start_kib"]) / max(1e-9, main_requests / 1000)
        main_violations = tally.violations
        expected_kinds = [*SERVER_FAULTS, *(f"client_{b}" for b in BEHAVIOURS if b != "normal")]
        expected_kinds.append("sigterm_under_load")
        missing = [k for k in expected_kinds if not injected.get(k)]
        self.invariants = [
            Invariant(
                "requests_end_precisely",
                main_violations == 0,
                f"{main_violations} violations in {main_requests} requests"
                + (f": {tally.examples}" if main_violations else ""),
            ),
            Invariant(
                "counters_zero",
                idle and ready and not end.busy and end.telemetry_pending == 0,
                "all zero"
                if not end.busy
                else "; ".join(end.busy) + ("" if ready else "; endpoints not ready"),
            ),
            Invariant(
                "tasks_baseline",
                tasks_ok,
                f"baseline {base.tasks:g}, after the load {tasks_end:g} (slack {TASK_SLACK})",
            ),
            Invariant(
                "connections_baseline",
                conns_ok and not any(live.values()),
                f"sockets at baseline {base_conns.as_dict()}, after {conns_end.as_dict()}; upstream pool "
                f"after: {pool_end.upstream_in_use:g} in use, {pool_end.upstream_idle:g} idle; "
                f"engines' live handlers {live}",
            ),
            Invariant(
                "rss_bounded",
                rss_growth_half <= rss_bound,
                f"second half +{rss_growth_half} KiB (bound {rss_bound:.0f}); whole load {per_1k:.1f} KiB "
                "per 1k requests",
            ),
            Invariant(
                "errors_explained",
                not verdict.unexplained and verdict.unparsed == 0,
                f"error events {dict(verdict.errors)}, unexplained {dict(verdict.unexplained)}, "
                f"non-JSON lines {verdict.unparsed} {verdict.unparsed_sample}",
            ),
            Invariant(
                "keys_not_logged",
                not leaked and bearer_lines == 0,
                f"keys found {leaked}, lines with a Bearer value {bearer_lines}",
            ),
            Invariant(
                "drain_on_sigterm",
                drain["exit_code"] == 0 and drain["violations"] == 0 and drain["running_at_sigterm"],
                f"exit code {drain['exit_code']}; running at SIGTERM {drain['running_at_sigterm']}; "
                f"burst {drain['burst']}; after SIGTERM {drain['after_sigterm']}"
                + (f"; {drain['examples']}" if drain["violations"] else ""),
            ),
            Invariant(
                "every_fault_kind", not missing, "all injected" if not missing else f"missing {missing}"
            ),
        ]
        self.figures = {
            "config": {
                "requests": cfg.requests,
                "concurrency": cfg.concurrency,
                "engines": cfg.engines,
                "seed": cfg.seed,
                "speed": cfg.speed,
                "fault_window_requests": cfg.window,
            },
            "requests": {"warmup": sum(warm.outcomes.values()), "load": main_requests},
            "load_s": round(load_s, 1),
            "requests_per_s": round(main_requests / load_s, 1),
            "faults_injected": dict(sorted(injected.items())),
            "engine_restarts": injector.restarts,
            "unconfirmed_reloads": injector.unconfirmed_reloads,
            "outcomes": dict(sorted(tally.outcomes.items())),
            "rss_kib": {**rss, "kib_per_1k_requests": round(per_1k, 1), "samples": sorted(samples)},
            "baseline": {"tasks": base.tasks, "connections": base_conns.as_dict()},
            "after_load": {
                "counters": end.as_dict(),
                "tasks": tasks_end,
                "connections": conns_end.as_dict(),
                "engines_live_requests": live,
            },
            "drain": drain,
            "log": verdict.as_dict(),
        }

    # ---------------------------------------------------------------------------------- report
    @property
    def passed(self) -> bool:
        return all(i.passed for i in self.invariants)

    def write_report(self) -> None:
        doc = {
            **self.figures,
            "invariants": {i.name: i.as_dict() for i in self.invariants},
            "passed": self.passed,
        }
        (self.out / "report.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        (self.out / "report.md").write_text(render_markdown(doc))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="berth-loadgen bench soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a few hundred requests, every fault kind")
    p.add_argument("--requests", type=int, help="requests of the load (default 20000; --quick 400)")
    p.add_argument("--concurrency", type=int, help="clients (default 64; --quick 32)")
    p.add_argument("--engines", type=int, default=4, help="simulated engines, one process each")
    p.add_argument("--speed", type=float, default=2.0, help="the engines' time scale (higher: faster)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, required=True, help="directory for the report and the logs")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def run(a: argparse.Namespace) -> Soak:
        out: Path = a.out
        out.mkdir(parents=True, exist_ok=True)
        soak = Soak(SoakConfig.of(a), out)
        try:
            soak.start()
            try:
                import uvloop

                uvloop.run(soak.run())
            except ImportError:  # pragma: no cover - uvloop is a dependency
                asyncio.run(soak.run())
        finally:
            soak.stop()
        soak.write_report()
        print((out / "report.md").read_text())
        return soak

    return run_bench(BENCHMARKS["soak"], args, run, passed=lambda s: s.passed)


if __name__ == "__main__":
    sys.exit(main())
