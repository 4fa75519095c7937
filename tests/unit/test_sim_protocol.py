"""The simulator's request parsing, token rule, faults, length distributions, fleet file and CLI flags."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from loadgen.engine_sim.cli import build_parser, specs_from_args
from loadgen.engine_sim.faults import Faults
from loadgen.engine_sim.fleet import FleetFileError, load_fleet_file, parse_fleet
from loadgen.engine_sim.lengths import LengthDist
from loadgen.engine_sim.protocol import (
    ApiError,
    ResponseWriter,
    chat_prompt_tokens,
    completion_prompt_tokens,
    parse_request,
)
from loadgen.engine_sim.spec import EndpointSpec


def parse(api: str, data: Any, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "models": ("m", "alias"),
        "max_model_len": 1000,
        "priority_enabled": False,
        "reject_priority_without_policy": True,
    }
    args.update(kw)
    return parse_request(api, data, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("prompt", "tokens"),
    [("abcd", 1), ("abcde", 2), ("x" * 400, 100), ("", 1), ([1, 2, 3], 3), (["abcdefgh"], 2), ([[5, 6]], 2)],
    ids=["4-chars", "5-chars", "400-chars", "empty", "token-ids", "one-string", "one-id-list"],
)
def test_completion_prompt_token_rule(prompt: Any, tokens: int) -> None:
    assert completion_prompt_tokens(prompt) == tokens


def test_chat_prompt_token_rule_renders_the_template() -> None:
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "x" * 40}]
    rendered = "<|system|>\nbe brief\n" + "<|user|>\n" + "x" * 40 + "\n" + "<|assistant|>\n"
    assert chat_prompt_tokens(msgs) == math.ceil(len(rendered) / 4)
    parts = [{"role": "user", "content": [{"type": "text", "text": "ab"}, {"type": "image_url"}]}]
    assert chat_prompt_tokens(parts) == math.ceil(len("<|user|>\nab\n<|assistant|>\n") / 4)


@pytest.mark.parametrize(
    ("api", "data", "status", "fragment"),
    [
        ("chat", [], 400, "JSON object"),
        ("chat", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "does not exist"),
        ("chat", {"model": "m"}, 400, "messages"),
        ("completion", {"model": "m"}, 400, "prompt"),
        ("completion", {"model": "m", "prompt": "x", "max_tokens": 0}, 400, "at least 1"),
        ("completion", {"model": "m", "prompt": "x" * 4000, "max_tokens": 10}, 400, "maximum context length"),
        ("completion", {"model": "m", "prompt": "x", "max_tokens": 5, "min_tokens": 9}, 400, "min_tokens"),
        ("completion", {"model": "m", "prompt": "x", "n": 2}, 400, "n=1"),
        ("completion", {"model": "m", "prompt": "x", "priority": 3}, 400, "Priority scheduling"),
        ("completion", {"model": "m", "prompt": ["a", "b"]}, 400, "one prompt"),
    ],
    ids=["not-object", "unknown-model", "no-messages", "no-prompt", "zero-max", "too-long", "min-gt-max", "n",
         "priority-off", "batch-prompts"],
)  # fmt: skip
def test_bad_requests_get_openai_errors(api: str, data: Any, status: int, fragment: str) -> None:
    with pytest.raises(ApiError) as e:
        parse(api, data)
    assert e.value.status == status
    assert fragment in e.value.message
    body = orjson.loads(e.value.body())
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == status


def test_parse_defaults_and_aliases() -> None:
    p = parse("chat", {"model": "alias", "messages": [{"role": "user", "content": "hi"}]})
    assert p.model == "alias"
    assert p.max_tokens == 1000 - p.prompt_tokens
    assert not p.max_tokens_given
    assert not p.stream
    assert not p.include_usage
    c = parse("completion", {"prompt": "hi", "stream": True, "stream_options": {"include_usage": True}})
    assert c.model == "m"
    assert c.max_tokens == 16
    assert c.stream
    assert c.include_usage
    q = parse("completion", {"model": "m", "prompt": "x", "priority": 3}, priority_enabled=True)
    assert q.priority == 3
    s = parse(
        "completion", {"model": "m", "prompt": "x", "priority": 3}, reject_priority_without_policy=False
    )
    assert s.priority == 0  # SGLang without priority scheduling ignores it


def test_stream_chunks_have_the_real_shapes() -> None:
    w = ResponseWriter("chat", "chatcmpl-1", "m")
    role = orjson.loads(w.role_chunk()[6:])
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"]["role"] == "assistant"
    tok = orjson.loads(w.token_chunk[6:])
    assert tok["choices"][0]["delta"] == {"content": " tok"}
    assert tok["choices"][0]["finish_reason"] is None
    last = orjson.loads(w.last_token_chunk("length")[6:])
    assert last["choices"][0]["finish_reason"] == "length"
    usage = orjson.loads(w.usage_chunk(7, 3)[6:])
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    assert w.token_chunk.startswith(b"data: ")
    assert w.token_chunk.endswith(b"\n\n")
    c = ResponseWriter("completion", "cmpl-1", "m")
    assert c.role_chunk() == b""
    full = orjson.loads(c.full_response(5, 2, "stop"))
    assert full["object"] == "text_completion"
    assert full["choices"][0]["text"] == " tok tok"
    assert full["usage"]["total_tokens"] == 7


def test_faults_patch_validates() -> None:
    f = Faults().patched({"fail_fraction": 0.5, "die_after_tokens": 3})
    assert f.fail_fraction == 0.5
    assert f.die_after_tokens == 3
    assert f.any
    assert f.patched({"reset": True, "health_503": True}) == Faults(health_503=True)
    for bad in ({"nope": 1}, {"fail_fraction": 2}, {"health_503": 1}, {"die_after_tokens": 1.5}):
        with pytest.raises(ValueError, match=r"fault|fail_fraction"):
            Faults().patched(bad)


@pytest.mark.parametrize(
    ("text", "check"),
    [
        ("fixed:7", lambda n: n == 7),
        ("uniform:3:5", lambda n: 3 <= n <= 5),
        ("lognormal:50:0.5", lambda n: n >= 1),
    ],
    ids=["fixed", "uniform", "lognormal"],
)
def test_length_distributions(text: str, check: Any) -> None:
    dist = LengthDist.parse(text)
    assert str(dist) == text
    rng = random.Random(1)
    assert all(check(dist.sample(rng)) for _ in range(200))


def test_lognormal_mean_is_close() -> None:
    rng = random.Random(3)
    dist = LengthDist.parse("lognormal:200:0.8")
    mean = sum(dist.sample(rng) for _ in range(20_000)) / 20_000
    assert mean == pytest.approx(200, rel=0.05)


@pytest.mark.parametrize("bad", ["fixed", "fixed:0", "uniform:5:3", "gauss:1:2", "lognormal:x:1"])
def test_bad_length_distributions(bad: str) -> None:
    with pytest.raises(ValueError, match="length"):
        LengthDist.parse(bad)


def test_fleet_file(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(
        """
