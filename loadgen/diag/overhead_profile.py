"""Where berth's CPU per request goes, and what a change buys: an A/B of berth builds in one run.

    berth-loadgen diag overhead-profile --pin --out /tmp/profile.json
    berth-loadgen diag overhead-profile --tree before=/tmp/old-tree --tree after=. --rounds 8
    berth-loadgen diag overhead-profile --stream --tree before=/tmp/old-tree --tree after=.

Every configuration (the bare aiohttp proxy and one berth per `--tree`, each `python -m gateway.cli serve`
run from that checkout, so the checkout's `gateway` package is the one imported, compiled modules
included) sits in front of the same stand-in upstream (`overhead_upstream`) and takes the overhead
benchmark's saturation load (`--concurrency` connections, non-streamed) from the overhead client, one
configuration at a time, the order rotating per round. The figure is the proxy's CPU time (utime+stime
from /proc) per completed request: a count, not a clock, so it holds on a shared machine far better than
latency does; its median and spread over rounds are reported, and each tree's difference to the first
one as a median of per-round differences (the runs of one round are seconds apart).

With `--stream` the load is the overhead benchmark's stream phase instead (waves of `--concurrency`
streams of `--chunks` chunks, paced `--chunk-interval-ms` apart by the upstream), and the figures are the
proxy's CPU per streamed chunk and the time to first chunk (each round's p50 over its streams; the
upstream's and the client's own time included: compare trees by their per-round difference).

With `--pyspy S`, each configuration is then sampled by py-spy (non-blocking) for S seconds under the
same load, and the samples are folded into components: the innermost frame that belongs to a known
owner decides (a berth subpackage, with the scheduler split by its entry point; prometheus_client;
structlog; aiohttp; asyncio), so standard-library helpers (dataclass `__init__`s, enum, typing) count
for the component that called them. A component's µs per request is its share of the samples times the
configuration's measured CPU per request in that window.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from loadgen.bench.overhead.overhead_client import Command
from loadgen.bench.overhead.overhead_procs import (
    CHAT_PATH,
    START_TIMEOUT_S,
    STOP_GRACE_S,
    Client,
    cpu_layout,
    start_proxy_berth,
    start_upstream,
)
from loadgen.diag.trees import tree_arg
from loadgen.harness import REPO_ROOT, ManagedProcess, ServerStartError, free_port, start_server

BARE: Final = "bare"
#: py-spy's sampling rate (Hz) for the breakdown.
PYSPY_RATE: Final = 250


@dataclass(frozen=True, slots=True)
class Config:
    name: str
    base_url: str
    proxy: ManagedProcess


@dataclass(slots=True)
class Run:
    round: int
    config: str
    completed: int  # requests, or with --stream chunks
    errors: int
    cpu_s: float
    ttfc_ms: float | None = None  # with --stream: the p50 of the round's streams' times to first chunk

    @property
    def us_per_request(self) -> float:
        return self.cpu_s * 1e6 / self.completed if self.completed else float("nan")


@dataclass(slots=True)
class Breakdown:
    config: str
    samples: int
    us_per_request: float  # measured by /proc in the sampled window
    components: dict[str, float] = field(default_factory=dict)  # µs per request


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------- folding py-spy samples
_BERTH_PARTS: Final = (
    "front",
    "dispatch",
    "admission",
    "sched",
    "telemetry",
    "upstream",
    "core",
    "lifecycle",
)
_LIBS: Final = (
    ("prometheus_client/", "prometheus_client (metrics)"),
    ("structlog/", "structlog (log line)"),
    ("aiohttp/", "aiohttp"),
    ("multidict/", "aiohttp"),
    ("yarl/", "aiohttp"),
    ("asyncio/", "asyncio and the event loop"),
    ("uvloop/", "asyncio and the event loop"),
)
LOOP: Final = "asyncio and the event loop"
#: Frames that only run the loop, owning none of its work: the bare proxy runs its loop from aiohttp's
#: `run_app`, berth from `uvloop.run`; a sample with nothing inside them is the loop's own C (uvloop,
#: HTTP parsers, syscalls) for both, not aiohttp's for one and the loop's for the other.
_RUNNERS: Final = ("aiohttp/web.py",)


def _frame_file(frame: str) -> tuple[str, str]:
    """(function, file) of one py-spy raw frame `func (file:line)`."""
    name, _, rest = frame.partition(" (")
    return name, rest.rpartition(":")[0]


def component(stack: Sequence[str]) -> str:
    """The component one sample counts for (frames outermost first, as py-spy writes them)."""
    sched_entry: str | None = None
    owner: str | None = None
    for frame in reversed(stack):  # innermost first
        name, path = _frame_file(frame)
        if path.endswith(_RUNNERS):
            continue
        part = _berth_part(path)
        if owner is None:
            if part is not None:
                owner = part
            else:
                owner = next((label for marker, label in _LIBS if marker in path), None)
        if part == "sched":
            sched_entry = name  # ends as the outermost frame of the scheduler core
    if owner is None:
        return LOOP
    if owner == "sched" and sched_entry is not None:
        return f"sched: {sched_entry}"
    if owner in _BERTH_PARTS:
        return f"berth {owner}/"
    return owner


def _berth_part(path: str) -> str | None:
    marker = "gateway/"
    i = path.rfind(marker)
    if i < 0:
        return None
    part = path[i + len(marker) :].partition("/")[0]
    return part if part in _BERTH_PARTS else None


def fold(raw: str) -> Counter[str]:
    """py-spy's raw output (`frame;frame;... count` per line) folded into sample counts per component."""
    out: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        out[component(stack.split(";"))] += int(count)
    return out


