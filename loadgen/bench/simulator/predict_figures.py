"""The predict-accuracy benchmark's figures: MAPE of the fitted latency and KV models against the
simulator's true model, the waiting-time R², and the output-length error against the outputs' spread.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from gateway.sched.perf import PerfCoefficients
from gateway.telemetry.lengths import LengthPrediction, OutputLengthPredictor
from gateway.telemetry.timeline import (
    DecodeObservation,
    PrefillObservation,
)
from gateway.telemetry.waiting import wait_for_position
from loadgen.bench.simulator.predict_client import MODEL, TASK_CLASS, Stream
from loadgen.engine_sim.latency import LatencyModel
from loadgen.workloads.sharegpt import OUTPUT_RANGE

Array = npt.NDArray[np.float64]
LENGTH_BUCKETS: Final = (64, 256, 1024, 4096)  # OutputLengthPredictor's default
LENGTH_WARMUP: Final = 50
BOOTSTRAP: Final = 2000


# ---- figures -----------------------------------------------------------------------------------------
def true_decode_s(true: LatencyModel, batch: float, avg_context: float) -> float:
    """The simulator's decode model at a fractional (mean) batch size."""
    return (true.k2 * avg_context + true.c2) * batch + true.c3


def mape(pred: Sequence[float], true: Sequence[float]) -> float:
    p, t = np.asarray(pred, dtype=np.float64), np.asarray(true, dtype=np.float64)
    return float(np.mean(np.abs(p - t) / t)) if len(t) else math.nan


def r_squared(pred: Sequence[float], actual: Sequence[float]) -> float:
    p, a = np.asarray(pred, dtype=np.float64), np.asarray(actual, dtype=np.float64)
    ss_tot = float(np.sum((a - a.mean()) ** 2))
    return 1.0 - float(np.sum((a - p) ** 2)) / ss_tot if ss_tot > 0 else math.nan


def prefill_mape(coef: PerfCoefficients, true: LatencyModel, at: Sequence[PrefillObservation]) -> float:
    return mape(
        [coef.prefill_s(p.prompt_tokens) for p in at], [true.prefill_s(int(p.prompt_tokens)) for p in at]
    )


def kv_mape(coef: PerfCoefficients, at: Sequence[tuple[float, float]]) -> float:
    """The per-request KV model against (context tokens, KV tokens) observations."""
    return mape([coef.kv_tokens(context) for context, _ in at], [kv for _, kv in at])


def decode_mape(coef: PerfCoefficients, true: LatencyModel, at: Sequence[DecodeObservation]) -> float:
    return mape(
        [coef.decode_iter_s(d.batch, d.avg_context) for d in at],
        [true_decode_s(true, d.batch, d.avg_context) for d in at],
    )


def grid_mape(coef: PerfCoefficients, true: LatencyModel, max_batch: int) -> tuple[float, float]:
    batches = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= max_batch]
    contexts = (100.0, 300.0, 1000.0, 2000.0)
    prompts = (16, 64, 256, 1024, 4096)
    pre = mape([coef.prefill_s(p) for p in prompts], [true.prefill_s(p) for p in prompts])
    dec = mape(
        [coef.decode_iter_s(b, c) for b in batches for c in contexts],
        [true.decode_s(b, c) for b in batches for c in contexts],
    )
    return pre, dec


def service_rate(
    coef: PerfCoefficients, preds: Sequence[LengthPrediction], prompts: Sequence[int], slots: int
) -> float:
    """Sustained output tokens/s of a full endpoint: ō tokens and one prefill per request, decode
    iterations of `slots` requests at the length-biased mean context p̄ + E[o²] / (2 ō)."""
    o_mean = statistics.fmean(p.mean for p in preds)
    o_sq = statistics.fmean(p.mean * p.mean + p.std * p.std for p in preds)
    p_mean = statistics.fmean(prompts)
    context = p_mean + o_sq / (2.0 * o_mean)
    per_request_s = coef.prefill_s(p_mean) + o_mean * coef.decode_iter_s(slots, context) / slots
    return o_mean / per_request_s


