"""Everything measured and fitted for one endpoint: its stream timings, token timeline, performance-model
fitter, prediction errors and the engine cross-checks (`gateway.telemetry.fleet_state` describes how
observations map onto the models)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Final

from gateway.core.types import EndpointId
from gateway.sched.perf import PerfCoefficients
from gateway.sched.running import RunningRequest
from gateway.sched.snapshot import EndpointEstimates
from gateway.telemetry.calibration import prior_factors
from gateway.telemetry.crosscheck import CrossCheck, CumulativeDelta, Verdict
from gateway.telemetry.perfmodel import Part, PerfModelFitter
from gateway.telemetry.promtext import Histogram
from gateway.telemetry.records import FinishedRequest, Quantity, ScrapeSample, TelemetrySettings
from gateway.telemetry.rolling import Ewma, LatencyTracker, RateMeter, RecentWindow
from gateway.telemetry.timeline import EndpointTimeline

#: The model parts the token timeline feeds (the KV part learns from scrapes).
TIMELINE_PARTS: Final[tuple[Part, ...]] = ("prefill", "decode", "throughput")
#: Engine running count vs the gateway's in-flight count: beyond this gap, KV is not ours to explain.
_KV_RUNNING_SLACK: Final = 2.0
_KV_RUNNING_SHARE: Final = 0.25


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
            settings.prior,
            window=settings.fit_window,
            min_obs=settings.min_observations,
            first_fit_min_obs=settings.first_fit_min_observations,
            guessed=settings.guessed_parts,
        )
        self.coefficients: PerfCoefficients = self.fitter.current
        self.prior_scale = (1.0, 1.0)  # (prefill, decode) factors of the prior's times until fitted
        self.timeline = EndpointTimeline()
        self.added_since_settle = 0  # streams the timeline took in since it was last settled
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
        computed: int | None = None,
    ) -> None:
        """A streamed, successful, first-attempt request that ran here (see the module docstring):
        `ttft` from dispatch, `decoding` the sum of its gaps, `per_token` decoding over tokens - 1."""
        self.timings.add(ttft, per_token, r.gaps)
        self.timings.output_rate.add(r.output_tokens, r.finished_at)
        self.checks["ttft"].gateway(ttft, 1)
        if per_token is not None:  # per token, like the engine's histogram, however events were batched
            self.checks["itl"].gateway(decoding, r.output_tokens - 1)
        self._on_timeline(r, prompt_tokens, computed)

    def observe_other(self, r: FinishedRequest, prompt_tokens: int, computed: int | None = None) -> None:
        """A request that ran here but is not measured (not streamed, failed, retried); its tokens, if it
        had timed ones, still tell the timeline which streams ran and when."""
        if r.ok and r.output_tokens:
            self.timings.output_rate.add(r.output_tokens, r.finished_at)
        self._on_timeline(r, prompt_tokens, computed)

    def _on_timeline(self, r: FinishedRequest, prompt_tokens: int, computed: int | None = None) -> None:
        """`computed`: the prompt tokens its prefill computed (the uncached ones; None: all): what the
        prefill fit learns from. Contexts count the whole prompt."""
        dispatched = r.dispatched_at
        if dispatched is None:
            return  # never reached the engine
        first = r.first_token_at
        if r.stream and first is not None:
            self.added_since_settle += 1
            self.timeline.add_stream(
                dispatched_at=dispatched if r.attempts == 1 else None,  # else: when it came here is unknown
                first_token_at=first,
                gaps=r.gaps,
                prompt_tokens=prompt_tokens,
                clean=r.ok,
                prefill_tokens=computed,
            )
        else:  # not streamed (its first token is the whole answer), or no token: when it ran is all we know
            self.timeline.add_untracked(dispatched, r.finished_at)

    @property
    def settle_due(self) -> bool:
        """Whether the timeline took in enough streams since it was last settled for a refit of a part it
        feeds (prefill, decode, throughput: at most one observation per stream each) to be due; until
        then a settle would derive little that a refit would use, and it costs the walk of every stream
        held (about 0.5 ms per endpoint). Settled with fewer, the observations only come later."""
        fitter = self.fitter
        need = min(fitter.observations_to_refit(p) for p in TIMELINE_PARTS)
        return self.added_since_settle >= need

    def settle(self, before: float) -> None:
        """Feed the fitter the timeline's observations of everything before `before` (see the module
        docstring: every request that ran here before it must have been observed)."""
        self.added_since_settle = 0
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

    def refit_part(self, part: Part) -> PerfCoefficients:
        self.coefficients = self.fitter.refit_part(part)
        return self.coefficients

    def refit_steps(self, part: Part) -> Iterator[None]:
        """`refit_part` in steps (`PerfModelFitter.refit_steps`)."""
        for _ in self.fitter.refit_steps(part):
            self.coefficients = self.fitter.current
            yield

    @property
    def on_prior(self) -> bool:
        """Some part of its performance model still holds the prior."""
        return bool(self.fitter.on_prior)

    def calibrate(self, running: Sequence[RunningRequest]) -> None:
        """While prefill or decode still holds a guessed prior: scale the prior by what the requests running
        here show (`gateway.telemetry.calibration`); a factor without a reading keeps its last value."""
        f = self.fitter
        if not (f.guessing("prefill") or f.guessing("decode")):
            return
        pre, dec = prior_factors(f.prior, running)
        if pre is None and dec is None:
            return
        old_pre, old_dec = self.prior_scale
        self.prior_scale = (old_pre if pre is None else pre, old_dec if dec is None else dec)
        self.coefficients = f.scale_prior(*self.prior_scale)

    def estimates(self, now: float) -> EndpointEstimates:
        t = self.timings
        total = t.output_rate.total(now)  # once: a refresh asks every endpoint
        return EndpointEstimates(
            perf=self.coefficients,
            kv_capacity_tokens=self.kv_capacity_tokens,
            ttft_ewma_s=t.ttft.ewma.value,
            itl_ewma_s=t.itl.value,
            tokens_per_s=t.output_rate.per_second(total) if total > 0 else None,
        )
