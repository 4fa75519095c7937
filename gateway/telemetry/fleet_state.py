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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple, cast

from gateway.core.types import SLO, EndpointId
from gateway.sched.perf import PerfCoefficients
from gateway.sched.snapshot import EndpointEstimates
from gateway.telemetry.attainment import SloAttainment, meets_slo
from gateway.telemetry.crosscheck import CrossCheck, CumulativeDelta, Verdict
from gateway.telemetry.lengths import LengthPrediction, OutputLengthPredictor
from gateway.telemetry.perfmodel import PerfModelFitter
from gateway.telemetry.promtext import Histogram
from gateway.telemetry.rolling import Ewma, LatencyTracker, RateMeter, RecentWindow
from gateway.telemetry.timeline import EndpointTimeline
from gateway.telemetry.tokens import TokenEstimator

Quantity = Literal["ttft", "itl"]

#: Coefficient names in the order the admin API and the metrics list them.
COEFFICIENTS: Final = ("k1", "c1", "k2", "c2", "c3", "h", "j", "thr1", "alpha", "beta")
#: Prompt-length buckets of the output-length predictor (upper bounds, tokens).
LENGTH_BUCKETS: Final = (64, 256, 1024, 4096)
#: Distinct (model, class, bucket, max_tokens) predictions kept between two history changes.
_MAX_CACHED_PREDICTIONS: Final = 4096
#: Engine running count vs the gateway's in-flight count: beyond this gap, KV is not ours to explain.
_KV_RUNNING_SLACK: Final = 2.0
_KV_RUNNING_SHARE: Final = 0.25


@dataclass(frozen=True, slots=True)
class TelemetrySettings:
    prior: PerfCoefficients
    min_observations: int = 20  # per model part, before fitted coefficients replace the prior
    fit_window: int = 2000  # observations kept per model part
    kv_capacity_tokens: float | None = None  # when the engine does not export it
    crosscheck_min_samples: int = 20
    disagreement_tolerance: float = 2.0  # gateway/engine mean ratio beyond [1/t, t] is a disagreement
    attainment_window_s: float = 60.0


class FinishedRequest(NamedTuple):
    """One finished request, as plain numbers (clock seconds). A NamedTuple: the finish phase makes one
    per request, and a tuple is the cheapest immutable record to build."""

    model: str  # the served name
    task_class: str
    slo: SLO
    ok: bool
    stream: bool
    endpoint: EndpointId | None
    attempts: int
    arrival: float
    dispatched_at: float | None
    first_token_at: float | None
    finished_at: float
    prompt_chars: int
    prompt_tokens: int | None  # as the engine reported it (usage); None when it did not
    prompt_tokens_est: int  # the gateway's estimate at admission
    output_tokens: int
    gaps: Sequence[float]  # inter-token gaps of a stream
    predicted_output_tokens: float | None


@dataclass(frozen=True, slots=True)
class ScrapeSample:
    running: float | None
    kv_usage: float | None  # fraction 0..1
    kv_capacity_tokens: float | None  # from the engine's page; None: not exported
    ttft: Histogram | None  # the engine's cumulative histograms
    itl: Histogram | None
    gateway_inflight: int
    gateway_context_tokens: float  # the sum of contexts of the requests the gateway runs there


class StreamTimings:
    """Measured latencies of one endpoint or one model."""

    __slots__ = ("itl", "itl_gaps", "output_rate", "ttft")

    def __init__(self, window_s: float) -> None:
        self.ttft = LatencyTracker()  # dispatch -> first token
        # EWMA of each stream's per-token time (1 / its tokens per second); quantiles over recent gaps.
        self.itl = Ewma()
        self.itl_gaps = RecentWindow(4096)
        self.output_rate = RateMeter(window_s=window_s)  # output tokens/s of everything finished here

    def add(self, ttft_s: float, per_token_s: float | None, gaps: Sequence[float]) -> None:
        self.ttft.add(ttft_s)
        if per_token_s is not None:
            self.itl.add(per_token_s)
        if gaps:
            self.itl_gaps.extend(gaps)

    def summary(self, now: float) -> dict[str, object]:
        p50, p90, p99 = self.itl_gaps.quantiles((0.5, 0.9, 0.99))
        itl = {"ewma": self.itl.value, "p50": p50, "p90": p90, "p99": p99, "n": self.itl.n}
        return {"ttft_s": self.ttft.summary(), "itl_s": itl, "tokens_per_s": self.output_rate.rate(now)}