def wait_figures(
    queue: Sequence[Stream],
    *,
    coef: PerfCoefficients,
    predictor: OutputLengthPredictor,
    true: LatencyModel,
    slots: int,
    speed: float,
) -> dict[str, Any]:
    preds = [predictor.predict(MODEL, TASK_CLASS, s.prompt, OUTPUT_RANGE[1]) for s in queue]
    rate = service_rate(coef, preds, [s.prompt for s in queue], slots)
    predicted: list[float] = []
    bounds: list[float] = []
    all_ahead: list[float] = []
    observed: list[float] = []
    for k, st in enumerate(queue):
        if not st.ok:
            continue
        est = wait_for_position(preds[: max(0, k - slots + 1)], rate)
        predicted.append(est.mean_s)
        bounds.append(est.bound_s)
        all_ahead.append(wait_for_position(preds[:k], rate).mean_s)
        observed.append((st.times[0] - st.dispatch) * speed - true.prefill_s(st.prompt))
    return {
        "r2": r_squared(predicted, observed),
        "r2_all_ahead": r_squared(all_ahead, observed),
        "bound_p90_coverage": float(np.mean(np.array(observed) <= np.array(bounds))),
        "tokens_per_s": rate,
        "n": len(observed),
        "observed_max_s": max(observed),
    }


def length_figures(streams: Sequence[Stream], seed: int) -> dict[str, Any]:
    """p50 predictions (made at dispatch) against the within-bucket spread of the same outputs."""
    rows = [s for s in streams if s.ok and s.predicted is not None][LENGTH_WARMUP:]
    if not rows:  # a run too short to pass the warm-up (a quick run): no figure, shown as nan
        nan = math.nan
        return {
            "n": 0,
            "median_abs_error": nan,
            "spread": nan,
            "ratio": nan,
            "ratio_ci95": [nan, nan],
            "claimed_spread": nan,
            "ratio_to_claimed": nan,
            "buckets": [],
        }
    out = np.array([float(s.tokens) for s in rows])
    p50 = np.array([s.predicted.p50 if s.predicted is not None else math.nan for s in rows])
    bucket = np.searchsorted(np.array(LENGTH_BUCKETS), np.array([s.prompt for s in rows]), side="left")
    err = np.abs(out - p50)

    def pooled_spread(idx: npt.NDArray[np.intp]) -> float:
        o, b = out[idx], bucket[idx]
        dev = np.empty(len(idx))
        for k in np.unique(b):
            m = b == k
            dev[m] = np.abs(o[m] - np.median(o[m]))
        return float(np.median(dev))

    every = np.arange(len(rows))
    spread = pooled_spread(every)
    ratio = float(np.median(err)) / spread
    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(BOOTSTRAP):
        idx = rng.integers(0, len(rows), len(rows))
        boot.append(float(np.median(err[idx])) / pooled_spread(idx))
    lo, hi = np.percentile(boot, [2.5, 97.5])
    buckets = []
    for k in np.unique(bucket):
        m = bucket == k
        label = f"<={LENGTH_BUCKETS[k]}" if k < len(LENGTH_BUCKETS) else f">{LENGTH_BUCKETS[-1]}"
        buckets.append(
            {
                "bucket": label,
                "n": int(m.sum()),
                "median_abs_error": float(np.median(err[m])),
                "spread": float(np.median(np.abs(out[m] - np.median(out[m])))),
            }
        )
    claimed = np.array([s.claimed_spread for s in rows])
    return {
        "n": len(rows),
        "median_abs_error": float(np.median(err)),
        "spread": spread,
        "ratio": ratio,
        "ratio_ci95": [float(lo), float(hi)],
        "claimed_spread": float(np.nanmedian(claimed)),
        "ratio_to_claimed": float(np.median(err)) / float(np.nanmedian(claimed)),
        "buckets": buckets,
    }
