"""berth's own per-request work without HTTP: CPU time per request in-process, A/B across checkouts.

    berth-loadgen diag overhead-micro                                  # this checkout
    berth-loadgen diag overhead-micro --tree main=OTHER_CHECKOUT --tree new=.  --rounds 7

Each piece is berth's real code, driven the way one non-streamed request at saturation drives it, over
`--requests` requests per run, timed with `time.thread_time_ns` (CPU time of this thread: another
process's load does not count, and the figure is µs of CPU per request, not a clock):

- `sched`: the scheduler's cycle of one request on the packaged default policy with two endpoints and
  `--inflight` requests running (the overhead benchmark's 64 connections over two upstreams): `submit`
  (placed at once) and, for the oldest running request, `complete`;
- `sched_stream`: the same with a progress report every 16 tokens of a 256-token stream (`progress`);
- `finish`: the front's finish phase of a finished request (its metrics, telemetry's record and its
  folding-in, the task clock; the log line is off, as at `--log-level warning`, which the overhead
  benchmarks run berth at);
- `finish_logged`: the same at `--log-level info` (berth's default), the canonical line written to
  /dev/null;
- `engine_call` (not run unless named in `--pieces`): one non-streamed engine call as the checkout makes
  it (`gateway.upstream.client.open_request`, the whole answer read, the response closed), 16 at a time,
  to the overhead benchmark's stand-in upstream (`overhead_upstream`) served on its own loop in another
  thread (its CPU is not this thread's), on uvloop as `berth serve` runs: what the engine-call client
  costs (aiohttp's ClientSession before berth's own HTTP/1.1 client, the pool after);
- `front`: the whole of berth's own Python for one request, as the OpenAI chat handler runs it
  (`gateway.front.api.handle`): auth, the body read, parse, admission (model, SLO, the scheduler's
  request), the dispatcher's acquire and release of a seat (the scheduler's submit and complete, as in
  `sched`, with `--inflight` requests running on each endpoint), and the finish phase (as `finish`);
  only the engine call is left out (a stub in the dispatcher's place answers from the seat it was
  given, as the runner would after reading an engine's answer). The request is aiohttp's own
  (`make_mocked_request`) with the peer harness's headers and body, made before the clock starts.
- `backlog_N` (not run unless named in `--pieces`, e.g. `backlog_0,backlog_1000,backlog_3000`): the
  scheduler's cycle behind N queued batch requests, under chat-and-batch's ordering (`priority-bands`,
  arrival order inside a band) and class bound (`BACKLOG_POLICY`): every seat is taken, an interactive
  request is submitted (admission counts its class's queue; it waits, first in line), and the oldest
  running one completes, which places it. What a submit and a completion cost while a batch backlog
  waits (a slow piece with a long backlog before the queue kept its keys: give it fewer `--requests`).
- `relay_iter` and `relay_deliver` (not run unless named; per streamed chunk, `--requests` chunks): the
  engine's chunks of a stream (the overhead benchmark's 200-chunk chat stream) fed to berth's engine
  connection (`H1Connection.data_received`, one chunk per loop callback, as from a socket) and written
  to the client's aiohttp response over transports that only count bytes (no syscalls, no `SseRelay`):
  `relay_iter` reads them with `async for` and writes with `StreamResponse.write` (berth's relay before
  `H1Response.deliver`, and its path when the writer is not the plain chunked one), `relay_deliver`
  takes them in the connection's callback and writes with `ChunkWriter` (its path now). On uvloop.
- `fleet_N` (not run unless named, e.g. `fleet_2,fleet_100`): `sched` with N endpoints and 8 requests
  running (the overhead benchmark's fleet phase: 8 connections in front of 100 endpoints): what
  placement costs per request as the fleet grows. With `--policy NAME` the fleet pieces run the shipped
  preset `policies/NAME.toml` of the checkout instead of `default`, their requests of its default class
  with first-token and end-to-end targets (2 s, 8 s), and the clock moves 5 ms per request (a fleet
  finishing 200 requests a second: the SLO plugins' loads age as they would). Each request arrives when
  it is submitted, and the run stops with an error if admission held or refused any (a request judged
  infeasible is tried on every endpoint: another cost than the one measured).

With `--tree NAME=DIR` (repeatable) each checkout runs in a child process with DIR first on its path
(compiled modules in DIR included), the children taking turns round by round; the report gives each
piece's median over rounds, and each later tree's median per-round difference to the first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import orjson

from loadgen.diag.overhead_micro_front import bench_finish, bench_front
from loadgen.diag.overhead_micro_io import bench_engine_call, bench_relay
from loadgen.diag.overhead_micro_sched import bench_backlog, bench_sched
from loadgen.diag.trees import tree_arg

PIECES: Final = ("sched", "sched_stream", "finish", "finish_logged", "front")
EXTRA_PIECES: Final = ("engine_call", "relay_iter", "relay_deliver")  # run only when named
BACKLOG: Final = "backlog_"  # + the number of batch requests queued
FLEET: Final = "fleet_"  # + the number of endpoints
FLEET_RUNNING: Final = 8  # requests running in the fleet pieces (the overhead benchmark's fleet phase)
#: The pieces' modules, each after those it imports: a child loads them from the files beside this one.
_PIECE_MODULES: Final = ("overhead_micro_sched", "overhead_micro_front", "overhead_micro_io")


def run_once(pieces: Sequence[str], n: int, inflight: int, policy: str | None = None) -> dict[str, float]:
    """µs of CPU per request of each piece, in this process."""
    benches: dict[str, Callable[[], float]] = {
        "sched": lambda: bench_sched(n, inflight, stream=False),
        "sched_stream": lambda: bench_sched(n, inflight, stream=True),
        "finish": lambda: bench_finish(n),
        "finish_logged": lambda: bench_finish(n, logged=True),
        "engine_call": lambda: bench_engine_call(n),
        "relay_iter": lambda: bench_relay(n, deliver=False),
        "relay_deliver": lambda: bench_relay(n, deliver=True),
        "front": lambda: bench_front(n, inflight),
    }
    out: dict[str, float] = {}
    for p in pieces:
        if p.startswith(BACKLOG):
            out[p] = bench_backlog(n, inflight, int(p.removeprefix(BACKLOG))) / 1000.0
        elif p.startswith(FLEET):
            count = int(p.removeprefix(FLEET))
            out[p] = bench_sched(n, FLEET_RUNNING, stream=False, endpoints=count, policy=policy) / 1000.0
        else:
            out[p] = benches[p]() / 1000.0
    return out


def _child(tree: Path, pieces: Sequence[str], n: int, inflight: int, policy: str | None) -> dict[str, float]:
    # This file and its pieces' modules run by their paths, with only `tree` on the path: the tree need
    # not have them (the pieces' modules are put in sys.modules before this file imports them).
    env = dict(os.environ, PYTHONPATH=str(tree))
    child = ["--child", "--requests", str(n), "--inflight", str(inflight), "--pieces", ",".join(pieces)]
    if policy is not None:
        child += ["--policy", policy]
    here = Path(__file__).resolve().parent
    modules = [(f"loadgen.diag.{m}", str(here / f"{m}.py")) for m in _PIECE_MODULES]
    code = (
        "import importlib.util, runpy, sys\n"
        f"for name, path in {modules!r}:\n"
        "    spec = importlib.util.spec_from_file_location(name, path)\n"
        "    sys.modules[name] = module = importlib.util.module_from_spec(spec)\n"
        "    spec.loader.exec_module(module)\n"
        f"sys.argv = {[__file__, *child]!r}\n"
        f"runpy.run_path({__file__!r}, run_name='__main__')\n"
    )
    argv = [sys.executable, "-c", code]
    out = subprocess.run(argv, env=env, cwd=tree, check=True, capture_output=True, timeout=600)
    result: dict[str, float] = orjson.loads(out.stdout)
    return result


def _backlog(piece: str) -> bool:
    """A `backlog_N` or `fleet_N` piece."""
    return any(piece.startswith(k) and piece.removeprefix(k).isdigit() for k in (BACKLOG, FLEET))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="berth-loadgen diag overhead-micro", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--tree", type=tree_arg, action="append", default=[], metavar="NAME=DIR")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=20000, help="requests per run (default 20000)")
    p.add_argument("--inflight", type=int, default=32, help="running requests per endpoint (default 32)")
    p.add_argument("--pieces", default=",".join(PIECES))
    p.add_argument("--policy", default=None, help="the fleet pieces' shipped preset (default: default)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=None, help="JSON report")
    args = p.parse_args(argv)
    pieces = [x for x in args.pieces.split(",") if x]
    if unknown := {x for x in pieces if x not in PIECES + EXTRA_PIECES and not _backlog(x)}:
        known = ",".join(PIECES + EXTRA_PIECES)
        p.error(f"unknown pieces {sorted(unknown)}; choose from {known}, {BACKLOG}N or {FLEET}N")
    trees = args.tree or [("berth", Path(__file__).resolve().parents[2])]
    if args.policy is not None and not args.child:
        for _, tree in trees:
            if not (tree / "policies" / f"{args.policy}.toml").is_file():
                names = ",".join(sorted(x.stem for x in (tree / "policies").glob("*.toml")))
                p.error(f"--policy {args.policy!r}: no shipped preset of that name in {tree}; one of {names}")
    if args.child:
        sys.stdout.write(orjson.dumps(run_once(pieces, args.requests, args.inflight, args.policy)).decode())
        return 0
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for r in range(args.rounds):
        order = trees[r % len(trees) :] + trees[: r % len(trees)]
        for name, tree in order:
            res = _child(tree, pieces, args.requests, args.inflight, args.policy)
            runs[name].append(res)
            shown = "  ".join(f"{k} {v:6.2f}" for k, v in res.items())
            print(f"round {r + 1}/{args.rounds} {name:10} {shown}  (µs CPU per request)", file=sys.stderr)
    first = trees[0][0]
    summary: dict[str, dict[str, float]] = {}
    lines = [f"{'piece':14}" + "".join(f"{name:>22}" for name, _ in trees)]
    for piece in pieces:
        row = f"{piece:14}"
        for name, _ in trees:
            vals = [x[piece] for x in runs[name]]
            s = summary.setdefault(f"{name}.{piece}", {})
            s["median"] = statistics.median(vals)
            cell = f"{s['median']:.2f}"
            if name != first:
                diffs = [a[piece] - b[piece] for a, b in zip(runs[name], runs[first], strict=True)]
                s["minus_first"] = statistics.median(diffs)
                cell += f" ({s['minus_first']:+.2f})"
            row += f"{cell:>22}"
        lines.append(row)
    table = "\n".join(lines)
    print(f"µs of CPU per request, median of {args.rounds} rounds of {args.requests} requests "
          f"(difference to {first}: median per round)\n{table}")  # fmt: skip
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {"benchmark": "overhead-micro", "trees": {n: str(t) for n, t in trees},
                  "runs": runs, "summary": summary, "table": table}  # fmt: skip
        args.out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