# ----------------------------------------------------------------- the run
@contextlib.contextmanager
def configs(
    args: argparse.Namespace, logdir: Path, layout: dict[str, frozenset[int] | None]
) -> Iterator[tuple[ManagedProcess, list[Config]]]:
    """The upstream, the bare proxy (unless --no-bare) and one berth per tree; all stopped on the way out."""
    servers: list[ManagedProcess] = []
    try:
        upstream, upstreams = start_upstream(args, logdir, layout["upstream"])
        servers.append(upstream.process)
        out: list[Config] = []
        if args.bare:
            port = free_port()
            bare = start_server(
                BARE,
                [args.python, "-m", "loadgen.bench.overhead.overhead_bare_proxy", "--port", str(port),
                 "--upstream", upstreams[0], "--upstream", upstreams[1]],
                port=port, log_path=logdir / "bare.log", ready_path="/health",
                timeout_s=START_TIMEOUT_S, cwd=REPO_ROOT, cpus=layout["proxy"],
            )  # fmt: skip
            servers.append(bare.process)
            out.append(Config(BARE, bare.base_url, bare.process))
        for name, tree in args.tree:
            proc, url = start_proxy_berth(args, upstreams, logdir, layout["proxy"], name=name, cwd=tree)
            servers.append(proc)
            out.append(Config(name, url, proc))
        yield upstream.process, out
    finally:
        for server in reversed(servers):
            server.stop(STOP_GRACE_S)


def _command(args: argparse.Namespace, cfg: Config, duration_s: float, warmup_s: float) -> Command:
    return Command(
        url=cfg.base_url + CHAT_PATH, concurrency=args.concurrency, warmup_s=warmup_s,
        duration_s=duration_s, stream=args.stream, max_tokens=args.chunks if args.stream else 16,
        cpu_pids=(cfg.proxy.pid,), waves=args.stream,
    )  # fmt: skip


def _units(args: argparse.Namespace, res: dict[str, Any]) -> int:
    """What CPU is counted per: completed requests, or with --stream the chunks relayed."""
    return int(res["chunks_in_window"] if args.stream else res["completed"])


def measure_rounds(args: argparse.Namespace, client: Client, cfgs: Sequence[Config]) -> list[Run]:
    runs: list[Run] = []
    for cfg in cfgs:  # connections, caches and lazy imports before anything counts
        client.run(_command(args, cfg, min(1.0, args.duration), 0.0))
    for r in range(args.rounds):
        shift = r % len(cfgs)
        for cfg in [*cfgs[shift:], *cfgs[:shift]]:
            res = client.run(_command(args, cfg, args.duration, args.warmup))
            ttfc = res["ttft_ms"].get("p50") if args.stream else None
            run = Run(r, cfg.name, _units(args, res), res["errors"], res["cpu_s"][str(cfg.proxy.pid)], ttfc)
            runs.append(run)
            _log(f"round {r + 1}/{args.rounds} {cfg.name:12} {run.us_per_request:7.2f} µs/{_unit(args)} "
                 f"({run.completed} {_unit(args)}s, {run.errors} errors)")  # fmt: skip
    return runs


