"""Engine dialects: where vLLM and SGLang keep their health, model list and metrics, and what the
metrics are called.

Metric names (checked against the engines' sources, see the report of the issue that added this file):

vLLM V1 (`vllm/v1/metrics/loggers.py`, `PrometheusStatLogger`), label names `model_name` and `engine`
(one label set per data-parallel engine core):
- gauges `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`
  ("KV-cache usage. 1 means 100 percent usage": a fraction 0..1 despite the name); until 0.10 also the
  deprecated twin `vllm:gpu_cache_usage_perc` with the same value (the only name before 0.9);
- counters `vllm:prompt_tokens_total`, `vllm:generation_tokens_total` (prometheus_client adds `_total`);
- histograms `vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds` (0.11+; before
  that `vllm:time_per_output_token_seconds`, and 0.10/0.11 emit both with identical data),
  `vllm:e2e_request_latency_seconds`.

SGLang (`sglang/srt/metrics/collector.py`), labels `model_name` plus, on scheduler gauges,
`engine_type`, `tp_rank`, `pp_rank` (and more with DP attention / PD disaggregation):
- gauges `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage` (used KV tokens /
  pool size, a fraction 0..1);
- counters `sglang:prompt_tokens_total`, `sglang:generation_tokens_total`;
- histograms `sglang:time_to_first_token_seconds`, `sglang:inter_token_latency_seconds` (older releases:
  `sglang:time_per_output_token_seconds`, a per-request average), `sglang:e2e_request_latency_seconds`.
SGLang writes `sglang:`; the same series also circulate as `sglang_...` (the sgl-router's aggregated
`/engine_metrics` and Prometheus-normalised copies), and newer `prometheus_client` releases write
`vllm_...`/`sglang_...` sample names in OpenMetrics output, so both spellings are read.

When an engine emits a new name next to its deprecated twin the values are the same series twice, so a
dialect reads the first name present in its list and never adds names together. Across label sets of
one name it adds (requests, tokens) or averages (KV fraction: vLLM's own log line averages
`kv_cache_usage` over its engines).

Priority: both engines take an integer `priority` in the request body when they run priority
scheduling (vLLM `--scheduling-policy priority`: lower runs first; an FCFS vLLM answers 400 "Priority
scheduling is not enabled" to a request that carries one. SGLang `--enable-priority-scheduling`: higher
runs first by default). `Dialect.priority` turns berth's urgency (0 most urgent) into the engine's value.

Abort: both engines abort a request when its HTTP connection closes. vLLM's OpenAI routes are wrapped
in `with_cancellation` (`vllm/entrypoints/utils.py`: a task waits for `http.disconnect` and cancels the
handler, and the cancelled generator aborts the request in the engine); streams stop with the
`StreamingResponse`. SGLang's `TokenizerManager` checks `request.is_disconnected()` while it waits and
calls `abort_request(rid)` (and aborts streams on disconnect too). So closing the upstream connection
is the abort. SGLang also has `POST /abort_request` with `{"rid": ...}` (its OpenAI requests accept a
`rid` field), which `abort_path`/`abort_body` describe for callers that want to abort without closing.

Tokenize (exact prompt-token counts, `[telemetry] prompt_tokens = "tokenize"`): both engines answer
`POST /tokenize` with `{"count": N, "max_model_len": M, "tokens": [...]}`.
- vLLM (`vllm/entrypoints/serve/tokenize/`): `{"model", "prompt", "add_special_tokens"}` counts a
  completion prompt; `{"model", "messages", "add_generation_prompt", "continue_final_message",
  "add_special_tokens", "chat_template", "chat_template_kwargs", "tools", ...}` renders the chat
  template as `/v1/chat/completions` does (same defaults) and counts that. A model the server does
  not serve is a 404.
- SGLang (`sglang/srt/entrypoints/http_server.py`, also at `/v1/tokenize`): `{"model", "prompt",
  "add_special_tokens"}`; current releases also take `messages` (with `tools`, `tool_choice`,
  `reasoning_effort`, `continue_final_message`, `chat_template_kwargs`) and render them as a chat
  request, older ones answer 400 to that, and the gateway falls back to its estimate.
Only a prompt that is one string, or chat messages of text only, is counted (a batch of prompts,
token ids or a message with an image part is not: `tokenize_body` returns None), and the request's
other fields never reach the tokenize call.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from gateway.core.types import ApiKind, EngineGauges, EngineKind
from gateway.telemetry.promtext import Exposition, Histogram


def _spellings(base: str, *prefixes: str) -> tuple[str, ...]:
    return tuple(p + base for p in prefixes)


@dataclass(frozen=True, slots=True)
class Dialect:
    """How to talk to one kind of engine. Name tuples are in order of preference."""

    kind: EngineKind
    prefixes: tuple[str, ...]  # metric-name prefixes that identify the engine
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    kv_usage: tuple[str, ...]  # a fraction 0..1
    ttft: tuple[str, ...]  # histogram base names
    itl: tuple[str, ...]
    e2e: tuple[str, ...]
    prompt_tokens: tuple[str, ...]  # counter sample names
    generation_tokens: tuple[str, ...]
    health_path: str = "/health"
    models_path: str = "/v1/models"
    metrics_path: str = "/metrics"
    # Closing the HTTP connection aborts the request inside the engine.
    aborts_on_disconnect: bool = True
    # An explicit abort endpoint (POST, JSON body from `abort_body`), when the engine has one.
    abort_path: str | None = None
    # The request-body field that sets the engine's own request id (what `abort_body` refers to).
    request_id_field: str | None = None
    # Priority scheduling: vLLM runs the lowest `priority` first, SGLang the highest (its default).
    priority_higher_first: bool = False
    # The tokenize route (POST, JSON body from `tokenize_body`); None: the engine has none.
    tokenize_path: str | None = "/tokenize"
    # Fields of a chat request that shape its rendered prompt and that the tokenize route takes too;
    # empty: the route counts no chat messages.
    tokenize_chat_fields: tuple[str, ...] = ()

    def priority(self, urgency: int) -> int:
        """The engine's `priority` value for berth's urgency (0 most urgent, larger less urgent)."""
        return -urgency if self.priority_higher_first else urgency

    def gauges(self, expo: Exposition) -> EngineGauges:
        """Running, waiting and KV usage for the whole endpoint (summed / averaged over label sets)."""
        running = _total(expo, self.running)
        waiting = _total(expo, self.waiting)
        kv = _mean(expo, self.kv_usage)
        return EngineGauges(
            running=None if running is None else max(0.0, running),
            waiting=None if waiting is None else max(0.0, waiting),
            kv_usage=None if kv is None else min(1.0, max(0.0, kv)),
        )

    def ttft_histogram(self, expo: Exposition) -> Histogram | None:
        return _histogram(expo, self.ttft)

    def itl_histogram(self, expo: Exposition) -> Histogram | None:
        return _histogram(expo, self.itl)

    def e2e_histogram(self, expo: Exposition) -> Histogram | None:
        return _histogram(expo, self.e2e)

    def prompt_tokens_total(self, expo: Exposition) -> float | None:
        return _total(expo, self.prompt_tokens)

    def generation_tokens_total(self, expo: Exposition) -> float | None:
        return _total(expo, self.generation_tokens)

    def abort_body(self, request_id: str) -> bytes | None:
        """The JSON body for `POST abort_path` that aborts `request_id`; None without `abort_path`."""
        if self.abort_path is None:
            return None
        return orjson.dumps({"rid": request_id})

    def tokenize_body(self, api: ApiKind, body: Mapping[str, Any], model: str) -> bytes | None:
        """The JSON body for `POST tokenize_path` that counts the prompt of `body` (an OpenAI request
        of kind `api`, as validated by the front) under `model`, the engine's served name; None when
        the engine cannot count it (no tokenize route, chat without `tokenize_chat_fields`, or a
        completion / embedding input that is not one string) or should not: a chat message with an
        image, audio or other non-text part (the engine would fetch and process the media once more
        just to count)."""
        if self.tokenize_path is None:
            return None
        out: dict[str, Any] = {"model": model}
        if api is ApiKind.CHAT:
            if not self.tokenize_chat_fields or not _text_only(body.get("messages")):
                return None
            for key in self.tokenize_chat_fields:
                value = body.get(key)
                if value is not None:
                    out[key] = value
        else:
            prompt = body.get("prompt" if api is ApiKind.COMPLETION else "input")
            if not isinstance(prompt, str):
                return None
            out["prompt"] = prompt
            special = body.get("add_special_tokens")
            if isinstance(special, bool):
                out["add_special_tokens"] = special
        return orjson.dumps(out)

    def served_models(self, body: bytes) -> list[str]:
        return served_models(body)

    def speaks(self, expo: Exposition) -> bool:
        """Whether the page carries this engine's scheduler gauges."""
        return any(expo.has(name) for name in self.running)


