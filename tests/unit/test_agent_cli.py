"""The CLI's JSON contract: one object on stdout, exit 0 with a report or non-zero with an error."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gateway.agent.cli import from_ssh, main
from gateway.agent.contract import (
    AgentError,
    ErrorCode,
    ErrorReport,
    ListReport,
    NodeReport,
    PlanReport,
    decode_output,
)

MODELS = '[[models]]\nname = "m"\nengine = "vllm"\ncommand = ["engine", "{port}"]\nmemory_gib = 4\n'


@pytest.fixture
def agent_toml(tmp_path: Path) -> Path:
    (tmp_path / "models.toml").write_text(MODELS)
    p = tmp_path / "agent.toml"
    p.write_text('state_dir = "state"\nnvml = false\n[[devices]]\nname = "gpu0"\nmemory_gib = 8\n')
    return p


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, bytes]:
    status = main(list(argv))
    out = capsys.readouterr().out
    assert out.endswith("\n")
    assert out.count("\n") == 1  # exactly one JSON object, one line
    return status, out.encode()


def test_node_list_plan(agent_toml: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = _run(capsys, "-c", str(agent_toml), "node")
    assert status == 0
    node = msgspec.json.decode(out, type=NodeReport)
    assert (node.nvml, node.total_bytes, node.free_bytes) == (False, 8 << 30, 7 << 30)
    assert node.models == ["m"]
    status, out = _run(capsys, "-c", str(agent_toml), "list")
    assert status == 0
    assert msgspec.json.decode(out, type=ListReport).instances == []
    status, out = _run(capsys, "-c", str(agent_toml), "plan", "m")
    assert status == 0
    plan = msgspec.json.decode(out, type=PlanReport)
    assert (plan.fits, plan.devices) == (True, ["gpu0"])


def test_config_from_the_environment(
    agent_toml: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BERTH_AGENT_CONFIG", str(agent_toml))
    status, _ = _run(capsys, "node")
    assert status == 0


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(["frobnicate"], (ErrorCode.BAD_ARGUMENTS, 2, "invalid choice"), id="unknown-command"),
        pytest.param(["start"], (ErrorCode.BAD_ARGUMENTS, 2, "required: model"), id="missing-arg"),
        pytest.param(
            ["stop", "x", "--drain-timeout", "-1"], (ErrorCode.BAD_ARGUMENTS, 2, "drain"), id="drain"
        ),
        pytest.param(["plan", "nope"], (ErrorCode.UNKNOWN_MODEL, 1, "'nope'"), id="unknown-model"),
        pytest.param(["logs", "nope"], (ErrorCode.UNKNOWN_INSTANCE, 1, "'nope'"), id="unknown-instance"),
    ],
)
def test_errors_are_json(
    agent_toml: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    expected: tuple[ErrorCode, int, str],
) -> None:
    code, status, says = expected
    got, out = _run(capsys, "-c", str(agent_toml), *argv)
    assert got == status
    err = msgspec.json.decode(out, type=ErrorReport).error
    assert err.code is code
    assert says in err.message


def test_config_errors_name_file_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "agent.toml"
    p.write_text("port_range = [1, 2, 3]\n")
    status, out = _run(capsys, "-c", str(p), "node")
    assert status == 2
    err = msgspec.json.decode(out, type=ErrorReport).error
    assert err.code is ErrorCode.CONFIG
    assert err.message.startswith(f"{p}:port_range: ")
    status, out = _run(capsys, "-c", str(tmp_path / "missing.toml"), "node")
    assert status == 2
    assert "cannot read file" in msgspec.json.decode(out, type=ErrorReport).error.message


def test_error_shape_is_code_and_message_first(agent_toml: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out = _run(capsys, "-c", str(agent_toml), "stop", "ghost")
    raw = msgspec.json.decode(out)
    assert list(raw) == ["error"]
    assert raw["error"] == {"code": "unknown_instance", "message": "no instance 'ghost'", "instance": "ghost"}


@pytest.mark.parametrize(
    ("original", "expected"),
    [
        pytest.param(
            "berth-agent -c /etc/other.toml start m --id x", ["start", "m", "--id", "x"], id="prefixed"
        ),
        pytest.param("/usr/bin/berth-agent --config=/x list", ["list"], id="config-eq"),
        pytest.param("stop 'a b'", ["stop", "a b"], id="bare"),
    ],
)
def test_from_ssh_takes_the_command_and_keeps_the_forced_config(original: str, expected: list[str]) -> None:
    forced = ["-c", "/etc/berth/agent.toml", "--from-ssh"]
    assert from_ssh(forced, {"SSH_ORIGINAL_COMMAND": original}) == ["-c", "/etc/berth/agent.toml", *expected]


def test_from_ssh_runs_the_command(
    agent_toml: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSH_ORIGINAL_COMMAND", "berth-agent -c /nowhere.toml plan m")
    status, out = _run(capsys, "-c", str(agent_toml), "--from-ssh")
    assert status == 0
    assert msgspec.json.decode(out, type=PlanReport).model == "m"
    monkeypatch.delenv("SSH_ORIGINAL_COMMAND")
    status, out = _run(capsys, "-c", str(agent_toml), "--from-ssh")
    assert status == 2
    assert msgspec.json.decode(out, type=ErrorReport).error.code is ErrorCode.BAD_ARGUMENTS


def test_decode_output_is_what_a_caller_uses(agent_toml: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out = _run(capsys, "-c", str(agent_toml), "plan", "m")
    plan = decode_output("plan", out)
    assert isinstance(plan, PlanReport)
    _, out = _run(capsys, "-c", str(agent_toml), "stop", "ghost")
    with pytest.raises(AgentError) as e:
        decode_output("stop", out)
    assert e.value.body.code is ErrorCode.UNKNOWN_INSTANCE
    with pytest.raises(msgspec.DecodeError):
        decode_output("node", b"ssh: connect to host gpu-07 port 22: Connection refused\n")
