"""The gateway's agent client: one subprocess per call, JSON on stdout, errors mapped to codes."""

from __future__ import annotations

import json
import sys

import pytest

from gateway.agent.contract import ListReport
from gateway.lifecycle.agent_client import AgentCallError, AgentClient


def _client(script: str, timeout_s: float = 30.0) -> AgentClient:
    # The "agent" is a Python one-liner; the call's own arguments follow it (ignored by the script).
    return AgentClient("n1", [sys.executable, "-c", script], timeout_s=timeout_s)


async def test_a_report_is_decoded() -> None:
    out = json.dumps({"node": "n1", "instances": []})
    report = await _client(f"print({out!r})").list_instances()
    assert report == ListReport(node="n1", instances=[])


async def test_an_agent_error_keeps_its_code_message_and_log_tail() -> None:
    err = json.dumps(
        {"error": {"code": "engine_exited", "message": "the engine exited (3)", "log_tail": ["boom"]}}
    )
    with pytest.raises(AgentCallError) as e:
        await _client(f"import sys; print({err!r}); sys.exit(1)").start("m", "m-1", timeout_s=30)
    assert (e.value.code, e.value.node, e.value.command) == ("engine_exited", "n1", "start")
    assert e.value.message == "the engine exited (3) | boom"


@pytest.mark.parametrize(
    ("script", "code"),
    [
        ("import sys; sys.stderr.write('Traceback: x'); sys.exit(1)", "agent_exited"),
        ("print('not json')", "bad_json"),
        ("print('{}')", "bad_json"),  # valid JSON, not a list report
        ("import time; time.sleep(60)", "timeout"),
    ],
    ids=["exit-without-json", "garbage", "wrong-shape", "timeout"],
)
async def test_failures_are_coded(script: str, code: str) -> None:
    with pytest.raises(AgentCallError) as e:
        await _client(script, timeout_s=0.5).list_instances()
    assert e.value.code == code


async def test_a_missing_agent_binary_is_an_error_not_a_crash() -> None:
    client = AgentClient("n1", ["/nonexistent/berth-agent"], timeout_s=5)
    with pytest.raises(AgentCallError) as e:
        await client.node_report()
    assert e.value.code == "agent_not_started"


async def test_start_names_the_instance_configuration() -> None:
    # The "agent" fails with its own argv as the message: what the client asked for.
    script = (
        "import json, sys; print(json.dumps({'error': {'code': 'bad_arguments', 'message': "
        "' '.join(sys.argv[1:])}})); sys.exit(2)"
    )
    with pytest.raises(AgentCallError) as e:
        await _client(script).start("m", "m-1", timeout_s=30, config="tp2-b4")
    assert e.value.message == "start m --id m-1 --config tp2-b4"
    with pytest.raises(AgentCallError) as e:
        await _client(script).start("m", "m-1", timeout_s=30)
    assert e.value.message == "start m --id m-1"
