"""The Responses API through berth with the official SDK: create (whole and streamed) through the
scheduler, and every later call about a response (`previous_response_id`, retrieve, cancel) back on the
engine that made it; another tenant's response is berth's 404, an unknown id the engine's."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest

from loadgen.engine_sim.server import serve_endpoint
from loadgen.engine_sim.spec import EndpointSpec
from tests.integration.conftest import EngineServer, Running, StartGateway
from tests.integration.fake_engine import FakeEngine
from tests.integration.fake_responses import FakeResponses

TENANTS = (
    "[auth]\nrequired = true\n"
    '[[tenants]]\nname = "a"\napi_keys = ["key-a"]\n'
    '[[tenants]]\nname = "b"\napi_keys = ["key-b"]\n'
    '[aliases]\nsmall = "tiny"\n'
)


async def _two_engines(
    engine_server: EngineServer, start_gateway: StartGateway
) -> tuple[Running, dict[str, FakeEngine]]:
    engines = {name: FakeEngine(responses=FakeResponses(name=name)) for name in ("a", "b")}
    urls = [await engine_server(e) for e in engines.values()]
    gw = await start_gateway([f"{u},engine=vllm" for u in urls], toml=TENANTS)
    return gw, engines


UNHEALTHY_AFTER = 2


async def test_follow_ups_go_back_to_the_engine_that_made_the_response(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    gw, engines = await _two_engines(engine_server, start_gateway)
    a, b = gw.client(api_key="key-a"), gw.client(api_key="key-b")
    first = await a.responses.create(model="small", input="hello", max_output_tokens=3)
    assert first.output_text == " t0 t1 t2"
    assert first.model == "small"  # the alias the client used
    assert first.usage is not None
    assert first.usage.output_tokens == 3
    maker_name = first.id[len("resp_")]
    engines[maker_name].running = engines[maker_name].waiting = 50  # busy: placement now prefers the other
    await gw.scrape()
    elsewhere = await a.responses.create(model="small", input="new conversation")
    assert elsewhere.id[len("resp_")] != maker_name
    maker = engines[maker_name].responses
    maker.requests.clear()
    # Each follow-up needs the response its engine keeps: the other engine would answer 404.
    turn = first
    for _ in range(4):
        turn = await a.responses.create(model="small", input="and then?", previous_response_id=turn.id)
        assert turn.id.startswith(first.id[:6])
    assert len(maker.requests) == 4
    got = await a.responses.retrieve(first.id)
    assert (got.id, got.status) == (first.id, "completed")
    assert maker.retrieved == [first.id]
    # Another tenant's response is berth's 404; the engines are not asked.
    with pytest.raises(openai.NotFoundError, match="not found"):
        await b.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError, match="not found"):
        await b.responses.cancel(first.id)
    with pytest.raises(openai.NotFoundError, match="not found"):
        await b.responses.create(model="tiny", input="x", previous_response_id=first.id)
    assert maker.retrieved == [first.id]
    assert len(maker.requests) == 4
    # An id berth never saw is asked of an engine: its 404.
    with pytest.raises(openai.NotFoundError, match="resp_unknown"):
        await a.responses.retrieve("resp_unknown")
    assert sum(e.responses.retrieved.count("resp_unknown") for e in engines.values()) == 1
    with pytest.raises(openai.NotFoundError, match="resp_nope"):
        await a.responses.create(model="tiny", input="x", previous_response_id="resp_nope")


async def test_background_response_cancelled_on_its_engine(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    gw, _ = await _two_engines(engine_server, start_gateway)
    url = gw.url
    a = gw.client(api_key="key-a")
    queued = await a.responses.create(model="tiny", input="later", background=True)
    assert queued.status == "queued"
    cancelled = await a.responses.cancel(queued.id)
    assert (cancelled.id, cancelled.status) == (queued.id, "cancelled")
    assert (await a.responses.retrieve(queued.id)).status == "cancelled"
    done = await a.responses.create(model="tiny", input="now")
    with pytest.raises(openai.BadRequestError, match="synchronous"):  # the engine's own refusal
        await a.responses.cancel(done.id)
    async with aiohttp.ClientSession() as http:
        async with http.delete(
            f"{url}/v1/responses/{done.id}", headers={"Authorization": "Bearer key-a"}
        ) as r:
            assert r.status == 405
        async with http.get(f"{url}/v1/responses/{done.id}") as r:
            assert r.status == 401


async def test_streamed_response_relayed_as_the_engine_sent_it(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    engine = FakeEngine()
    gw = await start_gateway([f"{await engine_server(engine)},engine=vllm"], toml=TENANTS)
    a = gw.client(api_key="key-a")
    stream = await a.responses.create(model="small", input="hi", stream=True)
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == " t0 t1 t2 t3"
    final = events[-1]
    assert final.type == "response.completed"
    assert final.response.model == "small"  # the alias the client used
    assert engine.responses.requests[0]["model"] == "tiny"
    assert "stream_options" not in engine.responses.requests[0]  # nothing added to the client's body
    # The id the stream named routes back too.
    assert (await a.responses.retrieve(final.response.id)).output_text == text
    async with aiohttp.ClientSession() as http, http.get(gw.url + "/metrics") as r:
        metrics = await r.text()
    assert 'berth_output_tokens_total{model="small"} 4.0' in metrics


async def test_no_ready_endpoint_is_berths_404(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    engine = FakeEngine()
    toml = f"[scrape]\nunhealthy_after = {UNHEALTHY_AFTER}\n"
    gw = await start_gateway([f"{await engine_server(engine)},engine=vllm"], toml=toml)
    made = await gw.client().responses.create(model="tiny", input="hi")
    engine.health_status = 503
    for _ in range(UNHEALTHY_AFTER):
        await gw.scrape()
    async with aiohttp.ClientSession() as http:
        for url in (f"{gw.url}/v1/responses/{made.id}", f"{gw.url}/v1/responses/resp_never"):
            async with http.get(url) as r:
                assert r.status == 404
                err = (await r.json())["error"]
                assert (err["code"], err["param"]) == ("not_found", "response_id")
    assert engine.responses.retrieved == []  # no engine was asked


async def test_a_streamed_background_response_is_cancelled_while_it_streams(
    engine_server: EngineServer, start_gateway: StartGateway
) -> None:
    gw, engines = await _two_engines(engine_server, start_gateway)
    for e in engines.values():
        e.responses.hold = asyncio.Event()  # each stream waits after its first token
    a = gw.client(api_key="key-a")
    stream = await a.responses.create(model="tiny", input="long", background=True, stream=True)
    events = aiter(stream)
    created = await anext(events)
    assert created.type == "response.created"
    rid = created.response.id
    assert (await anext(events)).type == "response.in_progress"
    assert (await anext(events)).type == "response.output_text.delta"  # the engine now holds the rest
    cancelled = await a.responses.cancel(rid)  # routed by the id the stream named, while it streams
    assert (cancelled.id, cancelled.status) == (rid, "cancelled")
    maker = engines[rid[len("resp_")]].responses
    assert maker.hold is not None
    maker.hold.set()
    rest = [e.type async for e in events]
    assert rest[-1] == "response.completed"


async def test_a_streamed_retrieve_is_relayed_as_the_engine_streams_it(start_gateway: StartGateway) -> None:
    """`GET /v1/responses/{id}?stream=true` of a background response, through berth, in front of the
    engine simulator: the events reach the client while the engine still generates (berth relays the
    stream as it comes, as it does a generation's), and they are the engine's own, byte for byte."""
    # fleet-7b: about 26 ms a token, so the 120 tokens take about 3 s (the first events come at once).
    spec = EndpointSpec(models=("sim",), profile="fleet-7b", load_time_s=0.0)
    async with serve_endpoint(spec) as engine:
        gw = await start_gateway([f"{engine.url},engine=vllm"])
        async with aiohttp.ClientSession() as s:
            body = {"model": "sim", "input": "hello", "max_output_tokens": 120, "background": True}
            async with s.post(gw.url + "/v1/responses", json=body) as r:
                assert r.status == 200, await r.text()
                rid = (await r.json())["id"]
            url = f"{gw.url}/v1/responses/{rid}?stream=true"
            async with s.get(url) as r:
                assert r.status == 200
                first = await r.content.readuntil(b"\n\n")
                assert first.startswith(b"event: response.created\n")
                # The engine has not finished: what came was relayed as it came, not held for the end.
                async with s.get(f"{engine.url}/v1/responses/{rid}") as now:
                    assert (await now.json())["status"] == "in_progress"
                relayed, headers = first + await r.read(), r.headers
            async with s.get(f"{engine.url}/v1/responses/{rid}?stream=true") as r:
                direct = await r.read()
            assert relayed == direct  # the whole stream, replayed by the engine: the same bytes
            assert headers["Content-Type"].startswith("text/event-stream")
            assert headers["X-Berth-Endpoint"] == engine.url.split("//")[1]
            assert relayed.count(b"event: response.output_text.delta\n") == 120
            assert relayed.rstrip().rsplit(b"\n\n", 1)[-1].startswith(b"event: response.completed\n")
            # Half of it, after a sequence number (the query goes with it), then an id the engine lacks.
            async with s.get(f"{url}&starting_after=60") as r:
                rest = await r.read()
            assert rest == direct[direct.index(b"event: ", direct.index(b'"sequence_number":60')) :]
            async with s.get(f"{gw.url}/v1/responses/resp_unknown?stream=true") as r:
                assert r.status == 404
                assert "resp_unknown" in (await r.json())["error"]["message"]
