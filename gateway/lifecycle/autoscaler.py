"""The live autoscaler: the policy's `[autoscale]` run by the lifecycle manager, its decisions logged,
counted and kept for /admin/fleet and `berth top`.

`LiveAutoscaler` holds the shared `ScaleLoop` (`gateway.lifecycle.scaling`) while the policy has an
`[autoscale]` table: `sync_policy` follows reloads (a new table keeps the counters and cool-downs; a
policy without one stops autoscaling, a policy that adds one starts it); the manager feeds it arrivals
and finished requests, and calls `step` on its tick, which returns the lifecycle's actions to carry out.

Every decision record of the runner becomes one `autoscale_decision` log event (model, action, class,
configuration, count, the scaler's reason, the runner's outcome and note, dry_run) and one increment of
`berth_autoscale_decisions_total{model,action,reason,mode,outcome,config}` (`config`: a scale-out's
configuration from models.toml, `default` for the model's default, `-` for other actions). The `reason`
label is bounded: `min_instances` for what the bounds demanded, `scaler` for the scaler's own
decisions, and the runner's note when it clipped or refused one (`max_instances`, `scale_in_cooldown`,
...); the scaler's free text (with its figures) goes to the log and /admin/fleet only. Hysteresis
(scaling actions / scale-ups, Chiron) is counted per model from the acted decisions (and apart, what
dry-run would have done).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import structlog
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from gateway.core.slo import SloPolicy
from gateway.core.types import EndpointId, ModelName
from gateway.lifecycle.config_choice import PlanAhead
from gateway.lifecycle.instances import Action, InstanceState, Lifecycle
from gateway.lifecycle.scaling import ScaleLoop
from gateway.sched.autoscale import UNBOUNDED, Autoscale, DecisionRecord, ScaleCounters
from gateway.sched.perf import PerfCoefficients
from gateway.sched.plugins.autoscale.interface import FinishedCall, Reclass, ScaleIn, ScaleOut, allotted
from gateway.sched.request import SchedRequest
from gateway.sched.scheduler import Scheduler
from gateway.telemetry.attainment import meets_slo
from gateway.telemetry.records import FinishedRequest

log = structlog.get_logger("berth.autoscale")

#: Decisions kept for /admin/fleet and `berth top`.
RECENT: Final = 50

#: The runner's notes as bounded metric label values (anything else: "other").
_NOTE_KEYS: Final = (
    "max_instances",
    "no_free_devices",
    "scale_out_cooldown",
    "scale_in_cooldown",
    "reclass_cooldown",
    "min_instances",
    "config_choice_pending",
)
_NOTE_PREFIXES: Final = (
    ("instance is ", "not_ready"),
    ("already of that class", "same_class"),
    ("unknown model", "unknown_model"),
    ("unknown instance", "unknown_instance"),
    ("unknown configuration", "unknown_config"),
    ("count must be", "bad_count"),
    ("not a scale decision", "not_a_decision"),
)


@dataclass(frozen=True, slots=True)
class DecisionView:
    """One decision as /admin/fleet and the log show it."""

    at: float
    scaler: str
    model: str
    action: str  # scale_out | scale_in | reclass | none (the scaler raised)
    instance: str | None
    instance_class: str | None
    count: int
    reason: str  # the scaler's (or "min_instances")
    outcome: str  # acted | clipped | dry_run | refused | fault
    note: str  # the runner's why, when it clipped or refused
    config: str | None = None  # a scale-out's instance configuration (None: the model's default)

    def document(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "scaler": self.scaler,
            "model": self.model,
            "action": self.action,
            "instance": self.instance,
            "instance_class": self.instance_class,
            "count": self.count,
            "reason": self.reason,
            "outcome": self.outcome,
            "note": self.note,
            "config": self.config,
        }


def decision_view(r: DecisionRecord, model_of: Mapping[str, ModelName]) -> DecisionView:
    d = r.decision
    at, by, out, note = r.at, r.scaler, r.outcome, r.note
    if isinstance(d, ScaleOut):
        cls = d.instance_class.value
        return DecisionView(at, by, d.model, "scale_out", None, cls, d.count, d.reason, out, note, d.config)
    if isinstance(d, ScaleIn):
        model = model_of.get(d.instance, "-")
        return DecisionView(at, by, model, "scale_in", d.instance, None, 1, d.reason, out, note)
    if isinstance(d, Reclass):
        model = model_of.get(d.instance, "-")
        cls = d.to_class.value
        return DecisionView(at, by, model, "reclass", d.instance, cls, 1, d.reason, out, note)
    return DecisionView(at, by, "-", "none", None, None, 0, "", out, note)


def reason_label(v: DecisionView) -> str:
    """The bounded `reason` label of a decision (see the module docstring)."""
    if v.note:
        if v.note in _NOTE_KEYS:
            return v.note
        for prefix, key in _NOTE_PREFIXES:
            if v.note.startswith(prefix):
                return key
        return "scaler_raised" if v.action == "none" else "other"
    return "min_instances" if v.reason == "min_instances" else "scaler"


class AutoscaleMetrics:
    def __init__(self, registry: CollectorRegistry, autoscaler: LiveAutoscaler) -> None:
        self.decisions = Counter(
            "berth_autoscale_decisions",
            "Autoscaler decisions by model, action, bounded reason, mode (act | dry_run), runner's outcome, "
            "and a scale-out's instance configuration (default: the model's default; - for other actions)",
            ["model", "action", "reason", "mode", "outcome", "config"],
            registry=registry,
        )
        self.start_failures = Counter(
            "berth_autoscale_start_failures",
            "Instances the autoscaler asked for whose start failed, by model",
            ["model"],
            registry=registry,
        )
        registry.register(_AutoscaleCollector(autoscaler))


class _AutoscaleCollector:
    def __init__(self, autoscaler: LiveAutoscaler) -> None:
        self._a = autoscaler

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        inst, hyst, enabled = self._families()
        a = self._a
        if a.loop is not None:
            for (model, cls), n in sorted(a.instances_by_class().items()):
                inst.add_metric([model, cls], n)
            for mode, per_model in (("act", a.counters), ("dry_run", a.dry_counters)):
                for model, c in sorted(per_model.items()):
                    h = c.hysteresis
                    if h is not None:
                        hyst.add_metric([model, mode], h)
        enabled.add_metric([], 0.0 if a.loop is None else 1.0)
        yield inst
        yield hyst
        yield enabled

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "berth_autoscale_instances",
                "Serving instances (starting or ready) by model and instance class",
                labels=["model", "instance_class"],
            ),
            GaugeMetricFamily(
                "berth_autoscale_hysteresis",
                "Scaling actions / scale-up actions per model (1: only grows; 2: every start also retired)",
                labels=["model", "mode"],
            ),
            GaugeMetricFamily("berth_autoscale_enabled", "1 when the policy has an [autoscale] table"),
        )


class LiveAutoscaler:
    def __init__(
        self,
        core: Lifecycle,
        scheduler: Scheduler,
        registry: CollectorRegistry,
        *,
        ahead: PlanAhead | None = None,
        prior: Callable[[], PerfCoefficients] | None = None,
    ) -> None:
        """`ahead`: where the configuration choice is computed (the manager hands in a worker thread's,
        `ThreadPlans`: never on the event loop). `prior`: the gateway's telemetry
        prior (`[telemetry.prior]`, as it is now), which the choice plans with for a configuration
        telemetry has not fitted yet."""
        self._core = core
        self._scheduler = scheduler
        self._ahead = ahead
        self._prior = prior
        self.loop: ScaleLoop | None = None
        self._autoscale: Autoscale | None = None
        self.recent: deque[DecisionView] = deque(maxlen=RECENT)
        self.counters: dict[str, ScaleCounters] = {}
        self.dry_counters: dict[str, ScaleCounters] = {}
        self.start_failures: dict[str, int] = {}
        self.metrics = AutoscaleMetrics(registry, self)
        self.sync_policy()

    # ----------------------------------------------------------------- policy
    def sync_policy(self) -> None:
        """Follow the scheduler's policy: start, swap or stop the loop when its `[autoscale]` changed."""
        autoscale = self._scheduler.policy.autoscale
        if autoscale is self._autoscale:
            return
        self._autoscale = autoscale
        if autoscale is None:
            if self.loop is not None:
                log.info("autoscale_disabled")
            self.loop = None
            return
        unknown = sorted(set(autoscale.settings.bounds) - set(self._core.models()))
        if unknown:
            log.warning("autoscale_unknown_models", models=unknown)
        if self.loop is None:
            self.loop = ScaleLoop(
                autoscale, self._core, self._scheduler, prior=self._prior, ahead=self._ahead
            )
        else:
            self.loop.set_autoscale(autoscale)
        log.info(
            "autoscale_enabled",
            scaler=autoscale.scaler.name,
            dry_run=autoscale.settings.dry_run,
            interval_s=autoscale.settings.interval_s,
        )

    @property
    def dry_run(self) -> bool:
        return self._autoscale is not None and self._autoscale.settings.dry_run

    # ----------------------------------------------------------------- inputs
    def arrived(self, req: SchedRequest, now: float) -> None:
        if self.loop is not None:
            self.loop.arrived(req, now)

    def finished(self, r: FinishedRequest, slo: SloPolicy) -> None:
        """A finished request (the front's finish phase)."""
        if self.loop is None:
            return
        s = r.slo
        first = r.first_token_at
        decoding = sum(r.gaps)
        per_token = decoding / (r.output_tokens - 1) if r.output_tokens > 1 and decoding > 0 else None
        ttft = None if first is None else first - r.arrival
        has_target = s.ttft_ms is not None or s.itl_ms is not None or s.deadline_ms is not None
        met = (
            meets_slo(
                s,
                ok=r.ok,
                ttft_s=ttft,
                itl_s=per_token,
                e2e_s=r.finished_at - r.arrival,
            )
            if has_target
            else None
        )
        e2e, allotted_s = allotted(s, r.allotment)
        self.loop.finished(
            ModelName(r.model),
            FinishedCall(
                kind=slo.class_of(s.slo_class).kind,
                arrival=r.arrival,
                finished_at=r.finished_at,
                allotted_s=allotted_s,
                took_s=r.finished_at - r.arrival if e2e else ttft,
                slo_met=met,
                id=r.request,
            ),
        )

    def start_failed(self, model: ModelName) -> None:
        self.start_failures[model] = self.start_failures.get(model, 0) + 1
        self.metrics.start_failures.labels(model).inc()

    # ----------------------------------------------------------------- the step
    def step(self, now: float, endpoints: Mapping[str, EndpointId]) -> list[Action]:
        """One tick: the loop's actions (a round only when its interval is due), its records reported."""
        self.sync_policy()
        if self.loop is None:
            return []
        actions = self.loop.step(now, endpoints)
        self._report(self.loop.runner.take_records())
        return actions

    def _report(self, records: list[DecisionRecord]) -> None:
        model_of = {i.id: i.model for i in self._core.instances()}
        mode = "dry_run" if self.dry_run else "act"
        for r in records:
            v = decision_view(r, model_of)
            self.recent.append(v)
            config = (v.config or "default") if v.action == "scale_out" else "-"
            self.metrics.decisions.labels(v.model, v.action, reason_label(v), mode, v.outcome, config).inc()
            if v.outcome in ("acted", "clipped", "dry_run"):
                per = (self.dry_counters if v.outcome == "dry_run" else self.counters).setdefault(
                    v.model, ScaleCounters()
                )
                if v.action == "scale_out":
                    per.started += v.count
                elif v.action == "scale_in":
                    per.retired += 1
                elif v.action == "reclass":
                    per.reclassed += 1
            log.info(
                "autoscale_decision",
                scaler=v.scaler,
                model=v.model,
                action=v.action,
                instance=v.instance,
                instance_class=v.instance_class,
                config=v.config,
                count=v.count,
                reason=v.reason,
                outcome=v.outcome,
                note=v.note,
                dry_run=mode == "dry_run",
            )

    # ----------------------------------------------------------------- views
    def instances_by_class(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for i in self._core.instances():
            if i.state in (InstanceState.PENDING, InstanceState.STARTING, InstanceState.READY):
                key = (str(i.model), i.instance_class.value)
                out[key] = out.get(key, 0) + 1
        return out

    def document(self) -> dict[str, Any] | None:
        """The autoscaler part of /admin/fleet's lifecycle document (None: the policy has none)."""
        a = self._autoscale
        if a is None or self.loop is None:
            return None
        s = a.settings
        models = sorted(set(self._core.models()) | set(s.bounds))
        bounds = {}
        for m in models:
            b = s.bounds_of(m)
            bounds[m] = {
                "min_instances": b.min_instances,
                "max_instances": None if b.max_instances >= UNBOUNDED else b.max_instances,
            }

        def counts(per: dict[str, ScaleCounters]) -> dict[str, Any]:
            return {
                m: {
                    "started": c.started,
                    "retired": c.retired,
                    "reclassed": c.reclassed,
                    "hysteresis": c.hysteresis,
                }
                for m, c in sorted(per.items())
            }

        runner = self.loop.runner.counters
        return {
            "scaler": a.scaler.name,
            "dry_run": s.dry_run,
            "interval_s": s.interval_s,
            "scale_out_cooldown_s": s.scale_out_cooldown_s,
            "scale_in_cooldown_s": s.scale_in_cooldown_s,
            "reclass_cooldown_s": s.reclass_cooldown_s,
            "bounds": bounds,
            "counters": counts(self.counters),
            "dry_run_counters": counts(self.dry_counters),
            "refused": runner.refused,
            "faults": runner.faults,
            "start_failures": dict(sorted(self.start_failures.items())),
            "recent": [v.document() for v in reversed(self.recent)],
        }
