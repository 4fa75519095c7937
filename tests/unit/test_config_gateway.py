"""gateway.toml: strict decode, defaults, cross-reference checks; every error names file and key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import (
    ADMIN_TOKEN_ENV,
    EndpointConfig,
    default_config,
    load_configured_policy,
    load_gateway_config,
)
from gateway.core.errors import ConfigError
from gateway.core.types import EndpointId, EngineKind, InstanceClass, ModelName
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.placement.least_outstanding import LeastOutstandingScorer, MaxScorePicker
from gateway.sched.types import EndpointSpec, QueueLimits

# The example from the design card, every key spelled out.
FULL = """
[server]
listen = "0.0.0.0:9090"
max_body_bytes = 1048576
drain_timeout_s = 5.0
admin_token = "from-file"
log_level = "debug"

[limits]
max_queue_per_model = 10
max_queue_wait_s = 2.5
retry_after_s = 3
default_endpoint_cap = 8

[upstream]
connect_timeout_s = 1.0
first_byte_timeout_s = 60.0
read_timeout_s = 30.0
max_retries = 0
pool_per_host = 16
pool_total = 64

[scrape]
interval_s = 1.0
timeout_s = 0.5
unhealthy_after = 2
stale_after_s = 4.0
models_refresh_s = 10.0

[policy]
file = "policies/mine.toml"

[aliases]
"gpt-4o-mini" = "tiny-llama"

[[endpoints]]
id = "gpu01-a"
url = "http://10.0.0.1:8000/"
engine = "sglang"
models = ["llama-3.1-8b", "tiny-llama"]
class = "interactive"
node = "gpu01"
cap = 32

