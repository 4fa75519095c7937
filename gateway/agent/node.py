"""The agent's commands: node, list, plan, start, stop, logs.

Every command first takes the node lock and re-adopts the instance records (`_refresh`): an engine whose
process (pid + start time) or unit still runs is kept, and a ready one is probed on its health route;
one that is gone is marked failed (stopped, if it was being stopped) and whatever it left running is
killed. The lock is held while the node's books change and released while a start waits for the
engine's health or a stop waits for processes to end, so `list` and `node` answer during a load; the
record in state `starting` (or `stopping`) keeps the memory booked meanwhile, and a device with a load
in progress takes no other load.

The re-adoption is `adoption` (the base of `Agent`), a start's admission `admission`.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from typing import Final

import msgspec.structs

from gateway.agent import ledger
from gateway.agent.admission import Admission
from gateway.agent.adoption import LEFTOVER_GRACE_S
from gateway.agent.contract import (
    AgentError,
    ErrorCode,
    InstanceState,
    ListReport,
    LogsReport,
    NodeReport,
    PlanReport,
    StartReport,
    StopReport,
)
from gateway.agent.loading import wait_ready
from gateway.agent.state import ID_PATTERN
from gateway.agent.view import device_report, instance_report, plan_report

#: Lines of engine output carried in a failed start's error.
ERROR_LOG_LINES: Final = 20


class Agent(Admission):
    """One invocation's agent: the configuration, a backend, NVML (or None), the state directory.

    `probe` (the health check) and `now` (Unix seconds for records) are injectable for tests.
    """

    # ------------------------------------------------------------------------------------ commands

    def node(self) -> NodeReport:
        with self.state.lock():
            view = self._refresh()
        book = ledger.books(view.slots(self.cfg.headroom_bytes), view.holdings())
        devices = [
            device_report(
                d,
                book[d.name],
                headroom_bytes=self.cfg.headroom_bytes,
                settled_at=self._settling_until(d.name, view),
            )
            for d in view.devices
        ]
        return NodeReport(
            node=socket.gethostname(),
            backend=self.cfg.backend,
            nvml=self.nvml is not None,
            total_bytes=sum(d.total_bytes for d in devices),
            reserved_bytes=sum(d.reserved_bytes for d in devices),
            free_bytes=sum(d.free_bytes for d in devices),
            devices=devices,
            models=sorted(self.cfg.models),
        )

    def instances(self) -> ListReport:
        with self.state.lock():
            view = self._refresh()
        records = sorted(view.records, key=lambda r: (not r.resident, r.started_at, r.id))
        return ListReport(node=socket.gethostname(), instances=[instance_report(r, view) for r in records])

    def plan(self, model_name: str, *, config: str | None = None) -> PlanReport:
        model = self._model(model_name, config)
        with self.state.lock():
            view = self._refresh()
        return plan_report(model, view, self.cfg.headroom_bytes)

    def start(
        self,
        model_name: str,
        *,
        instance_id: str | None = None,
        evict: Sequence[str] = (),
        drain_timeout_s: float | None = None,
        config: str | None = None,
    ) -> StartReport:
        """Plan, stop the `evict` victims (checked first: all ready, and enough), write the record, launch,
        and wait for health. Raises AgentError with the reason when it does not fit or the load fails.
        `config` names the model's instance configuration (None: its default one)."""
        model = self._model(model_name, config)
        if instance_id is not None and not ID_PATTERN.match(instance_id):
            raise AgentError.of(
                ErrorCode.BAD_ARGUMENTS,
                f"instance id {instance_id!r} must match {ID_PATTERN.pattern}",
                instance=instance_id,
            )
        if evict:
            with self.state.lock():
                self._check_eviction(model, self._refresh(), evict)
        timeout = self.cfg.stop_timeout_s if drain_timeout_s is None else drain_timeout_s
        evicted = [self._stop(victim, timeout, reason="evicted", only_ready=True) for victim in evict]
        with self.state.lock():
            view = self._refresh()
            rec = self._admit(model, view, instance_id)
            self.state.write(rec)  # before launch: a crash from here on leaves a record to re-adopt
            launched = time.monotonic()
            try:
                rec = self.backend.launch(rec, rec.env)
            except AgentError as e:
                self.state.write(self._ended(rec, InstanceState.FAILED, e.body.message))
                raise
            self.state.write(rec)
        outcome = wait_ready(self.backend, rec, model, self._probe)
        with self.state.lock():
            current = self.state.read(rec.id)
            tail = self.backend.logs(rec, ERROR_LOG_LINES)[1] if outcome is not None else []
            if current is None or current.state is not InstanceState.STARTING:
                # A `stop` took the instance over during its load (it owns the record now).
                raise AgentError.of(
                    ErrorCode.LOAD_CANCELLED,
                    f"instance {rec.id} was {current.state if current else 'removed'} during its load",
                    model=model.name,
                    instance=rec.id,
                    log_tail=tail,
                )
            if outcome is not None:
                self._stop_quietly(rec, LEFTOVER_GRACE_S)
                self.state.write(self._ended(rec, InstanceState.FAILED, outcome.message))
                raise AgentError.of(
                    outcome.code, outcome.message, model=model.name, instance=rec.id, log_tail=tail
                )
            rec = msgspec.structs.replace(
                current,
                state=InstanceState.READY,
                ready_at=self._now(),
                load_s=round(time.monotonic() - launched, 3),
                owner_pid=None,
                owner_start=None,
            )
            self.state.write(rec)
            view = self._view_of([rec])
        return StartReport(
            instance=instance_report(rec, view, healthy=True),
            load_s=rec.load_s or 0.0,
            evicted=evicted,
        )

    def stop(self, instance_id: str, *, drain_timeout_s: float | None = None) -> StopReport:
        timeout = self.cfg.stop_timeout_s if drain_timeout_s is None else drain_timeout_s
        return self._stop(instance_id, timeout, reason="stopped", only_ready=False)

    def _stop(self, instance_id: str, timeout: float, *, reason: str, only_ready: bool) -> StopReport:
        """Stop one instance (a victim of a start when `only_ready`); the lock is not held while its
        processes end, its `stopping` record keeps its memory booked meanwhile."""
        with self.state.lock():
            self._refresh()
            rec = self.state.read(instance_id)
            if rec is None:
                raise AgentError.of(
                    ErrorCode.UNKNOWN_INSTANCE, f"no instance {instance_id!r}", instance=instance_id
                )
            was = rec.state
            if not rec.resident:
                return StopReport(
                    id=rec.id,
                    state=rec.state,
                    stopped_at=rec.stopped_at or 0.0,
                    stop_s=0.0,
                    killed=False,
                    was=was,
                )
            if only_ready and rec.state is not InstanceState.READY:
                raise AgentError.of(
                    ErrorCode.BAD_ARGUMENTS,
                    f"cannot evict {rec.id}: it is {rec.state} (only ready instances are evicted)",
                    instance=rec.id,
                )
            rec = msgspec.structs.replace(
                rec, state=InstanceState.STOPPING, owner_pid=self._me[0], owner_start=self._me[1]
            )
            self.state.write(rec)
        began = time.monotonic()
        try:
            killed = self.backend.stop(rec, timeout)
        except AgentError as e:
            with self.state.lock():
                self.state.write(self._ended(rec, InstanceState.FAILED, e.body.message))
            raise
        with self.state.lock():
            done = self._ended(rec, InstanceState.STOPPED, reason)
            self.state.write(done)
        return StopReport(
            id=rec.id,
            state=InstanceState.STOPPED,
            stopped_at=done.stopped_at or 0.0,
            stop_s=round(time.monotonic() - began, 3),
            killed=killed,
            was=was,
        )

    def logs(self, instance_id: str, *, tail: int = 100) -> LogsReport:
        rec = self.state.read(instance_id)
        if rec is None:
            raise AgentError.of(
                ErrorCode.UNKNOWN_INSTANCE, f"no instance {instance_id!r}", instance=instance_id
            )
        source, lines = self.backend.logs(rec, max(0, tail))
        return LogsReport(id=rec.id, source=source, lines=lines)
