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
from typing import Final

import msgspec.structs

from gateway.agent import health, inventory, ledger, procs
from gateway.agent.backends import INSTANCE_ENV, Backend
from gateway.agent.config import AgentConfig, ModelSpec, render
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
from gateway.agent.ports import free_port
from gateway.agent.state import ID_PATTERN, InstanceRecord, StateDir
from gateway.agent.view import NodeView, device_report, fit, instance_report, plan_report, why_not
from gateway.agent.wait import poll_until

#: SIGTERM -> SIGKILL grace for what a dead engine left behind (it is failed already).
LEFTOVER_GRACE_S: Final = 2.0
#: Lines of engine output carried in a failed start's error.
ERROR_LOG_LINES: Final = 20
#: Records (and logs) of stopped or failed instances are forgotten this long after they ended.
RECORD_RETENTION_S: Final = 7 * 86400.0

_SLUG = re.compile(r"[^A-Za-z0-9_.-]+")


class Agent:
    """One invocation's agent: the configuration, a backend, NVML (or None), the state directory.

    `probe` (the health check) and `now` (Unix seconds for records) are injectable for tests.
    """

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

    # ------------------------------------------------------------------------------------ admission

    def _admit(self, model: ModelSpec, view: NodeView, instance_id: str | None) -> InstanceRecord:
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
            fits = [fit(b, required) for b in book.values()]
            # Enough room, but on devices with a load in progress: busy (retry later), not full.
            room = [b for b in book.values() if b.reserved_bytes + required <= b.slot.capacity_bytes]
            loading = [b.loading for b in room if b.loading is not None]
            if len(room) >= model.devices and loading:
                busy = loading[0]
                raise AgentError.of(
                    ErrorCode.DEVICE_BUSY,
                    f"{why_not(model, book)}; a load is in progress there ({busy})",
                    model=model.name,
                    devices=fits,
                    loading=busy,
                )
            raise AgentError.of(ErrorCode.DOES_NOT_FIT, why_not(model, book), model=model.name, devices=fits)
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
        ic = model.instance_config()  # `model` is configured: its default is the one to run
        values = {
            "port": str(port),
            "model": model.name,
            "devices": ",".join(str(i) for i in indices),
            "host": self.cfg.host,
            "id": iid,
            "tp": str(model.devices),
            "max_batch": "" if ic is None else str(ic.max_batch),  # checked: only used with configs
        }
        env = {k: render(v, values) for k, v in model.env.items()}
        env["CUDA_VISIBLE_DEVICES"] = values["devices"]
        env[INSTANCE_ENV] = iid
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
            config=None if ic is None else ic.name,
            max_batch=None if ic is None else ic.max_batch,
        )

    def _check_eviction(self, model: ModelSpec, view: NodeView, evict: Sequence[str]) -> None:
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
                f"even without {', '.join(evict)}: {why_not(model, book)}",
                model=model.name,
                devices=[fit(b, model.memory_bytes) for b in book.values()],
            )

    def _settle(self, chosen: list[str], view: NodeView, required: int, model: ModelSpec) -> None:
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

    def _settling_until(self, device: str, view: NodeView) -> float | None:
        """Without NVML: until when a load on `device` waits after the last stop there (None: it does not)."""
        settled = self._settled_at(device, view) if self.nvml is None else None
        return settled if settled is not None and settled > self._now() else None

    def _settled_at(self, device: str, view: NodeView) -> float | None:
        stops = [
            r.stopped_at
            for r in view.records
            if r.stopped_at is not None and device in r.devices and (r.pid is not None or r.unit is not None)
        ]
        return max(stops) + self.cfg.release_wait_s if stops else None

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
