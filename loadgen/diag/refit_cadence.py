"""What the performance models' refit cadence costs in accuracy and saves in work (a diagnostic: prints
figures).

    berth-loadgen diag refit-cadence [--profile fleet-7b] [--ticks 800] [--per-tick 3] [--seed 1]

One endpoint's observations, as the telemetry loop feeds them: every tick (a refit interval) adds
`--per-tick` observations of each kind (prefill, decode, KV, throughput) drawn from the profile's true
latency model (3 % multiplicative noise, 5 % of the times gross outliers that only add time, as a stalled
event loop does), and the engine turns 1.5x slower two thirds of the way through (the fits must follow it).
Two fitters see the same observations and are refitted at every tick: one fits every part with anything new
(`refit_share` 0), the other at the default cadence
(`gateway.telemetry.perfmodel.REFIT_SHARE`). Figures, per fitter: the part fits it made and their CPU time;
the error of its prefill and decode predictions against the true model (the largest relative error over a
grid of prompts, batches and contexts) after every tick: mean, p95 and max, before and after the change (the
change's first 100 ticks apart); and the largest gap between the two fitters' predictions. It says whether
the cadence's error is within the eager fitter's own: before the change, mean within 0.5 point and p95
within 1 point; after it (both lag the change: the robust weights hold on to the old model until the new one
carries the weight), mean within 1 point.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Final

import numpy as np

from gateway.sched.perf import PerfCoefficients, default_prior
from gateway.telemetry.perfmodel import REFIT_SHARE, PerfModelFitter
from loadgen.engine_sim.profiles import get_profile

NOISE: Final = 0.03
OUTLIERS: Final = 0.05
SLOWDOWN: Final = 1.5
SETTLING_TICKS: Final = 100  # ticks after the change left out of both phases' figures
PROMPTS: Final = (16, 64, 256, 1024, 4096)
POINTS: Final = tuple((b, c) for b in (1, 2, 4, 8, 16) for c in (50, 300, 1000, 3000))


def truth(profile: str, slowdown: float = 1.0) -> PerfCoefficients:
    lat = get_profile(profile).latency
    return replace(
        default_prior(),
        k1=lat.k1 * slowdown,
        c1=lat.c1 * slowdown,
        k2=lat.k2 * slowdown,
        c2=lat.c2 * slowdown,
        c3=lat.c3 * slowdown,
        h=1.0,
        j=1.0,
    )


def grid_error(fit: PerfCoefficients, true: PerfCoefficients) -> tuple[float, float]:
    """The largest relative error of the prefill and of the decode predictions over the grid."""
    pre = max(abs(fit.prefill_s(p) - true.prefill_s(p)) / true.prefill_s(p) for p in PROMPTS)
    dec = max(
        abs(fit.decode_iter_s(b, c) - true.decode_iter_s(b, c)) / true.decode_iter_s(b, c) for b, c in POINTS
    )
    return pre, dec


def gap(a: PerfCoefficients, b: PerfCoefficients) -> float:
    """The largest relative difference between two fits' prefill and decode predictions over the grid."""
    pre = max(abs(a.prefill_s(p) - b.prefill_s(p)) / b.prefill_s(p) for p in PROMPTS)
    dec = max(abs(a.decode_iter_s(x, c) - b.decode_iter_s(x, c)) / b.decode_iter_s(x, c) for x, c in POINTS)
    return max(pre, dec)


def observe(fitters: Sequence[PerfModelFitter], true: PerfCoefficients, n: int, rng: random.Random) -> None:
    def noisy(v: float) -> float:
        v *= rng.gauss(1.0, NOISE)
        if rng.random() < OUTLIERS:
            v *= rng.uniform(1.5, 4.0)
        return v

    for _ in range(n):
        p = rng.randint(16, 2048)
        pre = noisy(true.prefill_s(p))
        b = rng.uniform(1, 16)
        ctx = rng.uniform(50, 3000)
        dec = noisy(true.decode_iter_s(b, ctx))
        c = rng.uniform(50, 3000)
        kv = true.kv_tokens(c) * rng.gauss(1.0, NOISE / 3)
        tps = true.per_request_tps(b) * rng.gauss(1.0, NOISE)
        for f in fitters:
            f.observe_prefill(p, pre)
            f.observe_decode(b, ctx, dec)
            f.observe_kv(c, kv)
            f.observe_throughput(b, tps)


