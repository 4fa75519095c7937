"""The live autoscaler: berth (in process) in front of a real node agent (the process backend, a
subprocess per command) that starts `berth-engine-sim` engines when the policy's `[autoscale]` asks.

The node has two configured devices, each holding one instance. Waits are on the lifecycle manager's
change event (`LifecycleManager.wait_for`, re-checked after every action, agent answer and tick), bounded
by generous timeouts; nothing sleeps for a fixed time and nothing asserts how long anything took.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.agent import procs
from gateway.agent.contract import InstanceState as AgentInstanceState
from gateway.agent.contract import ListReport
from gateway.agent.state import StateDir
from gateway.core.types import EndpointId
from gateway.lifecycle.agent_client import AgentClient
from gateway.lifecycle.instances import Instance, InstanceState
from gateway.lifecycle.manager import LifecycleManager
from gateway.sched.request import SchedRequest
from loadgen.harness import REPO_ROOT
from tests.integration.agent_engines import sim_command
from tests.integration.conftest import Running, StartGateway

SIM = sim_command(0.3)
WAIT_S = 60.0


def _model(name: str, command: list[str], memory_gib: float) -> str:
    return (
        f'[[models]]\nname = "{name}"\nengine = "vllm"\ncommand = {json.dumps(command)}\n'
        f'memory_gib = {memory_gib}\nload_timeout_s = 60\nenv = {{ PYTHONPATH = "{REPO_ROOT}" }}\n'
    )


def _policy(autoscale: str) -> str:
    return (REPO_ROOT / "policies" / "default.toml").read_text() + "\n" + autoscale


@dataclass
class Fleet:
    running: Running
    state: StateDir

    @property
    def manager(self) -> LifecycleManager:
        lm = self.running.gw.lifecycle
        assert lm is not None
        return lm

    async def until(self, what: str, cond: Callable[[], bool]) -> None:
        assert await self.manager.wait_for(cond, WAIT_S), f"timed out waiting for: {what}"

    def states(self, model: str) -> dict[str, str]:
        return {i.id: i.state.value for i in self.manager.core.instances() if i.model == model}

    def count(self, model: str, state: InstanceState) -> int:
        return sum(1 for i in self.manager.core.instances() if i.model == model and i.state is state)

    async def metrics(self) -> str:
        async with aiohttp.ClientSession() as s, s.get(self.running.url + "/metrics") as r:
            return await r.text()

    async def fleet_doc(self) -> dict[str, Any]:
        async with aiohttp.ClientSession() as s, s.get(self.running.url + "/admin/fleet") as r:
            assert r.status == 200
            doc: dict[str, Any] = (await r.json())["lifecycle"]
            return doc

    def live_pids(self) -> list[int]:
        """Processes of every engine the agent ever started that still run."""
        return [
            pid
            for rec in self.state.records()
            if rec.pid is not None
            for pid in procs.group_members(rec.pid, since_ticks=rec.pid_start or 0)
        ]


StartFleet = Callable[..., Awaitable[Fleet]]


@pytest.fixture
async def start_fleet(
    tmp_path: Path, start_gateway: StartGateway, agent_ports: tuple[int, int]
) -> AsyncIterator[StartFleet]:
    fleets: list[Fleet] = []

    async def start(autoscale: str, extra_models: str = "") -> Fleet:
        (tmp_path / "models.toml").write_text(
            _model("sim-a", SIM, 4)
            + _model("crash", ["sh", "-c", "echo boom >&2; exit 3", "{port}"], 4)
            + extra_models
        )
        (tmp_path / "agent.toml").write_text(
            'models = "models.toml"\nstate_dir = "state"\nnvml = false\nheadroom_gib = 1\n'
            f"release_wait_s = 0.2\nstop_timeout_s = 2\nport_range = [{agent_ports[0]}, {agent_ports[1]}]\n"
            # capacity 6 GiB each: one 4 GiB instance per device
            '[[devices]]\nname = "gpu0"\nmemory_gib = 7\n[[devices]]\nname = "gpu1"\nmemory_gib = 7\n'
        )
        (tmp_path / "policy.toml").write_text(_policy(autoscale))
        agent = json.dumps([sys.executable, "-m", "gateway.agent", "-c", str(tmp_path / "agent.toml")])
        running = await start_gateway(
            [],
            toml=(
                '[policy]\nfile = "policy.toml"\n'
                "[limits]\ndefault_endpoint_cap = 1\n"
                "[lifecycle]\n"
                'models = "models.toml"\n'
                # a drain waits for its requests (the test ends it by their end, never by this timeout)
                "load_deadline_s = 60\nchurn_guard_s = 0\ndrain_timeout_s = 60\nrefresh_interval_s = 0.5\n"
                '[lifecycle.evictor]\nplugin = "lru"\n'
                f'[[nodes]]\nname = "n1"\nagent = {agent}\n'
                "[scrape]\ninterval_s = 0.2\nstale_after_s = 1\n"
            ),
        )
        fleet = Fleet(running, StateDir(tmp_path / "state"))
        fleets.append(fleet)
        assert await fleet.manager.wait_answered(WAIT_S)
        return fleet

    yield start
    for f in fleets:  # the engines outlive berth: end whatever a failing test left
        for pid in f.live_pids():
            os.kill(pid, signal.SIGKILL)


async def _complete(session: aiohttp.ClientSession, url: str, model: str, max_tokens: int) -> str:
    body = {"model": model, "prompt": "hello", "max_tokens": max_tokens}
    async with session.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        await r.read()
        return r.headers["X-Berth-Endpoint"]


def _metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def _seated_on(fleet: Fleet, eid: str) -> asyncio.Event:
    """An event set when the scheduler seats a request on `eid` (the driver's dispatch hook, which the
    lifecycle manager set and which is called on)."""
    driver = fleet.running.gw.driver
    seated = asyncio.Event()
    inner = driver.on_dispatch

    def on_dispatch(req: SchedRequest, where: EndpointId) -> None:
        if inner is not None:
            inner(req, where)
        if where == eid:
            seated.set()

    driver.on_dispatch = on_dispatch
    return seated


QUEUE_LENGTH = """
[autoscale]
plugin = "queue-length"
params = { target_per_instance = 1, upscale_delay_s = 0, downscale_delay_s = 0 }
interval_s = 0.2
scale_in_cooldown_s = 0
min_instances = 0
max_instances = 2
"""


async def test_a_burst_starts_an_instance_that_serves_and_its_end_drains_and_stops_it(
    start_fleet: StartFleet,
) -> None:
    fleet = await start_fleet(QUEUE_LENGTH)
    # A burst on an empty fleet: the first request cold-starts an instance (the lifecycle's, on demand);
    # the queue behind it (each instance's cap is 1) makes the scaler ask for more, clipped to the two
    # devices; the started instance joins the endpoint set and serves part of the burst.
    async with aiohttp.ClientSession() as session:
        burst = [asyncio.ensure_future(_complete(session, fleet.running.url, "sim-a", 64)) for _ in range(12)]
        await fleet.until("two instances", lambda: fleet.count("sim-a", InstanceState.READY) == 2)
        during = await fleet.metrics()
        served_by = await asyncio.gather(*burst)
    assert _metric(during, "berth_autoscale_instances", model="sim-a", instance_class="mixed") == 2
    assert len(set(served_by)) == 2, served_by  # both instances served
    starts = [
        d for d in fleet.manager.autoscaler.recent if d.action == "scale_out" and d.outcome != "refused"
    ]
    assert [(d.count, d.outcome, d.note) for d in starts] == [(1, "clipped", "max_instances")]

    # The burst is over: the idle instances drain and stop (reason scaled_in), one per round, down to 0.
    await fleet.until("both scaled in", lambda: fleet.count("sim-a", InstanceState.STOPPED) == 2)
    metrics = await fleet.metrics()
    assert _metric(metrics, "berth_lifecycle_evictions_total", reason="scaled_in") == 2
    assert (
        _metric(
            metrics,
            "berth_autoscale_decisions_total",
            model="sim-a",
            action="scale_out",
            reason="max_instances",
            mode="act",
            outcome="clipped",
        )
        == 1
    )
    assert (
        _metric(
            metrics,
            "berth_autoscale_decisions_total",
            model="sim-a",
            action="scale_in",
            reason="scaler",
            mode="act",
            outcome="acted",
        )
        == 2
    )
    # One instance started by the autoscaler, two retired: (1 + 2) / 1.
    assert _metric(metrics, "berth_autoscale_hysteresis", model="sim-a", mode="act") == pytest.approx(3.0)

    doc = await fleet.fleet_doc()
    auto = doc["autoscale"]
    assert (auto["scaler"], auto["dry_run"]) == ("queue-length", False)
    assert auto["bounds"]["sim-a"] == {"min_instances": 0, "max_instances": 2}
    assert auto["counters"]["sim-a"] == {"started": 1, "retired": 2, "reclassed": 0, "hysteresis": 3.0}
    assert auto["recent"][0]["action"] == "scale_in"  # newest first
    assert {i["instance_class"] for i in doc["instances"]} == {"mixed"}

    # Nothing is left behind: the agent lists both stopped, and their processes are gone.
    listed = await fleet.manager.clients["n1"].list_instances()
    assert sorted(i.state for i in listed.instances) == ["stopped", "stopped"]
    assert fleet.live_pids() == []


DRY_RUN = """
[autoscale]
plugin = "queue-length"
params = { target_per_instance = 1, upscale_delay_s = 0, downscale_delay_s = 0 }
dry_run = true
interval_s = 0.2
min_instances = 1
max_instances = 2
"""


async def test_dry_run_starts_nothing_but_exports_the_decisions(start_fleet: StartFleet) -> None:
    fleet = await start_fleet(DRY_RUN)
    await fleet.until("a round", lambda: any(d.model == "sim-a" for d in fleet.manager.autoscaler.recent))
    auto = (await fleet.fleet_doc())["autoscale"]
    assert auto["dry_run"] is True
    mine = [d for d in auto["recent"] if d["model"] == "sim-a"]
    assert ("scale_out", "dry_run") in {(d["action"], d["outcome"]) for d in mine}
    assert {d["outcome"] for d in mine} <= {"dry_run", "refused"}  # never "acted"
    assert auto["dry_run_counters"]["sim-a"]["started"] >= 1
    assert auto["counters"] == {}
    metrics = await fleet.metrics()
    assert (
        _metric(
            metrics,
            "berth_autoscale_decisions_total",
            model="sim-a",
            action="scale_out",
            mode="dry_run",
            outcome="dry_run",
        )
        >= 1
    )
    # Nothing acted: no instance planned, no agent start.
    assert fleet.manager.core.instances() == []
    assert _metric(metrics, "berth_lifecycle_agent_calls_total", command="start") == 0
    assert _metric(metrics, "berth_lifecycle_agent_calls_total", command="node") == 1
    assert fleet.state.records() == []


FAILING = """
[autoscale]
plugin = "queue-length"
params = { target_per_instance = 1, upscale_delay_s = 0, downscale_delay_s = 0 }
interval_s = 0.2
scale_out_cooldown_s = 0
min_instances = 1
max_instances = 1
"""


async def test_a_failed_start_is_counted_and_does_not_wedge_the_autoscaler(start_fleet: StartFleet) -> None:
    fleet = await start_fleet(FAILING)
    a = fleet.manager.autoscaler
    # Both models are below their minimum: the crash model's start fails (again and again, each counted),
    # while sim-a's start goes through and serves.
    await fleet.until("two failed starts", lambda: a.start_failures.get("crash", 0) >= 2)
    await fleet.until("sim-a ready", lambda: fleet.count("sim-a", InstanceState.READY) == 1)
    async with aiohttp.ClientSession() as session:
        await _complete(session, fleet.running.url, "sim-a", 4)
    metrics = await fleet.metrics()
    assert _metric(metrics, "berth_autoscale_start_failures_total", model="crash") >= 2
    assert _metric(metrics, "berth_lifecycle_loads_total", model="crash", result="failed") >= 2
    doc = await fleet.fleet_doc()
    assert doc["autoscale"]["start_failures"]["crash"] >= 2


ONE = """
[autoscale]
plugin = "queue-length"
params = { target_per_instance = 100, upscale_delay_s = 0, downscale_delay_s = 0 }
interval_s = 0.2
min_instances = 1
max_instances = 1
"""


async def test_a_scale_in_of_a_busy_instance_lets_its_request_finish_before_the_stop(
    start_fleet: StartFleet,
) -> None:
    fleet = await start_fleet(ONE)
    lm = fleet.manager
    await fleet.until("the minimum instance", lambda: fleet.count("sim-a", InstanceState.READY) == 1)
    ((iid, eid),) = lm.joined_endpoints().items()
    # The request's seat, as an event: the lifecycle's change event (what `until` waits on) comes with
    # its ticks and agent answers, which under load can all fall after a request's whole run.
    seated = _seated_on(fleet, eid)
    async with aiohttp.ClientSession() as session:
        call = asyncio.ensure_future(_complete(session, fleet.running.url, "sim-a", 100))
        await asyncio.wait_for(seated.wait(), WAIT_S)
        # The seat was taken in the last turn of the loop; the engine call has not even been answered.
        assert fleet.running.gw.scheduler.inflight_on(eid) == 1
        assert lm.retire(iid)  # what an accepted ScaleIn does
        assert fleet.states("sim-a")[iid] == "draining"  # left the endpoint set; not stopped under it
        assert await call == eid  # the request finished where it ran
    await fleet.until("the drained instance stopped", lambda: fleet.states("sim-a")[iid] == "stopped")
    metrics = await fleet.metrics()
    assert _metric(metrics, "berth_lifecycle_evictions_total", reason="scaled_in") == 1


CONFIGURED = """
[autoscale]
plugin = "queue-length"
params = { target_per_instance = 1, upscale_delay_s = 0, downscale_delay_s = 1000 }
interval_s = 0.2
min_instances = 0
max_instances = 2
"""
# A model of two configurations: the default runs the engine one request at a time, the other eight.
CONFIGURED_MODEL = (
    _model("sim-c", [*SIM, "--max-num-seqs", "{max_batch}"], 4)
    + 'default_config = "b1"\n[[models.configs]]\nname = "b1"\nmax_batch = 1\n'
    '[[models.configs]]\nname = "b8"\nmax_batch = 8\n'
)


async def test_the_loop_chooses_a_scale_outs_configuration_and_the_agent_starts_it(
    start_fleet: StartFleet,
) -> None:
    fleet = await start_fleet(CONFIGURED, CONFIGURED_MODEL)
    # A burst of requests with deadlines: the first cold-starts the default configuration (b1); the
    # queue behind it makes the scaler ask for one more without naming a configuration, and the loop
    # chooses by the mix it saw: eight seats serve the burst, one does not.
    headers = {"x-berth-deadline-ms": "60000"}
    body = {"model": "sim-c", "prompt": "hello", "max_tokens": 32}

    async def call(session: aiohttp.ClientSession) -> None:
        async with session.post(fleet.running.url + "/v1/completions", json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            await r.read()

    async with aiohttp.ClientSession() as session:
        burst = [asyncio.ensure_future(call(session)) for _ in range(12)]
        await fleet.until("two instances", lambda: fleet.count("sim-c", InstanceState.READY) == 2)
        await asyncio.gather(*burst)
    configs = sorted(str(i.config) for i in fleet.manager.core.instances() if i.model == "sim-c")
    assert configs == ["None", "b8"]  # the cold start's default, the scale-out's choice
    listed = await fleet.manager.clients["n1"].list_instances()
    started = {(i.config, i.max_batch) for i in listed.instances if i.model == "sim-c"}
    assert started == {("b1", 1), ("b8", 8)}  # the agent ran each with its max batch
    doc = await fleet.fleet_doc()
    [out] = [d for d in doc["autoscale"]["recent"] if d["action"] == "scale_out" and d["outcome"] == "acted"]
    assert out["config"] == "b8"
    assert "; config b8 (+" in out["reason"]
    metrics = await fleet.metrics()
    assert (
        _metric(metrics, "berth_autoscale_decisions_total", model="sim-c", config="b8", outcome="acted") == 1
    )


async def test_a_reload_turns_dry_run_off_keeps_the_counters_and_a_bad_table_keeps_the_running_one(
    start_fleet: StartFleet, tmp_path: Path
) -> None:
    """`[autoscale]` follows SIGHUP's reload: dry-run first, then acting; the dry-run counters survive the
    swap; a rejected reload (unknown scaler) leaves the acting autoscaler in charge; removing the table
    turns the autoscaler off without stopping what it started."""
    fleet = await start_fleet(DRY_RUN)
    a = fleet.manager.autoscaler
    gw = fleet.running.gw
    await fleet.until("a dry-run round", lambda: a.dry_counters.get("sim-a") is not None)
    dry_started = a.dry_counters["sim-a"].started
    assert dry_started >= 1
    assert fleet.manager.core.instances() == []

    policy = tmp_path / "policy.toml"
    policy.write_text(_policy(DRY_RUN.replace("dry_run = true\n", "")))
    assert await gw.reload()
    await fleet.until("the reloaded table in force", lambda: a.dry_run is False)
    await fleet.until("the minimum instance", lambda: fleet.count("sim-a", InstanceState.READY) >= 1)
    assert a.dry_counters["sim-a"].started >= dry_started  # kept across the swap
    assert a.counters["sim-a"].started >= 1

    acting = policy.read_text()
    policy.write_text(acting.replace('plugin = "queue-length"', 'plugin = "no-such-scaler"'))
    assert not await gw.reload()
    assert a.loop is not None
    assert a.dry_run is False
    assert "sim-a" in {d.model for d in a.recent}

    policy.write_text(_policy(""))
    assert await gw.reload()
    await fleet.until("the autoscaler off", lambda: a.loop is None)
    assert _metric(await fleet.metrics(), "berth_autoscale_enabled") == 0
    assert fleet.count("sim-a", InstanceState.READY) >= 1  # nothing it started is stopped by turning it off


async def _one_ready(start_fleet: StartFleet) -> tuple[Fleet, Instance, AgentClient]:
    """A fleet with no autoscaler, one instance cold-started by a request, and its node's agent client."""
    fleet = await start_fleet("")
    async with aiohttp.ClientSession() as s:
        await _complete(s, fleet.running.url, "sim-a", 2)
    (inst,) = [i for i in fleet.manager.core.instances() if i.state is InstanceState.READY]
    return fleet, inst, fleet.manager.clients["n1"]


