"""Evictor plugins: the direction of every CACE term (a table), LRU, and the runner's score contract."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import msgspec
import pytest

from gateway.core.errors import ConfigError
from gateway.core.types import ModelName
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.eviction.cace import CaceEvictor, CaceParams, reload_term
from gateway.sched.plugins.eviction.interface import (
    EvictionCandidate,
    EvictionContext,
    Evictor,
    checked_score,
)
from gateway.sched.plugins.eviction.lru import LruEvictor
from gateway.sched.registry import PluginKind

NOW = 10_000.0
CTX = EvictionContext(now=NOW, window=10)
BASE = EvictionCandidate(
    instance="m-1",
    model=ModelName("m"),
    last_used=NOW - 60,
    loaded_at=NOW - 600,
    load_s=20.0,
    frees_bytes=1 << 30,
    first_pending=5,
    expected_output_tokens=200.0,
)

# (id, field, its value in the candidate that must score HIGHER, its value in the one that must score lower)
DIRECTIONS = [
    ("idle-longer-goes-first", "last_used", NOW - 3600, NOW - 5),
    ("cheap-reload-goes-first", "load_s", 2.0, 120.0),
    ("demand-later-goes-first", "first_pending", 9, 0),
    ("not-in-window-goes-before-in-window", "first_pending", None, 3),
    ("long-output-goes-first", "expected_output_tokens", 4000.0, 30.0),
    ("unknown-output-is-kept-over-long", "expected_output_tokens", 1000.0, None),
]


@pytest.mark.parametrize(
    ("field", "higher", "lower"), [d[1:] for d in DIRECTIONS], ids=[d[0] for d in DIRECTIONS]
)
def test_cace_term_direction(field: str, higher: Any, lower: Any) -> None:
    cace = CaceEvictor(CaceParams())
    hi = cace.score(replace(BASE, **{field: higher}), CTX)
    lo = cace.score(replace(BASE, **{field: lower}), CTX)
    assert hi > lo


@pytest.mark.parametrize(
    ("weight", "field", "a", "b"),
    [
        ("idle_weight", "last_used", NOW - 3600, NOW - 5),
        ("reload_weight", "load_s", 2.0, 120.0),
        ("demand_weight", "first_pending", 9, 0),
        ("criticality_weight", "expected_output_tokens", 4000.0, 30.0),
    ],
    ids=["idle", "reload", "demand", "criticality"],
)
def test_a_zero_weight_switches_its_term_off(weight: str, field: str, a: Any, b: Any) -> None:
    cace = CaceEvictor(msgspec.structs.replace(CaceParams(), **{weight: 0.0}))
    assert cace.score(replace(BASE, **{field: a}), CTX) == pytest.approx(
        cace.score(replace(BASE, **{field: b}), CTX)
    )


def test_lru_is_idle_time() -> None:
    lru = LruEvictor()
    assert lru.score(replace(BASE, last_used=NOW - 100), CTX) > lru.score(
        replace(BASE, last_used=NOW - 1), CTX
    )
    assert lru.score(replace(BASE, last_used=NOW + 5), CTX) == 0.0  # a clock step back never goes negative


class _Broken:
    name = "broken"

    def score(self, cand: EvictionCandidate, ctx: EvictionContext) -> float:
        return math.nan


def test_runner_ranks_a_non_finite_score_last() -> None:
    ev: Evictor = _Broken()
    assert checked_score(ev, BASE, CTX) == -math.inf


def test_registered_and_params_validated() -> None:
    reg = default_registry()
    assert {"lru", "cace"} <= set(reg.names(PluginKind.EVICTOR))
    assert isinstance(
        reg.build(PluginKind.EVICTOR, "cace", {"demand_weight": 2.0}, path="lifecycle.evictor"), Evictor
    )
    with pytest.raises(ConfigError) as e:
        reg.build(PluginKind.EVICTOR, "cace", {"idle_weight": -1.0}, path="lifecycle.evictor")
    assert "lifecycle.evictor.params" in str(e.value)
    with pytest.raises(ConfigError, match="reload_scale_s"):
        reg.build(PluginKind.EVICTOR, "cace", {"reload_scale_s": 0.0}, path="lifecycle.evictor")
    with pytest.raises(ConfigError):
        reg.build(PluginKind.EVICTOR, "cace", {"nope": 1}, path="lifecycle.evictor")


def test_reload_scale_sets_how_far_apart_short_and_long_loads_score() -> None:
    short, long_ = replace(BASE, load_s=4.0), replace(BASE, load_s=20.0)

    def gap(params: CaceParams) -> float:
        cace = CaceEvictor(params)
        return cace.score(short, CTX) - cace.score(long_, CTX)

    assert reload_term(20.0, 100.0) == pytest.approx(1 / 1.2)
    assert CaceParams().reload_scale_s == 40.0  # the paper's 100 tells 4 s from 20 s loads apart too little
    assert gap(CaceParams(reload_scale_s=100.0)) == pytest.approx(1 / 1.04 - 1 / 1.2)
    assert gap(CaceParams(reload_scale_s=40.0)) > gap(CaceParams(reload_scale_s=100.0)) > 0


def test_without_prediction_only_a_queued_request_counts_as_demand() -> None:
    paper = CaceEvictor(CaceParams(predict_demand=False))
    predicted, unknown = replace(BASE, first_pending=2.0), replace(BASE, first_pending=None)
    assert paper.score(predicted, CTX) == paper.score(unknown, CTX)  # i/w = 1 when not in the window
    queued = replace(predicted, queued=True)
    assert paper.score(queued, CTX) < paper.score(unknown, CTX)
    shares = CaceEvictor(CaceParams())
    assert shares.score(predicted, CTX) < shares.score(unknown, CTX)  # the prediction counts
