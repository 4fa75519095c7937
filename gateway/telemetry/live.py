"""The live telemetry service: feeds `FleetTelemetry` from the finish phase and the scrapers, runs the
refresh loop (a supervised task), hands the estimates to the scheduler, exports the metrics.

Request-path cost: `on_finish` appends the finish phase's `FinishedRequest` record to a bounded deque
(the stream's token times travel in it as the relay recorded them: its first token's time and the list
of gaps). Only the refresh loop folds those records in (readers such as the admin API and the Prometheus
collector see the state as of the last refresh and change nothing). Everything
else (EWMAs, quantile windows, predictor updates, cross-checks, each endpoint's token timeline) runs in
`refresh()` every `telemetry.refresh_interval_s`. Every `telemetry.refit_interval_s` the timelines are
settled (each endpoint up to the dispatch of its oldest running request: everything before it has
finished and been folded in; an endpoint once it took in enough streams for a refit to be due,
`EndpointTelemetry.settle_due`) into performance-model observations, and the models are refitted (a
part once its new observations carry enough weight: `gateway.telemetry.perfmodel`, "Cadence"), one
endpoint at a time with the event loop free in between; only the estimates a refit changed are handed
over again. In between, every
`telemetry.first_fit_interval_s` (at the refreshes), only the endpoints with a model part still on the
prior are settled, and only those parts are fitted, as soon as they have
`telemetry.first_fit_min_observations` (a first fit; the prior is another machine's). Once every part
has a fit this costs a look at each endpoint's flag.

Staleness: when every ready endpoint's metrics are stale, routing runs on the gateway's own counts
(fail open: traffic never waits for metrics). `refresh()` notices it, sets
`berth_telemetry_fail_open` and logs `telemetry_fail_open`; `telemetry_fresh_again` when it ends.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from typing import Final, Literal

import msgspec
import structlog
from prometheus_client import CollectorRegistry

from gateway.config.schema import PrefixConfig, TelemetryConfig
from gateway.core.clock import Clock
from gateway.core.turnshare import TurnShare
from gateway.core.types import EndpointHealth, EndpointId, EngineGauges
from gateway.sched.perf import default_prior
from gateway.sched.scheduler import Scheduler
from gateway.telemetry.capacity import kv_capacity_tokens
from gateway.telemetry.endpoint_state import EndpointTelemetry
from gateway.telemetry.engine_metrics import EngineMetrics, HistogramReader
from gateway.telemetry.exporter import TelemetryCollector
from gateway.telemetry.fleet_state import CachedLengths, FleetTelemetry, prior_with
from gateway.telemetry.perfmodel import PART_COEFFICIENTS, PARTS, Part
from gateway.telemetry.prefix_exporter import PrefixCollector
from gateway.telemetry.prefix_index import PrefixIndex, PrefixSettings
from gateway.telemetry.promtext import Exposition, Histogram
from gateway.telemetry.records import FinishedRequest, ScrapeSample, TelemetrySettings
from gateway.telemetry.tokens import TokenEstimator

log = structlog.get_logger("berth.telemetry")

#: Finished requests the refresh folds in one go; a larger backlog is folded in slices of time
#: (`TurnShare`), the loop free between them. A record takes about 10 µs (2-CPU bench machine, in process,
#: the test rig's records). A fixed count per slice was either a third of a turn at 8 connections (32
#: records, 0.33 ms) or, at 8, too little of a saturated loop to keep up (the rest was then folded in one
#: piece: 40-120 ms).
FOLD_AT_ONCE: Final = 32
#: Endpoints whose estimates the refresh loop hands the scheduler before it yields (about 0.1 ms).
PUSH_SLICE: Final = 16
#: Finished requests waiting for the next refresh; past this the oldest are dropped (and counted).
PENDING_LIMIT: Final = 65536

#: A refit of every endpoint's every part ("all"), or only of the parts still on the prior ("first").
Refit = Literal["all", "first"]


def telemetry_settings(cfg: TelemetryConfig) -> TelemetrySettings:
    given = {k for k, v in msgspec.structs.asdict(cfg.prior).items() if v is not None}
    prior = prior_with(default_prior(), **msgspec.structs.asdict(cfg.prior))
    return TelemetrySettings(
        prior=prior,
        # a part none of whose coefficients the operator set holds the built-in prior: a guess
        guessed_parts=frozenset(p for p in PARTS if not given & set(PART_COEFFICIENTS[p])),
        min_observations=cfg.min_observations,
        first_fit_min_observations=cfg.first_fit_min_observations,
        fit_window=cfg.fit_window,
        kv_capacity_tokens=None if cfg.kv_capacity_tokens is None else float(cfg.kv_capacity_tokens),
        disagreement_tolerance=cfg.disagreement_tolerance,
    )


def prefix_settings(cfg: PrefixConfig, telemetry: TelemetryConfig | None = None) -> PrefixSettings:
    """The prefix index's settings: [prefix], its size falling back to [telemetry] kv_capacity_tokens."""
    size = cfg.index_tokens or (None if telemetry is None else telemetry.kv_capacity_tokens)
    return PrefixSettings(source=cfg.source, block_tokens=cfg.block_tokens, index_tokens=size)


