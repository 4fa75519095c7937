"""Prometheus families of SLO classes and admission, read at scrape time (nothing on the request path).

| family | labels | meaning |
| --- | --- | --- |
| berth_slo_requests_total | slo_class, result | finished requests that met / missed their SLO (goodput) |
| berth_admission_decisions_total | slo_class, outcome | admit, hold, best_effort, reject |
| berth_rejections_total | slo_class, reason | requests the gateway refused, by error code |
| berth_tasks_active | | tasks the task clock remembers |
| berth_tasks_forgotten_total | why | tasks dropped: idle (expired) or evicted (memory bound) |
| berth_tenant_requests_total | tenant, outcome | finished requests per tenant ("anonymous": no tenant) |
| berth_tenant_prompt_tokens_total | tenant | prompt tokens the engines reported |
| berth_tenant_completion_tokens_total | tenant | completion tokens relayed |
| berth_tenant_rate_limited_total | tenant, limit | requests a tenant's limit refused (429 rate_limited) |
| berth_tenant_class_downgrades_total | tenant | requests served in their tenant's class, not the one named |

Tenant names come from gateway.toml (plus "anonymous"), so the tenant label is bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.admission.state import SloAdmission
from gateway.admission.tenancy import TenantAccounting


class SloCollector:
    def __init__(
        self,
        state: SloAdmission,
        totals: Callable[[], Mapping[str, tuple[int, int]]],
        admission: Callable[[], Mapping[tuple[str, str], int]],
    ) -> None:
        self._state = state
        self._totals = totals
        self._admission = admission

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        req = CounterMetricFamily(
            "berth_slo_requests",
            "Finished requests by SLO class and whether they met their SLO (goodput = met / all)",
            labels=["slo_class", "result"],
        )
        for cls, (finished, met) in sorted(self._totals().items()):
            req.add_metric([cls, "met"], met)
            req.add_metric([cls, "missed"], finished - met)
        yield req
        adm = CounterMetricFamily(
            "berth_admission_decisions",
            "Admission outcomes by SLO class (admit, hold, best_effort, reject)",
            labels=["slo_class", "outcome"],
        )
        for (cls, outcome), n in sorted(self._admission().items()):
            adm.add_metric([cls, outcome], n)
        yield adm
        rej = CounterMetricFamily(
            "berth_rejections",
            "Requests the gateway refused (429/503), by SLO class and reason (the error code)",
            labels=["slo_class", "reason"],
        )
        for (cls, reason), n in sorted(self._state.rejections.items()):
            rej.add_metric([cls, reason], n)
        yield rej
        unknown = CounterMetricFamily(
            "berth_slo_unknown_class",
            "Requests whose x-berth-slo-class the policy lacks, served in the class named here (its default)",
            labels=["slo_class"],
        )
        for cls, n in sorted(self._state.unknown_classes.items()):
            unknown.add_metric([cls], n)
        yield unknown
        tasks = self._state.tasks
        yield GaugeMetricFamily("berth_tasks_active", "Tasks the task clock remembers", value=len(tasks))
        gone = CounterMetricFamily(
            "berth_tasks_forgotten", "Tasks dropped: idle past the expiry, or evicted", labels=["why"]
        )
        gone.add_metric(["expired"], tasks.expired)
        gone.add_metric(["evicted"], tasks.evicted)
        yield gone


class TenantCollector:
    def __init__(self, accounting: TenantAccounting, state: SloAdmission) -> None:
        self._acc = accounting
        self._state = state

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        acc = self._acc
        req = CounterMetricFamily(
            "berth_tenant_requests", "Finished requests by tenant and outcome", labels=["tenant", "outcome"]
        )
        for (tenant, outcome), n in sorted(acc.requests.items()):
            req.add_metric([tenant, outcome], n)
        yield req
        for name, what, counts in (
            (
                "berth_tenant_prompt_tokens",
                "Prompt tokens by tenant (as the engines reported)",
                acc.prompt_tokens,
            ),
            ("berth_tenant_completion_tokens", "Completion tokens by tenant", acc.completion_tokens),
            (
                "berth_tenant_class_downgrades",
                "Requests served in their tenant's default class because "
                "the class they named is not among its allowed_classes",
                self._state.downgraded,
            ),
        ):
            fam = CounterMetricFamily(name, what, labels=["tenant"])
            for tenant, n in sorted(counts.items()):
                fam.add_metric([tenant], n)
            yield fam
        limited = CounterMetricFamily(
            "berth_tenant_rate_limited",
            "Requests refused with 429 rate_limited, by tenant and limit",
            labels=["tenant", "limit"],
        )
        for (tenant, limit), n in sorted(acc.rate_limited.items()):
            limited.add_metric([tenant, limit], n)
        yield limited
