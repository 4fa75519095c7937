"""The live autoscaler's reporting: decision records as views and bounded metric labels."""

from __future__ import annotations

import pytest

from gateway.core.types import InstanceClass, ModelName
from gateway.lifecycle.autoscaler import DecisionView, decision_view, reason_label
from gateway.sched.autoscale import DecisionRecord
from gateway.sched.plugins.autoscale.interface import Reclass, ScaleIn, ScaleOut

M = ModelName("code-a")
OWNERS = {"code-a-3": M}


@pytest.mark.parametrize(
    ("record", "view"),
    [
        pytest.param(
            DecisionRecord(
                1.0,
                "chiron",
                ScaleOut(M, InstanceClass.BATCH, 3, None, "groups miss"),
                "clipped",
                "max_instances",
            ),
            ("code-a", "scale_out", None, "batch", 3, "groups miss"),
            id="scale-out",
        ),
        pytest.param(
            DecisionRecord(1.0, "chiron", ScaleIn("code-a-3", "idle"), "acted"),
            ("code-a", "scale_in", "code-a-3", None, 1, "idle"),
            id="scale-in: the model from the instance",
        ),
        pytest.param(
            DecisionRecord(
                1.0, "chiron", Reclass("gone-1", InstanceClass.MIXED, "spare"), "fault", "unknown instance"
            ),
            ("-", "reclass", "gone-1", "mixed", 1, "spare"),
            id="reclass of an unknown instance",
        ),
        pytest.param(
            DecisionRecord(1.0, "chiron", None, "fault", "ValueError('boom')"),
            ("-", "none", None, None, 0, ""),
            id="the scaler raised",
        ),
    ],
)
def test_decision_view(record: DecisionRecord, view: tuple[object, ...]) -> None:
    v = decision_view(record, OWNERS)
    assert (v.model, v.action, v.instance, v.instance_class, v.count, v.reason) == view
    assert (v.outcome, v.note, v.scaler, v.at) == (record.outcome, record.note, "chiron", 1.0)


def _view(action: str, reason: str, note: str) -> DecisionView:
    return DecisionView(0.0, "s", "m", action, None, None, 1, reason, "refused" if note else "acted", note)


@pytest.mark.parametrize(
    ("action", "reason", "note", "label"),
    [
        ("scale_out", "interactive backpressure 0.91 above 0.65", "", "scaler"),
        ("scale_out", "min_instances", "", "min_instances"),
        ("scale_out", "12 queued", "max_instances", "max_instances"),
        ("scale_in", "idle for 61 s", "scale_in_cooldown", "scale_in_cooldown"),
        ("scale_in", "idle", "instance is starting (only a ready one)", "not_ready"),
        ("reclass", "spare", "already of that class", "same_class"),
        ("scale_out", "x", "unknown configuration 'big'", "unknown_config"),
        ("scale_out", "late", "config_choice_pending", "config_choice_pending"),
        ("none", "", "RuntimeError('a plugin bug 42')", "scaler_raised"),
        ("scale_out", "x", "something new", "other"),
    ],
)
def test_reason_labels_are_bounded(action: str, reason: str, note: str, label: str) -> None:
    assert reason_label(_view(action, reason, note)) == label
