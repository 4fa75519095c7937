"""A start's admission: the record of a new instance on devices that admit it now, the check of its
eviction victims before anything stops, and the wait for the chosen devices to be free of stopped
engines (NVML's measure, or `release_wait_s` after the last stop without it).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from gateway.agent import inventory, ledger
from gateway.agent.adoption import Adoption
from gateway.agent.backends import INSTANCE_ENV, instance_marker
from gateway.agent.config import ModelSpec, render
from gateway.agent.contract import AgentError, ErrorCode, InstanceState
from gateway.agent.ports import free_port
from gateway.agent.state import InstanceRecord
from gateway.agent.view import NodeView, fit, why_not
from gateway.agent.wait import poll_until

_SLUG = re.compile(r"[^A-Za-z0-9_.-]+")


class Admission(Adoption):
    """The checks and the record of `Agent.start` (the caller holds the node lock, except in `_settle`'s
    bounded wait)."""

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
        env[INSTANCE_ENV] = instance_marker(self.state.path, iid)
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
