"""Exact prompt tokens from the engine's /tokenize (`[telemetry] prompt_tokens = "tokenize"`), over
loopback: the count becomes the request's prompt tokens (seen in /admin/fleet while the engine holds
the request) and calibrates the estimate; every failure falls back to the estimate without failing the
request; a client that leaves during the count leaks nothing; the default asks nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.admission.prompt_tokens import PromptTokens
from gateway.config import ADMIN_TOKEN_ENV
from gateway.core.types import ModelName
from loadgen.harness import free_port
from tests.integration.conftest import EngineServer, Running, StartGateway
from tests.integration.fake_engine import FakeEngine

CHAT = "/v1/chat/completions"
CONTENT = "x" * 200  # 200 characters: 50 tokens by the default estimate (4 characters per token)
ESTIMATE = 50
EXACT = 40  # what the fake engine's /tokenize says: 5 characters per token


@pytest.fixture(autouse=True)
def _no_admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ADMIN_TOKEN_ENV, raising=False)


def _toml(url: str, *, timeout_s: float = 5.0, mode: str = "tokenize") -> str:
    return (
        f'[telemetry]\nprompt_tokens = "{mode}"\ntokenize_timeout_s = {timeout_s}\n'
        '[aliases]\n"gpt-x" = "tiny"\n'
        f'[[endpoints]]\nurl = "{url}"\nengine = "vllm"\n'
    )


def _results(r: Running) -> dict[str, float]:
    out: dict[str, float] = {}
    for metric in r.gw.metrics.registry.collect():
        if metric.name == "berth_tokenize_requests":
            for s in metric.samples:
                if s.name.endswith("_total"):
                    out[s.labels["result"]] = s.value
    return out


async def _fleet(r: Running) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(r.url + "/admin/fleet") as resp:
        assert resp.status == 200
        doc = orjson.loads(await resp.read())
    assert isinstance(doc, dict)
    return doc


async def _running_prompt_tokens(r: Running) -> int:
    [ep] = (await _fleet(r))["endpoints"]
    n = ep["running_context"]["prompt_tokens"]
    assert isinstance(n, int)
    return n


async def _post(r: Running, path: str, body: dict[str, Any]) -> int:
    async with aiohttp.ClientSession() as s, s.post(r.url + path, data=orjson.dumps(body)) as resp:
        await resp.read()
        return resp.status


async def _held(r: Running, eng: FakeEngine, path: str, body: dict[str, Any]) -> int:
    """Send the request, read the prompt tokens it runs with while the engine holds it, release it."""
    assert eng.hold is not None
    call = asyncio.ensure_future(_post(r, path, body))
    await eng.started.wait()
    prompt_tokens = await _running_prompt_tokens(r)
    eng.hold.set()
    assert await call == 200
    return prompt_tokens


@pytest.mark.parametrize(
    ("path", "body", "tokenized"),
    [
        pytest.param(
            CHAT,
            {"model": "gpt-x", "messages": [{"role": "user", "content": CONTENT}], "max_tokens": 3},
            {"model": "tiny", "messages": [{"role": "user", "content": CONTENT}]},
            id="chat",
        ),
        pytest.param(
            CHAT,
            {
                "model": "gpt-x",
                "messages": [{"role": "user", "content": CONTENT}],
                "add_generation_prompt": False,
                "continue_final_message": True,
                "temperature": 0.5,
            },
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": CONTENT}],
                "add_generation_prompt": False,
                "continue_final_message": True,
            },
            id="chat-template-fields-only",
        ),
        pytest.param(
            "/v1/completions",
            {"model": "gpt-x", "prompt": CONTENT, "max_tokens": 3},
            {"model": "tiny", "prompt": CONTENT},
            id="completion",
        ),
    ],
)
async def test_the_engines_count_is_the_requests_prompt_tokens(
    engine_server: EngineServer,
    start_gateway: StartGateway,
    path: str,
    body: dict[str, Any],
    tokenized: dict[str, Any],
) -> None:
    eng = FakeEngine(hold=asyncio.Event(), tokenize_count=EXACT)
    r = await start_gateway([], toml=_toml(await engine_server(eng)))

    assert await _held(r, eng, path, body) == EXACT

    assert eng.tokenizes == [tokenized]  # the served name, the prompt and nothing else
    assert eng.requests[0]["model"] == "tiny"
    assert _results(r) == {"ok": 1.0}
    # The count calibrated the estimate: 200 characters in 40 tokens.
    assert (await _fleet(r))["models"]["tiny"]["chars_per_token"] == pytest.approx(5.0)


@pytest.mark.parametrize(
    ("tokenize", "result"),
    [
        pytest.param({"tokenize_status": 500}, "error", id="500"),
        pytest.param({"tokenize_count": None}, "error", id="404"),
        pytest.param({"tokenize_answer": b'{"tokens": []}'}, "error", id="no-count"),
        pytest.param({"tokenize_answer": b"<html>"}, "error", id="not-json"),
        pytest.param({"tokenize_answer": b'{"count": -1}'}, "error", id="negative-count"),
        pytest.param({"tokenize_hold": True}, "timeout", id="slow"),
    ],
)
async def test_a_failed_count_falls_back_to_the_estimate(
    engine_server: EngineServer, start_gateway: StartGateway, tokenize: dict[str, Any], result: str
) -> None:
    eng = FakeEngine(hold=asyncio.Event(), tokenize_count=EXACT)
    for key, value in tokenize.items():
        # "slow": an event never set, so only the gateway's timeout ends the call
        setattr(eng, key, asyncio.Event() if value is True else value)
    timeout_s = 0.001 if result == "timeout" else 5.0
    r = await start_gateway([], toml=_toml(await engine_server(eng), timeout_s=timeout_s))
    body = {"model": "tiny", "messages": [{"role": "user", "content": CONTENT}]}

    assert await _held(r, eng, CHAT, body) == ESTIMATE

    assert _results(r) == {result: 1.0}
    if result != "timeout":
        assert len(eng.tokenizes) == 1
    elif eng.tokenize_started.is_set():  # (the deadline may also pass before the engine reads it)
        await eng.tokenize_cancelled.wait()  # the gateway closed the tokenize connection


async def test_an_endpoint_without_the_route_is_not_asked_again(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    eng = FakeEngine(tokenize_count=None)  # 404
    r = await start_gateway([], toml=_toml(await engine_server(eng)))
    body = {"model": "tiny", "messages": [{"role": "user", "content": CONTENT}]}

    assert await _post(r, CHAT, body) == 200
    assert await _post(r, CHAT, body) == 200

    assert len(eng.tokenizes) == 1
    assert _results(r) == {"error": 1.0, "unsupported": 1.0}
    assert len(eng.requests) == 2


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param("/v1/completions", {"model": "tiny", "prompt": ["a", "b"]}, id="prompt-batch"),
        pytest.param("/v1/embeddings", {"model": "tiny", "input": ["a", "b"]}, id="embedding-batch"),
    ],
)
async def test_a_prompt_that_is_not_one_string_is_not_counted(
    engine_server: EngineServer, start_gateway: StartGateway, path: str, body: dict[str, Any]
) -> None:
    eng = FakeEngine(tokenize_count=EXACT)
    r = await start_gateway([], toml=_toml(await engine_server(eng)))

    assert await _post(r, path, body) == 200

    assert eng.tokenizes == []
    assert _results(r) == {"unsupported": 1.0}


async def test_a_prompt_of_token_ids_is_counted_without_asking(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    eng = FakeEngine(tokenize_count=EXACT)
    r = await start_gateway([], toml=_toml(await engine_server(eng)))

    assert await _post(r, "/v1/completions", {"model": "tiny", "prompt": [1, 2, 3]}) == 200

    assert eng.tokenizes == []
    assert _results(r) == {"given": 1.0}


async def test_client_disconnect_during_the_count_leaks_nothing(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    eng = FakeEngine(tokenize_count=EXACT, tokenize_hold=asyncio.Event())  # never released
    r = await start_gateway([], toml=_toml(await engine_server(eng), timeout_s=5.0))
    body = orjson.dumps({"model": "tiny", "messages": [{"role": "user", "content": CONTENT}]})
    async with aiohttp.ClientSession() as s:
        call = asyncio.ensure_future(s.post(r.url + CHAT, data=body))
        await eng.tokenize_started.wait()
        call.cancel()  # the client goes away while its prompt is being counted
    await eng.tokenize_cancelled.wait()  # the engine saw the tokenize connection close
    registry = r.gw.metrics.registry
    while not registry.get_sample_value("berth_client_disconnects_total", {"model": "tiny"}):
        await asyncio.sleep(0)  # the handler's finish phase runs next

    assert eng.requests == []  # never dispatched
    assert r.gw.scheduler.queue_depth(ModelName("tiny")) == 0
    assert sum(e.inflight for e in r.gw.scheduler.snapshot().endpoints) == 0
    assert _results(r) == {}  # a call the client abandoned is not an outcome


async def test_the_default_asks_no_engine(engine_server: EngineServer, start_gateway: StartGateway) -> None:
    eng = FakeEngine(tokenize_count=EXACT, hold=asyncio.Event())
    r = await start_gateway([], toml=_toml(await engine_server(eng), mode="estimate"))
    body = {"model": "tiny", "messages": [{"role": "user", "content": CONTENT}]}

    assert _timeout(r) is None
    assert await _held(r, eng, CHAT, body) == ESTIMATE

    assert eng.tokenizes == []
    assert _results(r) == {}


async def test_reload_turns_it_on_and_off(engine_server: EngineServer, start_gateway: StartGateway) -> None:
    eng = FakeEngine(tokenize_count=EXACT)
    url = await engine_server(eng)
    r = await start_gateway([], toml=_toml(url, mode="estimate"))
    cfg = r.gw.options.config_path
    assert cfg is not None
    assert _timeout(r) is None

    cfg.write_text(_toml(url, timeout_s=0.5))
    assert await r.gw.reload()
    assert _timeout(r) == 0.5
    assert await _post(r, CHAT, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}) == 200
    assert _results(r) == {"ok": 1.0}

    cfg.write_text(_toml(url, mode="estimate"))
    assert await r.gw.reload()
    assert _timeout(r) is None


def _timeout(r: Running) -> float | None:
    """The running counter's timeout; None: no counter (the estimate)."""
    counter = r.gw.services.prompt_counter
    return None if counter is None else counter.timeout_s


