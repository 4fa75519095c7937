"""Models on demand with real vLLM: berth starts two tiny models through the node agent (process backend)
under a memory budget that holds one at a time. A request for the second evicts the first and is served;
every process of the evicted engine is gone.

Both models are the tiny random Llama (served under two names); the agent's configured device holds one
(3 GiB, 2 GiB per model). vLLM runs pinned to the engine core, as in the rest of the tier.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.agent import procs
from gateway.agent.state import StateDir
from loadgen.harness import REPO_ROOT, RunningServer, free_port, pinned, start_server
from loadgen.vllm_server import ENGINE_CPU, MAX_MODEL_LEN, engine_env

ENGINE_ENV_KEYS = (
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_CPU_NUM_OF_RESERVED_CPU",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "VLLM_NO_USAGE_STATS",
    "DO_NOT_TRACK",
)


def _model(name: str, engine_python: Path, model_dir: Path) -> str:
    command = pinned(
        [
            str(engine_python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            "{model}",
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--dtype",
            "bfloat16",
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--enforce-eager",
            "--max-num-seqs",
            "4",
        ],
        {ENGINE_CPU},
    )
    env = {k: v for k, v in engine_env().items() if k in ENGINE_ENV_KEYS}
    env_toml = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
    return (
        f'[[models]]\nname = "{name}"\nengine = "vllm"\ncommand = {json.dumps(command)}\n'
        f"memory_gib = 2\nload_timeout_s = 300\nstall_timeout_s = 300\nenv = {{ {env_toml} }}\n"
    )


@pytest.fixture
def berth_on_demand(
    engine_python: Path,
    tiny_model_dir: Path,
    engine_logs: Path,
    tmp_path: Path,
    agent_ports: tuple[int, int],
) -> Iterator[tuple[RunningServer, StateDir]]:
    (tmp_path / "models.toml").write_text(
        _model("tiny-a", engine_python, tiny_model_dir)
        + "\n"
        + _model("tiny-b", engine_python, tiny_model_dir)
    )
    (tmp_path / "agent.toml").write_text(
        'models = "models.toml"\nstate_dir = "state"\nnvml = false\nheadroom_gib = 0\nrelease_wait_s = 0.5\n'
        f"stop_timeout_s = 10\nport_range = [{agent_ports[0]}, {agent_ports[1]}]\n"
        '[[devices]]\nname = "cpu0"\nmemory_gib = 3\n'  # one 2 GiB model at a time
    )
    agent = json.dumps([sys.executable, "-m", "gateway.agent", "-c", str(tmp_path / "agent.toml")])
    (tmp_path / "gateway.toml").write_text(
        '[lifecycle]\nmodels = "models.toml"\nload_deadline_s = 400\nchurn_guard_s = 0\n'
        'drain_timeout_s = 10\nagent_timeout_s = 60\n[lifecycle.evictor]\nplugin = "lru"\n'
        f'[[nodes]]\nname = "n1"\nagent = {agent}\n'
    )
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONUNBUFFERED"] = "1"
    berth = start_server(
        "berth",
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "-c",
            str(tmp_path / "gateway.toml"),
            "--listen",
            f"127.0.0.1:{port}",
            "--batch-dir",
            str(tmp_path / "batch"),
        ],
        port=port,
        log_path=engine_logs / "berth-lifecycle.log",
        ready_path="/readyz",
        timeout_s=120,
        env=env,
        cwd=REPO_ROOT,
    )
    state = StateDir(tmp_path / "state")
    try:
        yield berth, state
    finally:
        berth.process.stop()
        for rec in state.records():
            if rec.pid is not None:
                for pid in procs.group_members(rec.pid, since_ticks=rec.pid_start or 0):
                    os.kill(pid, signal.SIGKILL)


def _complete(berth: RunningServer, model: str) -> Any:
    with openai.OpenAI(base_url=f"{berth.base_url}/v1", api_key="test", max_retries=0, timeout=600) as client:
        return client.completions.create(
            model=model, prompt="def add(a, b):", max_tokens=4, extra_body={"ignore_eos": True}
        )


def test_second_model_evicts_the_first_and_its_processes_are_gone(
    berth_on_demand: tuple[RunningServer, StateDir],
) -> None:
    berth, state = berth_on_demand
    first = _complete(berth, "tiny-a")
    assert first.usage.completion_tokens == 4
    (a,) = [r for r in state.records() if r.model == "tiny-a"]
    assert a.pid is not None
    group = procs.group_members(a.pid, since_ticks=a.pid_start or 0)
    assert group  # the API server and its engine core

    second = _complete(berth, "tiny-b")
    assert second.usage.completion_tokens == 4
    assert second.model == "tiny-b"
    assert procs.group_members(a.pid, since_ticks=a.pid_start or 0) == []
    assert all(procs.stat(pid) is None or procs.stat(pid).gone for pid in group)  # type: ignore[union-attr]
    status, body = berth.get("/admin/fleet")
    assert status == 200
    by_model = {i["model"]: i["state"] for i in json.loads(body)["lifecycle"]["instances"]}
    assert by_model == {"tiny-a": "stopped", "tiny-b": "ready"}