async def test_an_agent_list_older_than_an_instance_change_is_no_crash_verdict(
    start_fleet: StartFleet,
) -> None:
    # The race a full suite once lost: the lifecycle asks its agent for the list, the instance it is
    # starting becomes ready meanwhile, and the answer, taken before that, says "starting". That is an
    # old answer, not a crash; the same answer about an instance that has not changed since is one.
    fleet, inst, client = await _one_ready(start_fleet)
    real = client.list_instances
    touch = True  # the first stale answer comes back after the instance changed
    answered: list[asyncio.Event] = [asyncio.Event(), asyncio.Event(), asyncio.Event()]

    async def stale() -> ListReport:
        listed = await real()
        if touch:
            inst.changed_at = fleet.running.gw.clock.now()  # changed while the list was asked for
        for e in answered:
            if not e.is_set():
                e.set()
                break
        starting = AgentInstanceState.STARTING
        return msgspec.structs.replace(
            listed,
            instances=[
                msgspec.structs.replace(r, state=starting) if r.id == inst.id else r for r in listed.instances
            ],
        )

    client.list_instances = stale  # type: ignore[method-assign]
    await asyncio.wait_for(answered[1].wait(), WAIT_S)  # the first stale answer was read whole
    assert inst.state is InstanceState.READY
    touch = False
    await asyncio.wait_for(answered[2].wait(), WAIT_S)
    await fleet.until("the instance crashed", lambda: inst.state is not InstanceState.READY)


