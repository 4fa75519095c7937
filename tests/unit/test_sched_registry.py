"""The plugin registry: explicit registration, strict parameters, errors that carry their key path."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gateway.core.errors import ConfigError
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.ordering.fcfs import FcfsOrdering
from gateway.sched.plugins.placement.least_outstanding import LeastOutstandingScorer, MaxScorePicker
from gateway.sched.plugins.placement.power_of_two import PowerOfTwoPicker
from gateway.sched.plugins.placement.round_robin import RoundRobinPicker
from gateway.sched.registry import BuildContext, NoParams, PluginKind, PluginRegistry, PluginSpec


def _spec(kind: PluginKind, name: str) -> PluginSpec[NoParams]:
    return PluginSpec(kind, name, NoParams, lambda p, ctx: object())


def test_registering_a_name_twice_raises() -> None:
    reg = PluginRegistry()
    reg.register(_spec(PluginKind.PICKER, "dup"))
    with pytest.raises(ValueError, match="picker plugin 'dup' is already registered"):
        reg.register(_spec(PluginKind.PICKER, "dup"))


def test_the_same_name_under_another_kind_is_a_different_plugin() -> None:
    reg = PluginRegistry()
    reg.register(_spec(PluginKind.PICKER, "x"))
    reg.register(_spec(PluginKind.SCORER, "x"))
    assert reg.names(PluginKind.PICKER) == ["x"]
    assert reg.names(PluginKind.SCORER) == ["x"]


def test_default_registry_is_a_fresh_object_not_a_global() -> None:
    a, b = default_registry(), default_registry()
    a.register(_spec(PluginKind.FILTER, "only-in-a"))
    assert b.spec(PluginKind.FILTER, "only-in-a") is None


@pytest.mark.parametrize(
    ("kind", "name", "built_type"),
    [
        pytest.param(PluginKind.ORDERING, "fcfs", FcfsOrdering, id="fcfs"),
        pytest.param(PluginKind.PICKER, "round-robin", RoundRobinPicker, id="round-robin"),
        pytest.param(PluginKind.SCORER, "least-outstanding", LeastOutstandingScorer, id="least-outstanding"),
        pytest.param(PluginKind.PICKER, "max-score", MaxScorePicker, id="max-score"),
        pytest.param(PluginKind.PICKER, "power-of-two", PowerOfTwoPicker, id="power-of-two"),
    ],
)
def test_default_registry_builds_the_in_tree_plugins(kind: PluginKind, name: str, built_type: type) -> None:
    reg = default_registry()
    assert reg.spec(kind, name) is not None
    assert isinstance(reg.build(kind, name, None, path="p"), built_type)


def test_default_registry_has_exactly_the_in_tree_names() -> None:
    reg = default_registry()
    assert {k: reg.names(k) for k in PluginKind} == {
        PluginKind.ORDERING: ["edf", "fcfs", "priority-bands", "slack"],
        PluginKind.FILTER: [
            "best-fit",
            "demand-split",
            "instance-class",
            "overflow-guard",
            "prefix-holders",
            "sub-cluster",
        ],
        PluginKind.SCORER: ["least-outstanding", "prefix-affinity"],
        PluginKind.PICKER: ["cato-slack", "max-score", "power-of-two", "round-robin"],
        PluginKind.ADMITTER: ["admit-all", "slo-feasibility"],
        PluginKind.EVICTOR: ["cace", "lru"],
        PluginKind.PREEMPTOR: ["least-progress", "most-slack", "smallest-kv-loss"],
        PluginKind.CONCURRENCY: ["chiron", "chiron-paper", "static"],
        PluginKind.SCALER: ["aladdin-workers", "cato-sla", "chiron", "queue-length", "utilization-band"],
    }


@pytest.mark.parametrize(
    ("kind", "known"),
    [
        pytest.param(
            PluginKind.PICKER, "known: cato-slack, max-score, power-of-two, round-robin", id="picker"
        ),
        pytest.param(PluginKind.ORDERING, "known: edf, fcfs, priority-bands, slack", id="ordering"),
        pytest.param(
            PluginKind.FILTER,
            "known: best-fit, demand-split, instance-class, overflow-guard, prefix-holders, sub-cluster",
            id="filter",
        ),
    ],
)
def test_unknown_plugin_names_the_known_ones_and_the_path(kind: PluginKind, known: str) -> None:
    with pytest.raises(ConfigError) as info:
        default_registry().build(kind, "nope", None, path="policies.p.profile.picker")
    err = info.value
    assert err.path == "policies.p.profile.picker"
    assert f"unknown {kind} plugin 'nope'" in err.message
    assert f"({known})" in err.message


@pytest.mark.parametrize(
    ("kind", "name", "params", "path", "message"),
    [
        pytest.param(
            PluginKind.PICKER,
            "power-of-two",
            {"choices": "two"},
            "pol.picker.params.choices",
            "Expected `int`, got `str`",
            id="wrong-type",
        ),
        pytest.param(
            PluginKind.PICKER,
            "power-of-two",
            {"choices": True},
            "pol.picker.params.choices",
            "Expected `int`, got `bool`",
            id="bool-is-not-int-strict",
        ),
        pytest.param(
            PluginKind.PICKER,
            "power-of-two",
            {"choices": 0},
            "pol.picker.params.choices",
            ">= 1",
            id="out-of-range",
        ),
        pytest.param(
            PluginKind.PICKER,
            "power-of-two",
            {"seed": 1.5},
            "pol.picker.params.seed",
            "Expected `int | null`, got `float`",
            id="seed-wrong-type",
        ),
        pytest.param(
            PluginKind.PICKER,
            "power-of-two",
            {"choicez": 2},
            "pol.picker.params",
            "unknown field `choicez`",
            id="unknown-key",
        ),
        pytest.param(
            PluginKind.ORDERING,
            "fcfs",
            {"anything": 1},
            "pol.picker.params",
            "unknown field `anything`",
            id="no-params-plugin-given-params",
        ),
    ],
)
def test_bad_params_name_the_key_path(
    kind: PluginKind, name: str, params: dict[str, Any], path: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        default_registry().build(kind, name, params, path="pol.picker")
    assert info.value.path == path
    assert message in info.value.message


def test_a_factory_value_error_becomes_a_config_error_at_params() -> None:
    def factory(p: NoParams, ctx: BuildContext) -> object:
        raise ValueError("the moon is in the wrong phase")

    reg = PluginRegistry()
    reg.register(PluginSpec(PluginKind.SCORER, "moody", NoParams, factory))
    with pytest.raises(ConfigError) as info:
        reg.build(PluginKind.SCORER, "moody", {}, path="profile.scorers[1]")
    assert info.value.path == "profile.scorers[1].params"
    assert info.value.message == "the moon is in the wrong phase"


def test_factory_receives_typed_params_and_the_build_context() -> None:
    class Params(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
        k: int = 1

    seen: list[tuple[Params, BuildContext]] = []

    def factory(p: Params, ctx: BuildContext) -> object:
        seen.append((p, ctx))
        return object()

    reg = PluginRegistry()
    reg.register(PluginSpec(PluginKind.FILTER, "f", Params, factory))
    reg.build(PluginKind.FILTER, "f", {"k": 3}, path="x", ctx=BuildContext(seed=9))
    reg.build(PluginKind.FILTER, "f", None, path="x")
    assert seen == [(Params(k=3), BuildContext(seed=9)), (Params(k=1), BuildContext())]
