"""The soak's client population: what each request does, and how its ending is judged.

Every request is drawn from a seeded RNG by its index: chat or completions, streamed or not, an API key of
one tenant, and a behaviour. Most behave; some disconnect before the response headers, some mid-stream,
some read slowly, some reuse an X-Request-Id that concurrent requests also carry (the duplicate-id
attack), and some present a key no tenant has (berth requires keys: 401 `invalid_api_key`). Every
request runs under a client deadline, so a hang is seen as one.

An ending is an `Outcome`: `ok`, a precise OpenAI error (`http <status> <code>` or `stream_error <code>`),
`client_abort` (the client went away on purpose), `not_accepted` (the connection was refused: berth had
stopped listening) or a violation (`hang`, `truncated_stream`, `bad_error_shape`, `bad_body`,
`internal_error`, `connection_dropped`, `id_not_echoed`, `slow_reader_timed_out`: a paused client's
stream taken for a stalled engine's), which the soak counts against its first invariant. A `Tally`
counts the endings of a phase's requests.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import aiohttp
import orjson

MODEL: Final = "soak-model"
BEHAVIOURS: Final = (
    "normal",
    "disconnect_before_headers",
    "disconnect_mid_stream",
    "slow_reader",
    "duplicate_request_id",
    "unknown_key",
)
# Shares of the behaviours above (the rest of the requests behave).
_WEIGHTS: Final = (0.78, 0.04, 0.05, 0.04, 0.07, 0.02)
DUPLICATE_IDS: Final = 3  # X-Request-Id values shared by the duplicate-id requests
LONG_STREAM_TOKENS: Final = 2000  # a slow reader's long stream (more than the socket buffers hold)
_STALL_MAX_EVENTS: Final = 8  # a stalled stream (the stall fault: after 1-3 tokens) has no more events
VIOLATIONS: Final = frozenset(
    (
        "hang",
        "truncated_stream",
        "bad_error_shape",
        "bad_body",
        "internal_error",
        "connection_dropped",
        "id_not_echoed",
        "slow_reader_timed_out",
    )
)


@dataclass(frozen=True, slots=True)
class Plan:
    index: int
    chat: bool
    stream: bool
    behaviour: str
    key: str
    max_tokens: int
    request_id: str | None
    cut_after_s: float  # disconnect_before_headers: give up after this long
    cut_after_events: int  # disconnect_mid_stream: close after this many events
    read_pause_s: float  # slow_reader: pause between reads
    min_tokens: int = 0  # > 0: ask for at least this many tokens (long streams)
    stop_reading_s: float = 0.0  # slow_reader: once, after the first chunk, read nothing for this long

    @classmethod
    def draw(cls, index: int, seed: int, keys: Sequence[str], *, stop_reading_s: float = 0.0) -> Plan:
        """The plan of request `index`; one slow reader in ten asks for a long stream and stops reading
        for `stop_reading_s` (longer than berth's stall timeout: a slow client is no stalled engine)."""
        rng = random.Random(seed * 1_000_003 + index)
        behaviour = rng.choices(BEHAVIOURS, _WEIGHTS)[0]
        stream = rng.random() < 0.6 or behaviour in ("disconnect_mid_stream", "slow_reader")
        long_pause = behaviour == "slow_reader" and rng.random() < 0.1 and stop_reading_s > 0
        return cls(
            index=index,
            chat=rng.random() < 0.5,
            stream=stream,
            behaviour=behaviour,
            key=rng.choice(keys) if behaviour != "unknown_key" else f"sk-unknown-{rng.getrandbits(64):016x}",
            max_tokens=rng.randint(4, 24),
            request_id=(
                f"soak-dup-{rng.randrange(DUPLICATE_IDS)}" if behaviour == "duplicate_request_id" else None
            ),
            cut_after_s=rng.uniform(0.0, 0.03),
            cut_after_events=rng.randint(1, 4),
            read_pause_s=rng.uniform(0.002, 0.02),
            min_tokens=LONG_STREAM_TOKENS if long_pause else 0,
            stop_reading_s=stop_reading_s if long_pause else 0.0,
        )

    def body(self) -> bytes:
        max_tokens = max(self.max_tokens, self.min_tokens)
        body: dict[str, object] = {"model": MODEL, "max_tokens": max_tokens, "stream": self.stream}
        if self.min_tokens:
            body["min_tokens"] = self.min_tokens
        if self.chat:
            body["messages"] = [{"role": "user", "content": f"soak request {self.index}: say something"}]
        else:
            body["prompt"] = f"soak request {self.index}: continue this"
        return orjson.dumps(body)

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"}
        if self.request_id is not None:
            h["X-Request-Id"] = self.request_id
        return h


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: str  # see the module docstring
    detail: str = ""

    @property
    def violation(self) -> bool:
        return self.kind in VIOLATIONS


async def run_one(session: aiohttp.ClientSession, base_url: str, plan: Plan, deadline_s: float) -> Outcome:
    """Send `plan`'s request and judge its ending (never raises but CancelledError)."""
    path = "/v1/chat/completions" if plan.chat else "/v1/completions"
    try:
        async with asyncio.timeout(deadline_s):
            if plan.behaviour == "disconnect_before_headers":
                return await _cut_before_headers(session, base_url + path, plan)
            async with session.post(base_url + path, data=plan.body(), headers=plan.headers()) as resp:
                return await _judge(resp, plan)
    except TimeoutError:
        return Outcome("hang", f"no ending within {deadline_s:g}s")
    except aiohttp.ClientConnectorError as e:
        return Outcome("not_accepted", str(e.os_error))
    except (aiohttp.ClientError, ConnectionError) as e:
        return Outcome("connection_dropped", f"{type(e).__name__}: {e}")


async def _cut_before_headers(session: aiohttp.ClientSession, url: str, plan: Plan) -> Outcome:
    """Start the request, and give up after `cut_after_s` if the headers have not come by then."""

    async def call() -> Outcome:
        async with session.post(url, data=plan.body(), headers=plan.headers()) as resp:
            return await _judge(resp, plan)

    try:
        async with asyncio.timeout(plan.cut_after_s):
            return await call()
    except TimeoutError:
        return Outcome("client_abort", "before headers")


async def _judge(resp: aiohttp.ClientResponse, plan: Plan) -> Outcome:
    if plan.request_id is not None and resp.headers.get("X-Request-Id") != plan.request_id:
        return Outcome("id_not_echoed", f"sent {plan.request_id}, got {resp.headers.get('X-Request-Id')}")
    if resp.status != 200:
        return _error(resp.status, await resp.read())
    if not plan.stream:
        try:
            obj = orjson.loads(await resp.read())
        except orjson.JSONDecodeError:
            return Outcome("bad_body", "a 200 whose body is not JSON")
        if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list) or not obj["choices"]:
            return Outcome("bad_body", "a 200 without choices")
        return Outcome("ok")
    return await _read_stream(resp, plan)