async def test_an_agent_list_older_than_a_stop_adopts_nothing(start_fleet: StartFleet) -> None:
    # The adoption side of the race above: the instance stops while the list is asked for, and the
    # answer, taken before that, still says "ready". That is an old answer, not an engine to adopt; a
    # list asked after the change that still shows the engine running adopts it.
    fleet, inst, client = await _one_ready(start_fleet)
    real = client.list_instances
    asked = [asyncio.Event(), asyncio.Event()]
    release = asyncio.Event()  # the second list waits until the test has looked

    async def stale() -> ListReport:
        calls = sum(e.is_set() for e in asked)
        if calls < len(asked):
            asked[calls].set()
        if calls == 1:
            await release.wait()
        listed = await real()
        if calls == 0:
            inst.state = InstanceState.STOPPED  # stopped while the list was asked for
            inst.changed_at = fleet.running.gw.clock.now()
        return listed

    client.list_instances = stale  # type: ignore[method-assign]
    await asyncio.wait_for(asked[1].wait(), WAIT_S)  # the stale answer was read whole
    assert fleet.manager.core.get(inst.id) is inst
    assert inst.state is InstanceState.STOPPED
    release.set()
    await fleet.until(
        "the running engine adopted",
        lambda: (i := fleet.manager.core.get(inst.id)) is not None and i.state is InstanceState.READY,
    )


