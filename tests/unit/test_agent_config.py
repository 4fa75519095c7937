"""agent.toml and models.toml: strict decode, cross-reference checks, every error names file and key path."""

from __future__ import annotations

from pathlib import Path

import msgspec.structs
import pytest

from gateway.agent.config import GIB, check_template, load_agent_config, render
from gateway.config import check
from gateway.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

MODEL = 'name = "m"\nengine = "vllm"\ncommand = ["serve", "--port", "{port}"]\nmemory_gib = 4\n'


def _write(tmp_path: Path, agent: str, models: str | None = None) -> Path:
    (tmp_path / "models.toml").write_text(models if models is not None else f"[[models]]\n{MODEL}")
    p = tmp_path / "agent.toml"
    p.write_text(agent)
    return p


def test_shipped_examples_load() -> None:
    cfg = load_agent_config(REPO / "conf" / "agent.toml")
    assert cfg.models_file == REPO / "conf" / "models.toml"
    assert [d.name for d in cfg.devices] == ["gpu0", "gpu1"]
    assert [d.index for d in cfg.devices] == [0, 1]
    assert cfg.models["reason-70b"].devices == 2
    assert cfg.headroom_bytes == GIB
    assert check(REPO / "conf" / "agent.toml") == []
    assert check(REPO / "conf" / "models.toml") == []


def test_paths_are_relative_to_agent_toml(tmp_path: Path) -> None:
    sub = tmp_path / "etc"
    sub.mkdir()
    p = _write(sub, 'models = "models.toml"\nstate_dir = "../state"\n')
    cfg = load_agent_config(p)
    assert cfg.state_dir == tmp_path / "state"
    assert cfg.models_file == sub / "models.toml"
    assert cfg.advertise_host == "127.0.0.1"


