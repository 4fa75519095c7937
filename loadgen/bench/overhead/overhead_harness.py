"""The overhead benchmark through the peer harness (`../shared/perf-peers`): the same figures, measured
exactly as the issue's table was (wrk and the harness's stream client, nginx and aiohttp stand-ins on
loopback, proxies pinned to one core, interleaved rounds).

It runs the harness's `bench.py` with two custom peers next to `direct`: the bare proxy
(`overhead_bare_proxy`, the harness's `aiohttp_proxy.py` reference with berth's lag monitor added; same
code path, same aiohttp and uvloop) and berth. It reads each test's result from `raw.jsonl` and adds what
the harness does not measure: each proxy's event-loop lag during each of its tests, read from its
`GET /admin/loop-lag` (the harness logs a line as each test ends; every proxy's sample count is marked
at each such line, so the samples taken between two marks are one test's). Set the harness up first:
`cp -r ../shared/perf-peers /tmp/perf-peers && PEERS=none /tmp/perf-peers/setup.sh`.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import orjson

from loadgen.bench.overhead.overhead_lag import LagReading, lag_since, mark_lag
from loadgen.bench.overhead.overhead_report import LAT1, LAT8, SATURATION, STREAM, Measurement
from loadgen.harness import REPO_ROOT

#: The harness's tests and the phases they are here; its stream test with 64 streams 10 ms apart.
TESTS: Final = {"sat": SATURATION, "lat8": LAT8, "lat1": LAT1, "s10_k64": STREAM}
#: The harness's names for the configurations (its own `aiohttp` peer is the bare proxy without the
#: lag monitor: read as "bare" when a run asks for it instead, e.g. `--harness-args '--peers ...'`).
CONFIG_OF: Final = {"direct": "direct", "bare": "bare", "aiohttp": "bare", "berth": "berth"}
#: The custom peers in the order they are given: the harness starts the i-th at 18600 + 100 i (fronting
#: the non-streaming stand-ins) and 18601 + 100 i (the streaming ones).
CUSTOM: Final = ("bare", "berth")
PORTS: Final = {
    (name, kind): 18600 + 100 * i + offset
    for i, name in enumerate(CUSTOM)
    for kind, offset in (("ns", 0), ("s", 1))
}
_RESULT_LINE = re.compile(r"\br(\d+) (\S+)\s+(\S+)\s+\{")


class HarnessFailed(RuntimeError):
    """The peer harness is not set up, or its run failed."""


def berth_command(python: str, berth_args: str) -> str:
    """The harness's command template for berth (fields `{port}`, `{up1}`, `{up2}`)."""
    cmd = (
        f"{python} -m gateway.cli serve --listen 127.0.0.1:{{port}} --endpoint {{up1}} --endpoint {{up2}} "
        "--log-level warning"
    )
    return f"{cmd} {berth_args}".strip()


def bare_lag_args(args: argparse.Namespace) -> list[str]:
    """The bare proxy's flags for `--lag-interval-ms` (none at 0: its default, as berth's)."""
    return [] if args.lag_interval_ms <= 0 else ["--lag-interval-s", repr(args.lag_interval_ms / 1000.0)]


def bare_command(python: str, lag_args: Sequence[str] = ()) -> str:
    """The harness's command template for the bare proxy."""
    proxy = "loadgen.bench.overhead.overhead_bare_proxy"
    cmd = f"{python} -m {proxy} --port {{port}} --upstream {{up1}} --upstream {{up2}}"
    return " ".join([cmd, *lag_args])


def harness_argv(root: Path, args: argparse.Namespace, out: Path) -> list[str]:
    return [
        str(root / "venv-harness" / "bin" / "python"),
        str(root / "harness" / "bench.py"),
        "--rounds", str(args.rounds),
        "--peers", "direct",
        "--custom", "bare=" + bare_command(args.python, bare_lag_args(args)),
        "--custom", "berth=" + berth_command(args.python, args.berth_args),
        "--tests", ",".join(name for name, phase in TESTS.items() if phase in args.tests),
        "--out", str(out),
        *shlex.split(args.harness_args),
    ]  # fmt: skip


