"""The agent's commands: node, list, plan, start, stop, logs.

Every command first takes the node lock and re-adopts the instance records (`_refresh`): an engine whose
process (pid + start time) or unit still runs is kept, and a ready one is probed on its health route;
one that is gone is marked failed (stopped, if it was being stopped) and whatever it left running is
killed. The lock is held while the node's books change and released while a start waits for the
engine's health or a stop waits for processes to end, so `list` and `node` answer during a load; the
record in state `starting` (or `stopping`) keeps the memory booked meanwhile, and a device with a load
in progress takes no other load.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec.structs

from gateway.agent import health, inventory, ledger, procs
from gateway.agent.backends import Backend
from gateway.agent.config import AgentConfig, ModelSpec, render
from gateway.agent.contract import (
    AgentError,
    DeviceFit,
    DeviceReport,
    ErrorBody,
    ErrorCode,
    InstanceReport,
    InstanceState,
    ListReport,
    LogsReport,
    NodeReport,
    PlanReport,
    StartReport,
    StopReport,
    Victim,
)
from gateway.agent.ports import free_port
from gateway.agent.state import ID_PATTERN, InstanceRecord, StateDir
from gateway.agent.wait import poll_until

#: How often a start looks at its loading engine (health, exit, CPU progress).
LOAD_POLL_S: Final = 0.1
#: SIGTERM -> SIGKILL grace for what a dead engine left behind (it is failed already).
LEFTOVER_GRACE_S: Final = 2.0
#: Lines of engine output carried in a failed start's error.
ERROR_LOG_LINES: Final = 20

_SLUG = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True, slots=True)
class _View:
    """The node as one invocation sees it after re-adoption."""

    devices: list[inventory.Device]
    records: list[InstanceRecord]
    measured: dict[str, dict[str, int]]  # instance id -> device -> bytes (NVML only)
    healthy: dict[str, bool]  # instance id -> the probe of this invocation

    @property
    def resident(self) -> list[InstanceRecord]:
        return [r for r in self.records if r.resident]

    def slots(self, headroom: int) -> list[ledger.DeviceSlot]:
        return [ledger.DeviceSlot(d.name, d.index, max(0, d.total_bytes - headroom)) for d in self.devices]

    def holdings(self) -> list[ledger.Holding]:
        return [
            ledger.Holding(
                id=r.id,
                devices=r.devices,
                admitted_bytes=r.memory_bytes,
                measured_bytes=self.measured.get(r.id, {}),
                loading=r.state is InstanceState.STARTING,
                evictable=r.state is InstanceState.READY,
            )
            for r in self.resident
        ]


def _failure(code: ErrorCode, message: str) -> ErrorBody:
    return ErrorBody(code=code, message=message)


class Agent:
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

    # ------------------------------------------------------------------------------------ commands

    def node(self) -> NodeReport:
        with self.state.lock():
            view = self._refresh()
        book = ledger.books(view.slots(self.cfg.headroom_bytes), view.holdings())
        devices = [self._device_report(d, book[d.name], view) for d in view.devices]
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
        return ListReport(
            node=socket.gethostname(), instances=[self._instance_report(r, view) for r in records]
        )

    def plan(self, model_name: str) -> PlanReport:
        model = self._model(model_name)
        with self.state.lock():
            view = self._refresh()
        return self._plan(model, view)

    def start(
        self,
        model_name: str,
        *,
        instance_id: str | None = None,
        evict: Sequence[str] = (),
        drain_timeout_s: float | None = None,
    ) -> StartReport:
        model = self._model(model_name)
        if instance_id is not None and not ID_PATTERN.match(instance_id):
            raise AgentError.of(
                ErrorCode.BAD_ARGUMENTS,
                f"instance id {instance_id!r} must match {ID_PATTERN.pattern}",
                instance=instance_id,
            )
        if evict:
            with self.state.lock():
                self._check_eviction(model, self._refresh(), evict)
        evicted = [self.stop(victim, drain_timeout_s=drain_timeout_s, _victim=True) for victim in evict]
        with self.state.lock():
            view = self._refresh()
            rec = self._admit(model, view, instance_id)
            self.state.write(rec)  # before launch: a crash from here on leaves a record to re-adopt
            try:
                rec = self.backend.launch(rec, rec.env)
            except AgentError as e:
                self.state.write(self._ended(rec, InstanceState.FAILED, e.body.message))
                raise
            self.state.write(rec)
        launched = self._now()
        outcome = self._wait_ready(rec, model)
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
            ready_at = self._now()
            rec = msgspec.structs.replace(
                current,
                state=InstanceState.READY,
                ready_at=ready_at,
                load_s=round(ready_at - launched, 3),
                owner_pid=None,
                owner_start=None,
            )
            self.state.write(rec)
            view = self._view_of([rec])
        return StartReport(
            instance=self._instance_report(rec, view, healthy=True),
            load_s=rec.load_s or 0.0,
            evicted=evicted,
        )

    def stop(
        self, instance_id: str, *, drain_timeout_s: float | None = None, _victim: bool = False
    ) -> StopReport:
        timeout = self.cfg.stop_timeout_s if drain_timeout_s is None else drain_timeout_s
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
            if _victim and rec.state is not InstanceState.READY:
                raise AgentError.of(
                    ErrorCode.BAD_ARGUMENTS,
                    f"cannot evict {rec.id}: it is {rec.state} (only ready instances are evicted)",
                    instance=rec.id,
                )
            rec = msgspec.structs.replace(
                rec, state=InstanceState.STOPPING, owner_pid=self._me[0], owner_start=self._me[1]
            )
            self.state.write(rec)
        began = self._now()
        try:
            killed = self.backend.stop(rec, timeout)
        except AgentError as e:
            with self.state.lock():
                self.state.write(self._ended(rec, InstanceState.FAILED, e.body.message))
            raise
        with self.state.lock():
            done = self._ended(rec, InstanceState.STOPPED, "evicted" if _victim else "stopped")
            self.state.write(done)
        return StopReport(
            id=rec.id,
            state=InstanceState.STOPPED,
            stopped_at=done.stopped_at or 0.0,
            stop_s=round((done.stopped_at or began) - began, 3),
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

    # ------------------------------------------------------------------------------------ re-adoption

    def _refresh(self) -> _View:
        """Re-adopt every record (caller holds the lock); writes back the ones whose state changed."""
        records = []
        healthy: dict[str, bool] = {}
        for rec in self.state.records():
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
            if self._probe(rec.url + rec.health_path):
                now = self._now()
                return msgspec.structs.replace(
                    rec, state=InstanceState.READY, ready_at=now, owner_pid=None, owner_start=None
                )
            if self._now() > rec.load_deadline:
                self._stop_quietly(rec, LEFTOVER_GRACE_S)
                return self._ended(rec, InstanceState.FAILED, "load deadline passed after its start was gone")
            return rec
        healthy[rec.id] = self._probe(rec.url + rec.health_path)
        return rec

    def _view_of(self, records: list[InstanceRecord], healthy: dict[str, bool] | None = None) -> _View:
        devices = inventory.devices(self.cfg.devices, self.nvml)
        measured: dict[str, dict[str, int]] = {}
        if self.nvml is not None:
            for r in records:
                if r.resident:
                    m = inventory.measured_bytes(self.nvml, devices, self.backend.pids(r))
                    if m:
                        measured[r.id] = m
        return _View(devices, records, measured, healthy or {})

    # ------------------------------------------------------------------------------------ admission

    def _plan(self, model: ModelSpec, view: _View) -> PlanReport:
        slots = view.slots(self.cfg.headroom_bytes)
        holdings = view.holdings()
        book = ledger.books(slots, holdings)
        required = model.memory_bytes
        chosen = ledger.choose(book, required, model.devices)
        per_device = [self._fit(b, required) for b in book.values()]
        victims = [
            Victim(
                id=h.id,
                model=next(r.model for r in view.resident if r.id == h.id),
                state=next(r.state for r in view.resident if r.id == h.id),
                devices=list(h.devices),
                frees_bytes=max(h.reserved_on(d) for d in h.devices) if h.devices else 0,
                idle=h.evictable,
            )
            for h in holdings
        ]
        if chosen is not None:
            return PlanReport(
                model=model.name,
                fits=True,
                devices=chosen,
                required_bytes=required,
                devices_needed=model.devices,
                per_device=per_device,
                evict=[],
                evict_devices=chosen,
                victims=victims,
                reason=f"fits on {', '.join(chosen)}",
            )
        eviction = ledger.plan_eviction(slots, holdings, required, model.devices)
        reason = self._why_not(model, book)
        if eviction is not None:
            reason += (
                f"; stopping {', '.join(eviction.victims)} would make room on {', '.join(eviction.devices)}"
            )
        else:
            reason += "; stopping ready instances would not make room"
        return PlanReport(
            model=model.name,
            fits=False,
            devices=[],
            required_bytes=required,
            devices_needed=model.devices,
            per_device=per_device,
            evict=list(eviction.victims) if eviction is not None else None,
            evict_devices=eviction.devices if eviction is not None else [],
            victims=victims,
            reason=reason,
        )

    def _admit(self, model: ModelSpec, view: _View, instance_id: str | None) -> InstanceRecord:
        """The record of a new instance of `model`, on devices that admit it now (caller holds the lock)."""
        if model.devices > len(view.devices):
            raise AgentError.of(
                ErrorCode.TOO_FEW_DEVICES,
                f"model {model.name} needs {model.devices} devices; this node has {len(view.devices)}",
                model=model.name,
            )
        book = ledger.books(view.slots(self.cfg.headroom_bytes), view.holdings())
        required = model.memory_bytes
        chosen = ledger.choose(book, required, model.devices)
        if chosen is None:
            fits = [self._fit(b, required) for b in book.values()]
            unloaded = {b.slot.name: b for b in book.values() if b.loading is None}
            would = [b for b in book.values() if b.reserved_bytes + required <= b.slot.capacity_bytes]
            if len(would) >= model.devices and len(unloaded) < len(book):
                busy = next(b.loading for b in book.values() if b.loading is not None)
                raise AgentError.of(
                    ErrorCode.DEVICE_BUSY,
                    f"{self._why_not(model, book)}; a load is in progress there ({busy})",
                    model=model.name,
                    devices=fits,
                    loading=busy,
                )
            raise AgentError.of(
                ErrorCode.DOES_NOT_FIT, self._why_not(model, book), model=model.name, devices=fits
            )
        self._settle(chosen, view, required, model)
        port = free_port(self.cfg.port_range, self.cfg.host, {r.port for r in view.resident})
        if port is None:
            lo, hi = self.cfg.port_range
            raise AgentError.of(ErrorCode.NO_PORT, f"no free port in {lo}-{hi}", model=model.name)
        iid = instance_id or f"{_SLUG.sub('-', model.name).strip('-.') or 'model'}-{port}"
        if any(r.id == iid for r in view.resident):
            raise AgentError.of(
                ErrorCode.DUPLICATE_INSTANCE, f"instance {iid} exists and is resident", instance=iid
            )
        indices = [next(d.index for d in view.devices if d.name == name) for name in chosen]
        values = {
            "port": str(port),
            "model": model.name,
            "devices": ",".join(str(i) for i in indices),
            "host": self.cfg.host,
            "id": iid,
            "tp": str(model.devices),
        }
        env = {k: render(v, values) for k, v in model.env.items()}
        env["CUDA_VISIBLE_DEVICES"] = values["devices"]
        now = self._now()
        host = self.cfg.advertise_host
        url_host = f"[{host}]" if ":" in host else host
        return InstanceRecord(
            id=iid,
            model=model.name,
            engine=str(model.engine),
            state=InstanceState.STARTING,
            backend=self.backend.name,
            host=self.cfg.host,
            url=f"http://{url_host}:{port}",
            port=port,
            devices=tuple(chosen),
            device_indices=tuple(indices),
            memory_bytes=required,
            argv=tuple(render(a, values) for a in model.command),
            env=env,
            health_path=model.health_path,
            started_at=now,
            load_deadline=now + model.load_timeout_s,
            log_file=str(self.state.log_path(iid)) if self.backend.name == "process" else None,
            owner_pid=self._me[0],
            owner_start=self._me[1],
        )

    def _check_eviction(self, model: ModelSpec, view: _View, evict: Sequence[str]) -> None:
        """Refuse a start before stopping anything when its victims are not all ready, or when the model
        would not fit even with them gone (nobody is evicted for nothing)."""
        by_id = {r.id: r for r in view.records}
        for victim in evict:
            rec = by_id.get(victim)
            if rec is None:
                raise AgentError.of(ErrorCode.UNKNOWN_INSTANCE, f"no instance {victim!r}", instance=victim)
            if rec.state is not InstanceState.READY:
                raise AgentError.of(
                    ErrorCode.BAD_ARGUMENTS,
                    f"cannot evict {victim}: it is {rec.state} (only ready instances are evicted)",
                    instance=victim,
                )
        gone = set(evict)
        rest = [h for h in view.holdings() if h.id not in gone]
        book = ledger.books(view.slots(self.cfg.headroom_bytes), rest)
        if (
            model.devices <= len(view.devices)
            and ledger.choose(book, model.memory_bytes, model.devices) is None
        ):
            raise AgentError.of(
                ErrorCode.DOES_NOT_FIT,
                f"even without {', '.join(evict)}: {self._why_not(model, book)}",
                model=model.name,
                devices=[self._fit(b, model.memory_bytes) for b in book.values()],
            )

    def _settle(self, chosen: list[str], view: _View, required: int, model: ModelSpec) -> None:
        """Wait until the chosen devices are free of stopped engines (bounded by release_wait_s).

        With NVML: until it measures `required` bytes free on each (engines' own "freed" reports are not
        trusted). Without: until release_wait_s has passed since the last stop on each.
        """
        if self.nvml is not None:

            def released() -> bool:
                devs = {d.name: d for d in inventory.devices(self.cfg.devices, self.nvml)}
                return all((devs[n].physical_free_bytes or 0) >= required for n in chosen if n in devs)

            if not poll_until(released, self.cfg.release_wait_s, interval_s=0.2):
                devs = {d.name: d for d in inventory.devices(self.cfg.devices, self.nvml)}
                short = ", ".join(
                    f"{n}: {devs[n].physical_free_bytes} bytes free by NVML"
                    for n in chosen
                    if n in devs and (devs[n].physical_free_bytes or 0) < required
                )
                raise AgentError.of(
                    ErrorCode.MEMORY_NOT_RELEASED,
                    f"model {model.name} needs {required} bytes per device; after "
                    f"{self.cfg.release_wait_s}s NVML still sees too little free ({short})",
                    model=model.name,
                )
            return
        until = max((self._settled_at(n, view) or 0.0) for n in chosen)
        wait = until - self._now()
        if wait > 0:
            time.sleep(wait)  # the bounded wait itself: without NVML there is nothing to observe

    def _settled_at(self, device: str, view: _View) -> float | None:
        stops = [
            r.stopped_at
            for r in view.records
            if r.stopped_at is not None and device in r.devices and (r.pid is not None or r.unit is not None)
        ]
        return max(stops) + self.cfg.release_wait_s if stops else None

    def _wait_ready(self, rec: InstanceRecord, model: ModelSpec) -> ErrorBody | None:
        """Poll the loading engine until its health answers (None) or the load fails (why)."""
        url = rec.url + rec.health_path
        deadline = time.monotonic() + model.load_timeout_s
        last_cpu = -1
        progress_at = time.monotonic()
        while True:
            if not self.backend.running(rec):
                status = self.backend.exit_status(rec)
                how = f" with status {status}" if status is not None else ""
                return _failure(ErrorCode.EARLY_EXIT, f"engine exited{how} before {rec.health_path} answered")
            if self._probe(url):
                return None
            now = time.monotonic()
            if now >= deadline:
                return _failure(
                    ErrorCode.LOAD_TIMEOUT, f"{rec.health_path} did not answer within {model.load_timeout_s}s"
                )
            cpu = procs.cpu_ticks(self.backend.pids(rec))
            if cpu != last_cpu:
                last_cpu, progress_at = cpu, now
            elif now - progress_at >= model.stall_timeout_s:
                return _failure(
                    ErrorCode.STALLED,
                    f"the engine used no CPU for {model.stall_timeout_s}s before {rec.health_path} answered",
                )
            time.sleep(min(LOAD_POLL_S, max(0.0, deadline - now)))

    # ------------------------------------------------------------------------------------ helpers

    def _model(self, name: str) -> ModelSpec:
        model = self.cfg.models.get(name)
        if model is None:
            known = ", ".join(sorted(self.cfg.models)) or "none"
            raise AgentError.of(
                ErrorCode.UNKNOWN_MODEL,
                f"model {name!r} is not in {self.cfg.models_file} (known: {known})",
                model=name,
            )
        return model

    def _ended(self, rec: InstanceRecord, state: InstanceState, reason: str) -> InstanceRecord:
        return msgspec.structs.replace(
            rec, state=state, reason=reason, stopped_at=self._now(), owner_pid=None, owner_start=None
        )

    def _stop_quietly(self, rec: InstanceRecord, grace_s: float) -> None:
        with contextlib.suppress(AgentError):  # reported by the next invocation that finds its processes
            self.backend.stop(rec, grace_s)

    @staticmethod
    def _fit(b: ledger.DeviceBook, required: int) -> DeviceFit:
        return DeviceFit(
            name=b.slot.name,
            capacity_bytes=b.slot.capacity_bytes,
            reserved_bytes=b.reserved_bytes,
            required_bytes=required,
            free_bytes=b.free_bytes,
            fits=b.admits(required),
            loading=b.loading,
        )

    def _why_not(self, model: ModelSpec, book: dict[str, ledger.DeviceBook]) -> str:
        parts = ", ".join(
            f"{b.slot.name}: {b.reserved_bytes} reserved + {model.memory_bytes} > {b.slot.capacity_bytes}"
            if b.reserved_bytes + model.memory_bytes > b.slot.capacity_bytes
            else f"{b.slot.name}: loading {b.loading}"
            if b.loading is not None
            else f"{b.slot.name}: fits"
            for b in book.values()
        )
        return f"model {model.name} needs {model.memory_bytes} bytes on {model.devices} device(s) ({parts})"

    def _device_report(self, d: inventory.Device, b: ledger.DeviceBook, view: _View) -> DeviceReport:
        settled = self._settled_at(d.name, view) if self.nvml is None else None
        return DeviceReport(
            name=d.name,
            index=d.index,
            source=d.source,
            total_bytes=d.total_bytes,
            headroom_bytes=min(self.cfg.headroom_bytes, d.total_bytes),
            reserved_bytes=b.reserved_bytes,
            free_bytes=b.free_bytes,
            measured_used_bytes=d.used_bytes,
            loading=b.loading,
            settled_at=settled if settled is not None and settled > self._now() else None,
            instances=list(b.holders),
        )

    def _instance_report(
        self, r: InstanceRecord, view: _View, *, healthy: bool | None = None
    ) -> InstanceReport:
        m = view.measured.get(r.id)
        return InstanceReport(
            id=r.id,
            model=r.model,
            engine=r.engine,
            state=r.state,
            url=r.url,
            port=r.port,
            devices=list(r.devices),
            device_indices=list(r.device_indices),
            memory_bytes=r.memory_bytes,
            measured_bytes=max(m.values()) if m else None,
            started_at=r.started_at,
            ready_at=r.ready_at,
            load_s=r.load_s,
            pid=r.pid,
            unit=r.unit,
            healthy=healthy if healthy is not None else view.healthy.get(r.id),
            reason=r.reason,
            stopped_at=r.stopped_at,
        )