def sample(args: argparse.Namespace, client: Client, cfg: Config, logdir: Path) -> Breakdown:
    """py-spy on `cfg`'s proxy under the saturation load; the samples folded into components."""
    out = logdir / f"pyspy-{cfg.name}.txt"
    spy = subprocess.Popen(
        [args.pyspy_bin, "record", "--nonblocking", "-r", str(PYSPY_RATE), "-d", str(int(args.pyspy)),
         "-f", "raw", "-o", str(out), "--pid", str(cfg.proxy.pid)],
        stdout=subprocess.DEVNULL, stderr=(logdir / f"pyspy-{cfg.name}.log").open("wb"),
    )  # fmt: skip
    try:
        res = client.run(_command(args, cfg, args.pyspy - 1.0, 0.5))
    finally:
        spy.wait(args.pyspy + 30)
    counts = fold(out.read_text() if out.exists() else "")
    total = sum(counts.values())
    per_request = res["cpu_s"][str(cfg.proxy.pid)] * 1e6 / max(1, _units(args, res))
    comps = {k: per_request * n / total for k, n in counts.most_common()} if total else {}
    return Breakdown(cfg.name, total, per_request, comps)


def summarise(
    runs: Sequence[Run],
    names: Sequence[str],
    figure: Callable[[Run], float | None] | None = None,
    *,
    ratio: bool = True,
) -> dict[str, dict[str, float]]:
    """Per configuration: median, min and max µs per request (or `figure`) over rounds, and (berth
    trees) the median per-round difference to the first tree and (`ratio`) the ratio to the bare proxy."""
    by: dict[str, dict[int, float]] = {}
    for run in runs:
        value = run.us_per_request if figure is None else figure(run)
        if value is not None:
            by.setdefault(run.config, {})[run.round] = value
    trees = [n for n in names if n != BARE]
    out: dict[str, dict[str, float]] = {}
    for name in names:
        vals = list(by.get(name, {}).values())
        if not vals:
            continue
        s: dict[str, float] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
        if name != BARE and trees and name != trees[0]:
            diffs = [v - by[trees[0]][r] for r, v in by[name].items() if r in by[trees[0]]]
            if diffs:
                s["minus_first_median"] = statistics.median(diffs)
                s["minus_first_min"] = min(diffs)
                s["minus_first_max"] = max(diffs)
        if ratio and name != BARE and BARE in by:
            ratios = [v / by[BARE][r] for r, v in by[name].items() if r in by[BARE]]
            if ratios:
                s["over_bare_median"] = statistics.median(ratios)
        out[name] = s
    return out


def _unit(args: argparse.Namespace) -> str:
    return "chunk" if args.stream else "request"


def render(
    summary: dict[str, dict[str, float]],
    breakdowns: Sequence[Breakdown],
    unit: str = "request",
    ttfc: dict[str, dict[str, float]] | None = None,
) -> str:
    what = "per streamed chunk" if unit == "chunk" else "per request at saturation"
    lines = [f"CPU {what} (µs; median [min-max] over rounds)", "", *_figure_lines(summary, 1)]
    if ttfc:
        lines += ["", "Time to first chunk (ms; each round's p50 over its streams, median [min-max])", ""]
        lines += _figure_lines(ttfc, 2)
    if breakdowns:
        names = [b.config for b in breakdowns]
        comps: dict[str, None] = {}
        for b in breakdowns:
            comps.update(dict.fromkeys(b.components))
        lines += ["", f"Where it goes (py-spy, µs per {unit})", ""]
        lines.append(f"  {'component':34}" + "".join(f"{n:>14}" for n in names))
        for c in comps:
            lines.append(f"  {c:34}" + "".join(f"{b.components.get(c, 0.0):14.1f}" for b in breakdowns))
        lines.append(
            f"  {'total (measured CPU)':34}" + "".join(f"{b.us_per_request:14.1f}" for b in breakdowns)
        )
        lines.append(f"  {'samples':34}" + "".join(f"{b.samples:14d}" for b in breakdowns))
    return "\n".join(lines)


