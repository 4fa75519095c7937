"""No admission control: every request is queued (subject to its class's queue bound)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import msgspec
from msgspec import Meta

from gateway.core.slo import SloPolicy
from gateway.sched.interfaces import ADMIT, AdmitDecision
from gateway.sched.plugins.admission.common import class_bound
from gateway.sched.registry import BuildContext, PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import FleetSnapshot


class AdmitAllParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    retry_after_s: Annotated[float, Meta(ge=0.0)] = 1.0  # Retry-After of a class-queue rejection


class AdmitAll:
    name = "admit-all"
    rechecks = False  # its recheck admits: the scheduler need not ask

    def __init__(self, params: AdmitAllParams, slo: SloPolicy) -> None:
        self.params = params
        self._slo = slo

    def admit(
        self, req: SchedRequest, snap: FleetSnapshot, queued_in_class: Callable[[str], int]
    ) -> AdmitDecision:
        return class_bound(self._slo, req, queued_in_class, self.params.retry_after_s) or ADMIT

    def recheck(self, req: SchedRequest, snap: FleetSnapshot) -> AdmitDecision:
        return ADMIT


def _build(p: AdmitAllParams, ctx: BuildContext) -> AdmitAll:
    return AdmitAll(p, ctx.slo)


SPEC = PluginSpec(
    PluginKind.ADMITTER, "admit-all", AdmitAllParams, _build, "queue every request (class bounds only)"
)