class EndpointTelemetry:
    """Everything measured and fitted for one endpoint."""

    def __init__(self, eid: EndpointId, settings: TelemetrySettings) -> None:
        self.eid = eid
        self.settings = settings
        self.timings = StreamTimings(settings.attainment_window_s)
        self.fitter = PerfModelFitter(
            settings.prior, window=settings.fit_window, min_obs=settings.min_observations
        )
        self.coefficients: PerfCoefficients = self.fitter.current
        self.timeline = EndpointTimeline()
        self.engine_kv_capacity: float | None = None
        # |predicted - observed| / observed with the coefficients in force when the request ran
        self.prediction_error: dict[Quantity, Ewma] = {"ttft": Ewma(), "itl": Ewma()}
        self.checks: dict[Quantity, CrossCheck] = {
            q: CrossCheck(
                min_samples=settings.crosscheck_min_samples, tolerance=settings.disagreement_tolerance
            )
            for q in ("ttft", "itl")
        }
        self.disagreements: dict[Quantity, int] = {"ttft": 0, "itl": 0}
        self._deltas: dict[Quantity, CumulativeDelta] = {"ttft": CumulativeDelta(), "itl": CumulativeDelta()}

    @property
    def kv_capacity_tokens(self) -> float | None:
        return self.engine_kv_capacity or self.settings.kv_capacity_tokens

    def observe_request(
        self,
        r: FinishedRequest,
        *,
        prompt_tokens: int,
        ttft: float,
        decoding: float,
        per_token: float | None,
    ) -> None:
        """A streamed, successful, first-attempt request that ran here (see the module docstring):
        `ttft` from dispatch, `decoding` the sum of its gaps, `per_token` decoding over tokens - 1."""
        self.timings.add(ttft, per_token, r.gaps)
        self.timings.output_rate.add(r.output_tokens, r.finished_at)
        self.checks["ttft"].gateway(ttft, 1)
        if per_token is not None:  # per token, like the engine's histogram, however events were batched
            self.checks["itl"].gateway(decoding, r.output_tokens - 1)
        self._on_timeline(r, prompt_tokens)

    def observe_other(self, r: FinishedRequest, *, prompt_tokens: int) -> None:
        """A request that ran here but is not measured (not streamed, failed, retried); its tokens, if it
        had timed ones, still tell the timeline which streams ran and when."""
        if r.ok and r.output_tokens:
            self.timings.output_rate.add(r.output_tokens, r.finished_at)
        self._on_timeline(r, prompt_tokens)

    def _on_timeline(self, r: FinishedRequest, prompt_tokens: int) -> None:
        dispatched = r.dispatched_at
        if dispatched is None:
            return  # never reached the engine
        first = r.first_token_at
        if r.stream and first is not None:
            self.timeline.add_stream(
                dispatched_at=dispatched if r.attempts == 1 else None,  # else: when it came here is unknown
                first_token_at=first,
                gaps=r.gaps,
                prompt_tokens=prompt_tokens,
                clean=r.ok,
            )
        else:  # not streamed (its first token is the whole answer), or no token: when it ran is all we know
            self.timeline.add_untracked(dispatched, r.finished_at)

    def settle(self, before: float) -> None:
        """Feed the fitter the timeline's observations of everything before `before` (see the module
        docstring: every request that ran here before it must have been observed)."""
        settled = self.timeline.settle(before)
        coef = self.coefficients
        fitter = self.fitter
        prefill_error, itl_error = self.prediction_error["ttft"], self.prediction_error["itl"]
        for p in settled.prefill:
            prefill_error.add(abs(coef.prefill_s(p.prompt_tokens) - p.seconds) / p.seconds)
            fitter.observe_prefill(p.prompt_tokens, p.seconds)
        for d in settled.decode:
            itl_error.add(abs(coef.decode_iter_s(d.batch, d.avg_context) - d.seconds) / d.seconds)
            fitter.observe_decode(d.batch, d.avg_context, d.seconds)
            fitter.observe_throughput(d.concurrency, d.tokens_per_s)

    def observe_scrape(self, s: ScrapeSample) -> list[tuple[Quantity, Verdict]]:
        """One scrape; returns the cross-check verdicts it completed."""
        if s.kv_capacity_tokens is not None:
            self.engine_kv_capacity = s.kv_capacity_tokens
        capacity = self.kv_capacity_tokens
        n = s.gateway_inflight
        if capacity is not None and s.kv_usage is not None and n > 0 and self._kv_is_ours(s):
            # per-request means: the model's kv_tokens(ctx) is one request's footprint
            self.fitter.observe_kv(s.gateway_context_tokens / n, s.kv_usage * capacity / n)
        verdicts: list[tuple[Quantity, Verdict]] = []
        pairs: tuple[tuple[Quantity, Histogram | None], ...] = (("ttft", s.ttft), ("itl", s.itl))
        for quantity, hist in pairs:
            if hist is None:
                continue
            inc = self._deltas[quantity].advance(hist.count, hist.sum)
            if inc is not None:
                self.checks[quantity].engine(*inc)
            v = self.checks[quantity].verdict()
            if v is not None:
                if v.disagrees:
                    self.disagreements[quantity] += 1
                verdicts.append((quantity, v))
        return verdicts

    @staticmethod
    def _kv_is_ours(s: ScrapeSample) -> bool:
        if s.running is None:
            return True
        slack = max(_KV_RUNNING_SLACK, _KV_RUNNING_SHARE * s.gateway_inflight)
        return abs(s.running - s.gateway_inflight) <= slack

    def refit(self) -> PerfCoefficients:
        self.coefficients = self.fitter.refit()
        return self.coefficients

    def estimates(self, now: float) -> EndpointEstimates:
        t = self.timings
        rate = t.output_rate.rate(now)
        return EndpointEstimates(
            perf=self.coefficients,
            kv_capacity_tokens=self.kv_capacity_tokens,
            ttft_ewma_s=t.ttft.ewma.value,
            itl_ewma_s=t.itl.value,
            tokens_per_s=rate if t.output_rate.total(now) > 0 else None,
        )


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
        restart = (old.prior, old.fit_window, old.min_observations) != (
            settings.prior,
            settings.fit_window,
            settings.min_observations,
        )
        for eid, ep in list(self.endpoints.items()):
            if restart:
                self.endpoints[eid] = fresh = EndpointTelemetry(eid, settings)
                fresh.timings = ep.timings
                fresh.timeline = ep.timeline
                fresh.engine_kv_capacity = ep.engine_kv_capacity
            else:
                ep.settings = settings

    # ----------------------------------------------------------------- observations
    def observe(self, r: FinishedRequest) -> None:
        first, dispatched = r.first_token_at, r.dispatched_at
        decoding = sum(r.gaps)
        per_token = decoding / (r.output_tokens - 1) if r.output_tokens > 1 and decoding > 0 else None
        ttft = None if first is None else first - r.arrival  # the client's: queueing included
        met = meets_slo(r.slo, ok=r.ok, ttft_s=ttft, itl_s=per_token, e2e_s=r.finished_at - r.arrival)
        self.attainment.record(r.slo.slo_class, met, r.finished_at)
        if r.prompt_tokens and r.prompt_chars > 0:
            self.tokens.observe(r.model, r.prompt_chars, r.prompt_tokens)
        prompt = r.prompt_tokens or r.prompt_tokens_est
        model = self.model(r.model)
        if r.ok and r.output_tokens > 0:
            self.lengths.observe(r.model, r.task_class, prompt, r.output_tokens)
            self.predictions.invalidate()
            if r.predicted_output_tokens is not None:
                model.output_error.add(abs(r.predicted_output_tokens - r.output_tokens) / r.output_tokens)
        if r.endpoint is None:
            return
        # An endpoint that left the fleet while the request ran is made again and forgotten at the next
        # `keep_endpoints`.
        ep = self.endpoint(r.endpoint)
        if r.ok and r.output_tokens:
            model.timings.output_rate.add(r.output_tokens, r.finished_at)
        if dispatched is None or first is None or not (r.ok and r.stream and r.attempts == 1):
            ep.observe_other(r, prompt_tokens=prompt)
            return
        engine_ttft = max(0.0, first - dispatched)
        model.timings.add(engine_ttft, per_token, r.gaps)
        ep.observe_request(r, prompt_tokens=prompt, ttft=engine_ttft, decoding=decoding, per_token=per_token)

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
