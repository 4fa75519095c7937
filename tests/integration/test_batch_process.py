"""A batch survives `berth serve` being killed: SIGKILL (or SIGTERM) in the middle, a new process on the
same batch directory, and every line answered exactly once in the output."""

from __future__ import annotations

import asyncio
import collections
import io
import signal
import sys
from pathlib import Path

import openai
import orjson
import pytest
from aiohttp.test_utils import TestServer

from loadgen.harness import ManagedProcess, free_port
from tests.integration.fake_engine import FakeEngine
from tests.integration.test_batch_api import CHAT, engine_event, jsonl, line, output_lines

LINES = 20
HELD_FROM = 8  # lines from this one on wait at the engine until released
IN_FLIGHT = 4


def _prompt_line(body: dict[str, object]) -> int:
    messages = body["messages"]
    assert isinstance(messages, list)
    return int(str(messages[0]["content"]).split()[1])


def _berth(tmp_path: Path, engine_url: str, port: int, name: str, watch: bytes) -> ManagedProcess:
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(
        f'[server]\nlisten = "127.0.0.1:{port}"\ndrain_timeout_s = 1\naccept_grace_s = 0\n'
        f'[batch]\ndir = "state"\nmax_lines_in_flight = {IN_FLIGHT}\n'
        f'[[endpoints]]\nurl = "{engine_url}"\nengine = "vllm"\n'
    )
    argv = [sys.executable, "-m", "gateway.cli", "serve", "-c", str(cfg)]
    return ManagedProcess(name, argv, log_path=tmp_path / f"{name}.log", watch=watch)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
async def test_a_batch_resumes_after_the_gateway_dies(tmp_path: Path, sig: signal.Signals) -> None:
    hold = asyncio.Event()
    engine = FakeEngine(tokens=2, hold=hold, hold_if=lambda body: _prompt_line(body) >= HELD_FROM)
    srv = TestServer(engine.app(), handler_cancellation=True)
    await srv.start_server()
    engine_url = str(srv.make_url("")).rstrip("/")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    first = _berth(tmp_path, engine_url, port, "berth-1", b"batch_started")
    second: ManagedProcess | None = None
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="k", max_retries=0)
    try:
        await asyncio.to_thread(first.wait_until_ok, base + "/readyz", 60)
        f = await client.files.create(
            file=("in.jsonl", io.BytesIO(jsonl([line(i) for i in range(LINES)]))), purpose="batch"
        )
        batch = await client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
        # Lines 0-7 answered (their slots fed lines 8-11, which wait at the engine).
        while engine.running < IN_FLIGHT:
            await engine_event(engine)
        assert len(engine.requests) == HELD_FROM + IN_FLIGHT
        first.send_signal(sig)
        await asyncio.to_thread(first.wait, 30)
        while engine.running:  # the engine sees its held calls dropped
            await engine_event(engine)

        hold.set()
        second = _berth(tmp_path, engine_url, port, "berth-2", b"batch_finished")
        await asyncio.to_thread(second.wait_for_lines, 1, 60)
        done = await client.batches.retrieve(batch.id)
        assert done.status == "completed", done
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)
        assert done.output_file_id is not None
        out = output_lines((await client.files.content(done.output_file_id)).content)
        assert [x["custom_id"] for x in out] == [f"req-{i}" for i in range(LINES)]  # each once, in order
        runs = collections.Counter(_prompt_line(body) for body in engine.requests)
        assert all(runs[i] == 1 for i in range(HELD_FROM)), runs  # answered before: not run again
        assert all(runs[i] == 2 for i in range(HELD_FROM, HELD_FROM + IN_FLIGHT)), runs  # in flight: again
        assert all(runs[i] == 1 for i in range(HELD_FROM + IN_FLIGHT, LINES)), runs
        assert orjson.loads(second.log_path.read_bytes().split(b"\n")[-2] or b"{}") is not None
    finally:
        await client.close()
        first.stop()
        if second is not None:
            second.stop()
        await srv.close()
