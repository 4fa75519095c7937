"""The output-length predictor: quantiles and capping against numpy, re-prediction, the fallback
chain, and bounded memory."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.telemetry.lengths import LengthPrediction, OutputLengthPredictor

M, C = "model-a", "chat"


def make(values: list[int], *, prompt: int = 100, **kw: int) -> OutputLengthPredictor:
    p = OutputLengthPredictor(**{"min_samples": 1, **kw})  # type: ignore[arg-type]
    for v in values:
        p.observe(M, C, prompt, v)
    return p


def expected(values: list[int], cap: float = math.inf) -> LengthPrediction:
    a = np.minimum(np.array(values, dtype=float), cap)
    q50, q90, q99 = np.quantile(a, [0.5, 0.9, 0.99])
    return LengthPrediction(float(a.mean()), float(a.std()), float(q50), float(q90), float(q99), len(values))


def approx(p: LengthPrediction, e: LengthPrediction) -> None:
    assert p.n == e.n
    for name in ("mean", "std", "p50", "p90", "p99"):
        assert getattr(p, name) == pytest.approx(getattr(e, name), rel=1e-9, abs=1e-9), name


# ---- summaries ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("values", "mean", "p50", "p90", "p99"),
    [
        (list(range(1, 101)), 50.5, 50.5, 90.1, 99.01),
        ([10], 10.0, 10.0, 10.0, 10.0),
        ([1, 2, 3, 4, 100], 22.0, 3.0, 61.6, 96.16),
    ],
    ids=["1..100", "one-value", "skewed"],
)
def test_quantiles_of_a_known_history(
    values: list[int], mean: float, p50: float, p90: float, p99: float
) -> None:
    pred = make(values).predict(M, C, 100, None)
    assert (pred.mean, pred.p50, pred.p90, pred.p99) == pytest.approx((mean, p50, p90, p99))
    assert pred.n == len(values)


@pytest.mark.parametrize("cap", [1, 60, 95, 100, 1000], ids=lambda c: f"max_tokens={c}")
def test_capping_by_max_tokens(cap: int) -> None:
    values = list(range(1, 101))
    pred = make(values).predict(M, C, 100, cap)
    approx(pred, expected(values, cap))
    assert max(pred.mean, pred.p50, pred.p90, pred.p99) <= cap


def test_no_history_is_the_documented_default() -> None:
    p = OutputLengthPredictor(default_mean=200.0)
    pred = p.predict(M, C, 100, None)
    assert pred.n == 0
    assert pred.mean == 200.0
    assert pred.p50 == pytest.approx(200.0 * math.exp(-0.5))
    assert pred.p50 < pred.p90 < pred.p99
    capped = p.predict(M, C, 100, 150)
    assert max(capped.mean, capped.std, capped.p50, capped.p90, capped.p99) <= 150
    assert math.isnan(p.spread(M, C, 100))


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(st.integers(min_value=0, max_value=5000), min_size=1, max_size=80),
    cap=st.one_of(st.none(), st.integers(min_value=1, max_value=6000)),
)
def test_summaries_match_numpy_and_are_ordered(values: list[int], cap: int | None) -> None:
    pred = make(values).predict(M, C, 100, cap)
    approx(pred, expected(values, math.inf if cap is None else cap))
    assert pred.p50 <= pred.p90 <= pred.p99
    assert min(*values, cap or math.inf) <= pred.mean + 1e-9
    assert pred.std >= 0
    if cap is not None:
        assert max(pred.mean, pred.p50, pred.p90, pred.p99) <= cap


# ---- re-prediction ------------------------------------------------------------------------------------
def test_repredict_is_the_conditional_distribution() -> None:
    values = list(range(1, 101))
    p = make(values)
    approx(p.repredict(M, C, 100, 80, None), expected(list(range(81, 101))))
    approx(p.repredict(M, C, 100, 80, 90), expected(list(range(81, 101)), 90))


@pytest.mark.parametrize(
    ("produced", "cap", "mean", "p90", "p99"),
    [(200, None, 400, 600, 800), (200, 500, 400, 500, 500), (200, 150, 150, 150, 150)],
    ids=["uncapped", "capped", "cap-below-produced"],
)
def test_repredict_beyond_all_history_grows_from_what_was_produced(
    produced: int, cap: int | None, mean: float, p90: float, p99: float
) -> None:
    pred = make(list(range(1, 101))).repredict(M, C, 100, produced, cap)
    assert (pred.mean, pred.p50, pred.p90, pred.p99, pred.n) == (mean, mean, p90, p99, 0)


def test_repredict_with_nothing_produced_is_predict() -> None:
    p = make(list(range(1, 101)))
    assert p.repredict(M, C, 100, 0, 50) == p.predict(M, C, 100, 50)


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(st.integers(min_value=1, max_value=3000), min_size=1, max_size=60),
    produced=st.integers(min_value=1, max_value=4000),
    cap=st.one_of(st.none(), st.integers(min_value=1, max_value=6000)),
)
def test_repredict_is_above_what_was_produced(values: list[int], produced: int, cap: int | None) -> None:
    pred = make(values).repredict(M, C, 100, produced, cap)
    floor = produced if cap is None else min(produced, cap)
    for name in ("mean", "p50", "p90", "p99"):
        value = getattr(pred, name)
        if cap is None or cap > produced:
            assert value > floor, name
        else:
            assert value == cap, name  # the engine stops at max_tokens, however long it ran


# ---- fallbacks ----------------------------------------------------------------------------------------
def test_bucket_edges() -> None:
    p = OutputLengthPredictor(buckets=(64, 256), min_samples=1)
    p.observe(M, C, 64, 10)  # <= 64: the first bucket
    p.observe(M, C, 65, 20)
    p.observe(M, C, 10_000, 30)  # above the last bound: one more bucket
    assert p.predict(M, C, 1, None).mean == 10
    assert p.predict(M, C, 256, None).mean == 20
    assert p.predict(M, C, 257, None).mean == 30


@pytest.mark.parametrize(
    ("history", "prompt", "mean"),
    [
        pytest.param([(M, C, 100, 10)], 100, 10, id="own-bucket"),
        pytest.param([(M, C, 100, 10)], 2000, 10, id="empty-bucket-uses-a-neighbour"),
        pytest.param([(M, C, 100, 10), (M, C, 5000, 99)], 30, 10, id="nearest-neighbour-first"),
        pytest.param([(M, C, 30, 10), (M, C, 500, 30)], 100, 20, id="both-neighbours-at-one-step"),
        pytest.param([(M, "batch", 100, 40)], 100, 40, id="other-class-of-the-model"),
        pytest.param([(M, "batch", 5000, 40)], 100, 40, id="model-history-any-bucket"),
        pytest.param([("model-b", C, 100, 40)], 100, 256, id="other-model-is-not-used"),
        pytest.param([], 100, 256, id="default"),
    ],
)
def test_fallback_chain(history: list[tuple[str, str, int, int]], prompt: int, mean: float) -> None:
    p = OutputLengthPredictor(min_samples=1, default_mean=256.0)
    for model, cls, prompt_tokens, out in history:
        p.observe(model, cls, prompt_tokens, out)
    assert p.predict(M, C, prompt, None).mean == mean


def test_the_class_history_wins_over_the_model_history() -> None:
    p = OutputLengthPredictor(min_samples=1)
    p.observe(M, "batch", 100, 500)
    p.observe(M, C, 5000, 10)  # another bucket of the same class is still preferred
    assert p.predict(M, C, 100, None).mean == 10


def test_too_few_samples_widen_to_neighbouring_buckets() -> None:
    p = OutputLengthPredictor(min_samples=4)
    for v in (100, 100):
        p.observe(M, C, 100, v)  # the request's bucket: too few alone
    for v in (10, 10, 10):
        p.observe(M, C, 500, v)  # its neighbour
    pred = p.predict(M, C, 100, None)
    assert pred.n == 5
    assert pred.mean == pytest.approx((200 + 30) / 5)


def test_spread_is_the_median_absolute_deviation() -> None:
    p = make([1, 2, 3, 4, 100])
    assert p.spread(M, C, 100) == 1.0  # median 3; deviations 2, 1, 0, 1, 97
    assert make(list(range(1, 101))).spread(M, C, 100) == 25.0


# ---- memory -------------------------------------------------------------------------------------------
def test_window_per_bucket_keeps_the_most_recent() -> None:
    p = make([1000] * 50 + list(range(1, 11)), window=10)
    approx(p.predict(M, C, 100, None), expected(list(range(1, 11))))


def test_keys_are_bounded_least_recently_used_first() -> None:
    p = OutputLengthPredictor(min_samples=1, max_keys=3, max_models=2)
    for i in range(3):
        p.observe(M, f"class-{i}", 100, 10 + i)
    p.predict(M, "class-0", 100, None)  # class-0 is used again: class-1 is now the oldest
    p.observe(M, "class-3", 100, 13)
    assert len(p) == 3
    assert p.predict(M, "class-0", 100, None).mean == 10
    assert p.predict(M, "class-2", 100, None).mean == 12
    # class-1's own history is gone; the model's all-class history answers for it
    assert p.predict(M, "class-1", 100, None).n == 4
    for m in ("b", "c", "d"):
        p.observe(m, C, 100, 1)
    assert p.models == 2


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("abcdefgh"), st.integers(0, 5000), st.integers(0, 3000)), max_size=300)
)
def test_memory_never_exceeds_its_bounds(obs: list[tuple[str, int, int]]) -> None:
    p = OutputLengthPredictor(window=8, max_keys=4, max_models=3)
    for key, prompt, out in obs:
        p.observe(f"m{ord(key) % 5}", key, prompt, out)
    assert len(p) <= 4
    assert p.models <= 3
    for hist in (*p._by_class.values(), *p._by_model.values()):
        assert all(len(b) <= 8 for b in hist.buckets)


@pytest.mark.parametrize(
    "kwargs",
    [{"buckets": ()}, {"buckets": (64, 64)}, {"buckets": (0, 10)}, {"window": 0}, {"default_mean": 0}],
    ids=["no-buckets", "not-increasing", "zero-bound", "window", "default-mean"],
)
def test_bad_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"."):
        OutputLengthPredictor(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("values", [[4998, 4998, 5000], [4200, 4202, 4202], [3, 3, 5]], ids=str)
def test_std_of_large_close_values_is_exact(values: list[int]) -> None:
    """`E[v²] - mean²` in floats cancels for large, close values (hypothesis found [4998, 4998, 5000]
    off by 1.6e-9); the summary's integer sums keep it exact."""
    approx(make(values).predict(M, C, 100, None), expected(values))