async def test_an_endpoint_with_kv_events_makes_berth_ask_for_token_ids(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    """The precise prefix source matches by token ids: with `kv_events` on an endpoint, berth asks the
    engine for the prompt's ids (even with the default estimate for counts) and keeps them."""
    eng = FakeEngine(tokenize_count=EXACT)
    port = free_port()  # nothing publishes there: the subscriber waits, the request path does not
    toml = _toml(await engine_server(eng), mode="estimate") + f'kv_events = "tcp://127.0.0.1:{port}"\n'
    r = await start_gateway([], toml=toml)
    counter = r.gw.services.prompt_counter
    assert counter is not None
    assert counter.ids
    seen: list[PromptTokens | None] = []
    measure = counter.measure

    async def spy(*args: Any) -> PromptTokens | None:
        seen.append(await measure(*args))
        return seen[-1]

    counter.measure = spy  # type: ignore[method-assign,assignment]
    body = {"model": "tiny", "messages": [{"role": "user", "content": CONTENT}]}
    assert await _post(r, CHAT, body) == 200
    assert await _post(r, "/v1/completions", {"model": "tiny", "prompt": [7, 8, 9]}) == 200

    assert len(eng.tokenizes) == 1  # the ids prompt needed no call
    assert seen == [PromptTokens(EXACT, tuple(range(EXACT))), PromptTokens(3, (7, 8, 9))]
    assert _results(r) == {"ok": 1.0, "given": 1.0}