@pytest.mark.parametrize(
    ("agent", "models", "expected"),
    [
        pytest.param("bogus = 1\n", None, "agent.toml:bogus: unknown key (known: models,", id="unknown-key"),
        pytest.param(
            'backend = "docker"\n', None, "agent.toml:backend: invalid value 'docker'", id="backend"
        ),
        pytest.param(
            "port_range = [30, 20]\n", None, "agent.toml:port_range: the first port", id="ports-order"
        ),
        pytest.param("port_range = [0, 20]\n", None, "agent.toml:port_range[0]: expected", id="port-zero"),
        pytest.param("headroom_gib = -1\n", None, "agent.toml:headroom_gib: expected", id="headroom"),
        pytest.param(
            'systemd_properties = ["KillMode=none"]\n',
            None,
            "agent.toml:systemd_properties[0]: is set by the agent: 'KillMode=none'",
            id="fixed-property",
        ),
        pytest.param(
            'systemd_properties = ["x"]\n', None, "systemd_properties[0]: expected NAME=VALUE", id="prop"
        ),
        pytest.param(
            'models = "nope.toml"\n', None, "agent.toml:models: models file not found", id="models-missing"
        ),
        pytest.param(
            '[[devices]]\nname = "gpu0"\nmemory_gib = 8\n[[devices]]\nname = "gpu0"\nmemory_gib = 8\n',
            None,
            "agent.toml:devices[1].name: duplicate device (also devices[0])",
            id="dup-device",
        ),
        pytest.param(
            '[[devices]]\nname = "gpu1"\nmemory_gib = 8\n'
            '[[devices]]\nname = "x"\nmemory_gib = 8\nindex = 1\n',
            None,
            "agent.toml:devices[1].index: duplicate device index 1",
            id="dup-index",
        ),
        pytest.param(
            '[[devices]]\nname = "gpu0"\nmemory_gib = 0\n',
            None,
            "agent.toml:devices[0].memory_gib",
            id="zero-mem",
        ),
        pytest.param(
            '[[devices]]\nname = "gpu0"\nsize = 8\n',
            None,
            "agent.toml:devices[0].size: unknown key",
            id="dev-key",
        ),
        pytest.param(
            "", f"[[models]]\n{MODEL}gpu = 1\n", "models.toml:models[0].gpu: unknown key", id="model-key"
        ),
        pytest.param(
            "", '[[models]]\nname = "m"\n', "models.toml:models[0].engine: missing required", id="missing"
        ),
        pytest.param(
            "",
            f"[[models]]\n{MODEL}".replace('"vllm"', '"tgi"'),
            "models.toml:models[0].engine: invalid value 'tgi' (expected one of: vllm, sglang)",
            id="engine",
        ),
        pytest.param(
            "",
            f"[[models]]\n{MODEL}".replace("{port}", "{gpu}"),
            "models.toml:models[0].command[2]: unknown placeholder {gpu} "
            "(known: devices, host, id, max_batch, model",
            id="placeholder",
        ),
        pytest.param(
            "",
            f"[[models]]\n{MODEL}".replace("{port}", "{port:d}"),
            "models.toml:models[0].command[2]: unknown placeholder {port:d}",
            id="format-spec",
        ),
        pytest.param(
            "",
            f"[[models]]\n{MODEL}".replace("{port}", "{port"),
            "models.toml:models[0].command[2]: bad template",
            id="unbalanced",
        ),
        pytest.param(
            "",
            f'[[models]]\n{MODEL}env = {{ X = "{{nope}}" }}\n',
            "models.toml:models[0].env.X: unknown",
            id="env",
        ),
        pytest.param(
            "",
            f"[[models]]\n{MODEL}".replace('"--port", "{port}"', '"--port", "8000"'),
            "models.toml:models[0].command: must pass the engine its port ({port})",
            id="no-port",
        ),
        pytest.param(
            "", f"[[models]]\n{MODEL}devices = 0\n", "models.toml:models[0].devices: expected", id="tp"
        ),
        pytest.param(
            "",
            f"[[models]]\n{MODEL}expected_load_s = 0\n",
            "models.toml:models[0].expected_load_s: expected",
            id="expected-load-positive",
        ),
        pytest.param(
            "",
            f"[[models]]\n{MODEL}expected_load_s = 400\n",
            "models.toml:models[0].expected_load_s: 400s is more than the model's load_timeout_s (300s)",
            id="expected-load-over-timeout",
        ),
        pytest.param(
            "",
            f'[[models]]\n{MODEL}health_path = "health"\n',
            "models[0].health_path: must start with /",
            id="hp",
        ),
        pytest.param(
            "",
            f"[[models]]\n{MODEL}[[models]]\n{MODEL}",
            "models.toml:models[1].name: duplicate model",
            id="dup",
        ),
        pytest.param(
            "",
            "[[models]]\n" + MODEL.replace('["serve", "--port", "{port}"]', "[]"),
            "models.toml:models[0].command: must name",
            id="empty-command",
        ),
    ],
)
def test_errors_name_file_and_key_path(tmp_path: Path, agent: str, models: str | None, expected: str) -> None:
    p = _write(tmp_path, agent, models)
    with pytest.raises(ConfigError) as e:
        load_agent_config(p)
    assert expected in str(e.value)
    problems = check(p)
    assert any(expected in line for line in problems), problems


def test_check_reports_every_problem(tmp_path: Path) -> None:
    p = _write(tmp_path, 'port_range = [9, 1]\nmodels = "gone.toml"\n')
    problems = check(p)
    assert len(problems) == 2
    assert all(line.startswith(str(p)) for line in problems)


def test_check_recognises_a_models_file_alone(tmp_path: Path) -> None:
    p = tmp_path / "registry.toml"
    p.write_text(f"[[models]]\n{MODEL}[[models]]\n{MODEL}")
    assert check(p) == [f"{p}:models[1].name: duplicate model (also models[0])"]


def test_templates() -> None:
    assert check_template("--tp={tp} {{literal}}") == []
    assert render("{host}:{port} {{x}}", {"host": "h", "port": "1"}) == "h:1 {x}"


def test_device_index_from_name_or_position(tmp_path: Path) -> None:
    p = _write(
        tmp_path, '[[devices]]\nname = "gpu3"\nmemory_gib = 8\n[[devices]]\nname = "big"\nmemory_gib = 8\n'
    )
    cfg = load_agent_config(p)
    assert [(d.name, d.index) for d in cfg.devices] == [("gpu3", 3), ("big", 1)]


