"""gateway.toml's [lifecycle] and [[nodes]]: decoded strictly, checked with the models.toml they name;
every error names its file and key path; `berth check` reports them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import check, load_gateway_config
from gateway.config.runtime import static_changes
from gateway.core.errors import ConfigError
from gateway.core.types import ModelName
from gateway.lifecycle.manager import registry_models
from gateway.sched.plugins.eviction.cace import CaceEvictor
from gateway.sched.plugins.eviction.lru import LruEvictor

MODELS = """
[[models]]
name = "code-a"
engine = "vllm"
command = ["berth-engine-sim", "--port", "{port}", "--model", "{model}"]
memory_gib = 4

[[models]]
name = "reason-b"
engine = "vllm"
command = ["berth-engine-sim", "--port", "{port}", "--model", "{model}"]
memory_gib = 8
"""

GOOD = """
[lifecycle]
models = "models.toml"
load_deadline_s = 60
churn_guard_s = 5
drain_timeout_s = 2
pinned = ["code-a"]
[lifecycle.evictor]
plugin = "lru"

[[nodes]]
name = "n1"
agent = ["berth-agent", "-c", "agent.toml"]
models = ["code-a", "reason-b"]
"""


def write(tmp_path: Path, gateway: str, models: str | None = MODELS) -> Path:
    if models is not None:
        (tmp_path / "models.toml").write_text(models)
    p = tmp_path / "gateway.toml"
    p.write_text(gateway)
    return p


def test_good_lifecycle_loads_with_its_registry_and_evictor(tmp_path: Path) -> None:
    cfg = load_gateway_config(write(tmp_path, GOOD))
    lc = cfg.lifecycle
    assert lc is not None
    assert set(lc.models) == {"code-a", "reason-b"}
    assert lc.models_file == tmp_path / "models.toml"
    assert isinstance(lc.evictor, LruEvictor)
    assert lc.config.pinned == ("code-a",)
    assert [n.name for n in lc.nodes] == ["n1"]
    assert cfg.endpoints == ()


def test_default_evictor_is_cace(tmp_path: Path) -> None:
    cfg = load_gateway_config(
        write(tmp_path, '[lifecycle]\nmodels = "models.toml"\n[[nodes]]\nname = "n"\nagent = ["a"]\n')
    )
    assert cfg.lifecycle is not None
    assert isinstance(cfg.lifecycle.evictor, CaceEvictor)


def test_no_lifecycle_section_means_no_lifecycle(tmp_path: Path) -> None:
    assert load_gateway_config(write(tmp_path, "", models=None)).lifecycle is None


LC = '[lifecycle]\nmodels = "models.toml"\n'
NODE = '[[nodes]]\nname = "n"\nagent = ["a"]\n'

BAD = [
    (
        "nodes-without-lifecycle",
        '[[nodes]]\nname = "n"\nagent = ["a"]\n',
        "gateway.toml:nodes: [[nodes]] needs a [lifecycle]",
    ),
    (
        "lifecycle-without-nodes",
        '[lifecycle]\nmodels = "models.toml"\n',
        "gateway.toml:lifecycle: needs at least one [[nodes]]",
    ),
    (
        "missing-models-file",
        '[lifecycle]\nmodels = "nope.toml"\n[[nodes]]\nname = "n"\nagent = ["a"]\n',
        "gateway.toml:lifecycle.models: models file not found",
    ),
    (
        "unknown-pinned",
        '[lifecycle]\nmodels = "models.toml"\npinned = ["x"]\n[[nodes]]\nname = "n"\nagent = ["a"]\n',
        "gateway.toml:lifecycle.pinned[0]: unknown model 'x'",
    ),
    (
        "unknown-node-model",
        LC + NODE + 'models = ["code-a", "zz"]\n',
        "gateway.toml:nodes[0].models[1]: unknown model 'zz'",
    ),
    (
        "duplicate-node",
        LC + NODE + NODE,
        "gateway.toml:nodes[1].name: duplicate node name 'n'",
    ),
    (
        "empty-agent",
        '[lifecycle]\nmodels = "models.toml"\n[[nodes]]\nname = "n"\nagent = []\n',
        "gateway.toml:nodes[0].agent: must be a non-empty",
    ),
    (
        "unknown-evictor",
        LC + 'evictor = { plugin = "mru" }\n' + NODE,
        "gateway.toml:lifecycle.evictor: unknown evictor plugin 'mru' (known: cace, lru)",
    ),
    (
        "bad-evictor-param",
        '[lifecycle]\nmodels = "models.toml"\nevictor = { plugin = "cace", params = { idle_weight = -1 } }\n'
        '[[nodes]]\nname = "n"\nagent = ["a"]\n',
        "gateway.toml:lifecycle.evictor.params: idle_weight must be",
    ),
]


@pytest.mark.parametrize(("text", "expected"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_lifecycle_names_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_gateway_config(write(tmp_path, text))
    assert str(e.value).startswith(str(tmp_path))
    assert expected in str(e.value)
    assert any(expected in line for line in check(tmp_path / "gateway.toml"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[lifecycle]\nmodels = "m.toml"\nchurn_guard = 1\n', "lifecycle.churn_guard"),
        ('[lifecycle]\nmodels = "m.toml"\nload_deadline_s = 0\n', "lifecycle.load_deadline_s"),
        (
            '[lifecycle]\nmodels = "m.toml"\n[[nodes]]\nname = "n"\nagent = ["a"]\nhost = "x"\n',
            "nodes[0].host",
        ),
    ],
    ids=["unknown-key", "out-of-range", "unknown-node-key"],
)
def test_strict_decode_errors_name_the_key(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_gateway_config(write(tmp_path, text))
    assert expected in str(e.value)


def test_models_file_problems_name_the_models_file(tmp_path: Path) -> None:
    bad_models = MODELS.replace("memory_gib = 8", "memory_gib = 0")
    lines = check(write(tmp_path, GOOD, models=bad_models))
    assert lines
    assert any(str(tmp_path / "models.toml") in line and "models[1].memory_gib" in line for line in lines)


def test_berth_check_passes_a_good_lifecycle(tmp_path: Path) -> None:
    assert check(write(tmp_path, GOOD)) == []


def test_a_changed_lifecycle_is_a_static_change(tmp_path: Path) -> None:
    before = load_gateway_config(write(tmp_path, GOOD))
    assert static_changes(before, load_gateway_config(write(tmp_path, GOOD))) == []
    after = load_gateway_config(write(tmp_path, GOOD.replace("churn_guard_s = 5", "churn_guard_s = 6")))
    assert static_changes(before, after) == ["lifecycle or nodes changed; restart needed"]


def test_models_toml_expected_load_s_is_the_registry_load_time_until_measured(tmp_path: Path) -> None:
    models = MODELS.replace("memory_gib = 8\n", "memory_gib = 8\nexpected_load_s = 90\n")
    cfg = load_gateway_config(
        write(
            tmp_path, GOOD.replace("[lifecycle.evictor]", "expected_load_s = 12\n[lifecycle.evictor]"), models
        )
    )
    assert cfg.lifecycle is not None
    assert cfg.lifecycle.models["reason-b"].expected_load_s == 90
    specs = registry_models(cfg.lifecycle)
    assert specs[ModelName("reason-b")].load_s == 90  # its own
    assert specs[ModelName("code-a")].load_s == 12  # [lifecycle]'s default
    assert check(tmp_path / "gateway.toml") == []
