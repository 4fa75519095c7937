"""The options of `berth-loadgen bench overhead` (`loadgen.bench.overhead.proxy`): the phases `--tests`
names, the configurations, each phase's settings and `--quick`'s."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from loadgen.bench.overhead.overhead_queue import QUEUE_SLA_SCALE
from loadgen.bench.overhead.overhead_report import CONFIGS, FLEET, LAT1, LAT8, QUEUE, SATURATION, STREAM

#: The phases, as `--tests` names them.
TEST_NAMES: Final = (SATURATION, LAT8, LAT1, STREAM, FLEET, QUEUE)
#: The phases run unless `--tests` names others: all but the standing queue (two minutes of its own).
DEFAULT_TESTS: Final = (SATURATION, LAT8, LAT1, STREAM, FLEET)


def _names(text: str, allowed: Sequence[str]) -> list[str]:
    """A comma-separated list of `allowed` names, each once, in the order given."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in allowed]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"choose from {','.join(allowed)} (got {text!r})")
    return list(dict.fromkeys(names))


def _tests(text: str) -> list[str]:
    return _names(text, TEST_NAMES)


def _configs(text: str) -> list[str]:
    return _names(text, CONFIGS)


#: --quick: seconds, not minutes; checks that every figure comes out, not what it is.
QUICK: Final = {
    "rounds": 1, "duration": 0.6, "warmup": 0.2, "chunks": 20, "chunk_interval_ms": 2.0,
    "stream_concurrency": 8, "saturation_concurrency": 16, "fleet_count": 10, "fleet_duration": 1.0,
    "queue_depth": 40, "queue_cap": 2, "queue_max_tokens": 16, "queue_warmup": 1.5, "queue_duration": 1.0,
}  # fmt: skip


def _parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="berth-loadgen bench overhead", description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--configs", type=_configs, default=list(CONFIGS), help="default: direct,bare,berth")
    p.add_argument(
        "--tests", type=_tests, default=list(DEFAULT_TESTS),
        help=f"the phases to run, of {','.join(TEST_NAMES)} (default: all but queue); e.g. lat8,fleet "
        "for the lag, queue for the standing queue",
    )  # fmt: skip
    p.add_argument("--duration", type=float, default=3.0, help="measured seconds per phase (default 3)")
    p.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds before each phase")
    p.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds; figures are medians (default 3)"
    )
    p.add_argument(
        "--chunks", type=int, default=200, help="chunks per stream in the stream phase (default 200)"
    )
    p.add_argument(
        "--chunk-interval-ms", type=float, default=10.0, help="upstream pause between chunks (default 10)"
    )
    p.add_argument("--saturation-concurrency", type=int, default=64)
    p.add_argument("--latency-concurrency", type=int, default=8)
    p.add_argument("--stream-concurrency", type=int, default=64, help="streams per wave (default 64)")
    p.add_argument(
        "--fleet-count", type=int, default=100,
        help="endpoints of the simulated fleet for the lag-while-scraped phase (0: skip it)",
    )  # fmt: skip
    p.add_argument("--fleet-duration", type=float, default=10.0, help="measured seconds of the fleet phase")
    q = p.add_argument_group("the standing-queue phase (--tests queue; its fleet is --fleet-count endpoints)")
    q.add_argument(
        "--queue-depth", type=int, default=1000, help="requests kept waiting in berth's queue (default 1000)"
    )
    q.add_argument(
        "--queue-policy", default="coding-assistant",
        help="berth's policy (default coding-assistant): a shipped preset's or baseline's name (given the "
        "coding classes, as the scheduling benchmark runs it: e.g. least-outstanding for berth without its "
        "SLO decisions), or a file",
    )  # fmt: skip
    q.add_argument(
        "--queue-workload", default="coding:pattern1",
        help="the tasks the clients send, with their headers (default coding:pattern1)",
    )  # fmt: skip
    q.add_argument(
        "--queue-cap", type=int, default=16,
        help="seats per endpoint: the engines' max-num-seqs and berth's cap (default 16, the profile's)",
    )  # fmt: skip
    q.add_argument(
        "--queue-max-tokens",
        type=int,
        default=0,
        help="output tokens per request at most (default 0: the workload's own lengths)",
    )
    q.add_argument(
        "--queue-sla-scale", type=float, default=QUEUE_SLA_SCALE,
        help=f"factor on the task SLAs, so that queued requests stay feasible (default {QUEUE_SLA_SCALE:g})",
    )  # fmt: skip
    q.add_argument("--queue-warmup", type=float, default=20.0, help="seconds before the window (default 20)")
    q.add_argument("--queue-duration", type=float, default=30.0, help="measured seconds (default 30)")
    p.add_argument("--python", default=sys.executable, help="interpreter for the servers and the client")
    p.add_argument("--berth-args", default="", help="extra arguments for `berth serve` (one shell string)")
    p.add_argument(
        "--lag-interval-ms", type=float, default=10.0,
        help="both proxies' lag sampling interval (default 10: 100 samples a second; 0: their default)",
    )  # fmt: skip
    p.add_argument(
        "--out", type=Path, default=Path("bench-out/overhead"),
        help="report directory (report.json, report.md)",
    )  # fmt: skip
    p.add_argument(
        "--pin", action="store_true",
        help="give the proxy a CPU of its own (client and upstream on others); steadier latency figures",
    )  # fmt: skip
    p.add_argument(
        "--harness", type=Path, default=None, metavar="DIR",
        help="run the peer harness set up in DIR (perf-peers' setup.sh) instead of the built-in load",
    )  # fmt: skip
    p.add_argument(
        "--harness-args", default="", help="more arguments for the harness's bench.py, e.g. '--sat-s 5'"
    )
    p.add_argument("--quick", action="store_true", help="a seconds-long run (see QUICK)")
    return p


def parse_args(argv: Sequence[str] | None, description: str) -> argparse.Namespace:
    """The options of `berth-loadgen bench overhead` (`description`: its help text), `--quick`'s applied."""
    args = _parser(description).parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    return args
