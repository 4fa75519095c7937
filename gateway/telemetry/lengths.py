"""Output-length prediction per (model, task class), by prompt-length bucket (Aladdin §2, Chiron §5).

History: for every (model, task class) and every prompt-length bucket, the output lengths of the last
``window`` finished requests; the same per model across all classes. A prediction summarises one *pool*
of that history (mean, std and quantiles), every figure capped by the request's ``max_tokens`` (the
engine stops there, so the distribution to predict is ``min(output, max_tokens)``).

Pool choice, the first one with at least ``min_samples`` values (default 16: the median of a handful of
values is a noisy guess, and pooling with the neighbours trades a little bias for much less noise; with
``min_samples=1`` this is exactly "an empty bucket falls back"):
1. the request's bucket of its (model, class);
2. that bucket widened to its neighbours of the same (model, class), one step each side at a time,
   up to all of its buckets;
3. the model's all-class history: the request's bucket, then widened the same way;
4. if no pool reaches ``min_samples``, the widest non-empty one seen; with no history at all,
   ``default_mean`` with a log-normal spread (sigma 1: median 0.61x, p90 2.2x, p99 6.2x the mean).

Re-prediction (Aladdin's correction as tokens arrive): given that a request has produced ``produced``
tokens, the same summary over the history of outputs longer than ``produced`` (the conditional
distribution); when the history holds none, the request has outlived everything seen, and the guess is
that it runs as long again (mean and median 2x produced, p90 3x, p99 4x), capped.

Memory is bounded: ``window`` values per bucket, ``max_keys`` (model, class) pairs and ``max_models``
models, least recently used (observed or predicted) evicted first. Per bucket the values are kept sorted
(insertion O(window)) with lazily rebuilt prefix sums, so a prediction costs O(log window) once the
bucket has not changed since the last one.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from heapq import merge
from itertools import accumulate, pairwise
from operator import mul
from typing import Final, TypeVar

# Default guess without history: log-normal with sigma 1 (ShareGPT-like outputs have sigma ~0.9).
_DEFAULT_SIGMA: Final = 1.0
_Z90: Final = 1.2815515655446004
_Z99: Final = 2.3263478740408408
# Beyond all history: the request is expected to run as long again as it already has.
_GROWTH_MEAN: Final = 2.0
_GROWTH_P90: Final = 3.0
_GROWTH_P99: Final = 4.0

_K = TypeVar("_K", tuple[str, str], str)


@dataclass(frozen=True, slots=True)
class LengthPrediction:
    """Predicted output tokens: every figure is capped by the request's max_tokens; ``n`` is how many
    history values the prediction summarises (0: a default guess)."""

    mean: float
    std: float
    p50: float
    p90: float
    p99: float
    n: int


class _Pool:
    """Sorted values with prefix sums of values and squares: capped / conditional stats in O(log n)."""

    __slots__ = ("_s1", "_s2", "values")

    def __init__(self, values: list[int]) -> None:
        self.values = values  # ascending
        self._s1 = [0, *accumulate(values)]
        self._s2 = [0, *accumulate(map(mul, values, values))]  # squares in C: remade after each fold

    def __len__(self) -> int:
        return len(self.values)

    def count_above(self, produced: int | None) -> int:
        if produced is None:
            return len(self.values)
        return len(self.values) - bisect.bisect_right(self.values, produced)

    def summary(self, produced: int | None, cap: float) -> LengthPrediction:
        """Stats of ``min(v, cap)`` over the values ``v > produced`` (all when None); needs one."""
        vals = self.values
        n = len(vals)
        lo = 0 if produced is None else bisect.bisect_right(vals, produced)
        m = n - lo
        if m <= 0:
            raise ValueError("no values to summarise")
        k = n if math.isinf(cap) else max(lo, bisect.bisect_right(vals, cap))
        over = n - k  # values above the cap count as the cap
        capped = cap if over else 0.0
        if float(capped).is_integer():
            # Integer sums: the variance's numerator is exact (in floats, `E[v²] - mean²` cancels badly
            # when the values are large and close together).
            c = int(capped)
            t = (self._s1[k] - self._s1[lo]) + over * c
            t2 = (self._s2[k] - self._s2[lo]) + over * c * c
            mean = t / m
            var = max(0, m * t2 - t * t) / (m * m)
        else:
            total = (self._s1[k] - self._s1[lo]) + over * capped
            total_sq = (self._s2[k] - self._s2[lo]) + over * capped * capped
            mean = total / m
            var = max(0.0, total_sq / m - mean * mean)
        return LengthPrediction(
            mean=mean,
            std=math.sqrt(var),
            p50=_quantile(vals, lo, m, 0.50, cap),
            p90=_quantile(vals, lo, m, 0.90, cap),
            p99=_quantile(vals, lo, m, 0.99, cap),
            n=m,
        )

    def mad(self) -> float:
        """Median absolute deviation from the median."""
        n = len(self.values)
        med = _quantile(self.values, 0, n, 0.5)
        return _quantile(sorted(abs(v - med) for v in self.values), 0, n, 0.5)


def _quantile(vals: Sequence[float], lo: int, m: int, q: float, cap: float = math.inf) -> float:
    """Linear-interpolation quantile (numpy's default) of ``min(v, cap)`` over ``vals[lo:lo + m]``
    (ascending)."""
    pos = q * (m - 1)
    i = int(pos)
    frac = pos - i
    v = min(cap, float(vals[lo + i]))
    if frac > 0 and i + 1 < m:
        v += frac * (min(cap, float(vals[lo + i + 1])) - v)
    return v


class _Bucket:
    """The last `window` output lengths of one bucket: arrival order (for eviction) and sorted."""

    __slots__ = ("_pool", "_recent", "_sorted")

    def __init__(self, window: int) -> None:
        self._recent: deque[int] = deque(maxlen=window)
        self._sorted: list[int] = []
        self._pool: _Pool | None = None

    def __len__(self) -> int:
        return len(self._sorted)

    def add(self, value: int) -> None:
        recent = self._recent
        if recent.maxlen is not None and len(recent) == recent.maxlen:
            old = recent[0]
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        recent.append(value)
        bisect.insort(self._sorted, value)
        self._pool = None

    @property
    def sorted_values(self) -> list[int]:
        return self._sorted

    def pool(self) -> _Pool:
        if self._pool is None:
            self._pool = _Pool(list(self._sorted))
        return self._pool


class _History:
    """Buckets of one (model, class) or of one model."""

    __slots__ = ("buckets",)

    def __init__(self, n_buckets: int, window: int) -> None:
        self.buckets = [_Bucket(window) for _ in range(n_buckets)]

    def pools(self, b: int) -> Iterator[_Pool]:
        """Bucket `b`, then widened one neighbour each side at a time (skipping unchanged pools)."""
        buckets = self.buckets
        yield buckets[b].pool()
        size = len(buckets[b])
        for d in range(1, len(buckets)):
            lo, hi = max(0, b - d), min(len(buckets) - 1, b + d)
            parts = [buckets[i].sorted_values for i in range(lo, hi + 1) if len(buckets[i])]
            total = sum(len(p) for p in parts)
            if total == size:
                continue  # the new neighbours are empty
            size = total
            yield _Pool(list(merge(*parts)))


class OutputLengthPredictor:
    def __init__(
        self,
        *,
        buckets: Sequence[int] = (64, 256, 1024, 4096),
        window: int = 512,
        default_mean: float = 256.0,
        min_samples: int = 16,
        max_keys: int = 1024,
        max_models: int = 256,
    ) -> None:
        """`buckets` are ascending upper bounds of prompt length (a prompt of exactly 64 tokens is in the
        first bucket); prompts above the last bound form one more bucket."""
        edges = [int(b) for b in buckets]
        if not edges or any(b <= 0 for b in edges) or any(x >= y for x, y in pairwise(edges)):
            raise ValueError("buckets must be positive and strictly increasing")
        if window < 1 or min_samples < 1 or max_keys < 1 or max_models < 1:
            raise ValueError("window, min_samples, max_keys and max_models must be >= 1")
        if not default_mean > 0:
            raise ValueError("default_mean must be > 0")
        self._edges = edges
        self._window = window
        self._default_mean = float(default_mean)
        self._min_samples = min_samples
        self._max_keys = max_keys
        self._max_models = max_models
        self._by_class: OrderedDict[tuple[str, str], _History] = OrderedDict()
        self._by_model: OrderedDict[str, _History] = OrderedDict()
        # `predict`'s pool per (model, class, bucket) until the next observation (a pool depends only on
        # the histories), with whether its lookup reached the model's history (`_lookup`'s recency marks)
        self._chosen: dict[tuple[str, str, int], tuple[_Pool | None, bool]] = {}
        self._reached_model = False

    # ---- observations ----------------------------------------------------------------------------
    def observe(self, model: str, task_class: str, prompt_tokens: int, output_tokens: int) -> None:
        """A finished request (not an aborted one: its length says nothing about the distribution)."""
        if output_tokens < 0 or prompt_tokens < 0:
            return
        b = self._bucket(prompt_tokens)
        self._chosen.clear()
        self._history(self._by_class, (model, task_class), self._max_keys).buckets[b].add(output_tokens)
        self._history(self._by_model, model, self._max_models).buckets[b].add(output_tokens)

    # ---- predictions -----------------------------------------------------------------------------
    def predict(
        self, model: str, task_class: str, prompt_tokens: int, max_tokens: int | None
    ) -> LengthPrediction:
        cap = _cap(max_tokens)
        pool = self._chosen_pool(model, task_class, prompt_tokens)
        if pool is None:
            return self._default(cap)
        return pool.summary(None, cap)

    def _chosen_pool(self, model: str, task_class: str, prompt_tokens: int) -> _Pool | None:
        """`_choose(model, task_class, prompt_tokens, None)`, kept until the next observation, with the
        recency marks its lookup leaves (the class's history, and the model's when it was reached)."""
        key = (model, task_class, self._bucket(prompt_tokens))
        hit = self._chosen.get(key)
        if hit is None:
            if len(self._chosen) >= self._max_keys:
                self._chosen.clear()
            self._reached_model = False
            pool = self._choose(model, task_class, prompt_tokens, None)
            self._chosen[key] = (pool, self._reached_model)
            return pool
        pool, reached_model = hit
        if (model, task_class) in self._by_class:
            self._by_class.move_to_end((model, task_class))
        if reached_model:
            self._by_model.move_to_end(model)
        return pool

    def repredict(
        self, model: str, task_class: str, prompt_tokens: int, produced: int, max_tokens: int | None
    ) -> LengthPrediction:
        """Conditional on `produced` tokens already streamed: every figure is above `produced` unless
        max_tokens caps it there."""
        if produced <= 0:
            return self.predict(model, task_class, prompt_tokens, max_tokens)
        cap = _cap(max_tokens)
        pool = self._choose(model, task_class, prompt_tokens, produced)
        if pool is None:
            g = float(produced)
            return LengthPrediction(
                mean=min(cap, _GROWTH_MEAN * g),
                std=min(cap, _GROWTH_MEAN * g) - min(cap, g),
                p50=min(cap, _GROWTH_MEAN * g),
                p90=min(cap, _GROWTH_P90 * g),
                p99=min(cap, _GROWTH_P99 * g),
                n=0,
            )
        return pool.summary(produced, cap)

    def spread(self, model: str, task_class: str, prompt_tokens: int) -> float:
        """The median absolute deviation of the pool a prediction for this prompt uses (NaN without
        history): the error no bucket-constant predictor can beat by much; the accuracy target."""
        pool = self._choose(model, task_class, prompt_tokens, None)
        return math.nan if pool is None else pool.mad()

    # ---- internals -------------------------------------------------------------------------------
    def _bucket(self, prompt_tokens: int) -> int:
        return bisect.bisect_left(self._edges, prompt_tokens)

    def _history(self, store: OrderedDict[_K, _History], key: _K, bound: int) -> _History:
        hist = store.get(key)
        if hist is None:
            hist = store[key] = _History(len(self._edges) + 1, self._window)
            while len(store) > bound:
                store.popitem(last=False)
        else:
            store.move_to_end(key)
        return hist

    def _choose(self, model: str, task_class: str, prompt_tokens: int, produced: int | None) -> _Pool | None:
        b = self._bucket(prompt_tokens)
        best: _Pool | None = None
        best_count = 0
        for hist in self._lookup(model, task_class):
            for pool in hist.pools(b):
                count = pool.count_above(produced)
                if count >= self._min_samples:
                    return pool
                if count > best_count:
                    best, best_count = pool, count
        return best

    def _lookup(self, model: str, task_class: str) -> Iterator[_History]:
        hist = self._by_class.get((model, task_class))
        if hist is not None:
            self._by_class.move_to_end((model, task_class))
            yield hist
        mhist = self._by_model.get(model)
        if mhist is not None:
            self._reached_model = True
            self._by_model.move_to_end(model)
            yield mhist

    def _default(self, cap: float) -> LengthPrediction:
        mean = self._default_mean
        s2 = _DEFAULT_SIGMA * _DEFAULT_SIGMA
        median = mean * math.exp(-s2 / 2.0)
        return LengthPrediction(
            mean=min(cap, mean),
            std=min(cap, mean * math.sqrt(math.expm1(s2))),
            p50=min(cap, median),
            p90=min(cap, median * math.exp(_Z90 * _DEFAULT_SIGMA)),
            p99=min(cap, median * math.exp(_Z99 * _DEFAULT_SIGMA)),
            n=0,
        )

    def __len__(self) -> int:
        """How many (model, class) keys hold history."""
        return len(self._by_class)

    @property
    def models(self) -> int:
        return len(self._by_model)


def _cap(max_tokens: int | None) -> float:
    return math.inf if max_tokens is None else float(max(0, max_tokens))
