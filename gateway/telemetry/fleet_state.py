"""What berth knows about its fleet beyond the scheduler's counters: measured latencies, fitted
performance models, engine cross-checks, output-length and prompt-token predictors, SLO attainment.

Sans-IO. Two kinds of input, both plain numbers:
- `FinishedRequest`: one per request, built by the finish phase (the daemon only appends it to a
  bounded queue; `FleetTelemetry.observe` runs later, in the background refresh);
- `ScrapeSample`: one per scrape of an endpoint (gauges, the engine's latency histograms, its KV
  capacity, and the gateway's running-context sum at that moment).
`refit()` fits the performance models; `estimates(eid)` is what the scheduler receives.

Observation mapping (the contract with `gateway.telemetry.perfmodel`):
- prefill, decode and throughput <- the endpoint's token timeline (`gateway.telemetry.timeline`):
  `observe` adds every stream that ran there (its token times: the first token's and the gaps after it,
  which the relay measures anyway) and the span of every request whose tokens were not timed;
  `settle(eid, before)` derives the observations of what happened before `before` (prefill from the gaps
  a prefill interrupted on a busy endpoint and from TTFT on an idle one; decode from the gaps free of
  first tokens, at the mean running count and context) and feeds them to the fitter. The caller picks
  `before` such that every request that ran there before it has been observed (the daemon: the dispatch
  time of the oldest request still running there);
- kv <- the engine's KV fraction × KV capacity tokens, vs the sum of contexts of the requests the
  gateway runs there (prompt tokens + half the predicted output: on average a running request is half
  way through its answer), both divided by the gateway's in-flight count (the model is per request);
  skipped when the engine reports a running count far from the gateway's (other traffic shares the
  engine, so its KV use is not ours to explain).
The measured latencies (TTFT from dispatch, per-token time) and the engine cross-checks take streamed,
successful, first-attempt requests only: a non-streamed answer has no first token, and a retried one's
TTFT includes the failed attempt. `prediction_error` is that of the coefficients in force on each
observation as it is fed to the fitter ("ttft": the prefill observations, "itl": the decode ones).
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import Any, Final, cast

from gateway.core.types import EndpointId
from gateway.sched.perf import PerfCoefficients
from gateway.sched.snapshot import EndpointEstimates
from gateway.telemetry.attainment import SloAttainment, meets_slo
from gateway.telemetry.crosscheck import Verdict
from gateway.telemetry.endpoint_state import EndpointTelemetry, StreamTimings
from gateway.telemetry.lengths import LengthPrediction, OutputLengthPredictor
from gateway.telemetry.records import FinishedRequest, Quantity, ScrapeSample, TelemetrySettings
from gateway.telemetry.rolling import Ewma
from gateway.telemetry.tokens import TokenEstimator

#: Coefficient names in the order the admin API and the metrics list them.
COEFFICIENTS: Final = ("k1", "c1", "k2", "c2", "c3", "h", "j", "thr1", "alpha", "beta")
#: Prompt-length buckets of the output-length predictor (upper bounds, tokens).
LENGTH_BUCKETS: Final = (64, 256, 1024, 4096)
#: Distinct (model, class, bucket, max_tokens) predictions kept between two history changes.
_MAX_CACHED_PREDICTIONS: Final = 4096


class ModelTelemetry:
    """Measured latencies of one model over all its endpoints, and how well its lengths are predicted."""

    def __init__(self, settings: TelemetrySettings) -> None:
        self.timings = StreamTimings(settings.attainment_window_s)
        self.output_error = Ewma()  # |predicted - actual| / actual output tokens


class CachedLengths:
    """Output-length predictions for the request path. A prediction depends only on (model, class,
    prompt bucket, max_tokens) and the history, and the history changes only when finished requests are
    folded in (the background refresh), so predictions are kept until then: the request path pays a dict
    lookup instead of a summary over the history."""

    __slots__ = ("_cache", "predictor")

    def __init__(self, predictor: OutputLengthPredictor) -> None:
        self.predictor = predictor
        self._cache: dict[tuple[str, str, int, int | None], LengthPrediction] = {}

    def predict(
        self, model: str, task_class: str, prompt_tokens: int, max_tokens: int | None
    ) -> LengthPrediction:
        key = (model, task_class, bisect_left(LENGTH_BUCKETS, prompt_tokens), max_tokens)
        hit = self._cache.get(key)
        if hit is None:
            if len(self._cache) >= _MAX_CACHED_PREDICTIONS:
                self._cache.clear()
            hit = self._cache[key] = self.predictor.predict(model, task_class, prompt_tokens, max_tokens)
        return hit

    def invalidate(self) -> None:
        self._cache.clear()


class FailOpen:
    """Whether every ready endpoint's metrics are stale (routing then runs on the gateway's counts)."""

    __slots__ = ("active", "since", "transitions")

    def __init__(self) -> None:
        self.active = False
        self.since: float | None = None
        self.transitions = 0  # times it started failing open

    def update(self, all_stale: bool, now: float) -> bool | None:
        """True when it starts failing open, False when it stops, None when nothing changed."""
        if all_stale == self.active:
            return None
        self.active = all_stale
        self.since = now if all_stale else None
        if all_stale:
            self.transitions += 1
        return all_stale


class FleetTelemetry:
    def __init__(
        self,
        settings: TelemetrySettings,
        *,
        tokens: TokenEstimator | None = None,
        lengths: OutputLengthPredictor | None = None,
    ) -> None:
        self.settings = settings
        self.tokens = tokens or TokenEstimator()
        self.lengths = lengths or OutputLengthPredictor(buckets=LENGTH_BUCKETS)
        self.predictions = CachedLengths(self.lengths)
        self.attainment = SloAttainment(window_s=settings.attainment_window_s)
        # The prefix index's correction of its predicted cached tokens per endpoint (None: taken as is).
        self.cache_correction: Callable[[EndpointId], float] | None = None
        self.endpoints: dict[EndpointId, EndpointTelemetry] = {}
        self.models: dict[str, ModelTelemetry] = {}
        self.fail_open = FailOpen()
        self.last_refit_at: float | None = None

    # ----------------------------------------------------------------- structure
    def endpoint(self, eid: EndpointId) -> EndpointTelemetry:
        ep = self.endpoints.get(eid)
        if ep is None:
            ep = self.endpoints[eid] = EndpointTelemetry(eid, self.settings)
        return ep

    def model(self, name: str) -> ModelTelemetry:
        m = self.models.get(name)
        if m is None:
            m = self.models[name] = ModelTelemetry(self.settings)
        return m

    def keep_endpoints(self, eids: Iterable[EndpointId]) -> None:
        """Forget endpoints that left the fleet; make room for new ones."""
        wanted = set(eids)
        for eid in list(self.endpoints):
            if eid not in wanted:
                del self.endpoints[eid]
        for eid in wanted:
            self.endpoint(eid)

    def set_settings(self, settings: TelemetrySettings) -> None:
        """New settings (config reload). A changed prior or fit window restarts the fits."""
        old, self.settings = self.settings, settings

        def fits(s: TelemetrySettings) -> tuple[object, ...]:
            return (s.prior, s.fit_window, s.min_observations, s.first_fit_min_observations, s.guessed_parts)

        restart = fits(old) != fits(settings)
        for eid, ep in list(self.endpoints.items()):
            if restart:
                self.endpoints[eid] = fresh = EndpointTelemetry(eid, settings)
                fresh.timings = ep.timings
                fresh.timeline = ep.timeline
                fresh.added_since_settle = ep.added_since_settle
                fresh.engine_kv_capacity = ep.engine_kv_capacity
            else:
                ep.settings = settings

    # ----------------------------------------------------------------- observations
    def observe(self, r: FinishedRequest) -> None:
        # Once per finished request (the refresh loop folds them in): lookups inline, calls positional.
        first, dispatched, arrival, finished = r.first_token_at, r.dispatched_at, r.arrival, r.finished_at
        ok, out, gaps = r.ok, r.output_tokens, r.gaps
        decoding = sum(gaps)
        per_token = decoding / (out - 1) if out > 1 and decoding > 0 else None
        ttft = None if first is None else first - arrival  # the client's: queueing included
        met = meets_slo(r.slo, ok, ttft, per_token, finished - arrival)
        self.attainment.record(r.slo.slo_class, met, finished)
        if r.prompt_tokens and r.prompt_chars > 0:
            self.tokens.observe(r.model, r.prompt_chars, r.prompt_tokens)
        prompt = r.prompt_tokens or r.prompt_tokens_est
        model = self.models.get(r.model) or self.model(r.model)
        if ok and out > 0:
            self.lengths.observe(r.model, r.task_class, prompt, out)
            self.predictions.invalidate()
            if r.predicted_output_tokens is not None:
                model.output_error.add(abs(r.predicted_output_tokens - out) / out)
        if r.endpoint is None:
            return
        # An endpoint that left the fleet while the request ran is made again and forgotten at the next
        # `keep_endpoints`.
        ep = self.endpoints.get(r.endpoint) or self.endpoint(r.endpoint)
        if ok and out:
            model.timings.output_rate.add(out, finished)
        if dispatched is None or first is None or not (ok and r.stream and r.attempts == 1):
            ep.observe_other(r, prompt, self.computed_tokens(r, prompt))
            return
        engine_ttft = max(0.0, first - dispatched)
        model.timings.add(engine_ttft, per_token, gaps)
        computed = self.computed_tokens(r, prompt)
        ep.observe_request(
            r,
            prompt_tokens=prompt,
            ttft=engine_ttft,
            decoding=decoding,
            per_token=per_token,
            computed=computed,
        )

    def computed_tokens(self, r: FinishedRequest, prompt: int) -> int:
        """The prompt tokens the engine really prefilled for `r`: its prompt less the tokens the prefix
        index predicted cached at dispatch, scaled by the correction the engine's own hit counters give
        for its endpoint (`PrefixIndex.correction`); at least one."""
        cached = r.cached_tokens
        if cached <= 0 or r.endpoint is None:
            return prompt
        correction = 1.0 if self.cache_correction is None else self.cache_correction(r.endpoint)
        return max(1, prompt - round(cached * correction))

    def observe_scrape(self, eid: EndpointId, s: ScrapeSample) -> list[tuple[Quantity, Verdict]]:
        return self.endpoint(eid).observe_scrape(s)

    def settle(self, eid: EndpointId, before: float) -> None:
        """Derive the performance-model observations of `eid` before `before` (see the module docstring)."""
        ep = self.endpoints.get(eid)
        if ep is not None:
            ep.settle(before)

    def forget_timelines(self, before: float) -> None:
        """Finished requests were lost: what ran before `before` can no longer be told apart."""
        for ep in self.endpoints.values():
            ep.timeline.forget(before)

    def refit(self, now: float) -> None:
        """Refit every endpoint's models (the daemon's loop refits one endpoint at a time instead)."""
        for ep in self.endpoints.values():
            ep.refit()
        self.last_refit_at = now

    def estimates(self, eid: EndpointId, now: float) -> EndpointEstimates | None:
        ep = self.endpoints.get(eid)
        return None if ep is None else ep.estimates(now)


def perf_document(c: PerfCoefficients) -> dict[str, dict[str, float | int | None]]:
    """The fitted coefficients by model part, with their fit error (MAPE) and observation counts."""
    return {
        "prefill": {"k1": c.k1, "c1": c.c1, "mape": c.prefill_mape, "n": c.n_prefill},
        "decode": {"k2": c.k2, "c2": c.c2, "c3": c.c3, "mape": c.decode_mape, "n": c.n_decode},
        "kv": {"h": c.h, "j": c.j, "mape": c.kv_mape, "n": c.n_kv},
        "throughput": {"thr1": c.thr1, "alpha": c.alpha, "beta": c.beta},
    }


def prior_with(prior: PerfCoefficients, **overrides: float | None) -> PerfCoefficients:
    """`prior` with the coefficients that are given (not None) replaced."""
    given = {k: float(v) for k, v in overrides.items() if v is not None}
    unknown = set(given) - set(COEFFICIENTS)
    if unknown:
        raise ValueError(f"not a coefficient: {', '.join(sorted(unknown))}")
    return dataclasses.replace(prior, **cast(dict[str, Any], given)) if given else prior