class LiveTelemetry:
    def __init__(
        self,
        scheduler: Scheduler,
        clock: Clock,
        config: TelemetryConfig,
        *,
        pending_limit: int = PENDING_LIMIT,
        prefix: PrefixConfig | None = None,
    ) -> None:
        self._scheduler = scheduler
        self._clock = clock
        self._share = TurnShare(clock)  # the slices of the refresh loop's background work
        self._config = config  # [telemetry] is reloadable: `reconfigure` pushes a new one
        self.fleet = FleetTelemetry(telemetry_settings(config))
        self._pending: deque[FinishedRequest] = deque(maxlen=pending_limit)
        self.dropped = 0
        self._dropped_settled = 0  # `dropped` when the timelines were last settled
        self._last_refit: float | None = None
        self._last_first_fit: float | None = None  # the last refit of either kind
        # per endpoint, its TTFT and ITL histograms as last read (derived again only when they change)
        self._histograms: dict[EndpointId, tuple[HistogramReader, HistogramReader]] = {}
        # Which prompt blocks each endpoint holds ([prefix]); its corrections reach the prefill fits.
        self._prefix_config = prefix or PrefixConfig()
        self.prefix = PrefixIndex(
            prefix_settings(self._prefix_config, config), self.fleet.tokens.chars_per_token
        )
        self.fleet.cache_correction = self.prefix.correction

    @property
    def tokens(self) -> TokenEstimator:
        return self.fleet.tokens

    @property
    def lengths(self) -> CachedLengths:
        """Output-length predictions for the request path (cached until the history changes)."""
        return self.fleet.predictions

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def last_refit_at(self) -> float | None:
        return self._last_refit

    def register(self, registry: CollectorRegistry) -> None:
        registry.register(TelemetryCollector(lambda: self.fleet, self._scrape_ages, self._clock.now))
        registry.register(PrefixCollector(lambda: self.prefix))

    # ----------------------------------------------------------------- inputs
    def on_finish(self, record: FinishedRequest) -> None:
        """The finish phase of every admitted request: one append (the rest happens in `refresh`)."""
        pending = self._pending
        if len(pending) == pending.maxlen:
            self.dropped += 1
        pending.append(record)

    def on_scrape(
        self,
        eid: EndpointId,
        gauges: EngineGauges,
        expo: Exposition | None,
        dialect: EngineMetrics | None,
    ) -> None:
        """A scrape that produced gauges (called by the scrape sink after the scheduler saw them)."""
        if expo is None or dialect is None:
            self.observe_engine(
                eid, gauges, kv_capacity_tokens=None if expo is None else kv_capacity_tokens(expo)
            )
            return
        hits, queries, rate = dialect.prefix_cache(expo)
        self.prefix.observe_engine(eid, hits=hits, queries=queries, hit_rate=rate)
        readers = self._histograms.get(eid)
        if readers is None:
            readers = self._histograms[eid] = (HistogramReader(), HistogramReader())
        self.observe_engine(
            eid,
            gauges,
            kv_capacity_tokens=kv_capacity_tokens(expo),
            ttft=readers[0].read(expo, dialect.ttft),
            itl=readers[1].read(expo, dialect.itl),
        )

    def observe_engine(
        self,
        eid: EndpointId,
        gauges: EngineGauges,
        *,
        kv_capacity_tokens: float | None,
        ttft: Histogram | None = None,
        itl: Histogram | None = None,
    ) -> None:
        """What one scrape of an endpoint read, as numbers (the offline simulator calls this directly)."""
        view = self._scheduler.endpoint_view(eid)
        if view is None:
            return
        sample = ScrapeSample(
            running=gauges.running,
            kv_usage=gauges.kv_usage,
            kv_capacity_tokens=kv_capacity_tokens,
            ttft=ttft,
            itl=itl,
            gateway_inflight=view.inflight,
            gateway_context_tokens=view.running_prompt_tokens + 0.5 * view.running_output_tokens,
        )
        verdicts = self.fleet.observe_scrape(eid, sample)
        self.prefix.set_capacity(eid, self.fleet.endpoint(eid).kv_capacity_tokens)
        for quantity, v in verdicts:
            if v.disagrees:
                log.warning(
                    "engine_metrics_disagree",
                    endpoint=eid,
                    quantity=quantity,
                    gateway_mean_s=round(v.gateway_mean_s, 6),
                    engine_mean_s=round(v.engine_mean_s, 6),
                    ratio=round(v.ratio, 3),
                )

    # ----------------------------------------------------------------- the background work
    def drain(self, *, until: Callable[[], bool] | None = None) -> int:
        """Fold the finished requests in, oldest first; with `until`, only until it says so (asked after
        each record: a slice's time is up), at least one. Returns how many were folded in."""
        pending = self._pending
        observe = self.fleet.observe
        n = 0
        while pending:
            observe(pending.popleft())
            n += 1
            if until is not None and until():
                break
        return n

    def settle_points(self, only: Iterable[EndpointId] | None = None) -> dict[EndpointId, float]:
        """Fold the finished requests in; then, per endpoint (of `only`, when given), the time before
        which everything that ran there has been folded in: the dispatch of the oldest request still
        running there (now when none is). In one synchronous step, so that a request finishing meanwhile
        still counts as running."""
        self.drain()
        now = self._clock.now()
        if self.dropped != self._dropped_settled:  # finished requests were lost: the timelines have holes
            self._dropped_settled = self.dropped
            self.fleet.forget_timelines(now)
        sched = self._scheduler
        points: dict[EndpointId, float] = {}
        for eid in self.fleet.endpoints if only is None else only:
            view = sched.endpoint_view(eid)
            running = () if view is None else view.running
            points[eid] = min((r.dispatched_at for r in running), default=now)
        return points

    def settle(self) -> None:
        """Turn every endpoint's token timeline into performance-model observations (`settle_points`)."""
        for eid, before in self.settle_points().items():
            self.fleet.settle(eid, before)

    def refresh(self, *, refit: bool = False) -> None:
        """Fold finished requests in, check staleness, (with `refit`: settle the timelines and refit
        every endpoint now), and hand the estimates to the scheduler. Tests call it directly."""
        self._fold_in()
        if refit:
            self.settle()
            now = self._clock.now()
            self.fleet.refit(now)
            self._last_refit = now
        self._push_estimates()
        self._check_stale()

    def _fold_in(self) -> None:
        """A refresh's first part: fold finished requests in, follow the fleet, calibrate the priors."""
        self.drain()
        eids = self._scheduler.endpoint_ids()
        self.fleet.keep_endpoints(eids)
        self.prefix.keep(eids)
        if self._histograms.keys() - set(eids):  # endpoints that left: forget their histograms
            kept = set(eids)
            self._histograms = {eid: r for eid, r in self._histograms.items() if eid in kept}
        self._calibrate()

    def refit_due(self, now: float) -> Refit | None:
        """The refit the loop runs at `now`: "all" every `refit_interval_s` (the first refresh too);
        "first" every `first_fit_interval_s` in between; None."""
        cfg = self._config
        if self._last_refit is None or now - self._last_refit >= cfg.refit_interval_s:
            return "all"
        if self._last_first_fit is None or now - self._last_first_fit >= cfg.first_fit_interval_s:
            return "first"
        return None

    def step(self) -> None:
        """One turn of `run` in one synchronous step: refresh, then the refit that is due (the offline
        simulator's refresh event; live, `run` does the same with the event loop free between
        endpoints)."""
        self.refresh()
        now = self._clock.now()
        kind = self.refit_due(now)
        if kind is not None:
            changed: list[EndpointId] = []
            for ep, before in self._refit_plan(kind):
                was = ep.coefficients
                for part in self._settled_parts(ep, before, kind):
                    ep.refit_part(part)
                if ep.coefficients is not was:
                    changed.append(ep.eid)
            self._refitted(kind, now)
            self._push_estimates(changed)  # the others' were pushed by the refresh, at this instant

    async def run(self) -> None:
        """The supervised loop: refresh every `refresh_interval_s`, refit when due (`step`)."""
        while True:
            await asyncio.sleep(self._config.refresh_interval_s)
            # A second's finished requests at thousands a second take milliseconds to fold in: a slice
            # at a time (`TurnShare`: a fifth of a turn, at least 0.2 ms), letting requests through in
            # between, so the loop never stalls on it; `refresh` folds in the last slice. Bounded (what
            # is pending now and as much again finishing meanwhile) so that the refresh comes even when
            # requests finish faster than they fold in.
            share = self._share
            share.begin()
            left = 2 * len(self._pending)
            while len(self._pending) > FOLD_AT_ONCE and left > 0:
                left -= self.drain(until=share.over)
                await share.pause()
            self._fold_in()  # `refresh`, with the estimates pushed a slice of endpoints at a time
            await self._push_in_slices()
            self._check_stale()
            now = self._clock.now()
            kind = self.refit_due(now)
            if kind is None:
                continue
            # A part's whole fit takes up to about 1 ms with a full window (an endpoint's four 3.5), a
            # step of it up to about 0.2: the steps run in slices of time, requests going through between.
            share.begin()
            changed: list[EndpointId] = []
            for ep, before in self._refit_plan(kind):
                was = ep.coefficients
                for part in self._settled_parts(ep, before, kind):
                    for _ in ep.refit_steps(part):
                        if share.over():
                            await share.pause()
                if ep.coefficients is not was:
                    changed.append(ep.eid)
            self._refitted(kind, now)
            await self._push_in_slices(changed)  # the others' are as the refresh pushed them

    def _refit_plan(self, kind: Refit) -> list[tuple[EndpointTelemetry, float | None]]:
        """The endpoints a refit of `kind` visits (for "first", those with a part on the prior), each
        with its settle point (None: "all" leaves its timeline for a later refit, `settle_due`)."""
        endpoints = self.fleet.endpoints
        if kind == "all":
            only = [eid for eid, ep in endpoints.items() if ep.settle_due]
        else:
            only = [eid for eid, ep in endpoints.items() if ep.on_prior]
            if not only:
                return []
        points = self.settle_points(only)
        if kind == "first":
            return [(endpoints[eid], before) for eid, before in points.items() if eid in endpoints]
        return [(ep, points.get(eid)) for eid, ep in endpoints.items()]

    @staticmethod
    def _settled_parts(ep: EndpointTelemetry, before: float | None, kind: Refit) -> tuple[Part, ...]:
        """Settle `ep` at `before` (None: not now) and name the parts a refit of `kind` fits there, in
        order (for "first", those on the prior whose first fit is due); fitted one at a time with
        `refit_part`, they give what one `refit` (or `refit_prior_parts`) gives."""
        if before is not None:
            ep.settle(before)  # requests added after the points were taken ran later: still correct
        return PARTS if kind == "all" else ep.fitter.prior_parts_due()

    def _refitted(self, kind: Refit, now: float) -> None:
        """Note a refit of `kind` begun at `now` (the caller then pushes the new estimates)."""
        self._last_first_fit = now
        if kind == "all":
            self._last_refit = now
            self.fleet.last_refit_at = self._clock.now()

    def _calibrate(self) -> None:
        """Scale the prior of every endpoint whose prefill or decode still holds a guess by what its running
        requests show (`gateway.telemetry.calibration`; a loop over those requests, until the fits)."""
        sched = self._scheduler
        for eid, ep in self.fleet.endpoints.items():
            if ep.fitter.guessing("prefill") or ep.fitter.guessing("decode"):
                view = sched.endpoint_view(eid)
                if view is not None:
                    ep.calibrate(view.running)

    def _push_estimates(self, eids: Iterable[EndpointId] | None = None) -> None:
        """Hand the scheduler the estimates of `eids` (default: every endpoint it has)."""
        now = self._clock.now()
        sched = self._scheduler
        for eid in sched.endpoint_ids() if eids is None else eids:
            sched.set_estimates(eid, self.fleet.estimates(eid, now))  # serves nothing by itself

    async def _push_in_slices(self, only: Iterable[EndpointId] | None = None) -> None:
        """`_push_estimates` of `only` (default: every endpoint), `PUSH_SLICE` endpoints at a time with the
        event loop free in between (every endpoint's estimates at once took about 0.6 ms for 100
        endpoints)."""
        eids = list(self._scheduler.endpoint_ids() if only is None else only)
        for at in range(0, len(eids), PUSH_SLICE):
            if at:
                await asyncio.sleep(0)
            self._push_estimates(eids[at : at + PUSH_SLICE])

    def _check_stale(self) -> None:
        snap = self._scheduler.snapshot()
        ready = [e for e in snap.endpoints if e.health is EndpointHealth.READY]
        all_stale = bool(ready) and not any(e.fresh for e in ready)
        change = self.fleet.fail_open.update(all_stale, snap.now)
        if change is True:
            log.warning(
                "telemetry_fail_open",
                endpoints=len(ready),
                stale_after_s=self._scheduler.limits.stale_after_s,
                detail="metrics of every ready endpoint are stale; routing on the gateway's own counts",
            )
        elif change is False:
            log.info("telemetry_fresh_again", endpoints=len(ready))

    def reconfigure(self, cfg: TelemetryConfig) -> None:
        """A reloaded [telemetry]: the new settings apply from the next refresh on."""
        if cfg == self._config:
            return
        self._config = cfg
        self.fleet.set_settings(telemetry_settings(cfg))
        self.prefix.configure(prefix_settings(self._prefix_config, cfg))
        log.info("telemetry_config_applied")

    def reconfigure_prefix(self, cfg: PrefixConfig) -> None:
        """A reloaded [prefix]: a new block size starts the approximate index afresh."""
        if cfg == self._prefix_config:
            return
        self._prefix_config = cfg
        self.prefix.configure(prefix_settings(cfg, self._config))
        log.info("prefix_config_applied", source=cfg.source, block_tokens=cfg.block_tokens)

    def _scrape_ages(self) -> dict[str, float | None]:
        snap = self._scheduler.snapshot()
        return {e.id: None if e.scraped_at is None else snap.now - e.scraped_at for e in snap.endpoints}
