"""The reload transaction (`load_runtime`) and `berth check`."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import (
    check,
    default_config,
    load_gateway_config,
    load_runtime,
    parse_endpoint_flag,
)
from gateway.core.errors import ConfigError
from gateway.core.types import EndpointId, EngineKind
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.placement.round_robin import RoundRobinPicker
from gateway.sched.types import QueueLimits

REPO = Path(__file__).resolve().parents[2]
# gateway.toml and its variants; other conf/ files (models.toml, agent.toml) have their own schemas.
SHIPPED_CONFIGS = sorted((REPO / "conf").glob("gateway*.toml"))

MAX_SCORE = '[ordering]\nplugin = "fcfs"\n[placement]\npicker = { plugin = "max-score" }\n'
ROUND_ROBIN = '[ordering]\nplugin = "fcfs"\n[placement]\npicker = { plugin = "round-robin" }\n'

GATEWAY = """
[server]
listen = "127.0.0.1:8080"
[limits]
max_queue_per_model = 100
[policy]
file = "policy.toml"
[aliases]
mini = "tiny-llama"
[[endpoints]]
url = "http://127.0.0.1:8001"
engine = "vllm"
[[endpoints]]
url = "http://127.0.0.1:8002"
"""


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    (tmp_path / "policy.toml").write_text(MAX_SCORE)
    path = tmp_path / "gateway.toml"
    path.write_text(GATEWAY)
    return path


def test_load_runtime_builds_everything(conf: Path) -> None:
    base = load_gateway_config(conf, env={})
    rt = load_runtime(
        conf, base, default_registry(), detected={EndpointId("127.0.0.1:8002"): EngineKind.SGLANG}
    )
    assert rt.policy.name == "policy"
    assert rt.policy.source == str(conf.parent / "policy.toml")
    assert [(s.id, s.engine) for s in rt.endpoints] == [
        ("127.0.0.1:8001", EngineKind.VLLM),
        ("127.0.0.1:8002", EngineKind.SGLANG),
    ]
    assert rt.engine_auto == {"127.0.0.1:8001": False, "127.0.0.1:8002": True}
    assert rt.limits == QueueLimits(max_queue_per_model=100)
    assert rt.aliases == {"mini": "tiny-llama"}
    assert rt.scrape == base.scrape
    assert rt.static_changes == ()
    assert rt.config == base


def test_a_reload_applies_reloadable_sections_and_reports_static_ones(conf: Path) -> None:
    base = load_gateway_config(conf, env={})
    conf.write_text(
        GATEWAY.replace('"127.0.0.1:8080"', '"0.0.0.0:9000"').replace("= 100", "= 7")
        + "[upstream]\nread_timeout_s = 5.0\n"
        + '[[endpoints]]\nurl = "http://127.0.0.1:8003"\n'
    )
    (conf.parent / "policy.toml").write_text(ROUND_ROBIN)

    rt = load_runtime(conf, base, default_registry())

    assert rt.static_changes == (
        "server.listen changed; restart needed",
        "upstream.read_timeout_s changed; restart needed",
    )
    assert rt.config.server == base.server  # not applied
    assert rt.config.upstream == base.upstream
    assert rt.limits.max_queue_per_model == 7  # applied
    assert len(rt.endpoints) == 3
    assert isinstance(rt.policy.profile.picker, RoundRobinPicker)


def test_endpoint_flags_still_override_the_file_on_reload(conf: Path) -> None:
    flags = [parse_endpoint_flag("http://10.9.9.9:8000,id=flagged")]
    base = load_gateway_config(conf, env={})
    rt = load_runtime(conf, base, default_registry(), endpoints=flags)
    assert [s.id for s in rt.endpoints] == ["flagged"]


def test_without_a_file_a_reload_rereads_the_policy(tmp_path: Path) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text(MAX_SCORE)
    flags = [parse_endpoint_flag("http://a:1")]
    registry = default_registry()
    first = load_runtime(None, default_config(env={}), registry, endpoints=flags, policy_file=policy)
    policy.write_text(ROUND_ROBIN)
    again = load_runtime(None, default_config(env={}), registry, endpoints=flags, policy_file=policy)
    assert not isinstance(first.policy.profile.picker, RoundRobinPicker)
    assert isinstance(again.policy.profile.picker, RoundRobinPicker)
    assert [s.id for s in again.endpoints] == ["a:1"]


@pytest.mark.parametrize(
    ("policy_text", "gateway_text", "expected_file", "expected"),
    [
        pytest.param(
            ROUND_ROBIN.replace("round-robin", "nope"),
            GATEWAY,
            "policy.toml",
            "placement.picker.plugin: unknown picker plugin 'nope' "
            "(known: cato-slack, max-score, power-of-two, round-robin)",
            id="bad-policy",
        ),
        pytest.param(
            MAX_SCORE,
            GATEWAY + "[limits]\n",
            "gateway.toml",
            "15:8: TOML syntax error: cannot declare ('limits',) twice (a key or table is defined twice)",
            id="bad-gateway-toml",
        ),
        pytest.param(
            MAX_SCORE,
            GATEWAY.replace('"policy.toml"', '"gone.toml"'),
            "gateway.toml",
            "policy.file: policy file not found: {dir}/gone.toml "
            "(relative to {dir}, the directory of this file)",
            id="policy-file-gone",
        ),
    ],
)
def test_a_bad_reload_raises_naming_file_and_path(
    conf: Path, policy_text: str, gateway_text: str, expected_file: str, expected: str
) -> None:
    base = load_gateway_config(conf, env={})
    (conf.parent / "policy.toml").write_text(policy_text)
    conf.write_text(gateway_text)
    with pytest.raises(ConfigError) as info:
        load_runtime(conf, base, default_registry())
    path = conf.parent / expected_file
    assert str(info.value) == f"{path}:" + expected.format(dir=conf.parent)


# ----------------------------------------------------------------------------- berth check


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=[p.name for p in SHIPPED_CONFIGS])
def test_every_shipped_gateway_config_loads(path: Path) -> None:
    assert check(path) == []
    rt = load_runtime(path, load_gateway_config(path, env={}), default_registry())
    assert rt.endpoints


def test_the_example_config_is_shipped() -> None:
    assert REPO / "conf" / "gateway.toml" in SHIPPED_CONFIGS


def test_check_reports_every_cross_reference_problem(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(
        '[server]\nlisten = "nope"\n[[endpoints]]\nurl = "ftp://a"\n[[endpoints]]\nurl = "ftp://a"\n'
    )
    assert check(path) == [
        f"{path}:server.listen: expected HOST:PORT, got 'nope'",
        f"{path}:endpoints[0].url: expected an http:// or https:// URL, got 'ftp://a'",
        f"{path}:endpoints[1].url: expected an http:// or https:// URL, got 'ftp://a'",
        f"{path}:endpoints[1].url: duplicate endpoint url 'ftp://a' (already used by endpoints[0])",
    ]


def test_check_loads_the_policy_a_gateway_config_names(conf: Path) -> None:
    (conf.parent / "policy.toml").write_text(MAX_SCORE.replace("fcfs", "lifo"))
    assert check(conf) == [
        f"{conf.parent / 'policy.toml'}:ordering.plugin: unknown ordering plugin 'lifo' "
        "(known: edf, fcfs, priority-bands, slack)"
    ]


@pytest.mark.parametrize(
    ("text", "problems"),
    [
        pytest.param(MAX_SCORE, [], id="good-policy"),
        pytest.param(
            MAX_SCORE + "[[placement.scorers]]\nplugin = 'x'\n",
            [
                "{path}:placement.scorers[0].plugin: unknown scorer plugin 'x' "
                "(known: least-outstanding, prefix-affinity)"
            ],
            id="bad-policy",
        ),
        pytest.param(
            '[ordering]\nplugin = "fcfs"\n',
            ["{path}:placement: missing required key"],
            id="policy-detected-by-ordering-alone",
        ),
        pytest.param(
            "[server\n",
            ["{path}:1:8: TOML syntax error: expected ']' at the end of a table declaration"],
            id="syntax",
        ),
    ],
)
def test_check_detects_policy_files(tmp_path: Path, text: str, problems: list[str]) -> None:
    path = tmp_path / "some.toml"
    path.write_text(text)
    assert check(path) == [p.format(path=path) for p in problems]