@dataclass(slots=True)
class Track:
    name: str
    fitter: PerfModelFitter
    cpu_s: float = 0.0
    errors: list[tuple[float, float]] = field(default_factory=list)

    def refit(self) -> PerfCoefficients:
        t0 = time.process_time()
        fit = self.fitter.refit()
        self.cpu_s += time.process_time() - t0
        return fit

    @property
    def fits(self) -> int:
        return self.fitter.fits


def summary(values: Sequence[float]) -> str:
    a = np.asarray(values) * 100.0
    return f"mean {a.mean():5.2f} %  p95 {np.percentile(a, 95):5.2f} %  max {a.max():5.2f} %"


def run(profile: str, ticks: int, per_tick: int, seed: int) -> int:
    rng = random.Random(seed)
    prior = truth(profile)
    eager = Track("every tick (refit_share 0)", PerfModelFitter(prior, refit_share=0.0, first_fit_min_obs=5))
    cadence = Track(
        f"cadence (refit_share {REFIT_SHARE:g})",
        PerfModelFitter(prior, refit_share=REFIT_SHARE, first_fit_min_obs=5),
    )
    tracks = (eager, cadence)
    change = 2 * ticks // 3
    gaps: list[float] = []
    for tick in range(ticks):
        true = truth(profile, SLOWDOWN if tick >= change else 1.0)
        observe([t.fitter for t in tracks], true, per_tick, rng)
        fits = [t.refit() for t in tracks]
        for t, fit in zip(tracks, fits, strict=True):
            t.errors.append(grid_error(fit, true))
        gaps.append(gap(fits[1], fits[0]))
    print(
        f"# Refit cadence: {profile}, {ticks} ticks of {per_tick} observations per kind, "
        f"the engine {SLOWDOWN:g}x slower from tick {change}"
    )
    print()
    phases = {
        "before the change": range(20, change),
        "after the change": range(change + SETTLING_TICKS, ticks),
    }
    for t in tracks:
        print(f"## {t.name}: {t.fits} part fits, {t.cpu_s:.2f} s CPU")
        for label, rows in phases.items():
            pre = [t.errors[i][0] for i in rows]
            dec = [t.errors[i][1] for i in rows]
            print(f"- {label}: prefill {summary(pre)}; decode {summary(dec)}")
        print()
    ok = True
    for k in (0, 1):  # prefill, decode
        e = np.asarray([eager.errors[i][k] for i in phases["before the change"]])
        c = np.asarray([cadence.errors[i][k] for i in phases["before the change"]])
        ok &= bool(c.mean() - e.mean() <= 0.005 and np.percentile(c, 95) - np.percentile(e, 95) <= 0.01)
        e = np.asarray([eager.errors[i][k] for i in phases["after the change"]])
        c = np.asarray([cadence.errors[i][k] for i in phases["after the change"]])
        ok &= bool(c.mean() - e.mean() <= 0.01)
    print(f"- largest gap between the two fitters' predictions: {summary(gaps)}")
    print(
        f"- fits: {cadence.fits} against {eager.fits} ({eager.fits / max(cadence.fits, 1):.1f}x fewer), "
        f"CPU {cadence.cpu_s:.2f} s against {eager.cpu_s:.2f} s"
    )
    print(f"- the cadence's error within the eager fitter's own: {'yes' if ok else 'no'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="berth-loadgen diag refit-cadence", description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="fleet-7b")
    p.add_argument("--ticks", type=int, default=800)
    p.add_argument("--per-tick", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    if args.ticks < 400:  # the change comes at two thirds, and its first 100 ticks are set apart
        p.error("--ticks must be at least 400")
    return run(args.profile, args.ticks, args.per_tick, args.seed)


if __name__ == "__main__":
    sys.exit(main())
