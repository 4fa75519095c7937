"""The SLO parts of the configuration: `[slo]`, `[tasks]`, `[admission]` and `[placement] lookahead` in
policy files, `[[tenants]]` and `scheduling` in gateway.toml; every error names the file and key path,
and no error message repeats an API key."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gateway.config.check import check
from gateway.config.cli_overrides import parse_endpoint_flag
from gateway.config.load import load_gateway_config
from gateway.config.policy import parse_policy_text
from gateway.config.runtime import load_runtime
from gateway.core.errors import ConfigError
from gateway.core.slo import Infeasible, SloKind, TaskMetric
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.admission.slo_feasibility import SloFeasibilityAdmitter

HEAD = '[ordering]\nplugin = "fcfs"\n[placement]\npicker = { plugin = "max-score" }\n'
CLASSES = """
[slo]
default_class = "chat"
[[slo.classes]]
name = "ide"
ttft_ms = 300.0
on_infeasible = "reject"
max_queue = 10
[[slo.classes]]
name = "chat"
kind = "interactive"
itl_ms = 100.0
[[slo.classes]]
name = "gen"
kind = "batch"
band = 7
task_sla_ms = 15000.0
task_metric = "ttft"
steps = [3.0, 1.0]
on_infeasible = "best-effort"
[[slo.rules]]
class = "ide"
model = "coder"
max_tokens_max = 32
"""


def policy_error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_policy_text(text, "p.toml", default_registry())
    return str(info.value)


def test_the_slo_section_builds_classes_rules_and_tasks() -> None:
    p = parse_policy_text(
        HEAD
        + CLASSES
        + '[admission]\nplugin = "slo-feasibility"\nparams = { margin = 1.2 }\n'
        + "[tasks]\nidle_expiry_s = 30.0\nmax_tasks = 5\nlearn_allotments = true\n",
        "p.toml",
        default_registry(),
    )
    slo = p.slo
    assert list(slo.classes) == ["ide", "chat", "gen"]
    assert slo.default_class == "chat"
    ide, chat, gen = slo.classes.values()
    assert (ide.band, chat.band, gen.band) == (0, 1, 7)  # default: the position in the list
    assert (ide.on_infeasible, chat.on_infeasible, gen.on_infeasible) == (
        Infeasible.REJECT,
        Infeasible.HOLD,
        Infeasible.BEST_EFFORT,
    )
    assert (gen.kind, gen.task_metric, gen.shares()) == (SloKind.BATCH, TaskMetric.TTFT, (0.75, 0.25))
    assert slo.rules[0].model == "coder"
    assert (slo.tasks.idle_expiry_s, slo.tasks.max_tasks, slo.tasks.learn_allotments) == (30.0, 5, True)
    assert isinstance(p.admitter, SloFeasibilityAdmitter)
    assert p.admitter.params.margin == 1.2
    assert p.lookahead == 0


def test_a_policy_without_slo_has_one_class_without_targets() -> None:
    p = parse_policy_text(HEAD, "p.toml", default_registry())
    assert list(p.slo.classes) == ["default"]
    assert p.admitter is None


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        pytest.param(
            CLASSES + '[[slo.classes]]\nname = "ide"\n',
            "p.toml:slo.classes[3].name: duplicate class 'ide'",
            id="duplicate-class",
        ),
        pytest.param(
            '[slo]\ndefault_class = "x"\n[[slo.classes]]\nname = "a"\n',
            "p.toml:slo.default_class: unknown SLO class 'x' (known: a)",
            id="unknown-default",
        ),
        pytest.param(
            '[slo]\n[[slo.classes]]\nname = "a"\n[[slo.rules]]\nclass = "b"\n',
            "p.toml:slo.rules[0].class: unknown SLO class 'b' (known: a)",
            id="unknown-rule-class",
        ),
        pytest.param(
            '[slo]\n[[slo.classes]]\nname = "a"\n[[slo.rules]]\nclass = "a"\npath = "/v1/chat"\n',
            "p.toml:slo.rules[0].path: unknown path '/v1/chat' "
            "(known: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses)",
            id="unknown-path",
        ),
        pytest.param(
            '[slo]\n[[slo.classes]]\nname = "a"\n[[slo.rules]]\nclass = "a"\nmax_tokens_min = 9\n'
            "max_tokens_max = 3\n",
            "p.toml:slo.rules[0].max_tokens_max: must not be below max_tokens_min (9)",
            id="min-above-max",
        ),
        pytest.param(
            '[slo]\n[[slo.classes]]\nname = "a b"\n',
            "p.toml:slo.classes[0].name: must be non-empty without whitespace, got 'a b'",
            id="class-name-with-space",
        ),
        pytest.param(
            '[slo]\n[[slo.classes]]\nname = "a"\nttft_ms = -1\n',
            "p.toml:slo.classes[0].ttft_ms: expected number > 0",
            id="negative-target",
        ),
        pytest.param(
            '[slo]\n[[slo.classes]]\nname = "a"\non_infeasible = "drop"\n',
            "p.toml:slo.classes[0].on_infeasible: invalid value 'drop' "
            "(expected one of: reject, hold, best-effort)",
            id="unknown-outcome",
        ),
        pytest.param(
            '[slo]\nunknown_class = "drop"\n[[slo.classes]]\nname = "a"\n',
            "p.toml:slo.unknown_class: invalid value 'drop' (expected one of: default, reject)",
            id="unknown-class-choice",
        ),
        pytest.param(
            '[slo]\n[[slo.classes]]\nname = "a"\nitl = 5\n',
            "p.toml:slo.classes[0].itl: unknown key",
            id="unknown-class-key",
        ),
        pytest.param(
            '[admission]\nplugin = "bouncer"\n',
            "p.toml:admission.plugin: unknown admitter plugin 'bouncer' (known: admit-all, slo-feasibility)",
            id="unknown-admitter",
        ),
        pytest.param(
            '[admission]\nplugin = "slo-feasibility"\nparams = { margin = 0.1 }\n',
            "p.toml:admission.params.margin: expected number >= 0.5",
            id="admitter-param-range",
        ),
        pytest.param(
            "[tasks]\nmax_tasks = 0\n",
            "p.toml:tasks.max_tasks: expected integer >= 1",
            id="task-bound",
        ),
    ],
)
def test_slo_errors_name_the_file_and_key_path(extra: str, expected: str) -> None:
    assert policy_error(HEAD + extra).startswith(expected)


def test_lookahead_is_a_placement_setting() -> None:
    text = '[ordering]\nplugin = "slack"\n[placement]\npicker = { plugin = "max-score" }\nlookahead = 4\n'
    assert parse_policy_text(text, "p.toml", default_registry()).lookahead == 4


# --------------------------------------------------------------------- gateway.toml
KEY = "sk-very-secret"


def write(tmp: Path, text: str, policy: str = HEAD + CLASSES) -> Path:
    (tmp / "p.toml").write_text(policy)
    path = tmp / "gateway.toml"
    path.write_text('[policy]\nfile = "p.toml"\n' + text)
    return path


def test_tenants_and_scheduling_load(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"other").hexdigest()
    path = write(
        tmp_path,
        f'[[tenants]]\nname = "ide"\napi_keys = ["{KEY}"]\nslo_class = "ide"\nttft_ms = 200.0\n'
        f'[[tenants]]\nname = "ops"\napi_key_sha256 = ["{digest}"]\n'
        '[[endpoints]]\nurl = "http://a:1"\nscheduling = "priority"\n',
    )
    cfg = load_gateway_config(path)
    assert [t.name for t in cfg.tenants] == ["ide", "ops"]
    assert cfg.endpoint_specs()[0].priority_scheduling is True
    assert check(path) == []
    assert KEY not in repr(cfg)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            '[[tenants]]\nname = "a"\napi_keys = ["k1"]\n[[tenants]]\nname = "a"\napi_keys = ["k2"]\n',
            "tenants[1].name: duplicate tenant 'a' (already tenants[0])",
            id="duplicate-name",
        ),
        pytest.param(
            '[[tenants]]\nname = "a"\n',
            "tenants[0]: a tenant needs api_keys or api_key_sha256 (or auth.keys_file)",
            id="no-keys",
        ),
        pytest.param(
            '[[tenants]]\nname = "a"\napi_key_sha256 = ["abc"]\n',
            "tenants[0].api_key_sha256[0]: expected 64 hexadecimal digits (sha256sum of the key)",
            id="bad-hash",
        ),
        pytest.param(
            f'[[tenants]]\nname = "a"\napi_keys = ["{KEY}"]\n[[tenants]]\nname = "b"\napi_keys = ["{KEY}"]\n',
            "tenants[1].api_keys[0]: the same API key is already given in tenants[0]",
            id="same-key-twice",
        ),
        pytest.param(
            '[[endpoints]]\nurl = "http://a:1"\nscheduling = "lifo"\n',
            "endpoints[0].scheduling: invalid value 'lifo' (expected one of: fcfs, priority)",
            id="bad-scheduling",
        ),
    ],
)
def test_gateway_slo_errors(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    problems = check(path)
    assert problems
    assert problems[0] == f"{path}:{expected}"
    assert all(KEY not in p for p in problems)


def test_a_tenant_class_must_exist_in_the_policy(tmp_path: Path) -> None:
    path = write(tmp_path, f'[[tenants]]\nname = "a"\napi_keys = ["{KEY}"]\nslo_class = "gold"\n')
    expected = f"{path}:tenants[0].slo_class: unknown SLO class 'gold' (the policy defines: ide, chat, gen)"
    assert check(path) == [expected]
    cfg = load_gateway_config(path)
    with pytest.raises(ConfigError) as info:
        load_runtime(path, cfg, default_registry())
    assert str(info.value) == expected


def test_the_endpoint_flag_takes_scheduling() -> None:
    assert parse_endpoint_flag("http://a:1,scheduling=priority").scheduling == "priority"