CONFIGS = (
    '[[models.configs]]\nname = "tp1-b16"\nmax_batch = 16\n'
    '[[models.configs]]\nname = "tp2-b4"\nmax_batch = 4\ndevices = 2\nmemory_gib = 3\n'
)
BATCHED = MODEL.replace('"{port}"]', '"{port}", "--max-num-seqs", "{max_batch}"]')


@pytest.mark.parametrize(
    ("models", "expected"),
    [
        pytest.param(
            f"[[models]]\n{BATCHED}",
            "models.toml:models[0].command[4]: {max_batch} needs [[models.configs]]",
            id="max-batch-without-configs",
        ),
        pytest.param(
            f'[[models]]\n{MODEL}env = {{ B = "{{max_batch}}" }}\n',
            "models.toml:models[0].env.B: {max_batch} needs [[models.configs]]",
            id="max-batch-env-without-configs",
        ),
        pytest.param(
            f'[[models]]\n{MODEL}[[models.configs]]\nname = "a"\n',
            "models.toml:models[0].configs[0].max_batch: missing required",
            id="config-needs-max-batch",
        ),
        pytest.param(
            f'[[models]]\n{MODEL}[[models.configs]]\nname = "a"\nmax_batch = 0\n',
            "models.toml:models[0].configs[0].max_batch: expected",
            id="config-max-batch-zero",
        ),
        pytest.param(
            f'[[models]]\n{MODEL}[[models.configs]]\nname = "a"\nmax_batch = 4\nbatch = 4\n',
            "models.toml:models[0].configs[0].batch: unknown key",
            id="config-unknown-key",
        ),
        pytest.param(
            f'[[models]]\n{MODEL}[[models.configs]]\nname = "a"\nmax_batch = 4\ndevices = 0\n',
            "models.toml:models[0].configs[0].devices: expected",
            id="config-devices",
        ),
        pytest.param(
            f'[[models]]\n{MODEL}{CONFIGS}[[models.configs]]\nname = "tp2-b4"\nmax_batch = 2\n',
            "models.toml:models[0].configs[2].name: duplicate configuration (also configs[1])",
            id="config-duplicate",
        ),
        pytest.param(
            f'[[models]]\n{MODEL}[[models.configs]]\nname = "a b"\nmax_batch = 4\n',
            "models.toml:models[0].configs[0].name: must match",
            id="config-name",
        ),
        pytest.param(
            f'[[models]]\n{MODEL}default_config = "tp9"\n{CONFIGS}',
            "models.toml:models[0].default_config: names no configuration of the model (tp1-b16, tp2-b4)",
            id="default-config-unknown",
        ),
        pytest.param(
            f'[[models]]\n{MODEL}default_config = "tp9"\n',
            "models.toml:models[0].default_config: names no configuration of the model (the model lists no",
            id="default-config-without-configs",
        ),
    ],
)
def test_instance_configuration_errors(tmp_path: Path, models: str, expected: str) -> None:
    p = _write(tmp_path, "", models)
    with pytest.raises(ConfigError) as e:
        load_agent_config(p)
    assert expected in str(e.value)
    assert any(expected in line for line in check(tmp_path / "models.toml")), check(tmp_path / "models.toml")


def test_instance_configurations_resolve(tmp_path: Path) -> None:
    p = _write(tmp_path, "", f'[[models]]\n{BATCHED}default_config = "tp2-b4"\n{CONFIGS}')
    cfg = load_agent_config(p)
    m = cfg.models["m"]
    assert m.config_names == ["tp1-b16", "tp2-b4"]
    default = m.configured()
    assert (default.default_config, default.devices, default.memory_bytes) == ("tp2-b4", 2, 3 * GIB)
    small = m.configured("tp1-b16")
    assert (small.default_config, small.devices, small.memory_bytes) == ("tp1-b16", 1, 4 * GIB)
    assert small.instance_config() == m.configs[0]
    with pytest.raises(KeyError):
        m.configured("tp8")
    # Without default_config the first one is the default; a model without configs is itself.
    first = msgspec.structs.replace(m, default_config=None)
    assert first.configured().default_config == "tp1-b16"
    plain = load_agent_config(_write(tmp_path, "")).models["m"]
    assert plain.configured() is plain
    assert plain.instance_config() is None
