"""What a refit holds the event loop for: each part's fit whole (`PerfModelFitter.refit_part`, one turn of
the loop before telemetry fitted in steps) beside the longest of its steps (`refit_steps`, the live
loop's turns now), with windows of `--window` observations, timed with `time.thread_time_ns` (CPU time
of this thread: another process's load does not count).

    berth-loadgen diag refit-steps [--window 2000] [--repeat 30] [--endpoints 100]

The observations are drawn from a 7B-class model with 3 % noise and 2 % gross outliers (a stalled loop),
the windows full, every fit made anew (each repetition forgets the last fit, so the same window is
fitted again). The last line is what one refit of a fleet of `--endpoints` such endpoints costs (every
part of every endpoint once: the live loop does it every `refit_interval_s`), as CPU per second of a
core at the default interval.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections.abc import Sequence

from gateway.config.schema import TelemetryConfig
from gateway.sched.perf import default_prior
from gateway.telemetry.perfmodel import PARTS, Part, PerfModelFitter


def fitter(window: int, seed: int = 1) -> PerfModelFitter:
    """A fitter with `window` observations of every kind."""
    rng = random.Random(seed)
    f = PerfModelFitter(default_prior(), window=window)

    def noisy(v: float) -> float:
        v *= rng.gauss(1.0, 0.03)
        return v * rng.uniform(1.5, 4.0) if rng.random() < 0.02 else v

    for _ in range(window):
        p = rng.randint(4, 4096)
        f.observe_prefill(p, noisy(2.0e-4 * p + 0.02))
        b, ctx = rng.uniform(1, 32), rng.uniform(20, 3000)
        f.observe_decode(b, ctx, noisy((2.0e-6 * ctx + 1.0e-3) * b + 0.025))
        c = rng.uniform(10, 4000)
        f.observe_kv(c, (1.0 * c + 1.0) * rng.gauss(1.0, 0.01))
        f.observe_throughput(b, noisy(60.0 - 8.0 * math.log1p(0.3 * b)))
    return f


def _forget(f: PerfModelFitter, part: Part) -> None:
    f._fitted[part] = -1


def time_part(f: PerfModelFitter, part: Part, repeat: int) -> tuple[float, float, int]:
    """Median µs of the whole fit, median µs of the longest step, and the steps per fit."""
    whole: list[float] = []
    longest: list[float] = []
    count = 0
    for _ in range(repeat):
        _forget(f, part)
        t = time.thread_time_ns()
        f.refit_part(part)
        whole.append((time.thread_time_ns() - t) / 1e3)
        _forget(f, part)
        steps = iter(f.refit_steps(part))
        worst, count = 0.0, 0
        while True:
            t = time.thread_time_ns()
            done = next(steps, StopIteration) is StopIteration
            worst = max(worst, (time.thread_time_ns() - t) / 1e3)
            if done:
                break
            count += 1
        longest.append(worst)
    return statistics.median(whole), statistics.median(longest), count


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--window", type=int, default=2000, help="observations per part (default 2000, full)")
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--endpoints", type=int, default=100)
    a = p.parse_args(argv)
    f = fitter(a.window)
    print(f"window {a.window} observations per part; medians of {a.repeat} fits (CPU µs, this thread)")
    print(f"{'part':<12}{'whole fit':>12}{'longest step':>15}{'steps':>8}")
    total = 0.0
    for part in PARTS:
        whole, step, count = time_part(f, part, a.repeat)
        total += whole
        print(f"{part:<12}{whole:>12.0f}{step:>15.0f}{count:>8}")
    interval = TelemetryConfig().refit_interval_s
    share = total * a.endpoints / 1e6 / interval
    print(
        f"one endpoint's refit {total / 1e3:.2f} ms; {a.endpoints} endpoints every {interval:g} s: "
        f"{share * 100:.1f} % of a core"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
