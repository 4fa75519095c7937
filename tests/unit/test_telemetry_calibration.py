"""The prior's scale from what running requests show, until the first fit (sans-IO)."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.core.types import RequestId
from gateway.sched.perf import default_prior
from gateway.sched.running import RunningRequest
from gateway.telemetry.calibration import prior_factors
from gateway.telemetry.perfmodel import PerfModelFitter

PRIOR = default_prior()


def running(i: int, *, prompt: int = 500, first_after: float | None = None, **kw: object) -> RunningRequest:
    r = RunningRequest(
        id=RequestId(f"r{i}"),
        slo_class="default",
        prompt_tokens=prompt,
        output_mean=100.0,
        output_std=0.0,
        max_tokens=None,
        dispatched_at=0.0,
        ttft_deadline=None,
        e2e_deadline=None,
        itl_s=None,
    )
    if first_after is not None:
        r = dataclasses.replace(r, first_token_at=first_after)
    return dataclasses.replace(r, **kw)  # type: ignore[arg-type]


def test_a_slower_machine_scales_prefill_by_the_least_and_decode_by_the_median() -> None:
    pre = PRIOR.prefill_s(500)
    batch = [running(i, first_after=pre * f) for i, f in enumerate((3.0, 2.0, 5.0))]
    ctx = 500 + 21  # every request has produced 21 tokens
    step = PRIOR.decode_iter_s(3, ctx)
    batch = [
        dataclasses.replace(r, produced=21, reported_at=r.first_token_at + 20 * step * f)  # type: ignore[operator]
        for r, f in zip(batch, (4.0, 3.0, 10.0), strict=True)
    ]
    p, d = prior_factors(PRIOR, batch)
    assert p == pytest.approx(2.0)
    assert d == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        pytest.param([], (None, None), id="idle"),
        pytest.param([running(0)], (None, None), id="no-first-token-yet"),
        pytest.param([running(0, first_after=1e-3)], (1.0, None), id="faster-than-the-prior-is-not-believed"),
        pytest.param(
            [running(0, first_after=1.0, produced=1, reported_at=1.0)],
            (pytest.approx(1.0 / 0.065), None),
            id="one-token-has-no-pace",
        ),
    ],
)
def test_what_cannot_be_read_is_none(batch: list[RunningRequest], expected: tuple[object, object]) -> None:
    assert prior_factors(PRIOR, batch) == expected


def test_the_scale_applies_to_guessed_parts_on_the_prior_only() -> None:
    f = PerfModelFitter(
        PRIOR, min_obs=20, first_fit_min_obs=5, guessed=frozenset({"prefill", "decode", "kv"})
    )
    for i in range(5):  # prefill gets its first fit
        f.observe_prefill(100 * (i + 1), 0.02 + 2e-4 * 100 * (i + 1))
    fitted = f.refit()
    scaled = f.scale_prior(3.0, 2.0)
    assert (scaled.k1, scaled.c1) == (fitted.k1, fitted.c1)  # fitted: left alone
    assert (scaled.k2, scaled.c2, scaled.c3) == (2 * PRIOR.k2, 2 * PRIOR.c2, 2 * PRIOR.c3)
    assert (scaled.thr1, scaled.alpha) == (PRIOR.thr1, PRIOR.alpha)  # an operator's: not a guess
    with pytest.raises(ValueError, match="scale"):
        f.scale_prior(0.0, 1.0)
