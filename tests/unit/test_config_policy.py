"""Policy files: strict schema, plugins built through the registry passed in, errors with key paths."""

from __future__ import annotations

import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.config import check, load_policy, parse_policy_text
from gateway.config.policy import SLOTS, Slot, decode_policy, default_policy_text
from gateway.config.policy_schema import PolicyFile
from gateway.core.errors import ConfigError
from gateway.core.strict_toml import parse_toml
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.ordering.fcfs import FcfsOrdering
from gateway.sched.plugins.placement.least_outstanding import LeastOutstandingScorer, MaxScorePicker
from gateway.sched.plugins.placement.power_of_two import PowerOfTwoPicker
from gateway.sched.registry import BuildContext, NoParams, PluginKind, PluginRegistry, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted((REPO / "policies").glob("*.toml"))

HEAD = '[ordering]\nplugin = "fcfs"\n'


def _policy_error(text: str, registry: PluginRegistry | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_policy_text(text, "p.toml", registry or default_registry())
    return str(info.value)


# ----------------------------------------------------------------------------- building


def test_the_default_shape_builds_the_named_plugins_with_weights() -> None:
    policy = parse_policy_text(
        HEAD
        + '[placement]\npicker = { plugin = "max-score" }\n'
        + '[[placement.scorers]]\nplugin = "least-outstanding"\nweight = 2.5\n',
        "policies/custom.toml",
        default_registry(),
    )
    assert policy.name == "custom"  # the file's stem when `name` is absent
    assert policy.source == "policies/custom.toml"
    assert isinstance(policy.ordering, FcfsOrdering)
    assert isinstance(policy.profile.picker, MaxScorePicker)
    assert policy.profile.filters == ()
    [ws] = policy.profile.scorers
    assert isinstance(ws.scorer, LeastOutstandingScorer)
    assert ws.weight == 2.5


def test_plugin_params_and_the_seed_reach_the_factory() -> None:
    @dataclass
    class Built:
        """A picker that keeps what it was built from."""

        params: Params
        ctx: BuildContext
        name = "probe"

        def pick(
            self, req: SchedRequest, scored: Sequence[tuple[EndpointView, float]], snap: FleetSnapshot
        ) -> EndpointView:
            return scored[0][0]

    class Params(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
        k: int = 0

    reg = default_registry()
    reg.register(PluginSpec(PluginKind.PICKER, "probe", Params, Built))
    policy = parse_policy_text(
        HEAD + '[placement]\npicker = { plugin = "probe", params = { k = 3 } }\n', "p.toml", reg, seed=7
    )
    picker: object = policy.profile.picker
    assert picker == Built(Params(k=3), BuildContext(seed=7))


@pytest.mark.parametrize("slot", SLOTS, ids=[s.key for s in SLOTS])
def test_every_plugin_slot_is_a_schema_field_of_its_shape(slot: Slot) -> None:
    struct: Any = PolicyFile
    field = None
    for part in slot.key.split("."):
        field = {f.name: f for f in msgspec.structs.fields(struct)}[part]
        struct = field.type
    assert field is not None
    assert field.required == slot.required
    assert (typing.get_origin(field.type) is tuple) == slot.many


def test_a_plugin_that_is_not_of_its_kind_is_refused_with_its_key_path() -> None:
    reg = default_registry()
    reg.register(PluginSpec(PluginKind.PICKER, "not-a-picker", NoParams, lambda p, ctx: object()))
    assert (
        _policy_error(HEAD + '[placement]\npicker = { plugin = "not-a-picker" }\n', reg)
        == "p.toml:placement.picker.plugin: picker plugin 'not-a-picker' does not implement Picker"
    )


def test_load_policy_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "two.toml"
    path.write_text(
        'name = "two"\n'
        + HEAD
        + '[placement]\npicker = { plugin = "power-of-two", params = { choices = 3 } }\n'
    )
    policy = load_policy(path, default_registry(), seed=1)
    assert policy.name == "two"
    assert policy.source == str(path)
    assert isinstance(policy.profile.picker, PowerOfTwoPicker)


# ----------------------------------------------------------------------------- errors

_PICKERS = "cato-slack, max-score, power-of-two, round-robin"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            'nmae = "x"\n' + HEAD + '[placement]\npicker = { plugin = "max-score" }\n',
            "p.toml:nmae: unknown key (known: name, description, ordering, placement, admission, preemption, "
            "concurrency, slo, tasks, autoscale)",
            id="unknown-top-level-key",
        ),
        pytest.param(
            HEAD + '[placement]\npicker = { plugin = "max-score" }\nscorer = []\n',
            "p.toml:placement.scorer: unknown key (known: picker, filters, scorers, lookahead)",
            id="unknown-placement-key",
        ),
        pytest.param(
            HEAD + '[placement]\npicker = { plugin = "max-score", weight = 1 }\n',
            "p.toml:placement.picker.weight: unknown key (known: plugin, params)",
            id="weight-on-picker",
        ),
        pytest.param(
            HEAD + '[placement]\npicker = { plugin = "best" }\n',
            f"p.toml:placement.picker.plugin: unknown picker plugin 'best' (known: {_PICKERS})",
            id="unknown-picker",
        ),
        pytest.param(
            HEAD + '[placement]\npicker = { plugin = "least-outstanding" }\n',
            f"p.toml:placement.picker.plugin: unknown picker plugin 'least-outstanding' (known: {_PICKERS}); "
            "'least-outstanding' is a scorer plugin",
            id="scorer-named-as-picker",
        ),
        pytest.param(
            '[ordering]\nplugin = "lifo"\n[placement]\npicker = { plugin = "max-score" }\n',
            "p.toml:ordering.plugin: unknown ordering plugin 'lifo' "
            "(known: edf, fcfs, priority-bands, slack)",
            id="unknown-ordering",
        ),
        pytest.param(
            HEAD + '[placement]\npicker = { plugin = "max-score" }\nfilters = [{ plugin = "healthy" }]\n',
            "p.toml:placement.filters[0].plugin: unknown filter plugin 'healthy' "
            "(known: best-fit, demand-split, instance-class, overflow-guard, prefix-holders, sub-cluster)",
            id="unknown-filter",
        ),
        pytest.param(
            HEAD
            + '[placement]\npicker = { plugin = "max-score" }\n'
            + '[[placement.scorers]]\nplugin = "least-outstanding"\n'
            + '[[placement.scorers]]\nplugin = "kv-usage"\n',
            "p.toml:placement.scorers[1].plugin: unknown scorer plugin 'kv-usage' "
            "(known: least-outstanding, prefix-affinity)",
            id="unknown-second-scorer",
        ),
        pytest.param(
            HEAD + '[placement]\npicker = { plugin = "power-of-two", params = { choices = "two" } }\n',
            "p.toml:placement.picker.params.choices: expected integer, got string",
            id="param-type",
        ),
        pytest.param(
            HEAD + '[placement]\npicker = { plugin = "power-of-two", params = { choices = 0 } }\n',
            "p.toml:placement.picker.params.choices: expected integer >= 1",
            id="param-range",
        ),
        pytest.param(
            HEAD + '[placement]\npicker = { plugin = "power-of-two", params = { chioces = 3 } }\n',
            "p.toml:placement.picker.params.chioces: unknown key (known: choices, seed)",
            id="param-unknown",
        ),
        pytest.param(
            HEAD + '[placement]\npicker = { plugin = "max-score", params = { x = 1 } }\n',
            "p.toml:placement.picker.params.x: picker plugin 'max-score' takes no parameters",
            id="params-for-plugin-without-any",
        ),
        pytest.param(
            HEAD
            + '[placement]\npicker = { plugin = "max-score" }\n'
            + '[[placement.scorers]]\nplugin = "least-outstanding"\nweight = -1\n',
            "p.toml:placement.scorers[0].weight: expected number >= 0.0",
            id="negative-weight",
        ),
        pytest.param(
            HEAD + '[placement]\npicker = { plugin = "max-score" }\nscorers = { plugin = "x" }\n',
            "p.toml:placement.scorers: expected array, got table",
            id="scorers-not-array",
        ),
        pytest.param(
            '[placement]\npicker = { plugin = "max-score" }\n',
            "p.toml:ordering: missing required key",
            id="missing-ordering",
        ),
        pytest.param(
            HEAD + "[placement]\nfilters = []\n",
            "p.toml:placement.picker: missing required key",
            id="missing-picker",
        ),
        pytest.param(
            'name = " "\n' + HEAD + '[placement]\npicker = { plugin = "max-score" }\n',
            "p.toml:name: policy name must not be empty",
            id="blank-name",
        ),
        pytest.param(
            "[ordering\n",
            "p.toml:1:10: TOML syntax error: expected ']' at the end of a table declaration",
            id="toml-syntax-error",
        ),
    ],
)
def test_policy_errors_name_the_file_and_key_path(text: str, expected: str) -> None:
    assert _policy_error(text) == expected


def test_a_missing_policy_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_policy(tmp_path / "nope.toml", default_registry())
    assert str(info.value) == f"{tmp_path / 'nope.toml'}: cannot read file: No such file or directory"


# ----------------------------------------------------------------------------- shipped presets


@pytest.mark.parametrize("path", PRESETS, ids=[p.name for p in PRESETS])
def test_every_shipped_policy_loads(path: Path) -> None:
    assert check(path) == []
    policy = load_policy(path, default_registry(), seed=0)
    assert policy.name == path.stem  # presets are named after their file


def test_presets_exist() -> None:
    names = {p.name for p in PRESETS}
    assert {
        "default.toml",
        "baseline-round-robin.toml",
        "baseline-least-outstanding.toml",
        "baseline-power-of-two.toml",
    } <= names


def test_the_packaged_default_policy_means_the_same_as_policies_default() -> None:
    packaged = decode_policy(parse_toml(default_policy_text(), "packaged"), "packaged")
    shipped = decode_policy(
        parse_toml((REPO / "policies" / "default.toml").read_text(), "shipped"), "shipped"
    )
    assert packaged == shipped
