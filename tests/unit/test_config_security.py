"""gateway.toml's security settings: [auth] and its keys file, tenants' allowed classes and limits,
engines' API keys from the environment or a private file, [ops]; `berth check` reports their errors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gateway.config import check, load_default_policy, load_gateway_config, load_runtime
from gateway.config.schema import EngineKey
from gateway.core.errors import ConfigError
from gateway.core.types import EndpointId
from gateway.sched.plugins import default_registry

KEY = "sk-client-1"
DIGEST = hashlib.sha256(KEY.encode()).hexdigest()
ENGINE_SECRET = "engine-secret-xyz"

TENANT = '[[tenants]]\nname = "ide"\n'


def _first_class() -> str:
    return next(iter(load_default_policy(default_registry()).slo.classes))


def _write(tmp: Path, name: str, text: str, mode: int = 0o600) -> Path:
    p = tmp / name
    p.write_text(text)
    p.chmod(mode)
    return p


def _gw(tmp: Path, text: str) -> Path:
    return _write(tmp, "gateway.toml", text, 0o644)


def _error(path: Path, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as e:
        load_gateway_config(path, env=env or {})
    return str(e.value)


def test_a_keys_file_maps_key_hashes_to_tenants(tmp_path: Path) -> None:
    _write(tmp_path, "keys.toml", f'[[keys]]\ntenant = "ide"\nsha256 = "{DIGEST.upper()}"\n')
    cfg = load_gateway_config(
        _gw(tmp_path, f'[auth]\nrequired = true\nkeys_file = "keys.toml"\n{TENANT}'), env={}
    )
    assert cfg.auth.required
    assert cfg.keys_file == tmp_path / "keys.toml"
    assert [(k.tenant, k.sha256) for k in cfg.keys] == [("ide", DIGEST)]
    assert DIGEST not in repr(cfg.keys)


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        pytest.param(
            '[[keys]]\ntenant = "nobody"\nsha256 = "' + DIGEST + '"\n',
            "keys.toml:keys[0].tenant: unknown tenant 'nobody' (gateway.toml's tenants: ide)",
            id="unknown-tenant",
        ),
        pytest.param(
            '[[keys]]\ntenant = "ide"\nsha256 = "abc"\n',
            "keys.toml:keys[0].sha256: expected 64 hexadecimal digits (sha256sum of the key)",
            id="bad-hash",
        ),
        pytest.param(
            '[[keys]]\ntenant = "ide"\nsha256 = "' + DIGEST + '"\nkey = "x"\n',
            "keys.toml:keys[0].key: unknown key (known: tenant, sha256)",
            id="strict-decode",
        ),
        pytest.param(
            '[[keys]]\ntenant = "ide"\nsha256 = "'
            + DIGEST
            + '"\n[[keys]]\ntenant = "ide"\nsha256 = "'
            + DIGEST
            + '"\n',
            "keys.toml:keys[1].sha256: the same API key is already given for keys[0]",
            id="duplicate",
        ),
    ],
)
def test_keys_file_errors_name_the_keys_file_and_never_the_hash(
    tmp_path: Path, keys: str, expected: str
) -> None:
    _write(tmp_path, "keys.toml", keys)
    err = _error(_gw(tmp_path, f'[auth]\nkeys_file = "keys.toml"\n{TENANT}'))
    assert err == str(tmp_path / expected)
    assert DIGEST not in err


def test_a_missing_keys_file_is_an_error(tmp_path: Path) -> None:
    err = _error(_gw(tmp_path, f'[auth]\nkeys_file = "nope.toml"\n{TENANT}'))
    assert "nope.toml" in err
    assert "cannot read file" in err


def test_required_auth_without_tenants_is_an_error(tmp_path: Path) -> None:
    assert _error(_gw(tmp_path, "[auth]\nrequired = true\n")).endswith(
        "auth.required: no [[tenants]] are configured, so every request would get 401"
    )


def test_a_tenant_without_keys_needs_a_keys_file(tmp_path: Path) -> None:
    assert "a tenant needs api_keys or api_key_sha256 (or auth.keys_file)" in _error(_gw(tmp_path, TENANT))


def test_a_tenants_default_class_must_be_allowed(tmp_path: Path) -> None:
    text = f'[[tenants]]\nname = "t"\napi_keys = ["{KEY}"]\nslo_class = "batch"\nallowed_classes = ["chat"]\n'
    assert _error(_gw(tmp_path, text)).endswith(
        "tenants[0].slo_class: slo_class 'batch' is not among allowed_classes"
    )


def test_allowed_classes_must_be_classes_of_the_policy(tmp_path: Path) -> None:
    text = f'[[tenants]]\nname = "t"\napi_keys = ["{KEY}"]\nallowed_classes = ["{_first_class()}", "gold"]\n'
    problems = check(_gw(tmp_path, text))
    assert len(problems) == 1
    assert (
        "gateway.toml:tenants[0].allowed_classes[1]: unknown SLO class 'gold' (the policy defines: "
        in problems[0]
    )


def test_tenant_limits_are_range_checked(tmp_path: Path) -> None:
    text = f'[[tenants]]\nname = "t"\napi_keys = ["{KEY}"]\nrequests_per_s = 0\n'
    assert "tenants[0].requests_per_s: expected number > 0" in _error(_gw(tmp_path, text))


# ----------------------------------------------------------------- engine credentials
def _endpoint(extra: str) -> str:
    return f'[[endpoints]]\nid = "e1"\nurl = "http://127.0.0.1:9"\n{extra}'


def test_an_engine_key_comes_from_the_environment_and_is_never_shown(tmp_path: Path) -> None:
    cfg = load_gateway_config(
        _gw(tmp_path, _endpoint('api_key_env = "E1_KEY"\n')), env={"E1_KEY": ENGINE_SECRET}
    )
    key = cfg.engine_keys[EndpointId("e1")]
    assert key.reveal() == ENGINE_SECRET
    assert ENGINE_SECRET not in repr(cfg)
    assert ENGINE_SECRET not in str(key)


def test_a_missing_environment_variable_is_an_error(tmp_path: Path) -> None:
    assert _error(_gw(tmp_path, _endpoint('api_key_env = "E1_KEY"\n'))).endswith(
        "endpoints[0].api_key_env: environment variable E1_KEY is not set or empty"
    )


def test_an_engine_key_file_must_be_private(tmp_path: Path) -> None:
    key_file = _write(tmp_path, "e1.key", ENGINE_SECRET + "\n", 0o644)
    gw = _gw(tmp_path, _endpoint('api_key_file = "e1.key"\n'))
    err = _error(gw)
    assert err.endswith(
        f"endpoints[0].api_key_file: {key_file} may be read by group or others (mode 0644); "
        f"run: chmod 600 {key_file}"
    )
    assert ENGINE_SECRET not in err
    assert check(gw) == [err]  # `berth check` says the same
    key_file.chmod(0o600)
    cfg = load_gateway_config(gw, env={})
    assert cfg.engine_keys[EndpointId("e1")] == EngineKey(ENGINE_SECRET)


def test_a_group_readable_key_file_is_refused_too(tmp_path: Path) -> None:
    _write(tmp_path, "e1.key", ENGINE_SECRET, 0o640)
    assert "mode 0640" in _error(_gw(tmp_path, _endpoint('api_key_file = "e1.key"\n')))


def test_env_and_file_together_are_an_error(tmp_path: Path) -> None:
    _write(tmp_path, "e1.key", ENGINE_SECRET)
    text = _endpoint('api_key_env = "E1_KEY"\napi_key_file = "e1.key"\n')
    assert "endpoints[0].api_key_file: give api_key_env or api_key_file, not both" in _error(
        _gw(tmp_path, text)
    )


def test_berth_check_reports_a_bad_keys_file_and_a_public_engine_key_file_together(tmp_path: Path) -> None:
    _write(tmp_path, "keys.toml", '[[keys]]\ntenant = "nobody"\nsha256 = "' + DIGEST + '"\n')
    _write(tmp_path, "e1.key", ENGINE_SECRET, 0o604)
    gw = _gw(tmp_path, f'[auth]\nkeys_file = "keys.toml"\n{TENANT}' + _endpoint('api_key_file = "e1.key"\n'))
    problems = check(gw)
    assert len(problems) == 2
    assert "keys[0].tenant: unknown tenant 'nobody'" in problems[0]
    assert "api_key_file:" in problems[1]
    assert "mode 0604" in problems[1]


# ----------------------------------------------------------------- ops and reload
def test_the_ops_listener_must_differ_from_the_public_one(tmp_path: Path) -> None:
    text = '[server]\nlisten = "127.0.0.1:8080"\n[ops]\nlisten = "127.0.0.1:8080"\n'
    assert _error(_gw(tmp_path, text)).endswith("ops.listen: must differ from server.listen")
    assert _error(_gw(tmp_path, '[ops]\nlisten = "nope"\n')).endswith(
        "ops.listen: expected HOST:PORT, got 'nope'"
    )


@pytest.mark.parametrize(
    "value", ["0.0", "0.0001", "61.0", "-1.0"], ids=["zero", "sub-ms", "above-60", "negative"]
)
def test_the_lag_monitor_interval_is_bounded(tmp_path: Path, value: str) -> None:
    message = _error(_gw(tmp_path, f"[ops]\nloop_lag_interval_s = {value}\n"))
    assert "ops.loop_lag_interval_s" in message
    assert (
        load_gateway_config(
            _gw(tmp_path, "[ops]\nloop_lag_interval_s = 0.01\n"), env={}
        ).ops.loop_lag_interval_s
        == 0.01
    )


def test_ops_is_static_and_auth_and_keys_reload(tmp_path: Path) -> None:
    keys = _write(tmp_path, "keys.toml", "")
    gw = _gw(tmp_path, f'[auth]\nkeys_file = "keys.toml"\n[ops]\nlisten = "127.0.0.1:9101"\n{TENANT}')
    base = load_gateway_config(gw, env={})
    keys.write_text(f'[[keys]]\ntenant = "ide"\nsha256 = "{DIGEST}"\n')
    gw.write_text(
        f'[auth]\nrequired = true\nkeys_file = "keys.toml"\n[ops]\nlisten = "127.0.0.1:9102"\n{TENANT}'
    )
    new = load_runtime(gw, base, default_registry(), env={})
    assert new.config.auth.required
    assert [k.tenant for k in new.config.keys] == ["ide"]
    assert new.config.ops.listen == "127.0.0.1:9101"
    assert new.static_changes == ("ops.listen changed; restart needed",)