VLLM: Final = Dialect(
    kind=EngineKind.VLLM,
    prefixes=("vllm:", "vllm_"),
    running=_spellings("num_requests_running", "vllm:", "vllm_"),
    waiting=_spellings("num_requests_waiting", "vllm:", "vllm_"),
    kv_usage=(
        *_spellings("kv_cache_usage_perc", "vllm:", "vllm_"),
        *_spellings("gpu_cache_usage_perc", "vllm:", "vllm_"),
    ),
    ttft=_spellings("time_to_first_token_seconds", "vllm:", "vllm_"),
    itl=(
        *_spellings("inter_token_latency_seconds", "vllm:", "vllm_"),
        *_spellings("time_per_output_token_seconds", "vllm:", "vllm_"),
    ),
    e2e=_spellings("e2e_request_latency_seconds", "vllm:", "vllm_"),
    prompt_tokens=_spellings("prompt_tokens_total", "vllm:", "vllm_"),
    generation_tokens=_spellings("generation_tokens_total", "vllm:", "vllm_"),
    tokenize_chat_fields=(
        "messages",
        "add_generation_prompt",
        "continue_final_message",
        "add_special_tokens",
        "chat_template",
        "chat_template_kwargs",
        "tools",
    ),
)

SGLANG: Final = Dialect(
    kind=EngineKind.SGLANG,
    prefixes=("sglang:", "sglang_"),
    running=_spellings("num_running_reqs", "sglang:", "sglang_"),
    waiting=_spellings("num_queue_reqs", "sglang:", "sglang_"),
    kv_usage=_spellings("token_usage", "sglang:", "sglang_"),
    ttft=_spellings("time_to_first_token_seconds", "sglang:", "sglang_"),
    itl=(
        *_spellings("inter_token_latency_seconds", "sglang:", "sglang_"),
        *_spellings("time_per_output_token_seconds", "sglang:", "sglang_"),
    ),
    e2e=_spellings("e2e_request_latency_seconds", "sglang:", "sglang_"),
    prompt_tokens=_spellings("prompt_tokens_total", "sglang:", "sglang_"),
    generation_tokens=_spellings("generation_tokens_total", "sglang:", "sglang_"),
    abort_path="/abort_request",
    request_id_field="rid",
    priority_higher_first=True,
    tokenize_chat_fields=(
        "messages",
        "tools",
        "tool_choice",
        "reasoning_effort",
        "continue_final_message",
        "chat_template_kwargs",
    ),
)

