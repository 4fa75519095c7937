"""The endpoint scraper: one task per endpoint that keeps the gateway's view of it current.

Each round it asks the engine three things, each bounded by `timeout_s`:
1. `GET <health_path>`: 200 is a success for the endpoint's HealthTracker, and so are 401 and 403 (the
   engine is up; it refuses berth's credentials, which is reported as a configuration error and must
   not flap the endpoint's health); anything else (another status, a refused connection, a timeout)
   is a failure. When it fails the round stops here.
2. `GET /metrics`: parsed `SLICE_LINES` lines per turn of the event loop (a large page, or many
   endpoints' pages at once, never holds the loop for a whole parse), the engine detected from its
   metric names when the caller did not say which engine it is, and the gauges (running, waiting, KV
   usage) reported. Pages are parsed whole until the engine is known and a whole page confirmed it
   (detection and the mismatch check read every name); after that only the samples berth reads
   (`EngineMetrics.scraped`), so `last_exposition` holds those and the page's other lines are
   skipped unparsed. A /metrics page that fails or says
   nothing useful costs the endpoint its gauges for this round, never its health: stale metrics degrade
   to the gateway's own counts (DESIGN.md, Telemetry), so an engine that answers /health keeps serving.
3. `GET /v1/models` while its models are unknown, then every `models_refresh_s`.
The sink then hears, in this order: the engine kind (once, when detected), gauges, changed models, a
health transition (only on transitions), and always one `on_scrape` per round. A sink method that
raises is logged and does not stop the rest of the round.

Every request carries the endpoint's credentials (`Credentials`: an `Authorization` header when the
endpoint has an API key) and reports its status back, so a 401/403 shows up as the gateway's
configuration error rather than only as a failing check.

The requests go through a `ScrapeClient` (the daemon's: `gateway.upstream.fetch.Fetcher`, berth's own
HTTP/1.1 client over a keep-alive pool of the scrapers' own, apart from the generation calls'; about a
quarter of aiohttp's client's CPU per request, which a 100-endpoint fleet pays 100 times a second).

The caller runs it under its TaskSupervisor (`supervisor.spawn(f"scrape:{eid}", scraper.run)`); tests
call `run_once()` directly. A round never raises except CancelledError.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

import structlog

from gateway.core.clock import Clock
from gateway.core.types import EndpointHealth, EndpointId, EngineGauges, EngineKind
from gateway.telemetry.engine_metrics import EngineMetrics, detect_engine, metrics_for
from gateway.telemetry.health import HealthTracker
from gateway.telemetry.promtext import SLICE_LINES, Exposition, PromParser

log = structlog.get_logger("berth.scraper")

# Both engines serve these paths; used until the engine is known.
_HEALTH_PATH: Final = "/health"
_METRICS_PATH: Final = "/metrics"
_MODELS_PATH: Final = "/v1/models"
# The client does not decompress, so ask for identity.
# prometheus_client answers format 0.0.4 to this Accept and OpenMetrics only when asked for it.
_METRICS_HEADERS: Final = {"Accept": "text/plain;version=0.0.4", "Accept-Encoding": "identity"}
_JSON_HEADERS: Final = {"Accept": "application/json", "Accept-Encoding": "identity"}
_AUTH_REFUSED: Final = frozenset({401, 403})
_MAX_METRICS_BYTES: Final = 32 * 1024 * 1024
_MAX_SMALL_BYTES: Final = 4 * 1024 * 1024

Wait = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ScrapeSettings:
    interval_s: float = 2.0
    timeout_s: float = 2.0  # for each request of a round
    unhealthy_after: int = 3  # consecutive failed health checks
    models_refresh_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("interval_s", "timeout_s", "models_refresh_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if self.unhealthy_after < 1:
            raise ValueError("unhealthy_after must be at least 1")


class ScrapeSink(Protocol):
    """Where scrape results go (the daemon forwards them to the scheduler and its own metrics).
    Called synchronously from the scraper task; implementations must not block."""

    def on_health(self, eid: EndpointId, health: EndpointHealth) -> None: ...

    def on_gauges(self, eid: EndpointId, gauges: EngineGauges) -> None: ...

    def on_models(self, eid: EndpointId, models: list[str]) -> None: ...

    def on_engine(self, eid: EndpointId, kind: EngineKind) -> None: ...

    def on_scrape(self, eid: EndpointId, ok: bool, duration_s: float, bad_lines: int) -> None: ...


class Credentials(Protocol):
    """How a scraper authenticates to its engine (gateway.upstream.credentials.EngineAuth): the
    headers of every request, and each answer's status (a 401/403 is the gateway's configuration
    error, which the credentials' owner reports)."""

    def headers(self, eid: EndpointId) -> Mapping[str, str]: ...

    def result(self, eid: EndpointId, route: str, status: int) -> None: ...


