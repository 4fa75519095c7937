"""The Files and Batches API end to end with the official openai SDK, in front of scripted engines."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any, Final

import aiohttp
import openai
import orjson
import pytest

from gateway.top import render
from tests.integration.conftest import EngineServer, Running, StartGateway
from tests.integration.fake_engine import FakeEngine
from tests.preempt_policy import POLICY as PREEMPT_POLICY

CHAT: Final = "/v1/chat/completions"


def batch_toml(extra: str = "") -> str:
    return f'[batch]\ndir = "batch"\nmax_lines_in_flight = 3\nmax_file_bytes = 20000\n{extra}'


def line(i: int, *, model: str = "tiny", url: str = CHAT, custom_id: str | None = None) -> dict[str, Any]:
    return {
        "custom_id": custom_id or f"req-{i}",
        "method": "POST",
        "url": url,
        "body": {"model": model, "messages": [{"role": "user", "content": f"line {i}"}], "max_tokens": 4},
    }


def jsonl(items: list[Any]) -> bytes:
    return b"".join(orjson.dumps(x) + b"\n" for x in items)


async def upload(client: openai.AsyncOpenAI, data: bytes, name: str = "in.jsonl") -> str:
    f = await client.files.create(file=(name, io.BytesIO(data)), purpose="batch")
    return f.id


async def run_gateway(
    engine_server: EngineServer, start_gateway: StartGateway, engine: FakeEngine, toml: str
) -> Running:
    url = await engine_server(engine)
    return await start_gateway([f"{url},engine=vllm"], toml=toml)


def output_lines(content: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in content.splitlines() if x.strip()]


async def test_sdk_end_to_end(engine_server: EngineServer, start_gateway: StartGateway) -> None:
    gw = await run_gateway(engine_server, start_gateway, FakeEngine(tokens=4), batch_toml())
    client = gw.client()
    file_id = await upload(client, jsonl([line(i) for i in range(10)]))
    f = await client.files.retrieve(file_id)
    assert (f.purpose, f.filename, f.object) == ("batch", "in.jsonl", "file")
    assert f.expires_at is not None
    assert f.expires_at - f.created_at == 30 * 86400
    assert [x.id for x in (await client.files.list()).data] == [file_id]

    batch = await client.batches.create(
        input_file_id=file_id,
        endpoint=CHAT,
        completion_window="24h",
        metadata={"job": "nightly"},
        output_expires_after={"anchor": "created_at", "seconds": 7200},
    )
    assert batch.status == "in_progress"
    assert batch.request_counts is not None
    assert batch.request_counts.total == 10
    assert batch.expires_at == batch.created_at + 86400
    await gw.gw.batch.wait_ended(batch.id)

    done = await client.batches.retrieve(batch.id)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (
        done.request_counts.completed,
        done.request_counts.failed,
    ) == (10, 0)
    assert done.metadata == {"job": "nightly"}
    assert done.usage is not None
    assert done.usage.output_tokens == 40
    assert done.output_file_id is not None
    assert done.error_file_id is None
    assert done.in_progress_at is not None
    assert done.finalizing_at is not None
    assert done.completed_at is not None

    out = output_lines((await client.files.content(done.output_file_id)).content)
    assert [x["custom_id"] for x in out] == [f"req-{i}" for i in range(10)]
    for x in out:
        assert x["error"] is None
        assert x["id"].startswith("batch_req_")
        assert x["response"]["status_code"] == 200
        assert x["response"]["body"]["object"] == "chat.completion"
    async with aiohttp.ClientSession() as http, http.get(gw.url + "/metrics") as resp:
        metrics = await resp.text()
    assert 'berth_batch_lines_total{outcome="ok"} 10.0' in metrics
    assert 'berth_batch_batches_total{status="completed"} 1.0' in metrics
    assert 'berth_batch_tokens_total{kind="output"} 40.0' in metrics
    listed = await client.batches.list(limit=5)
    assert [b.id for b in listed.data] == [batch.id]
    output = await client.files.retrieve(done.output_file_id)
    assert output.purpose == "batch_output"
    assert output.expires_at == output.created_at + 7200

    deleted = await client.files.delete(file_id)
    assert deleted.deleted
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(file_id)


async def test_errors_go_to_the_error_file(engine_server: EngineServer, start_gateway: StartGateway) -> None:
    engine = FakeEngine(tokens=2, fail_status=400, fail_times=2)
    gw = await run_gateway(
        engine_server,
        start_gateway,
        engine,
        batch_toml("max_lines_in_flight = 1\n").replace("max_lines_in_flight = 3\n", ""),
    )
    client = gw.client()
    batch = await client.batches.create(
        input_file_id=await upload(client, jsonl([line(i) for i in range(4)])),
        endpoint=CHAT,
        completion_window="24h",
    )
    await gw.gw.batch.wait_ended(batch.id)
    done = await client.batches.retrieve(batch.id)
    assert done.request_counts is not None
    assert (
        done.request_counts.completed,
        done.request_counts.failed,
    ) == (2, 2)
    assert done.error_file_id is not None
    assert done.output_file_id is not None
    errors = output_lines((await client.files.content(done.error_file_id)).content)
    assert [e["custom_id"] for e in errors] == ["req-0", "req-1"]
    assert errors[0]["response"]["status_code"] == 400
    assert errors[0]["response"]["body"]["error"]["message"] == "engine exploded"


@pytest.mark.parametrize(
    ("lines", "code", "bad_line"),
    [
        pytest.param(
            jsonl([line(1), line(2, custom_id="req-1")]), "duplicate_custom_id", 2, id="duplicate-ids"
        ),
        pytest.param(jsonl([line(1), line(2)]) + b"{not json\n", "invalid_json_line", 3, id="bad-json"),
        pytest.param(jsonl([line(1), line(2, model="nope")]), "model_not_found", 2, id="unknown-model"),
        pytest.param(jsonl([line(1, url="/v1/completions")]), "invalid_url", 1, id="wrong-url"),
        pytest.param(jsonl([{**line(1), "method": "GET"}]), "invalid_method", 1, id="wrong-method"),
        pytest.param(jsonl([{**line(1), "body": {"model": "tiny"}}]), "invalid_request", 1, id="bad-body"),
        pytest.param(jsonl([line(i) for i in range(4)]), "too_many_requests", 4, id="too-many-lines"),
    ],
)
async def test_malformed_input_fails_with_the_line(
    engine_server: EngineServer, start_gateway: StartGateway, lines: bytes, code: str, bad_line: int
) -> None:
    gw = await run_gateway(engine_server, start_gateway, FakeEngine(), batch_toml("max_lines = 3\n"))
    client = gw.client()
    batch = await client.batches.create(
        input_file_id=await upload(client, lines), endpoint=CHAT, completion_window="24h"
    )
    assert batch.status == "failed"
    assert batch.failed_at is not None
    assert batch.errors is not None
    assert batch.errors.data
    first = batch.errors.data[0]
    assert (first.code, first.line) == (code, bad_line), first


async def test_upload_limits_and_bad_requests(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    # An upload is not a request body: [server] max_body_bytes does not bound it, [batch] max_file_bytes does.
    toml = "[server]\nmax_body_bytes = 2048\n" + batch_toml()
    gw = await run_gateway(engine_server, start_gateway, FakeEngine(), toml)
    client = gw.client()
    fits = jsonl([line(i) for i in range(40)])
    assert 2048 < len(fits) < 20000
    kept = await upload(client, fits)
    assert (await client.files.retrieve(kept)).bytes == len(fits)
    with pytest.raises(openai.APIStatusError) as big:
        await upload(client, jsonl([line(i) for i in range(300)]))
    assert big.value.status_code == 413
    assert "max_file_bytes" in str(big.value)
    assert [p.name for p in (Path(gw.gw.batch.settings.dir) / "files").iterdir()] == [kept]  # no leftovers
    with pytest.raises(openai.BadRequestError, match="jsonl"):
        await upload(client, jsonl([line(1)]), name="in.csv")
    file_id = await upload(client, jsonl([line(1)]))
    with pytest.raises(openai.BadRequestError, match="expires_after"):
        await client.files.create(
            file=("x.jsonl", io.BytesIO(b"{}\n")),
            purpose="batch",
            expires_after={"anchor": "created_at", "seconds": 60},
        )
    short = await client.files.create(
        file=("x.jsonl", io.BytesIO(b"{}\n")),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": 3600},
    )
    assert short.expires_at == short.created_at + 3600
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        await client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="soon")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        await client.batches.create(
            input_file_id=file_id, endpoint="/v1/moderations", completion_window="24h"
        )
    with pytest.raises(openai.NotFoundError):
        await client.batches.create(input_file_id="file-nope", endpoint=CHAT, completion_window="24h")


async def test_another_tenant_sees_nothing(engine_server: EngineServer, start_gateway: StartGateway) -> None:
    tenants = (
        '[auth]\nrequired = true\n[[tenants]]\nname = "a"\napi_keys = ["key-a"]\n'
        '[[tenants]]\nname = "b"\napi_keys = ["key-b"]\n'
    )
    gw = await run_gateway(engine_server, start_gateway, FakeEngine(), batch_toml() + tenants)
    a = gw.client(api_key="key-a")
    b = gw.client(api_key="key-b")
    file_id = await upload(a, jsonl([line(i) for i in range(2)]))
    batch = await a.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
    await gw.gw.batch.wait_ended(batch.id)
    for call in (
        b.files.retrieve(file_id),
        b.files.content(file_id),
        b.files.delete(file_id),
        b.batches.retrieve(batch.id),
        b.batches.cancel(batch.id),
        b.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h"),
    ):
        with pytest.raises(openai.NotFoundError):
            await call
    assert (await b.files.list()).data == []
    assert (await b.batches.list()).data == []
    assert (await a.batches.retrieve(batch.id)).status == "completed"
    with pytest.raises(openai.AuthenticationError):
        await gw.client().files.list()


async def test_cancel_in_the_middle(engine_server: EngineServer, start_gateway: StartGateway) -> None:
    hold = asyncio.Event()
    engine = FakeEngine(tokens=2, hold=hold, hold_if=lambda body: body["messages"][0]["content"] != "line 0")
    gw = await run_gateway(engine_server, start_gateway, engine, batch_toml())
    client = gw.client()
    batch = await client.batches.create(
        input_file_id=await upload(client, jsonl([line(i) for i in range(8)])),
        endpoint=CHAT,
        completion_window="24h",
    )
    while engine.running < 3:  # line 0 answered, lines 1-3 held at the engine
        await engine_event(engine)
    async with aiohttp.ClientSession() as http, http.get(gw.url + "/admin/fleet") as resp:
        doc = await resp.json()
    [running] = doc["batches"]
    assert (running["id"], running["completed"], running["in_flight"], running["total"]) == (
        batch.id,
        1,
        3,
        8,
    )
    frame = render(doc)
    assert "BATCHES" in frame
    assert batch.id in frame
    assert "12.5" in frame  # progress, %
    with pytest.raises(openai.BadRequestError, match="cancel it first"):
        await client.files.delete(batch.input_file_id)
    cancelling = await client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    await gw.gw.batch.wait_ended(batch.id)
    done = await client.batches.retrieve(batch.id)
    assert done.status == "cancelled"
    assert done.cancelled_at is not None
    assert done.request_counts is not None
    assert done.request_counts.completed == 1
    assert done.output_file_id is not None
    out = output_lines((await client.files.content(done.output_file_id)).content)
    assert [x["custom_id"] for x in out] == ["req-0"]
    assert engine.aborts == 3  # what ran was aborted at the engine
    assert len(engine.requests) == 4  # nothing was fed after the cancel


async def test_window_expires(engine_server: EngineServer, start_gateway: StartGateway) -> None:
    hold = asyncio.Event()
    engine = FakeEngine(tokens=2, hold=hold, hold_if=lambda body: body["messages"][0]["content"] != "line 0")
    gw = await run_gateway(engine_server, start_gateway, engine, batch_toml())
    now = [1_800_000_000.0]
    runner = gw.gw.batch
    runner.wall = runner.lines.wall = lambda: now[0]  # type: ignore[attr-defined]
    client = gw.client()
    batch = await client.batches.create(
        input_file_id=await upload(client, jsonl([line(i) for i in range(6)])),
        endpoint=CHAT,
        completion_window="90s",  # type: ignore[arg-type]  # a berth extension,
    )
    assert batch.completion_window == "90s"
    assert batch.expires_at == batch.created_at + 90
    while engine.running < 3:
        await engine_event(engine)
    now[0] += 91
    runner.poke()
    await runner.wait_ended(batch.id)
    done = await client.batches.retrieve(batch.id)
    assert done.status == "expired"
    assert done.expired_at is not None
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 5)
    assert done.output_file_id is not None
    assert done.error_file_id is not None
    errors = output_lines((await client.files.content(done.error_file_id)).content)
    assert sorted(e["custom_id"] for e in errors) == [f"req-{i}" for i in range(1, 6)]
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    assert all(e["response"] is None for e in errors)


async def engine_event(engine: FakeEngine) -> None:
    """The engine's next start or end of a generation."""
    engine.started.clear()
    engine.ended.clear()
    started = asyncio.ensure_future(engine.started.wait())
    ended = asyncio.ensure_future(engine.ended.wait())
    await asyncio.wait_for(asyncio.wait({started, ended}, return_when=asyncio.FIRST_COMPLETED), 10)
    started.cancel()
    ended.cancel()