def _error(status: int, body: bytes) -> Outcome:
    try:
        err = orjson.loads(body)["error"]
        shape_ok = set(err) == {"message", "type", "param", "code"} and isinstance(err["code"], str)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        shape_ok = False
    if not shape_ok:
        return Outcome("bad_error_shape", f"{status}: {body[:200]!r}")
    if status == 500:
        return Outcome("internal_error", str(err["message"])[:200])
    return Outcome(f"http {status} {err['code']}")


async def _read_stream(resp: aiohttp.ClientResponse, plan: Plan) -> Outcome:
    buf = b""
    events = 0
    stop_reading_s = plan.stop_reading_s
    async for chunk in resp.content.iter_any():
        buf += chunk
        events = buf.count(b"\n\n")
        if plan.behaviour == "disconnect_mid_stream" and events >= plan.cut_after_events:
            resp.close()  # mid-stream: the connection is dropped, not returned to the pool
            return Outcome("client_abort", "mid-stream")
        if plan.behaviour == "slow_reader":
            await asyncio.sleep(plan.read_pause_s + stop_reading_s)
            stop_reading_s = 0.0
    parts = [e for e in buf.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]
    if not parts:
        return Outcome("truncated_stream", "an empty stream")
    last = parts[-1]
    if last == b"data: [DONE]":
        return Outcome("ok")
    try:
        err = orjson.loads(last.removeprefix(b"data:").strip())["error"]
        code = err["code"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return Outcome("truncated_stream", f"{events} events, the last {last[:120]!r}")
    if not isinstance(code, str):
        return Outcome("truncated_stream", f"an error event without a code: {last[:120]!r}")
    if code == "engine_timeout" and plan.stop_reading_s and events > _STALL_MAX_EVENTS:
        # the stall fault stops a stream within its first tokens; this one ran on, then its client paused
        return Outcome("slow_reader_timed_out", f"{events} events, then {last[:120]!r}")
    return Outcome(f"stream_error {code}")


@dataclass
class Tally:
    """Outcomes by kind, and a few examples of each violation."""

    outcomes: Counter[str] = field(default_factory=Counter)
    behaviours: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    unknown_keys: set[str] = field(default_factory=set)  # presented, to look for in the log too

    def add(self, plan: Plan, outcome: Outcome) -> None:
        self.outcomes[outcome.kind] += 1
        self.behaviours[plan.behaviour] += 1
        if plan.behaviour == "unknown_key":
            self.unknown_keys.add(plan.key)
        if outcome.violation:
            self.examples.setdefault(outcome.kind, [])
            if len(self.examples[outcome.kind]) < 5:
                self.examples[outcome.kind].append(f"#{plan.index} {plan.behaviour}: {outcome.detail}")

    @property
    def violations(self) -> int:
        return sum(n for kind, n in self.outcomes.items() if Outcome(kind).violation)
