"""`OutputLengthPredictor.predict` keeps its chosen pool until the next observation: the same predictions
and the same least-recently-used order as choosing afresh every time."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.telemetry.lengths import OutputLengthPredictor

_MODELS = ("m1", "m2", "m3")
_CLASSES = ("chat", "code", "batch")

_op = st.one_of(
    st.tuples(
        st.just("observe"),
        st.sampled_from(_MODELS),
        st.sampled_from(_CLASSES),
        st.integers(0, 5000),
        st.integers(0, 3000),
    ),
    st.tuples(
        st.just("predict"),
        st.sampled_from(_MODELS),
        st.sampled_from(_CLASSES),
        st.integers(0, 5000),
        st.one_of(st.none(), st.integers(0, 4000)),
    ),
    st.tuples(
        st.just("repredict"),
        st.sampled_from(_MODELS),
        st.sampled_from(_CLASSES),
        st.integers(0, 5000),
        st.integers(0, 2000),
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_op, max_size=120), st.integers(1, 6), st.integers(1, 4), st.integers(1, 3))
def test_the_kept_pool_predicts_as_a_fresh_choice(
    ops: list[tuple[str, str, str, int, int | None]], min_samples: int, max_keys: int, max_models: int
) -> None:
    def make() -> OutputLengthPredictor:
        return OutputLengthPredictor(
            buckets=(64, 256, 1024),
            window=8,
            min_samples=min_samples,
            max_keys=max_keys,
            max_models=max_models,
        )

    kept, fresh = make(), make()
    for op, model, cls, prompt, arg in ops:
        if op == "observe":
            assert arg is not None
            kept.observe(model, cls, prompt, arg)
            fresh.observe(model, cls, prompt, arg)
        elif op == "predict":
            fresh._chosen.clear()  # choose afresh every time
            assert kept.predict(model, cls, prompt, arg) == fresh.predict(model, cls, prompt, arg)
        else:
            assert arg is not None
            want = fresh.repredict(model, cls, prompt, arg, None)
            assert kept.repredict(model, cls, prompt, arg, None) == want
        assert list(kept._by_class) == list(fresh._by_class)
        assert list(kept._by_model) == list(fresh._by_model)