async def test_a_missed_health_probe_is_no_crash_until_three_lists_in_a_row_miss_it(
    start_fleet: StartFleet,
) -> None:
    # The agent's health probe is one wall-clock timeout: a stalled machine or a busy engine misses it
    # without being dead, and a crash verdict stops the engine with whatever runs there. Three misses
    # in a row are one; a probe answered in between starts the count again.
    fleet, inst, client = await _one_ready(start_fleet)
    real = client.list_instances
    healthy = [False, False, True, False, False, False]  # what each next list says of its probe
    asked = [asyncio.Event() for _ in range(len(healthy))]  # each set as its list is asked for

    async def probed() -> ListReport:
        calls = sum(e.is_set() for e in asked)
        if calls < len(asked):
            asked[calls].set()  # (the lifecycle reads its agent's lists one after another)
        listed = await real()
        if calls >= len(healthy):
            return listed
        return msgspec.structs.replace(
            listed,
            instances=[
                msgspec.structs.replace(r, healthy=healthy[calls]) if r.id == inst.id else r
                for r in listed.instances
            ],
        )

    client.list_instances = probed  # type: ignore[method-assign]
    await asyncio.wait_for(asked[3].wait(), WAIT_S)  # two misses, then an answer: read whole
    assert inst.state is InstanceState.READY
    await asyncio.wait_for(asked[5].wait(), WAIT_S)  # two misses again
    assert inst.state is InstanceState.READY
    await fleet.until("the third miss in a row", lambda: inst.state is not InstanceState.READY)
    assert inst.reason == "health check failed"
    metrics = await fleet.metrics()
    assert _metric(metrics, "berth_lifecycle_evictions_total", reason="crashed") == 1
