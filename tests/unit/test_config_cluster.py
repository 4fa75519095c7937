"""[cluster] in gateway.toml: strict decode, checks that name the file and key path, the password from
the environment or a 0600 file (never from the URL, never in a repr), static on reload."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gateway.config import load_gateway_config
from gateway.config.check import check_file
from gateway.config.cluster import ClusterConfig, advertised_url, safe_url
from gateway.config.runtime import static_changes
from gateway.core.errors import ConfigError


def _write(tmp_path: Path, cluster: str) -> Path:
    p = tmp_path / "gateway.toml"
    p.write_text(cluster)
    return p


def test_without_cluster_there_is_none(tmp_path: Path) -> None:
    assert load_gateway_config(_write(tmp_path, "")).cluster is None


def test_a_cluster_with_defaults_and_a_password_from_the_environment(tmp_path: Path) -> None:
    p = _write(tmp_path, '[cluster]\nredis = "rediss://user@redis.internal:6380/2"\npassword_env = "PW"\n')
    cfg = load_gateway_config(p, env={"PW": "hunter22"})
    c = cfg.cluster
    assert c is not None
    assert c.name == socket.gethostname()
    assert c.password is not None
    assert c.password.reveal() == "hunter22"
    assert c.safe_url == "rediss://redis.internal:6380/2"
    assert "hunter22" not in repr(c) + repr(cfg) + str(c.password)
    assert (c.config.lease_s, c.config.publish_interval_s, c.config.on_redis_down) == (5.0, 0.1, "local")
    assert c.config.slice_share == 0.02


def test_a_password_file_must_be_private(tmp_path: Path) -> None:
    pw = tmp_path / "redis.pass"
    pw.write_text("s3cret\n")
    pw.chmod(0o644)
    p = _write(
        tmp_path, '[cluster]\nredis = "redis://r:6379/0"\nname = "gw-1"\npassword_file = "redis.pass"\n'
    )
    with pytest.raises(ConfigError) as e:
        load_gateway_config(p)
    assert e.value.path == "cluster.password_file"
    assert "chmod 600" in str(e.value)
    pw.chmod(0o600)
    c = load_gateway_config(p).cluster
    assert c is not None
    assert c.password is not None
    assert c.password.reveal() == "s3cret"


@pytest.mark.parametrize(
    ("body", "path", "words"),
    [
        pytest.param(
            'redis = "redis://:pw@r:6379/0"',
            "cluster.redis",
            "must not hold the password",
            id="password-in-url",
        ),
        pytest.param('redis = "http://r:6379"', "cluster.redis", "redis://", id="scheme"),
        pytest.param('redis = "redis://r:6379/x"', "cluster.redis", "database", id="db"),
        pytest.param(
            'redis = "redis://r"\nlease_s = 1.0\npublish_interval_s = 0.8',
            "cluster.publish_interval_s",
            "half",
            id="interval",
        ),
        pytest.param(
            'redis = "redis://r"\npassword_env = "NOPE_NOT_SET"',
            "cluster.password_env",
            "not set",
            id="env-unset",
        ),
        pytest.param('redis = "redis://r"\nname = "a b"', "cluster.name", "without spaces", id="name"),
        pytest.param('redis = "redis://r"\ncolour = 1', "cluster.colour", "unknown", id="unknown-key"),
        pytest.param(
            'redis = "redis://r"\non_redis_down = "panic"', "cluster.on_redis_down", "", id="fallback-mode"
        ),
        pytest.param('redis = "redis://r"\ntimeout_s = 0', "cluster.timeout_s", "", id="timeout"),
        pytest.param(
            'redis = "redis://r"\nadvertise_url = "http://gw1:8081/v1"',
            "cluster.advertise_url",
            "without a path",
            id="advertise-path",
        ),
        pytest.param(
            'redis = "redis://r"\nadvertise_url = "gw1:8081"', "cluster.advertise_url", "http", id="advertise"
        ),
        pytest.param('redis = "redis://r"\nslice_share = 0.5', "cluster.slice_share", "", id="slice-share"),
    ],
)
def test_errors_name_file_and_key(tmp_path: Path, body: str, path: str, words: str) -> None:
    p = _write(tmp_path, f"[cluster]\n{body}\n")
    with pytest.raises(ConfigError) as e:
        load_gateway_config(p, env={})
    assert e.value.path == path
    assert e.value.file == str(p)
    assert words in str(e.value)
    assert "pw@" not in str(e.value)


def test_berth_check_reports_cluster_problems(tmp_path: Path) -> None:
    p = _write(tmp_path, '[cluster]\nredis = "redis://:pw@r:6379/0"\n')
    report = check_file(p)
    assert any("cluster.redis" in problem for problem in report.problems)


def test_a_changed_cluster_needs_a_restart(tmp_path: Path) -> None:
    a = load_gateway_config(_write(tmp_path, '[cluster]\nredis = "redis://r"\nname = "a"\n'))
    b = load_gateway_config(_write(tmp_path, '[cluster]\nredis = "redis://r"\nname = "b"\n'))
    assert static_changes(a, b) == ["cluster changed; restart needed"]
    assert static_changes(a, a) == []


def test_safe_url_never_shows_a_password() -> None:
    assert safe_url("redis://u:pw@h:1/0") == "redis://h:1/0"
    assert safe_url("rediss://[::1]:6380/3") == "rediss://[::1]:6380/3"


def test_the_name_from_the_environment_wins(tmp_path: Path) -> None:
    p = _write(tmp_path, '[cluster]\nredis = "redis://r"\nname = "file"\n')
    c = load_gateway_config(p, env={"BERTH_CLUSTER_NAME": "host-8081"}).cluster
    assert c is not None
    assert c.name == "host-8081"


@pytest.mark.parametrize(
    ("advertise", "listen", "expected"),
    [
        ("", ("127.0.0.1", 8081), "http://127.0.0.1:8081"),
        ("", ("::1", 8081), "http://[::1]:8081"),
        ("", ("0.0.0.0", 8081), f"http://{socket.getfqdn()}:8081"),
        ("https://gw-1.internal:443/", ("0.0.0.0", 8081), "https://gw-1.internal:443"),
    ],
)
def test_where_the_other_replicas_reach_this_one(
    advertise: str, listen: tuple[str, int], expected: str
) -> None:
    assert advertised_url(ClusterConfig(redis="redis://r", advertise_url=advertise), listen) == expected