[defaults]
profile = "fleet-7b"
speed = 5

[[endpoints]]
flavor = "vllm"
models = ["a", "a-alias"]
count = 2

[[endpoints]]
flavor = "sglang"
models = "b"
port = 9100
max_num_seqs = 4
output_len = "fixed:9"
latency = { k1 = 1e-4, c1 = 0.01, k2 = 0.0, c2 = 1e-3, c3 = 0.02 }
faults = { fail_fraction = 0.25 }
"""
    )
    specs = load_fleet_file(path, base_port=9000)
    assert [s.port for s in specs] == [9000, 9001, 9100]
    assert [s.flavor for s in specs] == ["vllm", "vllm", "sglang"]
    assert specs[0].models == ("a", "a-alias")
    assert specs[2].models == ("b",)
    assert all(s.speed == 5.0 for s in specs)
    assert specs[2].faults.fail_fraction == 0.25
    assert specs[2].output_len == LengthDist("fixed", 9.0)
    assert len({s.seed for s in specs}) == 3
    resolved = specs[2].resolve()
    assert resolved.engine.max_num_seqs == 4
    assert resolved.engine.latency.c3 == pytest.approx(0.02 / 5)  # speed divides the model


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        ({"endpoints": [{"modles": ["x"]}]}, "endpoints[0].modles"),
        ({"defaults": {"spead": 2}, "endpoints": [{}]}, "defaults.spead"),
        ({"endpoints": [{"latency": {"k1": 1}}]}, "endpoints[0].latency"),
        ({"endpoints": [{"faults": {"fail_fraction": 3}}]}, "endpoints[0].faults"),
        ({"endpoints": [{"max_num_seqs": "8"}]}, "endpoints[0].max_num_seqs"),
        ({"endpoints": [{"flavor": "tgi"}]}, "endpoints[0]"),
        ({"endpoint": []}, "endpoint"),
        ({"endpoints": []}, "endpoints"),
    ],
    ids=[
        "unknown-key",
        "unknown-default",
        "latency-missing",
        "bad-fault",
        "type",
        "flavor",
        "top-key",
        "empty",
    ],
)
def test_fleet_file_errors_name_the_key_path(doc: dict[str, Any], where: str) -> None:
    with pytest.raises(FleetFileError) as e:
        parse_fleet(doc, source="f.toml")
    assert str(e.value).startswith(f"f.toml: {where}")


def test_cli_flags_build_specs() -> None:
    args = build_parser().parse_args(
        ["--flavor", "sglang", "--model", "a,b", "--model", "c", "--port", "9000", "--count", "3",
         "--k2", "0", "--speed", "10", "--fail-fraction", "0.1", "--scheduling-policy", "priority",
         "--output-len", "fixed:5"]
    )  # fmt: skip
    specs = specs_from_args(args)
    assert [s.port for s in specs] == [9000, 9001, 9002]
    assert specs[0].models == ("a", "b", "c")
    assert specs[0].flavor == "sglang"
    assert specs[0].latency is not None
    assert specs[0].latency.k2 == 0.0
    assert specs[0].latency.c3 == 0.025
    assert specs[1].faults.fail_fraction == 0.1
    assert specs[2].scheduling_policy == "priority"
    assert specs[0].resolve().engine.higher_priority_first  # SGLang runs higher values first


def test_endpoint_spec_validates() -> None:
    with pytest.raises(ValueError, match="at least one model"):
        EndpointSpec(models=())
    with pytest.raises(ValueError, match="unknown profile"):
        EndpointSpec(profile="nope")
    with pytest.raises(ValueError, match="speed"):
        EndpointSpec(speed=0)
    spec = EndpointSpec(kv_capacity_tokens=500, max_model_len=4096)
    assert spec.resolve().max_model_len == 499
