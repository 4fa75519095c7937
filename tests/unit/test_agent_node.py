"""The agent's commands over a fake backend, a scripted health probe and a fake NVML (no processes).

What runs is what the CLI runs (`gateway.agent.node.Agent`); only the engine side is scripted: whether
an instance's process runs, what its health route answers, what NVML measures.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import msgspec.structs
import pytest

from gateway.agent.config import GIB, load_agent_config
from gateway.agent.contract import AgentError, ErrorCode, InstanceState
from gateway.agent.node import Agent
from gateway.agent.state import InstanceRecord, StateDir

MODELS = """
[[models]]
name = "small"
engine = "vllm"
command = ["engine", "--port", "{port}", "--model", "{model}", "--id", "{id}", "--tp", "{tp}"]
memory_gib = 4
load_timeout_s = 30
env = { LOG = "{host}:{port}" }

[[models]]
name = "large"
engine = "sglang"
command = ["engine", "{port}"]
memory_gib = 7

[[models]]
name = "jumbo"
engine = "vllm"
command = ["engine", "{port}"]
memory_gib = 9.5

[[models]]
name = "wide"
engine = "vllm"
command = ["engine", "{port}", "{devices}"]
memory_gib = 2
devices = 2

[[models]]
name = "huge"
engine = "vllm"
command = ["engine", "{port}"]
memory_gib = 2
devices = 3

[[models]]
name = "slow"
engine = "vllm"
command = ["engine", "{port}"]
memory_gib = 1
load_timeout_s = 0.05

[[models]]
name = "hetero"
engine = "vllm"
command = ["engine", "{port}", "--tp", "{tp}", "--max-num-seqs", "{max_batch}"]
memory_gib = 4
default_config = "tp1-b16"
[[models.configs]]
name = "tp2-b4"
max_batch = 4
devices = 2
memory_gib = 3
[[models.configs]]
name = "tp1-b16"
max_batch = 16

