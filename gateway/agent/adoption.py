"""The base of every agent command: the configuration, the backend, NVML and the state directory, and
the re-adoption of the instance records each command starts with (under the node lock).

An engine whose process (pid + start time) or unit still runs is kept, and a ready one is probed on its
health route; one that is gone is marked failed (stopped, if it was being stopped) and whatever it left
running is killed. Records of instances that ended are forgotten after `RECORD_RETENTION_S`.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Final

import msgspec.structs

from gateway.agent import health, inventory, procs
from gateway.agent.backends import Backend
from gateway.agent.config import AgentConfig, ModelSpec
from gateway.agent.contract import AgentError, ErrorCode, InstanceState
from gateway.agent.state import InstanceRecord, StateDir
from gateway.agent.view import NodeView

#: SIGTERM -> SIGKILL grace for what a dead engine left behind (it is failed already).
LEFTOVER_GRACE_S: Final = 2.0
#: Records (and logs) of stopped or failed instances are forgotten this long after they ended.
RECORD_RETENTION_S: Final = 7 * 86400.0


class Adoption:
    """An agent's node as one invocation finds it: `_refresh` re-adopts the records (see `Agent`)."""

    def __init__(
        self,
        cfg: AgentConfig,
        backend: Backend,
        *,
        nvml: inventory.Nvml | None = None,
        probe: Callable[[str], bool] = health.healthy,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.backend = backend
        self.nvml = nvml
        self.state = StateDir(cfg.state_dir)
        self._probe = probe
        self._now = now
        me = os.getpid()
        self._me = (me, procs.start_ticks(me) or 0)

    # ------------------------------------------------------------------------------------ re-adoption

    def _refresh(self) -> NodeView:
        """Re-adopt every record (caller holds the lock); writes back the ones whose state changed."""
        records = []
        healthy: dict[str, bool] = {}
        for rec in self.state.records():
            if not rec.resident and (rec.stopped_at or 0.0) < self._now() - RECORD_RETENTION_S:
                self.state.remove(rec.id)
                continue
            new = self._readopt(rec, healthy)
            if new is not rec:
                self.state.write(new)
            records.append(new)
        return self._view_of(records, healthy)

    def _readopt(self, rec: InstanceRecord, healthy: dict[str, bool]) -> InstanceRecord:
        if not rec.resident:
            return rec
        owner_alive = (
            rec.owner_pid is not None
            and rec.owner_start is not None
            and procs.alive(rec.owner_pid, rec.owner_start)
        )
        if owner_alive:
            return rec  # its `start` (waiting for health) or `stop` is at work and will write the outcome
        if rec.state is InstanceState.STOPPING:
            self._stop_quietly(rec, LEFTOVER_GRACE_S)  # that `stop` died: finish it
            return self._ended(rec, InstanceState.STOPPED, rec.reason or "stopped")
        if not self.backend.running(rec):
            self._stop_quietly(rec, LEFTOVER_GRACE_S)  # leftovers of a dead leader (EngineCore, workers)
            what = "during its load" if rec.state is InstanceState.STARTING else "after it was ready"
            return self._ended(rec, InstanceState.FAILED, f"engine exited {what}")
        if rec.state is InstanceState.STARTING:
            if self._probe(rec.health_url):
                now = self._now()
                return msgspec.structs.replace(
                    rec, state=InstanceState.READY, ready_at=now, owner_pid=None, owner_start=None
                )
            if self._now() > rec.load_deadline:
                self._stop_quietly(rec, LEFTOVER_GRACE_S)
                return self._ended(rec, InstanceState.FAILED, "load deadline passed after its start was gone")
            return rec
        healthy[rec.id] = self._probe(rec.health_url)
        return rec

    def _view_of(self, records: list[InstanceRecord], healthy: dict[str, bool] | None = None) -> NodeView:
        devices = inventory.devices(self.cfg.devices, self.nvml)
        measured: dict[str, dict[str, int]] = {}
        if self.nvml is not None:
            for r in records:
                if r.resident:
                    m = inventory.measured_bytes(self.nvml, devices, self.backend.pids(r))
                    if m:
                        measured[r.id] = m
        return NodeView(devices, records, measured, healthy or {})

    # ------------------------------------------------------------------------------------ helpers

    def _model(self, name: str, config: str | None = None) -> ModelSpec:
        """The model as configuration `config` runs it (None: its default configuration)."""
        model = self.cfg.models.get(name)
        if model is None:
            known = ", ".join(sorted(self.cfg.models)) or "none"
            raise AgentError.of(
                ErrorCode.UNKNOWN_MODEL,
                f"model {name!r} is not in {self.cfg.models_file} (known: {known})",
                model=name,
            )
        try:
            return model.configured(config)
        except KeyError:
            known = ", ".join(model.config_names) or "it lists no [[models.configs]]"
            raise AgentError.of(
                ErrorCode.UNKNOWN_CONFIG,
                f"model {name} has no configuration {config!r} (known: {known})",
                model=name,
            ) from None

    def _ended(self, rec: InstanceRecord, state: InstanceState, reason: str) -> InstanceRecord:
        return msgspec.structs.replace(
            rec, state=state, reason=reason, stopped_at=self._now(), owner_pid=None, owner_start=None
        )

    def _stop_quietly(self, rec: InstanceRecord, grace_s: float) -> None:
        with contextlib.suppress(AgentError):  # reported by the next invocation that finds its processes
            self.backend.stop(rec, grace_s)
