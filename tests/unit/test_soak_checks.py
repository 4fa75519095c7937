"""The soak's judges: log events against the faults injected, secrets in a log, the client plans."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from loadgen.bench.reliability.soak_checks import bearer_tokens_in, judge_log, secrets_in
from loadgen.bench.reliability.soak_clients import BEHAVIOURS, Outcome, Plan


def _log(tmp_path: Path, *lines: object) -> Path:
    p = tmp_path / "berth.log"
    p.write_bytes(
        b"$ berth serve\n"
        + b"".join(orjson.dumps(x) + b"\n" if not isinstance(x, bytes) else x for x in lines)
    )
    return p


REJECTED = {"event": "config_reload_rejected", "level": "error"}


@pytest.mark.parametrize(
    ("injected", "unexplained"),
    [(["reload_broken"], {}), (["engine_die"], {"config_reload_rejected": 1})],
    ids=["explained", "not-explained"],
)
def test_error_events_are_explained_only_by_their_faults(
    tmp_path: Path, injected: list[str], unexplained: dict[str, int]
) -> None:
    path = _log(tmp_path, REJECTED, {"event": "request", "level": "info", "outcome": "ok"})
    verdict = judge_log(path, injected)
    assert dict(verdict.errors) == {"config_reload_rejected": 1}
    assert dict(verdict.unexplained) == unexplained
    assert dict(verdict.outcomes) == {"ok": 1}


def test_unknown_errors_and_plain_text_lines_are_counted(tmp_path: Path) -> None:
    path = _log(
        tmp_path, {"event": "request_failed", "level": "error"}, b"Traceback (most recent call last):\n"
    )
    verdict = judge_log(path, ["reload_broken", "engine_die"])
    assert dict(verdict.unexplained) == {"request_failed": 1}
    assert verdict.unparsed == 1
    assert verdict.unparsed_sample == ["Traceback (most recent call last):"]


def test_secrets_are_named_by_prefix_only(tmp_path: Path) -> None:
    path = _log(tmp_path, {"event": "x", "note": "sk-soak-abcdef123"}, b"Authorization: Bearer zzz\n")
    assert secrets_in(path, ["sk-soak-abcdef123", "sk-other"]) == ["sk-soa..."]
    assert bearer_tokens_in(path) == 1


def test_plans_are_drawn_from_the_seed_and_cover_every_behaviour() -> None:
    keys = ["k1", "k2"]
    plans = [Plan.draw(i, 7, keys) for i in range(2000)]
    assert plans == [Plan.draw(i, 7, keys) for i in range(2000)]
    assert {p.behaviour for p in plans} == set(BEHAVIOURS)
    dup = [p for p in plans if p.behaviour == "duplicate_request_id"]
    assert dup
    assert all(p.request_id is not None and p.request_id.startswith("soak-dup-") for p in dup)
    assert all(p.stream for p in plans if p.behaviour in ("disconnect_mid_stream", "slow_reader"))
    assert orjson.loads(plans[0].body())["model"] == "soak-model"
    assert plans[0].headers()["Authorization"] in ("Bearer k1", "Bearer k2")


@pytest.mark.parametrize(
    ("kind", "violation"),
    [
        ("ok", False),
        ("client_abort", False),
        ("http 503 queue_timeout", False),
        ("hang", True),
        ("truncated_stream", True),
        ("internal_error", True),
        ("slow_reader_timed_out", True),
    ],
)
def test_which_outcomes_are_violations(kind: str, violation: bool) -> None:
    assert Outcome(kind).violation is violation
