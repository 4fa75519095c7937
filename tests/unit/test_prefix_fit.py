"""The fitted prefill model under heavy prefix reuse: it learns from the tokens the engine really
computed (the prompt less the cached tokens the prefix index predicted, corrected by the engine's hit
counters), so it stays right where most of every prompt is cached."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from gateway.core.types import SLO, EndpointId
from gateway.sched.perf import default_prior
from gateway.telemetry.fleet_state import FleetTelemetry
from gateway.telemetry.records import FinishedRequest, TelemetrySettings

EID = EndpointId("gpu-01:8000")
TRUE = dataclasses.replace(default_prior(), k1=2.0e-4, c1=0.02, k2=1.0e-6, c2=5.0e-4, c3=0.01)


def reuse_heavy(n: int, *, predicted_over: float = 1.0, seed: int = 3) -> list[FinishedRequest]:
    """One request at a time (each prefill timed from dispatch on an idle endpoint), 50-95 % of every
    prompt in the engine's prefix cache; the index predicted `predicted_over` × what the engine hit."""
    rng = random.Random(seed)
    out: list[FinishedRequest] = []
    for i in range(n):
        t = 1000.0 + 2.0 * i
        prompt = rng.randint(1_000, 8_000)
        hit = int(prompt * rng.uniform(0.5, 0.95))
        first = t + TRUE.prefill_s(prompt - hit)
        gaps = [TRUE.decode_iter_s(1, prompt)] * 9
        rec = FinishedRequest(
            "m", "default", SLO(), True, True, EID, 1, t, t, first, first + sum(gaps), 0, prompt, prompt, 10,
            gaps, None, None, None, round(hit * predicted_over),
        )  # fmt: skip
        out.append(rec)
    return out


def fitted(records: list[FinishedRequest], correction: float | None = None) -> float:
    fleet = FleetTelemetry(TelemetrySettings(prior=default_prior(), min_observations=10))
    if correction is not None:
        fleet.cache_correction = lambda eid: correction
    fleet.keep_endpoints([EID])
    for r in records:
        fleet.observe(r)
    fleet.settle(EID, math.inf)
    fleet.refit(now=5000.0)
    c = fleet.endpoints[EID].coefficients
    assert c.n_prefill >= 50
    return c.k1


def test_the_prefill_fit_learns_from_the_uncached_tokens() -> None:
    assert fitted(reuse_heavy(80)) == pytest.approx(TRUE.k1, rel=0.02)


def test_counting_the_whole_prompt_would_mislead_the_fit() -> None:
    blind = [r._replace(cached_tokens=0) for r in reuse_heavy(80)]
    assert fitted(blind) < 0.5 * TRUE.k1  # prefill looks several times cheaper than it is


def test_the_engine_counters_correct_an_index_that_over_predicts() -> None:
    """The index predicted twice the hits the engine measured: the correction (0.5, from the counters,
    `PrefixIndex.correction`) brings the fit back."""
    over = reuse_heavy(80, predicted_over=1.0 / 0.75)
    assert fitted(over) != pytest.approx(TRUE.k1, rel=0.05)
    assert fitted(over, correction=0.75) == pytest.approx(TRUE.k1, rel=0.02)
