"""Command-line overrides: --endpoint parsing, and flags taking precedence over the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import EndpointConfig, apply_overrides, default_config, parse_endpoint_flag
from gateway.core.errors import ConfigError
from gateway.core.types import EngineKind, InstanceClass
from gateway.sched.fleet import Fleet


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        pytest.param("http://127.0.0.1:8001", EndpointConfig(url="http://127.0.0.1:8001"), id="url-only"),
        pytest.param(
            "http://10.0.0.1:8000,engine=sglang,class=interactive,models=a|b,cap=16,id=gpu01-a,node=gpu01",
            EndpointConfig(
                url="http://10.0.0.1:8000",
                engine=EngineKind.SGLANG,
                instance_class=InstanceClass.INTERACTIVE,
                models=("a", "b"),
                cap=16,
                id="gpu01-a",
                node="gpu01",
            ),
            id="every-option",
        ),
        pytest.param(
            "http://h:1,engine=auto", EndpointConfig(url="http://h:1", engine=None), id="engine-auto-is-none"
        ),
        pytest.param(
            "http://h:1, class = batch , models = x | y ",
            EndpointConfig(url="http://h:1", instance_class=InstanceClass.BATCH, models=("x", "y")),
            id="spaces-ignored",
        ),
        pytest.param(
            "http://h:1,max_batch=8,config=tp1-b8",
            EndpointConfig(url="http://h:1", max_batch=8, config="tp1-b8"),
            id="instance-configuration",
        ),
        pytest.param(
            "http://h:1,kv_events=tcp://10.0.0.5:5557,kv_events_replay=tcp://10.0.0.5:5558,kv_events_topic=kv",
            EndpointConfig(
                url="http://h:1",
                kv_events="tcp://10.0.0.5:5557",
                kv_events_replay="tcp://10.0.0.5:5558",
                kv_events_topic="kv",
            ),
            id="kv-events",
        ),
    ],
)
def test_endpoint_flags_parse(flag: str, expected: EndpointConfig) -> None:
    assert parse_endpoint_flag(flag) == expected


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        pytest.param("", "--endpoint: '': expected URL[,key=value...]", id="empty"),
        pytest.param(
            "http://a:1,foo=1",
            "--endpoint: 'http://a:1,foo=1': unknown option 'foo' "
            "(known: engine, class, models, cap, id, node, scheduling, max_batch, config, kv_events, "
            "kv_events_replay, kv_events_topic)",
            id="unknown-option",
        ),
        pytest.param(
            "http://a:1,cap",
            "--endpoint: 'http://a:1,cap': expected key=value after the URL, got 'cap'",
            id="no-value",
        ),
        pytest.param(
            "http://a:1,kv_events=tcp://*:5557",
            "--endpoint: 'http://a:1,kv_events=tcp://*:5557': kv_events: expected tcp://HOST:PORT with a "
            "host berth can reach and a port 1-65535, got 'tcp://*:5557'",
            id="kv-events-wildcard",
        ),
        pytest.param(
            "http://a:1,kv_events_replay=tcp://h:2",
            "--endpoint: 'http://a:1,kv_events_replay=tcp://h:2': kv_events_replay: a replay socket needs "
            "kv_events (the publisher) too",
            id="kv-events-replay-alone",
        ),
        pytest.param(
            "http://a:1,cap=1,cap=2",
            "--endpoint: 'http://a:1,cap=1,cap=2': option 'cap' given twice",
            id="repeated-option",
        ),
        pytest.param(
            "http://a:1,cap=x",
            "--endpoint: 'http://a:1,cap=x': cap: expected an integer, got 'x'",
            id="cap-not-integer",
        ),
        pytest.param(
            "http://a:1,cap=0", "--endpoint: 'http://a:1,cap=0': cap: expected integer >= 1", id="cap-zero"
        ),
        pytest.param(
            "http://a:1,class=fast",
            "--endpoint: 'http://a:1,class=fast': class: invalid value 'fast' "
            "(expected one of: interactive, mixed, batch)",
            id="bad-class",
        ),
        pytest.param(
            "http://a:1,engine=tgi",
            "--endpoint: 'http://a:1,engine=tgi': engine: invalid value 'tgi' "
            "(expected one of: auto, vllm, sglang)",
            id="bad-engine",
        ),
        pytest.param(
            "tcp://a:1",
            "--endpoint: 'tcp://a:1': url: expected an http:// or https:// URL, got 'tcp://a:1'",
            id="bad-url",
        ),
        pytest.param(
            "http://a:1,models=a||b",
            "--endpoint: 'http://a:1,models=a||b': models[1]: model name must not be empty",
            id="empty-model",
        ),
        pytest.param(
            "http://a:1,id=a b",
            "--endpoint: 'http://a:1,id=a b': id: must be non-empty without whitespace, got 'a b'",
            id="id-with-space",
        ),
    ],
)
def test_bad_endpoint_flags_are_errors_at_the_flag(flag: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_endpoint_flag(flag)
    assert str(info.value) == expected
    assert info.value.path == "--endpoint"


def test_endpoint_flags_replace_the_files_list() -> None:
    base = default_config(env={})
    base = apply_overrides(base, endpoints=[EndpointConfig(url="http://file:1")])
    flags = [parse_endpoint_flag("http://a:1"), parse_endpoint_flag("http://b:1,class=batch")]
    cfg = apply_overrides(base, listen=None, endpoints=flags, policy_file=None)
    assert cfg.endpoints == tuple(flags)
    assert cfg.server == base.server


def test_no_overrides_leave_the_config_alone() -> None:
    base = default_config(env={})
    assert apply_overrides(base, listen=None, endpoints=(), policy_file=None) is base


def test_listen_overrides_the_file() -> None:
    cfg = apply_overrides(default_config(env={}), listen="[::1]:9000")
    assert cfg.server.listen == "[::1]:9000"
    assert cfg.server.host_port == ("::1", 9000)


def test_a_relative_policy_flag_resolves_against_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mine.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    cfg = apply_overrides(default_config(env={}), policy_file="mine.toml")
    assert cfg.policy_file == tmp_path / "mine.toml"


@pytest.mark.parametrize(
    ("listen", "endpoints", "expected"),
    [
        pytest.param("8080", [], "--listen: expected HOST:PORT, got '8080'", id="bad-listen"),
        pytest.param(
            None,
            [EndpointConfig(url="http://a:1"), EndpointConfig(url="http://a:1/")],
            "--endpoint: duplicate endpoint url 'http://a:1/' (--endpoint #2 repeats #1)",
            id="duplicate-url",
        ),
        pytest.param(
            None,
            [EndpointConfig(url="http://a:1", id="x"), EndpointConfig(url="http://b:1", id="x")],
            "--endpoint: duplicate endpoint id 'x' (--endpoint #2 repeats #1)",
            id="duplicate-id",
        ),
    ],
)
def test_bad_overrides_are_errors_at_the_flag(
    listen: str | None, endpoints: list[EndpointConfig], expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        apply_overrides(default_config(env={}), listen=listen, endpoints=endpoints)
    assert str(info.value) == expected


def test_a_missing_policy_flag_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        apply_overrides(default_config(env={}), policy_file=tmp_path / "nope.toml")
    assert str(info.value) == f"--policy: policy file not found: {tmp_path / 'nope.toml'}"


def test_an_unset_cap_is_bounded_by_the_max_batch() -> None:
    # No cap of the operator's: the engine's max batch (its --max-num-seqs) bounds the cap, before any
    # batch size learned from its gauges and before the default cap.
    specs = [
        parse_endpoint_flag("http://h:1,max_batch=8").spec(default_cap=64),
        parse_endpoint_flag("http://h:2,max_batch=128").spec(default_cap=64),
        parse_endpoint_flag("http://h:3").spec(default_cap=64),
    ]
    assert [s.cap for s in specs] == [None, None, None]
    fleet = Fleet()
    fleet.sync(specs)
    assert [fleet.cap_of(s.id) for s in specs] == [8, 128, 64]
    spec = parse_endpoint_flag("http://h:1,max_batch=8,cap=32,config=b8").spec(default_cap=64)
    assert (spec.cap, spec.max_batch, spec.config) == (32, 8, "b8")  # a configured cap is the operator's
    with pytest.raises(ConfigError, match="max_batch: expected an integer"):
        parse_endpoint_flag("http://h:1,max_batch=x")