DIALECTS: Final[tuple[Dialect, ...]] = (VLLM, SGLANG)
_BY_KIND: Final[dict[EngineKind, Dialect]] = {d.kind: d for d in DIALECTS}


def dialect_for(kind: EngineKind) -> Dialect:
    return _BY_KIND[kind]


def detect_engine(expo: Exposition) -> EngineKind | None:
    """Which engine served this page: the one whose scheduler gauges are on it, else the one whose
    metric prefix is on it. None when neither or both (a page that mixes engines is not an engine's)."""
    speaking = [d.kind for d in DIALECTS if d.speaks(expo)]
    if len(speaking) == 1:
        return speaking[0]
    if speaking:
        return None
    prefixed = {d.kind for d in DIALECTS for name in expo.sample_names() if name.startswith(d.prefixes)}
    return prefixed.pop() if len(prefixed) == 1 else None


def served_models(body: bytes) -> list[str]:
    """Model ids from an OpenAI `GET /v1/models` body (`{"object": "list", "data": [{"id": ...}]}`),
    in order, without repeats. vLLM lists LoRA adapters there too (with `parent` set): they are
    servable names. Raises ValueError when the body is not that shape."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"models list is not JSON: {e}") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise ValueError("models list has no 'data' array")
    out: list[str] = []
    for item in data:
        model_id = item.get("id") if isinstance(item, dict) else None
        if not isinstance(model_id, str) or not model_id:
            raise ValueError("models list has an entry without a string 'id'")
        if model_id not in out:
            out.append(model_id)
    return out


def _text_only(messages: object) -> bool:
    """Whether every message's content is a string, null, or a list of "text" parts."""
    if not isinstance(messages, list):
        return False
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and any(
            not isinstance(part, dict) or part.get("type") != "text" for part in content
        ):
            return False
    return True


def tokenize_count(body: bytes) -> int:
    """The prompt-token count from a tokenize answer (`{"count": N, ...}`, both engines). Raises
    ValueError when the body is not that shape or `count` is not a non-negative integer."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"tokenize answer is not JSON: {e}") from None
    count = doc.get("count") if isinstance(doc, dict) else None
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"tokenize answer has no non-negative integer 'count' ({type(count).__name__})")
    return count


def _first_present(expo: Exposition, names: Iterable[str]) -> str | None:
    for name in names:
        if expo.has(name):
            return name
    return None


def _finite(expo: Exposition, name: str) -> list[float]:
    return [s.value for s in expo.samples(name) if math.isfinite(s.value)]


def _total(expo: Exposition, names: Iterable[str]) -> float | None:
    name = _first_present(expo, names)
    if name is None:
        return None
    values = _finite(expo, name)
    return sum(values) if values else None


def _mean(expo: Exposition, names: Iterable[str]) -> float | None:
    name = _first_present(expo, names)
    if name is None:
        return None
    values = _finite(expo, name)
    return sum(values) / len(values) if values else None


def _histogram(expo: Exposition, names: Iterable[str]) -> Histogram | None:
    for name in names:
        if expo.has(name + "_bucket") or expo.has(name + "_count"):
            return expo.histogram(name)
    return None