[[endpoints]]
url = "http://10.0.0.2:8000"
engine = "auto"
"""

POLICY = """
[ordering]
plugin = "fcfs"
[placement]
picker = { plugin = "max-score" }
"""


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Work in an empty directory so error strings name `gateway.toml` as an operator would type it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _write(directory: Path, text: str, name: str = "gateway.toml") -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _error(text: str) -> str:
    Path("gateway.toml").write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_gateway_config("gateway.toml", env={})
    return str(info.value)


# ----------------------------------------------------------------------------- the happy path


def test_the_full_example_loads_with_every_value(in_tmp: Path) -> None:
    _write(in_tmp, FULL)
    _write(in_tmp, POLICY, "policies/mine.toml")
    cfg = load_gateway_config("gateway.toml", env={})

    assert cfg.server.listen == "0.0.0.0:9090"
    assert cfg.server.host_port == ("0.0.0.0", 9090)
    assert cfg.server.admin_token == "from-file"
    assert cfg.server.log_level == "debug"
    assert cfg.upstream.pool_total == 64
    assert cfg.scrape.unhealthy_after == 2
    assert cfg.aliases == {"gpt-4o-mini": "tiny-llama"}
    assert cfg.file == in_tmp / "gateway.toml"
    assert cfg.policy_file == in_tmp / "policies" / "mine.toml"
    assert cfg.queue_limits() == QueueLimits(
        max_queue_per_model=10, max_wait_s=2.5, retry_after_s=3.0, stale_after_s=4.0
    )
    assert cfg.endpoints[1].engine_auto
    assert not cfg.endpoints[0].engine_auto
    assert cfg.endpoint_specs() == [
        EndpointSpec(
            id=EndpointId("gpu01-a"),
            url="http://10.0.0.1:8000",
            engine=EngineKind.SGLANG,
            models=frozenset({ModelName("llama-3.1-8b"), ModelName("tiny-llama")}),
            instance_class=InstanceClass.INTERACTIVE,
            cap=32,
            node="gpu01",
            default_cap=8,
        ),
        EndpointSpec(
            id=EndpointId("10.0.0.2:8000"),
            url="http://10.0.0.2:8000",
            engine=EngineKind.VLLM,  # "auto": provisional until detected
            models=frozenset(),
            instance_class=InstanceClass.MIXED,
            cap=None,  # not set: the engine's batch size bounds it, limits.default_endpoint_cap until known
            default_cap=8,
            node=None,
        ),
    ]


def test_detected_engine_kinds_fill_in_auto_endpoints_only(in_tmp: Path) -> None:
    _write(in_tmp, FULL)
    _write(in_tmp, POLICY, "policies/mine.toml")
    cfg = load_gateway_config("gateway.toml", env={})
    detected = {EndpointId("gpu01-a"): EngineKind.VLLM, EndpointId("10.0.0.2:8000"): EngineKind.SGLANG}
    assert [s.engine for s in cfg.endpoint_specs(detected)] == [EngineKind.SGLANG, EngineKind.SGLANG]


def test_an_empty_file_means_all_defaults_and_the_packaged_policy(in_tmp: Path) -> None:
    _write(in_tmp, "")
    cfg = load_gateway_config("gateway.toml", env={})
    assert cfg.server == default_config(env={}).server
    assert cfg.endpoints == ()
    assert cfg.policy_file is None
    assert cfg.queue_limits() == QueueLimits()
    policy = load_configured_policy(cfg, default_registry())
    assert policy.name == "default"


def test_the_policy_path_resolves_against_the_config_files_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path, '[policy]\nfile = "../policies/p.toml"\n', "conf/gateway.toml")
    _write(tmp_path, POLICY, "policies/p.toml")
    monkeypatch.chdir(tmp_path / "policies")  # the current directory does not matter
    cfg = load_gateway_config(tmp_path / "conf" / "gateway.toml", env={})
    assert cfg.policy_file == tmp_path / "policies" / "p.toml"


@pytest.mark.parametrize(
    ("env", "token"),
    [
        pytest.param({}, "from-file", id="file"),
        pytest.param({ADMIN_TOKEN_ENV: ""}, "from-file", id="empty-env-ignored"),
        pytest.param({ADMIN_TOKEN_ENV: "from-env"}, "from-env", id="env-wins"),
    ],
)
def test_the_admin_token_comes_from_the_environment_first(
    in_tmp: Path, env: dict[str, str], token: str
) -> None:
    _write(in_tmp, '[server]\nadmin_token = "from-file"\n')
    assert load_gateway_config("gateway.toml", env=env).server.admin_token == token


def test_default_config_serves_flags_only() -> None:
    cfg = default_config(env={ADMIN_TOKEN_ENV: "t"})
    assert cfg.server.listen == "127.0.0.1:8080"
    assert cfg.server.admin_token == "t"
    assert cfg.endpoints == ()
    assert cfg.file is None
    assert cfg.policy_file is None
    policy = load_configured_policy(cfg, default_registry())
    assert isinstance(policy.profile.picker, MaxScorePicker)
    assert [type(ws.scorer) for ws in policy.profile.scorers] == [LeastOutstandingScorer]


@pytest.mark.parametrize(
    ("url", "endpoint_id"),
    [
        pytest.param("http://10.0.0.1:8000", "10.0.0.1:8000", id="explicit-port"),
        pytest.param("http://gpu01", "gpu01:80", id="http-default-port"),
        pytest.param("https://gpu01/vllm/", "gpu01:443", id="https-default-port"),
        pytest.param("http://[::1]:8000", "[::1]:8000", id="ipv6"),
    ],
)
def test_the_default_endpoint_id_is_host_and_port(url: str, endpoint_id: str) -> None:
    assert EndpointConfig(url=url).endpoint_id == endpoint_id


# ----------------------------------------------------------------------------- errors

_ENDPOINT_KEYS = (
    "url, id, engine, models, class, node, cap, scheduling, api_key_env, api_key_file, max_batch, config, "
    "kv_events, kv_events_replay, kv_events_topic"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            'colour = "blue"\n',
            "gateway.toml:colour: unknown key "
            "(known: server, limits, upstream, scrape, telemetry, prefix, policy, auth, ops, batch, aliases, "
            "endpoints, tenants, lifecycle, nodes)",
            id="unknown-top-level-key",
        ),
        pytest.param(
            '[server]\nlsten = "x:1"\n',
            "gateway.toml:server.lsten: unknown key "
            "(known: listen, max_body_bytes, drain_timeout_s, accept_grace_s, admin_token, log_level)",
            id="unknown-key-in-section",
        ),
        pytest.param(
            '[[endpoints]]\nurl = "http://a:1"\n[[endpoints]]\nurl = "http://b:1"\nfoo = 2\n',
            f"gateway.toml:endpoints[1].foo: unknown key (known: {_ENDPOINT_KEYS})",
            id="unknown-key-in-second-endpoint",
        ),
        pytest.param(
            '[limits]\nmax_queue_per_model = "many"\n',
            "gateway.toml:limits.max_queue_per_model: expected integer, got string",
            id="wrong-type",
        ),
        pytest.param(
            "[server]\nlisten = 8080\n",
            "gateway.toml:server.listen: expected string, got integer",
            id="wrong-type-listen",
        ),
        pytest.param(
            "server = 1\n", "gateway.toml:server: expected table, got integer", id="section-not-table"
        ),
        pytest.param(
            '[[endpoints]]\nurl = "http://a:1"\ncap = 1.5\n',
            "gateway.toml:endpoints[0].cap: expected integer, got float",
            id="float-for-integer",
        ),
        pytest.param(
            '[[endpoints]]\nurl = "http://a:1"\nmodels = "x"\n',
            "gateway.toml:endpoints[0].models: expected array, got string",
            id="string-for-array",
        ),
        pytest.param(
            '[[endpoints]]\nurl = "http://a:1"\nmodels = ["x", 1]\n',
            "gateway.toml:endpoints[0].models[1]: expected string, got integer",
            id="array-item-type",
        ),
        pytest.param(
            "[[endpoints]]\ncap = 2\n",
            "gateway.toml:endpoints[0].url: missing required key",
            id="missing-url",
        ),
        pytest.param(
            '[[endpoints]]\nurl = "http://a:1"\nclass = "fast"\n',
            "gateway.toml:endpoints[0].class: invalid value 'fast' "
            "(expected one of: interactive, mixed, batch)",
            id="bad-class",
        ),
        pytest.param(
            '[[endpoints]]\nurl = "http://a:1"\nengine = "tgi"\n',
            "gateway.toml:endpoints[0].engine: invalid value 'tgi' (expected one of: auto, vllm, sglang)",
            id="bad-engine",
        ),
        pytest.param(
            '[server]\nlog_level = "loud"\n',
            "gateway.toml:server.log_level: invalid value 'loud' "
            "(expected one of: debug, info, warning, error, critical)",
            id="bad-log-level",
        ),
        pytest.param(
            '[[endpoints]]\nurl = "tcp://10.0.0.1:8000"\n',
            "gateway.toml:endpoints[0].url: expected an http:// or https:// URL, got 'tcp://10.0.0.1:8000'",
            id="url-scheme",
        ),
        pytest.param(
            '[[endpoints]]\nurl = "10.0.0.1:8000"\n',
            "gateway.toml:endpoints[0].url: expected an http:// or https:// URL, got '10.0.0.1:8000'",
            id="url-without-scheme",
        ),
        pytest.param(
            '[[endpoints]]\nurl = "http://:8000"\n',
            "gateway.toml:endpoints[0].url: URL has no host: 'http://:8000'",
            id="url-without-host",
        ),
        pytest.param(
            '[[endpoints]]\nurl = "http://a:99999"\n',
            "gateway.toml:endpoints[0].url: invalid URL 'http://a:99999': Port out of range 0-65535",
            id="url-port",
        ),
        pytest.param(
            '[[endpoints]]\nurl = "http://a:1/?x=1"\n',
            "gateway.toml:endpoints[0].url: URL must not have a query or fragment: 'http://a:1/?x=1'",
            id="url-query",
        ),
        pytest.param(
            '[[endpoints]]\nurl = "http://a:1"\nid = "x"\n[[endpoints]]\nurl = "http://b:1"\nid = "x"\n',
            "gateway.toml:endpoints[1].id: duplicate endpoint id 'x' (already used by endpoints[0])",
            id="duplicate-id",
        ),
        pytest.param(
            '[[endpoints]]\nurl = "http://A:80/"\nid = "x"\n[[endpoints]]\nurl = "http://a"\nid = "y"\n',
            "gateway.toml:endpoints[1].url: duplicate endpoint url 'http://a' (already used by endpoints[0])",
            id="duplicate-url-normalised",
        ),
        pytest.param(
            '[[endpoints]]\nurl = "http://a:1/x"\n[[endpoints]]\nurl = "http://a:1/y"\n',
            "gateway.toml:endpoints[1].id: duplicate endpoint id 'a:1', derived from its url; "
            "set id explicitly (already used by endpoints[0])",
            id="duplicate-derived-id",
        ),
        pytest.param(
            '[[endpoints]]\nurl = "http://a:1"\nid = ""\n',
            "gateway.toml:endpoints[0].id: must be non-empty without whitespace, got ''",
            id="empty-id",
        ),
        pytest.param(
            '[[endpoints]]\nurl = "http://a:1"\nmodels = ["x", " "]\n',
            "gateway.toml:endpoints[0].models[1]: model name must not be empty",
            id="empty-model",
        ),
        pytest.param(
            '[server]\nlisten = "8080"\n',
            "gateway.toml:server.listen: expected HOST:PORT, got '8080'",
            id="listen-port-only",
        ),
        pytest.param(
            '[server]\nlisten = "localhost:http"\n',
            "gateway.toml:server.listen: port must be a number from 0 to 65535, got 'localhost:http'",
            id="listen-named-port",
        ),
        pytest.param(
            '[server]\nlisten = "::1:8080"\n',
            "gateway.toml:server.listen: expected HOST:PORT with an IPv6 host in brackets ([::1]:8080), "
            "got '::1:8080'",
            id="listen-ipv6-without-brackets",
        ),
        pytest.param(
            "[server]\nmax_body_bytes = -1\n",
            "gateway.toml:server.max_body_bytes: expected integer >= 1",
            id="negative-int",
        ),
        pytest.param(
            "[server]\ndrain_timeout_s = -1.0\n",
            "gateway.toml:server.drain_timeout_s: expected number >= 0.0",
            id="negative-float",
        ),
        pytest.param(
            "[limits]\nmax_queue_wait_s = 0\n",
            "gateway.toml:limits.max_queue_wait_s: expected number > 0.0",
            id="zero-timeout",
        ),
        pytest.param(
            "[upstream]\nmax_retries = -1\n",
            "gateway.toml:upstream.max_retries: expected integer >= 0",
            id="negative-retries",
        ),
        pytest.param(
            '[[endpoints]]\nurl = "http://a:1"\ncap = 0\n',
            "gateway.toml:endpoints[0].cap: expected integer >= 1",
            id="zero-cap",
        ),
        pytest.param(
            "[upstream]\npool_per_host = 100\npool_total = 10\n",
            "gateway.toml:upstream.pool_per_host: must not exceed upstream.pool_total (10)",
            id="pool-per-host-over-total",
        ),
        pytest.param(
            "[scrape]\ninterval_s = 5.0\nstale_after_s = 1.0\n",
            "gateway.toml:scrape.stale_after_s: must be at least scrape.interval_s (5.0), "
            "or every scrape is stale before the next one",
            id="stale-before-next-scrape",
        ),
        pytest.param(
            '[aliases]\nok = "x"\n"a.b" = 1\n',
            'gateway.toml:aliases."a.b": expected string, got integer',
            id="alias-wrong-type-quoted-key",
        ),
        pytest.param(
            '[aliases]\nmini = "mini"\n',
            "gateway.toml:aliases.mini: alias 'mini' points at itself",
            id="alias-to-itself",
        ),
        pytest.param(
            '[aliases]\nmini = ""\n',
            "gateway.toml:aliases.mini: alias target must not be empty",
            id="alias-empty-target",
        ),
        pytest.param(
            '[aliases]\na = "b"\nb = "c"\n',
            "gateway.toml:aliases.a: alias target 'b' is itself an alias; point at the engine's served name",
            id="alias-chain",
        ),
        pytest.param(
            "[server]\nlisten = \n",
            "gateway.toml:2:10: TOML syntax error: invalid value",
            id="toml-syntax-error-line-and-column",
        ),
        pytest.param(
            '[server]\nlisten = "a:1"\n[server]\n',
            "gateway.toml:3:8: TOML syntax error: cannot declare ('server',) twice "
            "(a key or table is defined twice)",
            id="toml-table-twice",
        ),
        pytest.param(
            '[policy]\nfile = ""\nfiel = "x"\n',
            "gateway.toml:policy.fiel: unknown key (known: file)",
            id="unknown-policy-key",
        ),
    ],
)
def test_errors_name_the_file_and_key_path(in_tmp: Path, text: str, expected: str) -> None:
    assert _error(text) == expected


def test_the_error_carries_file_and_path_separately(in_tmp: Path) -> None:
    _write(in_tmp, '[[endpoints]]\nurl = "http://a:1"\n[[endpoints]]\nurl = "http://b:1"\nfoo = 2\n')
    with pytest.raises(ConfigError) as info:
        load_gateway_config("gateway.toml", env={})
    assert (info.value.file, info.value.path) == ("gateway.toml", "endpoints[1].foo")


def test_a_missing_policy_file_is_reported_at_policy_file(in_tmp: Path) -> None:
    missing = in_tmp / "policies" / "nope.toml"
    assert _error('[policy]\nfile = "policies/nope.toml"\n') == (
        f"gateway.toml:policy.file: policy file not found: {missing} "
        f"(relative to {in_tmp}, the directory of this file)"
    )


def test_a_directory_is_not_a_policy_file(in_tmp: Path) -> None:
    (in_tmp / "policies").mkdir()
    assert _error('[policy]\nfile = "policies"\n') == (
        f"gateway.toml:policy.file: policy file is not a file: {in_tmp / 'policies'} "
        f"(relative to {in_tmp}, the directory of this file)"
    )


def test_an_absolute_policy_path_gets_no_relative_hint(in_tmp: Path) -> None:
    missing = in_tmp / "elsewhere" / "p.toml"
    assert _error(f'[policy]\nfile = "{missing}"\n') == (
        f"gateway.toml:policy.file: policy file not found: {missing}"
    )


def test_a_missing_config_file_is_reported(in_tmp: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_gateway_config("missing.toml", env={})
    assert str(info.value) == "missing.toml: cannot read file: No such file or directory"


def test_a_file_that_is_not_utf8_is_reported(in_tmp: Path) -> None:
    (in_tmp / "gateway.toml").write_bytes(b'[server]\nlisten = "\xff"\n')
    with pytest.raises(ConfigError) as info:
        load_gateway_config("gateway.toml", env={})
    assert str(info.value) == "gateway.toml: not valid UTF-8 (byte 19)"