async def test_lines_count_against_the_creators_limits(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    tenant = '[auth]\nrequired = true\n[[tenants]]\nname = "a"\napi_keys = ["key-a"]\nmax_concurrency = 1\n'
    gw = await run_gateway(
        engine_server, start_gateway, FakeEngine(tokens=3), batch_toml("retry_s = 0.01\n") + tenant
    )
    a = gw.client(api_key="key-a")
    batch = await a.batches.create(
        input_file_id=await upload(a, jsonl([line(i) for i in range(3)])),
        endpoint=CHAT,
        completion_window="24h",
    )
    await gw.gw.batch.wait_ended(batch.id)
    done = await a.batches.retrieve(batch.id)
    assert done.request_counts is not None
    assert (done.status, done.request_counts.completed) == ("completed", 3)
    tenancy = gw.gw.services.tenancy
    assert tenancy.rate_limited.get(("a", "max_concurrency"), 0) >= 1  # three lines, one seat: some waited
    assert tenancy.completion_tokens["a"] == 9
    assert tenancy.requests[("a", "ok")] == 3


async def test_a_line_is_preempted_by_interactive_work_and_resumed(
    tmp_path: Path, engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    engine = FakeEngine(tokens=10, pause_after_tokens=4, role_chunk=True)
    url = await engine_server(engine)
    policy = tmp_path / "policy.toml"
    policy.write_text(PREEMPT_POLICY)
    gw = await start_gateway(
        [f"{url},engine=vllm,class=mixed,cap=1"], toml=batch_toml(f'[policy]\nfile = "{policy}"\n')
    )
    client = gw.client()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    item = {"custom_id": "only", "method": "POST", "url": CHAT, "body": body}
    batch = await client.batches.create(
        input_file_id=await upload(client, jsonl([item])), endpoint=CHAT, completion_window="24h"
    )
    await engine.paused.wait()  # the line has produced 4 tokens and holds the only seat
    answer = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "now"}], max_tokens=3
    )
    assert answer.choices[0].message.content == " t0 t1 t2"
    await gw.gw.batch.wait_ended(batch.id)
    done = await client.batches.retrieve(batch.id)
    assert done.output_file_id is not None
    [out] = output_lines((await client.files.content(done.output_file_id)).content)
    assert out["response"]["body"]["choices"][0]["message"]["content"] == "".join(f" t{i}" for i in range(10))
    assert engine.aborts == 1  # the line's first engine call, aborted when it was preempted
    assert len(engine.requests) == 3  # the line, the interactive request, the line's resumed call


async def test_a_test_gateway_keeps_its_batches_in_the_tests_directory(
    engine_server: EngineServer, start_gateway: StartGateway, tmp_path: Path
) -> None:
    # No [batch] dir: berth's default is ./berth-state/batch, which a test must not write into the cwd.
    gw = await run_gateway(engine_server, start_gateway, FakeEngine(), "")
    async with aiohttp.ClientSession() as s, s.get(gw.url + "/v1/files") as r:
        assert r.status == 200  # the route opened (created) the store
    assert gw.gw.batch is not None
    assert gw.gw.batch.settings.dir == tmp_path / "batch"
    assert (tmp_path / "batch" / "batch.sqlite3").exists()