class ScrapeClient(Protocol):
    """How a scraper asks its engine (gateway.upstream.fetch.Fetcher)."""

    async def get(self, url: str, headers: Mapping[str, str], limit: int) -> tuple[int, bytes]:
        """GET `url` with `headers`: (status, body), redirects not followed, the body as sent (no
        decompression). Raises OSError when there is no usable answer (refused, dropped, garbled, a
        body over `limit` bytes); the caller bounds the time (a call cut short leaves nothing open)."""
        ...


class _NoCredentials:
    def headers(self, eid: EndpointId) -> Mapping[str, str]:
        return {}

    def result(self, eid: EndpointId, route: str, status: int) -> None:
        return None


class _Failed(Exception):
    """A request of the round did not produce a usable answer; the message says why."""


class EndpointScraper:
    """Scrapes one endpoint. `dialect=None` means "detect the engine from the first /metrics page".
    `wait(seconds)` is how `run()` pauses between rounds (tests pass a fake)."""

    # Positional arguments are fine here: each has its own type, so mypy catches a swapped pair.
    def __init__(  # noqa: PLR0917
        self,
        eid: EndpointId,
        base_url: str,
        dialect: EngineMetrics | None,
        client: ScrapeClient,
        settings: ScrapeSettings,
        sink: ScrapeSink,
        clock: Clock,
        *,
        wait: Wait = asyncio.sleep,
        credentials: Credentials | None = None,
    ) -> None:
        self.eid = eid
        self._credentials = credentials if credentials is not None else _NoCredentials()
        self.url = base_url
        self._base = base_url.rstrip("/")
        self._dialect = dialect
        self._client = client
        self._settings = settings
        self._sink = sink
        self._clock = clock
        self._wait = wait
        self._tracker = HealthTracker(settings.unhealthy_after)
        self._parser = PromParser()
        self._models: list[str] | None = None
        self._models_at = 0.0
        self._checked_kind = False
        self._last_error = ""
        self.last_exposition: Exposition | None = None
        # Set once the first round is over, whatever its outcome (the daemon waits for every scraper's
        # first round before it reports READY to systemd).
        self.round_done = asyncio.Event()

    @property
    def health(self) -> EndpointHealth:
        return self._tracker.state

    @property
    def dialect(self) -> EngineMetrics | None:
        return self._dialect

    @property
    def models(self) -> list[str] | None:
        return None if self._models is None else list(self._models)

    @property
    def settings(self) -> ScrapeSettings:
        return self._settings

    def update_settings(self, settings: ScrapeSettings) -> None:
        """Take new settings (config reload); they apply from the next request on."""
        self._settings = settings
        self._emit_health(self._tracker.set_unhealthy_after(settings.unhealthy_after))

    @property
    def phase(self) -> float:
        """This endpoint's place in the scrape interval, in [0, 1): stable per endpoint id, so the rounds
        of a large fleet are spread over the interval instead of landing on the event loop together
        (100 endpoints scraped at the same instant stalled the loop 5-20 ms every interval)."""
        return zlib.crc32(str(self.eid).encode()) / 2**32

    async def run(self) -> None:
        """Scrape at once (readiness waits for every first round), then every `interval_s` (measured start
        to start), each endpoint at its own `phase` of the interval, until cancelled."""
        first = True
        while True:
            started = self._clock.now()
            await self.run_once()
            elapsed = self._clock.now() - started
            pause = max(0.0, self._settings.interval_s - elapsed)
            if first:
                pause = self.phase * self._settings.interval_s
                first = False
            await self._wait(pause)

    async def run_once(self) -> None:
        """One round. Never raises except CancelledError."""
        started = self._clock.now()
        ok = False
        bad_lines = 0
        try:
            try:
                await self._check_health()
            except _Failed as e:
                self._note_failure(str(e))
                self._emit_health(self._tracker.failure())
            else:
                ok, bad_lines = await self._scrape_metrics()
                if self._models_due():
                    await self._refresh_models()
                self._emit_health(self._tracker.success())
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("scrape_round_failed", endpoint=self.eid)
        self._tell(self._sink.on_scrape, ok, max(0.0, self._clock.now() - started), bad_lines)
        self.round_done.set()

    # ----------------------------------------------------------------- the three requests
    async def _check_health(self) -> None:
        path = self._dialect.health_path if self._dialect else _HEALTH_PATH
        status, _ = await self._get(path, _JSON_HEADERS, _MAX_SMALL_BYTES, route="health")
        # 401/403: the engine is up but refuses berth's credentials. That is the gateway's configuration
        # error (reported by the credentials' owner), not an engine failing its checks: health holds.
        if status != 200 and status not in _AUTH_REFUSED:
            raise _Failed(f"health check answered {status}")

    async def _scrape_metrics(self) -> tuple[bool, int]:
        """Fetch, parse and report /metrics; returns (ok, bad_lines)."""
        path = self._dialect.metrics_path if self._dialect else _METRICS_PATH
        try:
            status, body = await self._get(path, _METRICS_HEADERS, _MAX_METRICS_BYTES, route="metrics")
        except _Failed as e:
            log.debug("metrics_failed", endpoint=self.eid, reason=str(e))
            return False, 0
        if status != 200:
            log.debug("metrics_failed", endpoint=self.eid, reason=f"status {status}")
            return False, 0
        # Once the engine is known (and a whole page checked it), only what berth reads is parsed.
        only = self._dialect.scraped if self._dialect is not None and self._checked_kind else None
        job = self._parser.start(body.decode("utf-8", errors="replace"), only)
        # Not a wait for something (ASYNC110): the loop runs what is ready between two slices.
        while not job.step(SLICE_LINES):  # noqa: ASYNC110
            await asyncio.sleep(0)
        expo = job.exposition
        self.last_exposition = expo
        dialect = self._learn_engine(expo)
        if dialect is None:
            return False, expo.bad_lines
        gauges = dialect.gauges(expo)
        if gauges.running is None and gauges.waiting is None and gauges.kv_usage is None:
            return False, expo.bad_lines
        self._tell(self._sink.on_gauges, gauges)
        return True, expo.bad_lines

    def _models_due(self) -> bool:
        if self._models is None:
            return True
        return self._clock.now() - self._models_at >= self._settings.models_refresh_s

    async def _refresh_models(self) -> None:
        path = self._dialect.models_path if self._dialect else _MODELS_PATH
        try:
            status, body = await self._get(path, _JSON_HEADERS, _MAX_SMALL_BYTES, route="models")
            if status != 200:
                raise _Failed(f"models list answered {status}")
            dialect = self._dialect or metrics_for(EngineKind.VLLM)  # the OpenAI shape is shared
            models = dialect.served_models(body)
        except (_Failed, ValueError) as e:
            log.debug("models_failed", endpoint=self.eid, reason=str(e))
            return  # retried next round
        self._models_at = self._clock.now()
        if models != self._models:
            self._models = models
            self._tell(self._sink.on_models, list(models))

    async def _get(self, path: str, headers: dict[str, str], limit: int, *, route: str) -> tuple[int, bytes]:
        """GET base+path within `timeout_s`, with the engine's credentials; (status, body). Raises
        _Failed on any transport problem. The status is reported to the credentials' owner."""
        url = self._base + path
        creds = self._credentials
        auth = creds.headers(self.eid)
        if auth:
            headers = {**headers, **auth}
        try:
            async with asyncio.timeout(self._settings.timeout_s):
                status, body = await self._client.get(url, headers, limit)
        except TimeoutError:
            raise _Failed(f"no answer within {self._settings.timeout_s:g}s") from None
        except OSError as e:
            raise _Failed(f"{type(e).__name__}: {e}") from None
        creds.result(self.eid, route, status)
        return status, body

    # ----------------------------------------------------------------- bookkeeping
    def _learn_engine(self, expo: Exposition) -> EngineMetrics | None:
        if self._dialect is None:
            kind = detect_engine(expo)
            if kind is None:
                if not self._checked_kind:
                    self._checked_kind = True
                    log.warning("engine_not_detected", endpoint=self.eid, families=len(expo.families))
                return None
            self._dialect = metrics_for(kind)
            self._checked_kind = True
            self._tell(self._sink.on_engine, kind)
        elif not self._checked_kind:
            kind = detect_engine(expo)
            if kind is not None:
                self._checked_kind = True
                if kind is not self._dialect.kind:
                    log.warning(
                        "engine_mismatch",
                        endpoint=self.eid,
                        configured=self._dialect.kind.value,
                        detected=kind.value,
                    )
        return self._dialect

    def _note_failure(self, reason: str) -> None:
        self._last_error = reason
        log.debug("health_check_failed", endpoint=self.eid, reason=reason)

    def _emit_health(self, state: EndpointHealth | None) -> None:
        if state is None:
            return
        if state is EndpointHealth.UNHEALTHY:
            # The sink logs every transition; this adds why the checks failed.
            log.warning(
                "endpoint_checks_failing",
                endpoint=self.eid,
                failures=self._tracker.consecutive_failures,
                reason=self._last_error,
            )
        self._tell(self._sink.on_health, state)

    def _tell(self, method: Callable[..., None], *args: object) -> None:
        try:
            method(self.eid, *args)
        except Exception:
            log.exception("scrape_sink_failed", endpoint=self.eid, method=method.__name__)
