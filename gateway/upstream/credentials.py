"""Engine credentials: the `Authorization: Bearer` header of each endpoint that has an API key, and
which endpoints refuse it.

Every call berth makes to an engine (generation, tokenize, health, /metrics, /v1/models) takes its
headers from `headers(eid)` and reports the answer's status with `result(eid, route, status)`. A 401
or 403 is a configuration error of the gateway (a missing or wrong key), not an engine failure: it is
logged once per endpoint each time the endpoint's state changes (`engine_auth_failed`, then
`engine_auth_ok` once every route that failed answered 2xx again), counted, and shown per endpoint in
/admin/fleet. A key that changes on reload forgets the endpoint's failures (the new key gets its own
first log line). The keys themselves never reach a log line, a metric or a repr.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Final

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.config.schema import EngineKey
from gateway.core.types import EndpointId

log = structlog.get_logger("berth.upstream")

_NONE: Final[Mapping[str, str]] = {}
AUTH_REFUSED: Final = frozenset({401, 403})


class EngineAuth:
    def __init__(self) -> None:
        self._keys: dict[EndpointId, EngineKey] = {}
        self._headers: dict[EndpointId, Mapping[str, str]] = {}
        self._failing: dict[EndpointId, dict[str, int]] = {}  # route -> the status it answered
        self.failures: dict[EndpointId, int] = {}  # 401/403 answers since start

    def update(self, keys: Mapping[EndpointId, EngineKey]) -> None:
        """Take the keys of a (re)load; endpoints whose key changed (or went) start afresh."""
        for eid in set(self._keys) | set(keys):
            if self._keys.get(eid) != keys.get(eid):
                self._failing.pop(eid, None)
        self._keys = dict(keys)
        self._headers = {eid: {"Authorization": f"Bearer {k.reveal()}"} for eid, k in keys.items()}

    def headers(self, eid: EndpointId) -> Mapping[str, str]:
        """The headers that authenticate berth to endpoint `eid` ({} without a key)."""
        return self._headers.get(eid, _NONE)

    def result(self, eid: EndpointId, route: str, status: int) -> None:
        """What endpoint `eid` answered on `route` (generation, tokenize, health, metrics, models)."""
        if status in AUTH_REFUSED:
            self.failures[eid] = self.failures.get(eid, 0) + 1
            routes = self._failing.get(eid)
            if routes is None:
                self._failing[eid] = {route: status}
                log.error(
                    "engine_auth_failed",
                    endpoint=eid,
                    route=route,
                    status=status,
                    has_key=eid in self._keys,
                    hint="set the endpoint's api_key_env or api_key_file to the engine's --api-key",
                )
            else:
                routes[route] = status
        elif 200 <= status < 300:
            routes = self._failing.get(eid)
            if routes is not None and route in routes:
                del routes[route]
                if not routes:
                    del self._failing[eid]
                    log.info("engine_auth_ok", endpoint=eid)

    def failing(self, eid: EndpointId) -> dict[str, int]:
        """The routes of `eid` whose last answer was 401/403, with that status ({}: none)."""
        return dict(self._failing.get(eid, {}))

    def forget(self, eid: EndpointId) -> None:
        self._failing.pop(eid, None)
        self.failures.pop(eid, None)

    def __repr__(self) -> str:
        return f"EngineAuth(endpoints_with_keys={len(self._keys)}, failing={sorted(self._failing)})"


class EngineAuthCollector:
    """`berth_engine_auth_failures_total{endpoint}` and `berth_endpoint_auth_failed{endpoint}`."""

    def __init__(self, auth: EngineAuth) -> None:
        self._auth = auth

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        auth = self._auth
        total = CounterMetricFamily(
            "berth_engine_auth_failures",
            "Engine answers of 401/403 to berth's credentials (a configuration error), by endpoint",
            labels=["endpoint"],
        )
        for eid, n in sorted(auth.failures.items()):
            total.add_metric([eid], n)
        yield total
        failed = GaugeMetricFamily(
            "berth_endpoint_auth_failed",
            "1 while an endpoint refuses berth's credentials on some route",
            labels=["endpoint"],
        )
        for eid in sorted(auth.failures):
            failed.add_metric([eid], 1 if auth.failing(eid) else 0)
        yield failed