[[models]]
name = "stuck"
engine = "vllm"
command = ["engine", "{port}"]
memory_gib = 1
stall_timeout_s = 0.05
"""


@dataclass
class FakeBackend:
    """Instances run until stopped; `exits` lists ids whose engine exits at once."""

    name: str = "process"
    live: dict[str, bool] = field(default_factory=dict)
    exits: set[str] = field(default_factory=set)
    launched: list[tuple[InstanceRecord, dict[str, str]]] = field(default_factory=list)
    stopped: list[tuple[str, float]] = field(default_factory=list)
    state: StateDir | None = None
    pid_of: dict[str, list[int]] = field(default_factory=dict)

    def launch(self, rec: InstanceRecord, env: Mapping[str, str]) -> InstanceRecord:
        assert self.state is not None
        on_disk = self.state.read(rec.id)
        assert on_disk is not None, "the record is written before launch"
        assert on_disk.state is InstanceState.STARTING
        self.launched.append((rec, dict(env)))
        self.live[rec.id] = rec.id not in self.exits
        return msgspec.structs.replace(rec, pid=4242, pid_start=1)

    def running(self, rec: InstanceRecord) -> bool:
        return self.live.get(rec.id, False)

    def exit_status(self, rec: InstanceRecord) -> int | None:
        return 3 if rec.id in self.exits else None

    def pids(self, rec: InstanceRecord) -> list[int]:
        return self.pid_of.get(rec.id, [])

    def stop(self, rec: InstanceRecord, timeout_s: float) -> bool:
        self.stopped.append((rec.id, timeout_s))
        self.live[rec.id] = False
        return False

    def logs(self, rec: InstanceRecord, tail: int) -> tuple[str, list[str]]:
        return "fake", [f"{rec.id} line {i}" for i in range(tail)][-tail:]


@dataclass
class FakeNvml:
    total: list[int]
    used: list[int]
    per_pid: dict[int, dict[int, int]] = field(default_factory=dict)  # device index -> pid -> bytes

    def memory(self) -> list[tuple[int, int]]:
        return list(zip(self.total, self.used, strict=True))

    def process_memory(self, index: int) -> Mapping[int, int]:
        return self.per_pid.get(index, {})


class Health:
    def __init__(self) -> None:
        self.down: set[str] = set()
        self.probed: list[str] = []

    def __call__(self, url: str) -> bool:
        self.probed.append(url)
        return not any(url.startswith(d) for d in self.down)


@dataclass
class Node:
    agent: Agent
    backend: FakeBackend
    health: Health
    state: StateDir


def _node(tmp_path: Path, devices: str, *, nvml: FakeNvml | None = None, release_wait_s: float = 0) -> Node:
    (tmp_path / "models.toml").write_text(MODELS)
    (tmp_path / "agent.toml").write_text(
        f'state_dir = "state"\nheadroom_gib = 1\nport_range = [26000, 26099]\n'
        f"release_wait_s = {release_wait_s}\nstop_timeout_s = 7\n{devices}"
    )
    cfg = load_agent_config(tmp_path / "agent.toml")
    backend = FakeBackend()
    health = Health()
    agent = Agent(cfg, backend, nvml=nvml, probe=health)
    backend.state = agent.state
    return Node(agent, backend, health, agent.state)


ONE = '[[devices]]\nname = "gpu0"\nmemory_gib = 10\n'
TWO = ONE + '[[devices]]\nname = "gpu1"\nmemory_gib = 10\n'


def test_start_renders_the_command_and_reports_the_ready_instance(tmp_path: Path) -> None:
    n = _node(tmp_path, TWO)
    report = n.agent.start("small", instance_id="s1")
    rec, env = n.backend.launched[0]
    assert rec.argv == ("engine", "--port", str(rec.port), "--model", "small", "--id", "s1", "--tp", "1")
    marker = f"{n.state.path.resolve()}/s1"  # the instance within this agent's state directory
    assert env == {
        "LOG": f"127.0.0.1:{rec.port}",
        "CUDA_VISIBLE_DEVICES": "0",
        "BERTH_AGENT_INSTANCE": marker,
    }
    inst = report.instance
    assert inst.state is InstanceState.READY
    assert inst.url == f"http://127.0.0.1:{rec.port}"
    assert inst.devices == ["gpu0"]
    assert inst.memory_bytes == 4 * GIB
    assert inst.healthy is True
    assert report.load_s == inst.load_s
    assert report.load_s is not None
    assert inst.pid == 4242
    on_disk = n.state.read("s1")
    assert on_disk is not None
    assert on_disk.state is InstanceState.READY
    assert on_disk.owner_pid is None
    node = n.agent.node()
    assert node.reserved_bytes == 4 * GIB
    assert node.devices[0].instances == ["s1"]
    assert node.devices[0].free_bytes == 5 * GIB  # 10 - 1 headroom - 4


def test_default_id_is_model_and_port(tmp_path: Path) -> None:
    n = _node(tmp_path, TWO)
    a = n.agent.start("small")
    b = n.agent.start("small")
    assert a.instance.id == f"small-{a.instance.port}"
    assert b.instance.port != a.instance.port
    assert b.instance.devices == ["gpu0"]  # best fit: 5 GiB left on gpu0 holds it, gpu1 stays whole


def test_tensor_parallel_gets_two_devices_and_their_indices(tmp_path: Path) -> None:
    n = _node(tmp_path, TWO)
    report = n.agent.start("wide")
    rec, env = n.backend.launched[0]
    assert report.instance.devices == ["gpu0", "gpu1"]
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert rec.argv[-1] == "0,1"


def test_a_start_that_does_not_fit_is_refused_with_the_numbers(tmp_path: Path) -> None:
    n = _node(tmp_path, ONE)
    n.agent.start("small", instance_id="s1")
    with pytest.raises(AgentError) as e:
        n.agent.start("large")
    body = e.value.body
    assert body.code is ErrorCode.DOES_NOT_FIT
    assert e.value.exit_status == 1
    assert body.devices is not None
    (fit,) = body.devices
    assert (fit.capacity_bytes, fit.reserved_bytes, fit.required_bytes) == (9 * GIB, 4 * GIB, 7 * GIB)
    assert fit.fits is False
    assert "gpu0: 4294967296 reserved + 7516192768 > 9663676416" in body.message
    assert len(n.backend.launched) == 1


def test_one_load_per_device(tmp_path: Path) -> None:
    n = _node(tmp_path, ONE)
    # A load in progress: a `starting` record whose owner (this process) is alive.
    n.agent.start("small", instance_id="s1")
    rec = n.state.read("s1")
    assert rec is not None
    me = (os.getpid(), rec.pid_start)
    n.state.write(
        msgspec.structs.replace(
            rec, state=InstanceState.STARTING, owner_pid=me[0], owner_start=n.agent._me[1]
        )
    )
    with pytest.raises(AgentError) as e:
        n.agent.start("slow")
    assert e.value.body.code is ErrorCode.DEVICE_BUSY
    assert e.value.body.loading == "s1"
    assert n.agent.node().devices[0].loading == "s1"


@pytest.mark.parametrize(
    ("call", "code", "status"),
    [
        pytest.param(lambda a: a.start("nope"), ErrorCode.UNKNOWN_MODEL, 1, id="unknown-model"),
        pytest.param(lambda a: a.plan("nope"), ErrorCode.UNKNOWN_MODEL, 1, id="plan-unknown-model"),
        pytest.param(lambda a: a.stop("nope"), ErrorCode.UNKNOWN_INSTANCE, 1, id="unknown-instance"),
        pytest.param(lambda a: a.logs("nope"), ErrorCode.UNKNOWN_INSTANCE, 1, id="logs-unknown"),
        pytest.param(lambda a: a.start("huge"), ErrorCode.TOO_FEW_DEVICES, 1, id="too-few-devices"),
        pytest.param(lambda a: a.start("small", instance_id="../x"), ErrorCode.BAD_ARGUMENTS, 2, id="bad-id"),
    ],
)
def test_errors(tmp_path: Path, call: object, code: ErrorCode, status: int) -> None:
    n = _node(tmp_path, TWO)
    with pytest.raises(AgentError) as e:
        call(n.agent)  # type: ignore[operator]
    assert e.value.body.code is code
    assert e.value.exit_status == status


def test_a_resident_id_is_not_reused(tmp_path: Path) -> None:
    n = _node(tmp_path, TWO)
    n.agent.start("small", instance_id="s1")
    with pytest.raises(AgentError) as e:
        n.agent.start("small", instance_id="s1")
    assert e.value.body.code is ErrorCode.DUPLICATE_INSTANCE
    n.agent.stop("s1")
    assert n.agent.start("small", instance_id="s1").instance.state is InstanceState.READY


def test_early_exit_is_a_failed_start(tmp_path: Path) -> None:
    n = _node(tmp_path, ONE)
    n.backend.exits.add("x")
    with pytest.raises(AgentError) as e:
        n.agent.start("small", instance_id="x")
    body = e.value.body
    assert body.code is ErrorCode.EARLY_EXIT
    assert "status 3" in body.message
    assert body.log_tail
    rec = n.state.read("x")
    assert rec is not None
    assert rec.state is InstanceState.FAILED
    assert n.agent.node().reserved_bytes == 0


def test_load_timeout(tmp_path: Path) -> None:
    n = _node(tmp_path, ONE)
    n.health.down.add("http://")
    with pytest.raises(AgentError) as e:
        n.agent.start("slow", instance_id="x")
    assert e.value.body.code is ErrorCode.LOAD_TIMEOUT
    assert [i for i, _ in n.backend.stopped] == ["x"]  # its processes are ended
    assert n.agent.instances().instances[0].state is InstanceState.FAILED


def test_stall(tmp_path: Path) -> None:
    n = _node(tmp_path, ONE)
    n.health.down.add("http://")
    with pytest.raises(AgentError) as e:
        n.agent.start("stuck", instance_id="x")
    assert e.value.body.code is ErrorCode.STALLED


def test_stop_and_evict(tmp_path: Path) -> None:
    n = _node(tmp_path, ONE)
    n.agent.start("small", instance_id="s1")
    plan = n.agent.plan("large")
    assert plan.fits is False
    assert plan.evict == ["s1"]
    assert plan.evict_devices == ["gpu0"]
    assert [(v.id, v.frees_bytes, v.idle) for v in plan.victims] == [("s1", 4 * GIB, True)]
    started = n.agent.start("large", instance_id="l1", evict=["s1"])
    assert [(s.id, s.state, s.was) for s in started.evicted] == [
        ("s1", InstanceState.STOPPED, InstanceState.READY)
    ]
    assert ("s1", 7.0) in n.backend.stopped
    s1 = n.state.read("s1")
    assert s1 is not None
    assert (s1.state, s1.reason) == (InstanceState.STOPPED, "evicted")
    stop = n.agent.stop("l1", drain_timeout_s=0.5)
    assert stop.state is InstanceState.STOPPED
    assert ("l1", 0.5) in n.backend.stopped
    assert n.agent.stop("l1").stop_s == 0.0  # stopping a stopped instance changes nothing


def test_plan_when_it_fits(tmp_path: Path) -> None:
    n = _node(tmp_path, TWO)
    plan = n.agent.plan("wide")
    assert (plan.fits, plan.devices, plan.evict, plan.devices_needed) == (True, ["gpu0", "gpu1"], [], 2)
    assert [f.fits for f in plan.per_device] == [True, True]


def test_plan_when_nothing_can_make_room(tmp_path: Path) -> None:
    n = _node(tmp_path, '[[devices]]\nname = "gpu0"\nmemory_gib = 5\n')
    plan = n.agent.plan("large")
    assert (plan.fits, plan.evict) == (False, None)


def test_readoption_marks_a_dead_engine_failed_and_clears_leftovers(tmp_path: Path) -> None:
    n = _node(tmp_path, ONE)
    n.agent.start("small", instance_id="s1")
    n.backend.live["s1"] = False  # killed behind the agent's back
    listed = n.agent.instances().instances
    assert [(i.id, i.state, i.reason) for i in listed] == [
        ("s1", InstanceState.FAILED, "engine exited after it was ready")
    ]
    assert n.backend.stopped[-1][0] == "s1"
    assert n.agent.node().reserved_bytes == 0


def test_readoption_probes_ready_engines(tmp_path: Path) -> None:
    n = _node(tmp_path, ONE)
    url = n.agent.start("small", instance_id="s1").instance.url
    n.health.down.add(url)
    (inst,) = n.agent.instances().instances
    assert (inst.state, inst.healthy) == (InstanceState.READY, False)  # alive: kept, its memory booked


def test_a_load_whose_start_died_is_adopted_once_healthy(tmp_path: Path) -> None:
    n = _node(tmp_path, ONE)
    n.agent.start("small", instance_id="s1")
    rec = n.state.read("s1")
    assert rec is not None
    orphan = msgspec.structs.replace(rec, state=InstanceState.STARTING, owner_pid=os.getpid(), owner_start=1)
    n.state.write(orphan)
    (inst,) = n.agent.instances().instances
    assert inst.state is InstanceState.READY
    # ... and a stop whose invocation died is finished by the next one.
    n.state.write(msgspec.structs.replace(orphan, state=InstanceState.STOPPING))
    (inst,) = n.agent.instances().instances
    assert inst.state is InstanceState.STOPPED


def test_a_load_whose_start_died_fails_past_its_deadline(tmp_path: Path) -> None:
    n = _node(tmp_path, ONE)
    n.agent.start("small", instance_id="s1")
    rec = n.state.read("s1")
    assert rec is not None
    n.state.write(
        msgspec.structs.replace(
            rec, state=InstanceState.STARTING, owner_pid=os.getpid(), owner_start=1, load_deadline=0.0
        )
    )
    n.health.down.add(rec.url)
    (inst,) = n.agent.instances().instances
    assert inst.state is InstanceState.FAILED


def test_nvml_measure_above_admission_is_what_is_reserved(tmp_path: Path) -> None:
    nvml = FakeNvml(total=[24 * GIB], used=[9 * GIB])
    n = _node(tmp_path, "", nvml=nvml)
    n.agent.start("small", instance_id="s1")
    n.backend.pid_of["s1"] = [4242, 4243]
    nvml.per_pid[0] = {4242: 5 * GIB, 4243: 3 * GIB, 999: 1 * GIB}  # 999 is not ours
    node = n.agent.node()
    assert node.nvml is True
    (dev,) = node.devices
    assert (dev.name, dev.source, dev.total_bytes) == ("gpu0", "nvml", 24 * GIB)
    assert dev.reserved_bytes == 8 * GIB
    assert dev.measured_used_bytes == 9 * GIB
    (inst,) = n.agent.instances().instances
    assert inst.measured_bytes == 8 * GIB


def test_configured_device_overrides_nvml_size(tmp_path: Path) -> None:
    nvml = FakeNvml(total=[80 * GIB, 80 * GIB], used=[0, 0])
    n = _node(tmp_path, '[[devices]]\nname = "gpu1"\nmemory_gib = 20\n', nvml=nvml)
    devs = n.agent.node().devices
    assert [(d.name, d.source, d.total_bytes) for d in devs] == [
        ("gpu0", "nvml", 80 * GIB),
        ("gpu1", "config", 20 * GIB),
    ]


def test_memory_not_seen_free_by_nvml_refuses_the_load(tmp_path: Path) -> None:
    # The books say it fits (a configured 10 GiB), but NVML sees the physical device full.
    nvml = FakeNvml(total=[10 * GIB], used=[9 * GIB])
    n = _node(tmp_path, ONE, nvml=nvml, release_wait_s=0.05)
    with pytest.raises(AgentError) as e:
        n.agent.start("small")
    assert e.value.body.code is ErrorCode.MEMORY_NOT_RELEASED
    assert n.backend.launched == []


def test_without_nvml_a_device_settles_for_release_wait_after_a_stop(tmp_path: Path) -> None:
    n = _node(tmp_path, ONE, release_wait_s=3600)
    n.agent.start("small", instance_id="s1")
    stopped = n.agent.stop("s1")
    (dev,) = n.agent.node().devices
    assert dev.settled_at == pytest.approx(stopped.stopped_at + 3600)


def test_victims_are_checked_before_anything_is_stopped(tmp_path: Path) -> None:
    n = _node(tmp_path, ONE)
    n.backend.exits.add("x")
    with pytest.raises(AgentError):
        n.agent.start("small", instance_id="x")
    n.agent.start("small", instance_id="s1")
    stops = len(n.backend.stopped)
    with pytest.raises(AgentError) as e:
        n.agent.start("small", evict=["s1", "ghost"])
    assert e.value.body.code is ErrorCode.UNKNOWN_INSTANCE
    with pytest.raises(AgentError) as e:
        n.agent.start("small", evict=["s1", "x"])
    assert e.value.body.code is ErrorCode.BAD_ARGUMENTS  # x failed: not an instance to evict
    # jumbo (9.5 GiB) is larger than the device's 9 GiB capacity: stopping s1 would not help.
    with pytest.raises(AgentError) as e:
        n.agent.start("jumbo", evict=["s1"])
    assert e.value.body.code is ErrorCode.DOES_NOT_FIT
    assert "even without s1" in e.value.body.message
    assert len(n.backend.stopped) == stops


def test_instance_configurations_start_and_plan(tmp_path: Path) -> None:
    n = _node(tmp_path, TWO)
    plan = n.agent.plan("hetero", config="tp2-b4")
    assert (plan.config, plan.devices_needed, plan.required_bytes, plan.devices) == (
        "tp2-b4",
        2,
        3 * GIB,
        ["gpu0", "gpu1"],
    )
    assert n.agent.plan("hetero").config == "tp1-b16"  # the default configuration
    wide = n.agent.start("hetero", instance_id="h2", config="tp2-b4").instance
    rec, env = n.backend.launched[0]
    assert rec.argv == ("engine", str(rec.port), "--tp", "2", "--max-num-seqs", "4")
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert (wide.config, wide.max_batch, wide.devices, wide.memory_bytes) == (
        "tp2-b4",
        4,
        ["gpu0", "gpu1"],
        3 * GIB,
    )
    default = n.agent.start("hetero", instance_id="h1").instance
    assert n.backend.launched[1][0].argv[-1] == "16"
    assert (default.config, default.max_batch, default.devices) == ("tp1-b16", 16, ["gpu0"])
    listed = {i.id: (i.config, i.max_batch) for i in n.agent.instances().instances}
    assert listed == {"h1": ("tp1-b16", 16), "h2": ("tp2-b4", 4)}
    plain = n.agent.start("small").instance
    assert (plain.config, plain.max_batch) == (None, None)


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda a: a.start("hetero", config="tp8"), id="start"),
        pytest.param(lambda a: a.plan("hetero", config="tp8"), id="plan"),
        pytest.param(lambda a: a.start("small", config="tp1-b16"), id="model-without-configs"),
    ],
)
def test_an_unknown_configuration_is_refused(tmp_path: Path, call: object) -> None:
    n = _node(tmp_path, TWO)
    with pytest.raises(AgentError) as e:
        call(n.agent)  # type: ignore[operator]
    assert e.value.body.code is ErrorCode.UNKNOWN_CONFIG
    assert e.value.exit_status == 1
    assert n.backend.launched == []
