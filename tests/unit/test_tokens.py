"""The tokenizer-free prompt-token estimator: default, convergence, tracking a change, what it ignores."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.telemetry.tokens import TokenEstimator


@pytest.mark.parametrize(
    ("chars", "tokens"), [(0, 0), (1, 1), (3, 1), (4, 1), (6, 2), (400, 100), (401, 100), (402, 101)]
)
def test_default_is_four_characters_per_token(chars: int, tokens: int) -> None:
    assert TokenEstimator().estimate("m", chars) == tokens


def test_the_first_observation_replaces_the_default() -> None:
    est = TokenEstimator()
    est.observe("m", 3000, 1000)
    assert est.chars_per_token("m") == pytest.approx(3.0)
    assert est.estimate("m", 600) == 200
    assert est.chars_per_token("other") == 4.0  # per model


@pytest.mark.parametrize("ratio", [2.5, 3.2, 4.7], ids=lambda r: f"{r}-chars-per-token")
def test_converges_to_the_engines_ratio(ratio: float) -> None:
    rng = random.Random(ratio)
    est = TokenEstimator()
    for _ in range(300):
        tokens = rng.randint(20, 3000)
        est.observe("m", round(tokens * ratio * rng.gauss(1.0, 0.05)), tokens)
    assert est.chars_per_token("m") == pytest.approx(ratio, rel=0.02)
    assert est.estimate("m", round(1000 * ratio)) == pytest.approx(1000, rel=0.02)
    assert est.observations("m") == 300


def test_follows_a_change_at_the_ewma_rate() -> None:
    est = TokenEstimator(alpha=0.05)
    for _ in range(200):
        est.observe("m", 4000, 1000)
    for _ in range(60):  # 1 - 0.95**60 = 95 % of the way
        est.observe("m", 2500, 1000)
    assert est.chars_per_token("m") == pytest.approx(2.5 + 1.5 * 0.95**60, rel=1e-6)


@pytest.mark.parametrize(
    ("chars", "tokens"),
    [(40, 10), (0, 100), (10, 100), (100_000, 100)],
    ids=["tiny-prompt", "no-chars", "ratio-too-small", "ratio-too-large"],
)
def test_ignored_observations(chars: int, tokens: int) -> None:
    est = TokenEstimator()
    est.observe("m", chars, tokens)
    assert est.chars_per_token("m") == 4.0
    assert est.observations("m") == 0


def test_models_are_bounded_least_recently_observed_first() -> None:
    est = TokenEstimator(max_models=2)
    est.observe("a", 3000, 1000)
    est.observe("b", 2000, 1000)
    est.observe("a", 3000, 1000)
    est.observe("c", 5000, 1000)
    assert est.chars_per_token("b") == 4.0  # evicted: back to the default
    assert est.chars_per_token("a") == pytest.approx(3.0)
    assert est.chars_per_token("c") == pytest.approx(5.0)


@pytest.mark.parametrize(
    "kwargs", [{"default_chars_per_token": 0}, {"alpha": 0}, {"alpha": 1.5}, {"max_models": 0}]
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"."):
        TokenEstimator(**kwargs)  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(
    obs=st.lists(st.tuples(st.integers(0, 100_000), st.integers(0, 20_000)), max_size=50),
    chars=st.integers(0, 1_000_000),
)
def test_estimates_stay_sane(obs: list[tuple[int, int]], chars: int) -> None:
    est = TokenEstimator()
    for c, t in obs:
        est.observe("m", c, t)
    assert 0.5 <= est.chars_per_token("m") <= 32.0
    n = est.estimate("m", chars)
    assert (n == 0) if chars == 0 else (n >= 1)
