"""The CPU-per-request A/B benches' pure parts: py-spy samples folded into components, the per-round
summary, and the in-process micro-benchmark's pieces (run small)."""

from __future__ import annotations

import pytest

from loadgen.diag import overhead_micro
from loadgen.diag.overhead_profile import BARE, LOOP, Run, component, fold, summarise

_OUTER = "<module> (gateway/cli.py:143);run (gateway/core/runloop.py:14);run (uvloop/__init__.py:92)"
_HANDLE = (
    f"{_OUTER};RequestHandler._handle_request (aiohttp/web_protocol.py:577);handle (gateway/front/api.py:57)"
)


@pytest.mark.parametrize(
    ("inner", "expected"),
    [
        pytest.param("parse_body (gateway/front/schemas.py:27)", "berth front/", id="berth-frame"),
        pytest.param(
            "admit (gateway/front/api.py:70);submit (gateway/sched/scheduler.py:250);"
            "_serve (gateway/sched/scheduler.py:420);view (gateway/sched/fleet.py:118);"
            "__init__ (<string>:3)",
            "sched: submit",
            id="sched-by-entry-stdlib-helper-to-caller",
        ),
        pytest.param(
            "finish (gateway/front/api.py:190);inc (prometheus_client/metrics.py:300)",
            "prometheus_client (metrics)",
            id="library",
        ),
        pytest.param(
            "run (gateway/dispatch/runner.py:120);open_request (gateway/upstream/client.py:80);"
            "ClientSession._request (aiohttp/client.py:700)",
            "aiohttp",
            id="innermost-owner-wins",
        ),
    ],
)
def test_a_sample_counts_for_its_innermost_known_owner(inner: str, expected: str) -> None:
    assert component(f"{_HANDLE};{inner}".split(";")) == expected


def test_a_sample_in_the_loop_alone_counts_for_the_loop() -> None:
    assert component(f"{_OUTER};Runner.run (asyncio/runners.py:118)".split(";")) == LOOP
    assert component(["<module> (gateway/cli.py:143)"]) == LOOP  # no known owner at all
    # The bare proxy runs its loop from aiohttp's run_app: the loop's own work there is the loop's too.
    proxy = "loadgen/bench/overhead/overhead_bare_proxy.py"
    bare = f"<module> ({proxy}:99);main ({proxy}:88)"
    assert component(f"{bare};run_app (aiohttp/web.py:526)".split(";")) == LOOP
    relay = f"relay ({proxy}:45);ClientSession._request (aiohttp/client.py:700)"
    assert component(f"{bare};run_app (aiohttp/web.py:526);{relay}".split(";")) == "aiohttp"


def test_fold_sums_counts_per_component_and_skips_junk() -> None:
    raw = "\n".join(
        [
            f"{_HANDLE};parse_body (gateway/front/schemas.py:27) 3",
            f"{_HANDLE} 2",
            f"{_HANDLE};read_body (gateway/front/http.py:60) 4",
            "not a sample line",
            "",
        ]
    )
    assert fold(raw) == {"berth front/": 9}


def test_summary_gives_medians_ratios_and_per_round_differences() -> None:
    runs = [
        Run(0, BARE, 100, 0, 0.010),  # 100 µs per request
        Run(0, "a", 100, 0, 0.020),
        Run(0, "b", 100, 0, 0.018),
        Run(1, BARE, 100, 0, 0.012),
        Run(1, "a", 100, 0, 0.024),
        Run(1, "b", 100, 0, 0.023),
    ]
    s = summarise(runs, [BARE, "a", "b"])
    assert s[BARE]["median"] == pytest.approx(110.0)
    assert s["a"]["over_bare_median"] == pytest.approx(2.0)
    assert s["b"]["minus_first_median"] == pytest.approx(-15.0)  # -20 and -10
    assert (s["b"]["minus_first_min"], s["b"]["minus_first_max"]) == pytest.approx((-20.0, -10.0))
    assert "minus_first_median" not in s["a"]


def test_the_micro_benchmark_measures_every_piece() -> None:
    out = overhead_micro.run_once(overhead_micro.PIECES, 50, 4)
    assert set(out) == set(overhead_micro.PIECES)
    assert all(v > 0 for v in out.values())
    assert out["sched_stream"] > out["sched"]  # the same cycle plus a stream's progress reports
