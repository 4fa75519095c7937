"""Prometheus families of the fleet telemetry, read from `FleetTelemetry` at scrape time.

Nothing is updated on the request path: a collector registered on the gateway's registry walks the
telemetry state when /metrics is rendered. Labels stay low-cardinality (endpoint, model, SLO class,
and fixed small sets: coefficient names, model parts, quantities).

| family | labels | meaning |
| --- | --- | --- |
| berth_perfmodel_coefficient | endpoint, coefficient | fitted (or prior) coefficient value |
| berth_perfmodel_fit_error_ratio | endpoint, part | MAPE of the current fit (prefill, decode, kv) |
| berth_perfmodel_observations | endpoint, part | observations the current fit used (0: prior) |
| berth_prediction_error_ratio | endpoint, quantity | EWMA of abs(predicted - observed) / observed |
| berth_prediction_output_tokens_error_ratio | model | the same for predicted output lengths |
| berth_endpoint_ttft_ewma_seconds | endpoint | dispatch to first token, measured by the gateway |
| berth_endpoint_itl_ewma_seconds | endpoint | per-token time of a stream, measured by the gateway |
| berth_endpoint_output_tokens_per_second | endpoint | output tokens/s delivered over the last minute |
| berth_endpoint_kv_capacity_tokens | endpoint | engine KV capacity (exported or configured) |
| berth_endpoint_scrape_age_seconds | endpoint | age of the last successful metrics scrape |
| berth_telemetry_engine_disagreement_ratio | endpoint, quantity | gateway mean / engine mean, last window |
| berth_telemetry_engine_disagreements_total | endpoint, quantity | windows whose ratio was out of tolerance |
| berth_telemetry_fail_open | | 1 while every ready endpoint's metrics are stale |
| berth_telemetry_fail_open_events_total | | times routing started failing open |
| berth_slo_attainment_ratio | slo_class | share of requests that met their SLO, last minute |
| berth_slo_finished_requests | slo_class | requests finished, last minute |
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.telemetry.fleet_state import COEFFICIENTS, FleetTelemetry

_PARTS: Final = ("prefill", "decode", "kv")


class TelemetryCollector:
    def __init__(
        self,
        fleet: Callable[[], FleetTelemetry],
        scrape_ages: Callable[[], Mapping[str, float | None]],
        now: Callable[[], float],
    ) -> None:
        self._fleet = fleet
        self._ages = scrape_ages
        self._now = now

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        fleet = self._fleet()
        now = self._now()
        coef = GaugeMetricFamily(
            "berth_perfmodel_coefficient",
            "Performance-model coefficient per endpoint (fitted, or the prior until enough data)",
            labels=["endpoint", "coefficient"],
        )
        fit_err = GaugeMetricFamily(
            "berth_perfmodel_fit_error_ratio",
            "Mean absolute relative error of the current fit over its window",
            labels=["endpoint", "part"],
        )
        fit_n = GaugeMetricFamily(
            "berth_perfmodel_observations",
            "Observations the current fit used (0 while the prior holds)",
            labels=["endpoint", "part"],
        )
        pred_err = GaugeMetricFamily(
            "berth_prediction_error_ratio",
            "EWMA of |predicted - observed| / observed for TTFT (prefill) and ITL (decode)",
            labels=["endpoint", "quantity"],
        )
        ttft = GaugeMetricFamily(
            "berth_endpoint_ttft_ewma_seconds",
            "Dispatch to first token measured by the gateway (EWMA)",
            labels=["endpoint"],
        )
        itl = GaugeMetricFamily(
            "berth_endpoint_itl_ewma_seconds",
            "Per-token time of streams measured by the gateway (EWMA)",
            labels=["endpoint"],
        )
        rate = GaugeMetricFamily(
            "berth_endpoint_output_tokens_per_second",
            "Output tokens per second the endpoint delivered over the last minute",
            labels=["endpoint"],
        )
        kvcap = GaugeMetricFamily(
            "berth_endpoint_kv_capacity_tokens",
            "KV-cache capacity in tokens (engine-exported, else configured)",
            labels=["endpoint"],
        )
        dis_ratio = GaugeMetricFamily(
            "berth_telemetry_engine_disagreement_ratio",
            "Gateway-measured mean over engine-reported mean in the last cross-check window",
            labels=["endpoint", "quantity"],
        )
        dis_total = CounterMetricFamily(
            "berth_telemetry_engine_disagreements",
            "Cross-check windows where engine and gateway latencies disagreed beyond the tolerance",
            labels=["endpoint", "quantity"],
        )
        for eid, ep in sorted(fleet.endpoints.items()):
            c = ep.coefficients
            for name in COEFFICIENTS:
                coef.add_metric([eid, name], getattr(c, name))
            for part, mape, n in zip(
                _PARTS,
                (c.prefill_mape, c.decode_mape, c.kv_mape),
                (c.n_prefill, c.n_decode, c.n_kv),
                strict=True,
            ):
                if mape is not None:
                    fit_err.add_metric([eid, part], mape)
                fit_n.add_metric([eid, part], n)
            for quantity, err in ep.prediction_error.items():
                if err.value is not None:
                    pred_err.add_metric([eid, quantity], err.value)
            t = ep.timings
            if t.ttft.ewma.value is not None:
                ttft.add_metric([eid], t.ttft.ewma.value)
            if t.itl.value is not None:
                itl.add_metric([eid], t.itl.value)
            rate.add_metric([eid], t.output_rate.rate(now))
            if ep.kv_capacity_tokens is not None:
                kvcap.add_metric([eid], ep.kv_capacity_tokens)
            for quantity, check in ep.checks.items():
                if check.last is not None:
                    dis_ratio.add_metric([eid, quantity], check.last.ratio)
                dis_total.add_metric([eid, quantity], ep.disagreements[quantity])
        yield from (coef, fit_err, fit_n, pred_err, ttft, itl, rate, kvcap, dis_ratio, dis_total)

        out_err = GaugeMetricFamily(
            "berth_prediction_output_tokens_error_ratio",
            "EWMA of |predicted - actual| / actual output tokens",
            labels=["model"],
        )
        for model, mt in sorted(fleet.models.items()):
            if mt.output_error.value is not None:
                out_err.add_metric([model], mt.output_error.value)
        yield out_err

        age = GaugeMetricFamily(
            "berth_endpoint_scrape_age_seconds",
            "Seconds since the last successful metrics scrape",
            labels=["endpoint"],
        )
        for endpoint, a in sorted(self._ages().items()):
            if a is not None:
                age.add_metric([endpoint], a)
        yield age

        yield GaugeMetricFamily(
            "berth_telemetry_fail_open",
            "1 while every ready endpoint's metrics are stale and routing runs on the gateway's counts",
            value=1.0 if fleet.fail_open.active else 0.0,
        )
        yield CounterMetricFamily(
            "berth_telemetry_fail_open_events",
            "Times routing started failing open on stale metrics",
            value=fleet.fail_open.transitions,
        )

        ratio = GaugeMetricFamily(
            "berth_slo_attainment_ratio",
            "Share of requests that met their SLO over the last minute",
            labels=["slo_class"],
        )
        finished = GaugeMetricFamily(
            "berth_slo_finished_requests", "Requests finished over the last minute", labels=["slo_class"]
        )
        for cls, att in fleet.attainment.by_class(now).items():
            finished.add_metric([cls], att.finished)
            if att.ratio is not None:
                ratio.add_metric([cls], att.ratio)
        yield ratio
        yield finished