def run_harness(
    root: Path, args: argparse.Namespace, logdir: Path
) -> tuple[list[Measurement], dict[str, str]]:
    """Run the harness set up in `root`; its results as measurements, and why berth was not measured
    (if it was not)."""
    bench = root / "harness" / "bench.py"
    python = root / "venv-harness" / "bin" / "python"
    if not bench.is_file() or not python.is_file():
        raise HarnessFailed(f"no peer harness set up in {root} (run its setup.sh)")
    out = logdir / "harness"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))  # berth from this checkout, whatever is installed
    proc = subprocess.Popen(
        harness_argv(root, args, out), cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert proc.stderr is not None
    lag: dict[tuple[int, str, str], tuple[float, ...]] = {}
    marks: dict[tuple[str, str], LagReading | None] = {}
    with (logdir / "harness.log").open("w") as log:
        for line in proc.stderr:
            log.write(line)
            print(line, end="", file=sys.stderr, flush=True)
            hit = _RESULT_LINE.search(line)
            if hit is not None and hit.group(2) in CUSTOM and hit.group(3) in TESTS:
                name, phase = hit.group(2), TESTS[hit.group(3)]
                kind = "s" if phase == STREAM else "ns"
                samples = lag_since(_url(name, kind), marks.get((name, kind)))
                if samples is not None:
                    lag[(int(hit.group(1)), phase, CONFIG_OF[name])] = samples
            marks = {key: mark_lag(_url(*key)) for key in PORTS}
    if proc.wait() != 0:
        raise HarnessFailed(f"the peer harness failed (exit {proc.returncode}); see {logdir / 'harness.log'}")
    measurements = [m for rec in _records(out / "raw.jsonl") if (m := _measurement(rec, lag)) is not None]
    unavailable = (
        {} if any(m.config == "berth" for m in measurements) else {"berth": "not ready (harness log)"}
    )
    return measurements, unavailable


def _url(name: str, kind: str) -> str:
    return f"http://127.0.0.1:{PORTS[(name, kind)]}"


def _records(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _measurement(
    rec: dict[str, Any], lag: dict[tuple[int, str, str], tuple[float, ...]]
) -> Measurement | None:
    """One harness result as a measurement (None: not a result of a test and peer compared here)."""
    if rec.get("type") != "result" or rec.get("test") not in TESTS or rec.get("peer") not in CONFIG_OF:
        return None
    phase, config = TESTS[rec["test"]], CONFIG_OF[rec["peer"]]
    stream = phase == STREAM
    wall = float(rec.get("wall_s") or 0.0)
    if stream:
        completed = int(rec.get("streams") or 0)
        lat = {}
        ttft = {
            k: float(rec[f"ttfc_ms_{k}"])
            for k in ("p50", "p90", "p99")
            if rec.get(f"ttfc_ms_{k}") is not None
        }
    else:
        completed = int(rec.get("requests") or 0)
        lat = {
            k: float(rec[f"{k}_us"]) / 1000.0 for k in ("p50", "p90", "p99") if rec.get(f"{k}_us") is not None
        }
        ttft = {}
    return Measurement(
        round=int(rec["round"]),
        phase=phase,
        config=config,
        concurrency={"sat": 64, "lat8": 8, "lat1": 1, "s10_k64": 64}[rec["test"]],
        max_tokens=16,
        completed=completed,
        errors=int(rec.get("errors") or 0),
        window_s=wall,
        rps=float(rec.get("rps") or (completed / wall if wall else 0.0)),
        lat_ms=lat,
        ttft_ms=ttft,
        chunks=int(rec.get("chunks_total") or 0) if stream else 0,
        proxy_cpu_s=None if config == "direct" else float(rec["proxy_cpu_s"]),
        upstream_cpu_s=float(rec["upstream_cpu_s"]) if rec.get("upstream_cpu_s") is not None else None,
        lag_s=lag.get((int(rec["round"]), phase, config), ()),
    )
