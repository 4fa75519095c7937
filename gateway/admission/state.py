"""The daemon's SLO state across requests: the task clock, and the rejections the gateway answered, by
SLO class and reason.

`resolve` runs on the request path (a header scan, a rule scan, the task clock; the tenant was found by
the front's auth phase); `on_finish` runs in the finish phase (one dict update at most). Both are
synchronous; the policy's `[tasks]` settings are picked up when they change (reload).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Protocol

from gateway.admission.slo import (
    DOWNGRADED_SOURCE,
    NO_SLO_HEADERS,
    UNKNOWN_CLASS_SOURCE,
    Resolved,
    SloHeaders,
    Tenant,
    parse_slo_headers,
    resolve,
)
from gateway.admission.tasks import TaskClock
from gateway.core.errors import BerthError, ErrorSource
from gateway.core.slo import SloPolicy, TaskCall, TaskMetric
from gateway.core.types import ParsedRequest

#: A shared task start within this of the local one is the same (the clocks of replicas and Redis differ
#: by the time a call takes to reach Redis).
SAME_START_S: Final = 0.05


class SharedTaskClock(Protocol):
    """Task clocks shared by the replicas of a cluster (gateway.cluster.tasks)."""

    async def call(
        self, key: str, task_type: str, sla_s: float | None, idle_expiry_s: float
    ) -> tuple[float, str, float | None, int] | None:
        """(seconds since the task started, its type, its SLA, this call's step); None: not shared now."""

    def abandon(self, key: str, step: int) -> None:
        """The call of `step` never ran: give the step back."""


class SloAdmission:
    def __init__(self) -> None:
        self.tasks = TaskClock()
        # Cluster mode: the task clocks are the cluster's (`share`); None: this process's own.
        self.shared: SharedTaskClock | None = None
        self.rejections: dict[tuple[str, str], int] = {}  # (class, error code) -> n
        # Requests that named a class the policy lacks and were served in its default class, by that
        # class (the names clients sent are not kept: they are theirs to choose, without bound).
        self.unknown_classes: dict[str, int] = {}
        # Requests that named a class outside their tenant's allowed_classes and were served in the
        # tenant's default class, by tenant (names from gateway.toml: bounded).
        self.downgraded: dict[str, int] = {}
        # The answer for a request with no x-berth-* header and no tenant under a policy without rules:
        # the same for every such request, so made once per policy.
        self._plain: tuple[SloPolicy, Resolved] | None = None

    def resolve(
        self,
        headers: Iterable[tuple[str, str]],
        tenant: Tenant | None,
        parsed: ParsedRequest,
        *,
        served: str,
        now: float,
        policy: SloPolicy,
        reject_disallowed: bool = False,
    ) -> Resolved:
        """The request's SLO (gateway.admission.slo); raises a 400 naming a bad x-berth-* header, or
        a 403 for a class its tenant may not use with `reject_disallowed`."""
        if self.tasks.settings is not policy.tasks:
            self.tasks.settings = policy.tasks
        hdrs = parse_slo_headers(headers)
        if hdrs is NO_SLO_HEADERS and tenant is None and not policy.rules:
            plain = self._plain
            if plain is None or plain[0] is not policy:
                plain = self._plain = (policy, resolve(policy, hdrs, None, parsed, served, now=now))
            return plain[1]
        resolved = resolve(
            policy,
            hdrs,
            tenant,
            parsed,
            served,
            now=now,
            tasks=self.tasks,
            reject_disallowed=reject_disallowed,
        )
        if resolved.source == UNKNOWN_CLASS_SOURCE:
            cls = resolved.slo.slo_class
            self.unknown_classes[cls] = self.unknown_classes.get(cls, 0) + 1
        elif resolved.source == DOWNGRADED_SOURCE and tenant is not None:
            self.downgraded[tenant.name] = self.downgraded.get(tenant.name, 0) + 1
        return resolved

    async def share(
        self,
        resolved: Resolved,
        headers: Iterable[tuple[str, str]],
        tenant: Tenant | None,
        parsed: ParsedRequest,
        *,
        served: str,
        now: float,
        policy: SloPolicy,
        reject_disallowed: bool = False,
    ) -> Resolved:
        """Cluster mode: a task call resolved on the local task clock, taken through the shared one (its
        start, SLA and step as the cluster knows them) and resolved again when they differ."""
        call = resolved.task
        if call is None or self.shared is None:
            return resolved
        got = await self.shared.call(call.key, call.task_type, call.sla_s, self.tasks.settings.idle_expiry_s)
        if got is None:
            return resolved  # Redis does not answer: the local clock's answer
        age, task_type, sla_s, step = got
        start = now - age
        if (
            step == call.step
            and task_type == call.task_type
            and sla_s == call.sla_s
            and abs(start - call.start) < SAME_START_S
        ):
            return resolved
        self.tasks.adopt(call.key, task_type=task_type, sla_s=sla_s, start=start, calls=step, now=now)
        hdrs: SloHeaders = parse_slo_headers(headers)
        return resolve(
            policy,
            hdrs,
            tenant,
            parsed,
            served,
            now=now,
            tasks=self.tasks,
            reject_disallowed=reject_disallowed,
        )

    def on_finish(
        self,
        call: TaskCall | None,
        slo_class: str,
        error: BerthError | None,
        *,
        ok: bool,
        arrival: float,
        dispatched_at: float | None,
        first_token_at: float | None,
        finished_at: float | None,
    ) -> None:
        """A request finished (any outcome): learn its task step's duration, or give the step back when
        it never ran; count a gateway rejection by class and reason."""
        if call is not None:
            if ok and finished_at is not None:
                end = finished_at
                if call.metric is TaskMetric.TTFT and first_token_at is not None:
                    end = first_token_at
                self.tasks.finished(call, end - arrival)
            elif dispatched_at is None:
                self.tasks.abandon(call)
                if self.shared is not None:
                    self.shared.abandon(call.key, call.step)
        if error is not None and error.source is ErrorSource.GATEWAY:
            key = (slo_class, error.code)
            self.rejections[key] = self.rejections.get(key, 0) + 1

    def rejections_by_class(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (cls, reason), n in sorted(self.rejections.items()):
            out.setdefault(cls, {})[reason] = n
        return out

    def document(
        self,
        policy: SloPolicy,
        admission: dict[str, dict[str, int]],
        totals: dict[str, tuple[int, int]],
    ) -> dict[str, Any]:
        """The `slo` part of /admin/fleet: per class its definition, goodput since start, admission
        outcomes and rejections by reason; and the task clock."""
        rejected = self.rejections_by_class()
        names = [*policy.classes, *sorted(set(totals) | set(admission) | set(rejected) - set(policy.classes))]
        classes: dict[str, Any] = {}
        for name in dict.fromkeys(names):
            c = policy.get(name)
            finished, met = totals.get(name, (0, 0))
            classes[name] = {
                "kind": None if c is None else c.kind.value,
                "band": None if c is None else c.band,
                "targets": None
                if c is None
                else {
                    "ttft_ms": c.ttft_ms,
                    "itl_ms": c.itl_ms,
                    "e2e_ms": c.e2e_ms,
                    "task_sla_ms": c.task_sla_ms,
                },
                "on_infeasible": None if c is None else c.on_infeasible.value,
                "finished": finished,
                "met": met,
                "goodput": met / finished if finished else None,
                "admission": admission.get(name, {}),
                "rejections": rejected.get(name, {}),
            }
        t = self.tasks
        return {
            "default_class": policy.default_class,
            "classes": classes,
            "tasks": {
                "active": len(t),
                "expired": t.expired,
                "evicted": t.evicted,
                "max_tasks": t.settings.max_tasks,
                "idle_expiry_s": t.settings.idle_expiry_s,
                "step_seconds": t.learned(),
            },
        }
