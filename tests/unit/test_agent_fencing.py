"""`--fencing-token N` on every agent command: the node remembers the highest token it has seen and
refuses a lower one with `stale_fencing_token` (exit non-zero, nothing done); no token: as always."""

from __future__ import annotations

import tempfile
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.agent.cli import main
from gateway.agent.contract import ErrorCode, ErrorReport, ListReport
from gateway.agent.state import StaleFencingToken, StateDir
from gateway.lifecycle.agent_client import AgentClient

MODELS = '[[models]]\nname = "m"\nengine = "vllm"\ncommand = ["engine", "{port}"]\nmemory_gib = 4\n'


@pytest.fixture
def agent_toml(tmp_path: Path) -> Path:
    (tmp_path / "models.toml").write_text(MODELS)
    p = tmp_path / "agent.toml"
    p.write_text('state_dir = "state"\nnvml = false\n[[devices]]\nname = "gpu0"\nmemory_gib = 8\n')
    return p


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, bytes]:
    status = main(list(argv))
    return status, capsys.readouterr().out.encode()


@pytest.mark.parametrize(
    "where",
    [
        pytest.param(("--fencing-token", "{n}", "list"), id="before-the-command"),
        pytest.param(("list", "--fencing-token", "{n}"), id="after-the-command"),
    ],
)
def test_a_lower_token_is_refused_and_nothing_is_done(
    agent_toml: Path, capsys: pytest.CaptureFixture[str], where: tuple[str, ...]
) -> None:
    def run(n: int) -> tuple[int, bytes]:
        return _run(capsys, "-c", str(agent_toml), *(w.format(n=n) for w in where))

    assert run(5)[0] == 0
    assert run(5)[0] == 0  # the same leader again
    status, out = run(4)
    assert status == 1
    err = msgspec.json.decode(out, type=ErrorReport).error
    assert err.code is ErrorCode.STALE_FENCING_TOKEN
    assert "5" in err.message
    assert (agent_toml.parent / "state" / "fence").read_text().strip() == "5"
    assert run(7)[0] == 0
    assert (agent_toml.parent / "state" / "fence").read_text().strip() == "7"
    # No token: as before (single-gateway setups).
    status, out = _run(capsys, "-c", str(agent_toml), "list")
    assert status == 0
    assert msgspec.json.decode(out, type=ListReport).instances == []


def test_a_stale_start_starts_nothing(agent_toml: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "-c", str(agent_toml), "--fencing-token", "9", "node")[0] == 0
    status, out = _run(capsys, "-c", str(agent_toml), "start", "m", "--id", "x", "--fencing-token", "3")
    assert status == 1
    assert msgspec.json.decode(out, type=ErrorReport).error.code is ErrorCode.STALE_FENCING_TOKEN
    assert not (agent_toml.parent / "state" / "instances" / "x.json").exists()


def test_a_bad_token_is_a_bad_argument(agent_toml: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = _run(capsys, "-c", str(agent_toml), "list", "--fencing-token", "-1")
    assert status == 2
    assert msgspec.json.decode(out, type=ErrorReport).error.code is ErrorCode.BAD_ARGUMENTS


@settings(deadline=None, max_examples=50)  # each write is fsynced: slow on a busy disk, not wrong
@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=30))
def test_the_fence_admits_exactly_the_tokens_not_below_the_highest_seen(tokens: list[int]) -> None:
    with tempfile.TemporaryDirectory() as d:
        state = StateDir(Path(d))
        highest = 0
        for t in tokens:
            if t < highest:
                with pytest.raises(StaleFencingToken):
                    state.fence(t)
            else:
                assert state.fence(t) == highest
                highest = t
        fence = Path(d) / "fence"
        assert (fence.read_text().strip() if fence.exists() else "0") == str(highest)


async def test_the_client_sends_the_leaders_token(tmp_path: Path) -> None:
    """The gateway's agent client adds `--fencing-token N` while it leads, nothing otherwise."""
    script = tmp_path / "agent.sh"
    script.write_text('#!/bin/sh\nprintf \'{"instances": [], "args": "%s"}\\n\' "$*"\n')
    script.chmod(0o755)
    token: list[int | None] = [None]
    client = AgentClient("n", [str(script)], timeout_s=5, fencing=lambda: token[0])
    out = await client.call(["list"], dict)
    assert out["args"] == "list"
    token[0] = 12
    out = await client.call(["list"], dict)
    assert out["args"] == "list --fencing-token 12"