def _figure_lines(summary: dict[str, dict[str, float]], digits: int) -> list[str]:
    """One line per configuration: median [min-max], the ratio to bare, the difference to the first tree."""
    lines: list[str] = []
    first: str | None = None
    d = digits
    for name, s in summary.items():
        text = f"  {name:14} {s['median']:7.{d}f} [{s['min']:.{d}f}-{s['max']:.{d}f}]"
        if "over_bare_median" in s:
            text += f"  {s['over_bare_median']:.3f}x bare"
        if "minus_first_median" in s:
            text += (
                f"  {s['minus_first_median']:+.{d}f} vs {first} "
                f"[{s['minus_first_min']:+.{d}f} to {s['minus_first_max']:+.{d}f}]"
            )
        elif name != BARE and first is None:
            first = name
        lines.append(text)
    return lines


def run(args: argparse.Namespace) -> dict[str, Any]:
    logdir = Path(tempfile.mkdtemp(prefix="berth-overhead-profile-"))
    started = time.time()
    layout = cpu_layout(args.pin)
    breakdowns: list[Breakdown] = []
    with configs(args, logdir, layout) as (_upstream, cfgs):
        client = Client(args.python, logdir, layout["client"])
        try:
            runs = measure_rounds(args, client, cfgs)
            if args.pyspy > 0:
                for cfg in cfgs:
                    breakdowns.append(sample(args, client, cfg, logdir))
        finally:
            client.stop()
    names = [c.name for c in cfgs]
    summary = summarise(runs, names)
    # A time to first chunk includes the upstream's and the client's own time (no direct run here to
    # subtract): compare trees by their difference, not by a ratio to the bare proxy.
    ttfc = summarise(runs, names, lambda r: r.ttfc_ms, ratio=False) if args.stream else {}
    return {
        "benchmark": "overhead-profile",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "elapsed_s": round(time.time() - started, 1),
        "options": {k: v for k, v in vars(args).items() if k not in ("out", "tree")},
        "trees": {name: str(tree) for name, tree in args.tree},
        "load_avg_at_end": os.getloadavg(),
        "logs": str(logdir),
        "summary": summary,
        "ttfc_ms": ttfc,
        "runs": [asdict(r) | {"us_per_request": r.us_per_request} for r in runs],
        "breakdowns": [asdict(b) for b in breakdowns],
        "table": render(summary, breakdowns, _unit(args), ttfc),
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="berth-loadgen diag overhead-profile", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument(
        "--tree", type=tree_arg, action="append", default=[], metavar="NAME=DIR",
        help="a berth checkout to measure (repeatable; default: this one, as 'berth')",
    )  # fmt: skip
    p.add_argument("--no-bare", dest="bare", action="store_false", help="leave the bare proxy out")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=float, default=3.0, help="measured seconds per run (default 3)")
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--stream", action="store_true", help="CPU per streamed chunk (waves of streams)")
    p.add_argument("--chunks", type=int, default=200, help="chunks per stream with --stream (default 200)")
    p.add_argument(
        "--chunk-interval-ms", type=float, default=10.0, help="upstream pause between chunks (default 10)"
    )
    p.add_argument("--pyspy", type=float, default=0.0, metavar="S", help="sample each proxy S seconds")
    p.add_argument(
        "--pyspy-bin", default=shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    )
    p.add_argument("--pin", action="store_true", help="the proxy on a CPU of its own (as `overhead --pin`)")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--berth-args", default="", help="extra arguments for `berth serve` (one shell string)")
    p.add_argument("--out", type=Path, default=Path("reports/bench-overhead-profile.json"))
    args = p.parse_args(argv)
    if not args.tree:
        args.tree = [("berth", REPO_ROOT)]
    if len({n for n, _ in args.tree}) != len(args.tree) or any(n == BARE for n, _ in args.tree):
        p.error("--tree names must be distinct and not 'bare'")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = run(args)
    except ServerStartError as e:
        _log(f"overhead profile failed: {e}")
        return 2
    print(result["table"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    args.out.with_suffix(".md").write_text(
        f"# berth CPU per request, A/B\n\n{result['started_at']}, load average at the end "
        f"{', '.join(f'{x:.2f}' for x in result['load_avg_at_end'])}\n\n```\n{result['table']}\n```\n"
    )
    print(f"\nreport: {args.out}  (server logs: {result['logs']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
