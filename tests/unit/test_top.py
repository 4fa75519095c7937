"""`berth top` frames from /admin/fleet documents (no terminal, no network except a refused port)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core.admin_read import AdminReadError
from gateway.top import fetch, render, run
from loadgen.harness import free_port

DOC: dict[str, Any] = {
    "version": "0.1.0",
    "uptime_s": 3725.0,
    "policy": "default",
    "ready": True,
    "draining": False,
    "fail_open": {"active": False, "since_s": None, "events": 0},
    "endpoints": [
        {
            "id": "gpu-01",
            "state": "ready",
            "class": "interactive",
            "group": "decode",
            "inflight": 3,
            "cap": 32,
            "running_by_kind": {"interactive": 2, "batch": 1},
            "gauges": {"running": 3.0, "waiting": 1.0, "kv_usage": 0.25, "fresh": True, "scrape_age_s": 1.2},
            "kv_capacity_tokens": 65536.0,
            "latency": {
                "ttft_s": {"ewma": 0.045, "p50": 0.04, "p90": 0.09, "p99": 0.2, "n": 10},
                "itl_s": {"ewma": 0.012, "p50": 0.011, "p90": 0.02, "p99": 0.03, "n": 10},
                "tokens_per_s": 230.5,
            },
            "perf": {
                "prefill": {"k1": 1e-4, "c1": 0.015, "mape": 0.03, "n": 40},
                "decode": {"k2": 3.8e-7, "c2": 1.5e-4, "c3": 0.011, "mape": 0.05, "n": 38},
                "kv": {"h": 1.0, "j": 8.0, "mape": None, "n": 0},
                "throughput": {"thr1": 95.0, "alpha": 25.0, "beta": 0.18},
            },
            "prediction_error": {"ttft": 0.1, "itl": 0.2},
            "engine_check": {"ttft": {"ratio": 1.05, "disagreements": 0}},
        },
        {"id": "gpu-02", "state": "unhealthy", "class": "batch", "inflight": 0, "cap": 64, "gauges": {}},
    ],
    "models": {
        "llama": {
            "queued": {"batch": 4, "default": 1},
            "queued_total": 5,
            "latency": {"ttft_s": {"p50": 0.05, "p90": 0.1}, "itl_s": {"p50": 0.01, "p99": 0.05}},
            "chars_per_token": 3.7,
            "output_tokens_error": 0.4,
            "groups": {
                "decode": {"share": 0.625, "endpoints": ["gpu-01"]},
                "context": {"share": 0.375, "endpoints": ["gpu-02"]},
            },
        }
    },
    "attainment": {
        "window_s": 60.0,
        "classes": {"default": {"finished": 120, "met": 118, "ratio": 118 / 120}},
    },
}


def test_a_frame_shows_endpoints_models_queues_and_attainment() -> None:
    frame = render(DOC, url="http://gw:8080")
    assert "\x1b" not in frame  # no colour unless asked
    lines = frame.splitlines()
    assert lines[0].startswith("berth 0.1.0  http://gw:8080  policy default  up 1h02m  ready")
    row = next(line for line in lines if line.startswith("gpu-01") and "interactive" in line)
    for cell in ("decode", "3/32", "2/1", "25%", "1.2s", "45ms", "12ms", "230.5", "1.05"):
        assert cell in row
    assert next(line for line in lines if line.startswith("gpu-02")).split()[1] == "unhealthy"
    perf = [line for line in lines if line.startswith("gpu-01")][1]
    assert "3%/5%/-" in perf
    assert "40/38/0" in perf
    assert "65536" in perf
    model = next(line for line in lines if line.startswith("llama"))
    assert "batch=4 default=1" in model
    assert "3.70" in model
    assert model.endswith("decode=1 (62%) context=1 (38%)")
    assert "FAILING OPEN" not in frame
    assert any(line.split() == ["default", "120", "118", "98.3%"] for line in lines)


def test_failing_open_is_a_banner_in_colour() -> None:
    doc = {**DOC, "fail_open": {"active": True, "since_s": 12.0, "events": 1}}
    frame = render(doc, color=True)
    assert "FAILING OPEN" in frame
    assert "\x1b[31m" in frame


def test_an_empty_document_still_renders() -> None:
    frame = render({})
    assert "ENDPOINTS" in frame
    assert "SLO ATTAINMENT" in frame


def _refused_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def test_fetch_reports_an_unreachable_gateway() -> None:
    with pytest.raises(AdminReadError, match=r"127\.0\.0\.1"):
        fetch(_refused_url(), None, timeout_s=2.0)


def test_once_exits_1_when_the_gateway_cannot_be_read(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_refused_url(), None, once=True) == 1
    assert "berth top:" in capsys.readouterr().err


def test_the_slo_section_shows_goodput_admission_and_rejections() -> None:
    doc = {
        **DOC,
        "slo": {
            "default_class": "chat",
            "classes": {
                "ide": {
                    "kind": "interactive",
                    "band": 0,
                    "finished": 200,
                    "met": 190,
                    "goodput": 0.95,
                    "admission": {"admit": 195, "reject": 5},
                    "rejections": {"slo_infeasible": 5},
                    "on_infeasible": "reject",
                },
                "batch": {"kind": "batch", "band": 2, "finished": 0, "goodput": None, "admission": {}},
            },
            "tasks": {"active": 3, "expired": 1, "evicted": 0, "max_tasks": 100},
        },
    }
    frame = render(doc)
    assert "SLO CLASSES (since start; default chat)" in frame
    ide = next(line for line in frame.splitlines() if line.startswith("ide "))
    for part in ("interactive", "95.0%", "admit=195 reject=5", "slo_infeasible=5", "reject"):
        assert part in ide
    assert "tasks: 3 active, 1 expired, 0 evicted (max 100)" in frame
    assert "SLO CLASSES" not in render(DOC)  # an older gateway without the section


def test_the_lifecycle_section_shows_nodes_instances_loads_and_stops() -> None:
    doc = {
        "lifecycle": {
            "evictor": "cace",
            "agent_errors": 2,
            "nodes": [
                {
                    "name": "gpu-07",
                    "answered": True,
                    "error": None,
                    "devices": [{"name": "gpu0", "capacity_bytes": 6 << 30, "used_bytes": 4 << 30}],
                }
            ],
            "instances": [
                {
                    "id": "code-a-1",
                    "model": "code-a",
                    "node": "gpu-07",
                    "state": "ready",
                    "devices": ["gpu0"],
                    "memory_bytes": 4 << 30,
                    "load_s": 12.5,
                    "idle_s": 3.0,
                    "inflight": 1,
                    "url": "http://x",
                    "reason": None,
                }
            ],
            "waiting_loads": {"reason-b": 2.0},
            "loads": {"code-a": {"n": 1, "mean_s": 12.5, "last_s": 12.5}},
            "evictions": {"evicted": 3},
        }
    }
    text = render(doc)
    assert "evictor cace; agent errors 2" in text
    assert "gpu0:4.0/6.0GiB" in text
    assert "code-a-1" in text
    assert "ready" in text
    assert "12.5s" in text
    assert "waiting for a load: reason-b 2.0s" in text
    assert "stops: evicted=3" in text
    assert "NODES" not in render({})
    assert "AUTOSCALE" not in text  # a policy without [autoscale]


def test_the_autoscale_section_shows_instances_by_class_and_the_last_decision() -> None:
    instance = {"model": "code-a", "node": "n", "devices": [], "memory_bytes": 0, "inflight": 0}
    doc = {
        "lifecycle": {
            "evictor": "lru",
            "nodes": [],
            "instances": [
                {**instance, "id": "code-a-1", "state": "ready", "instance_class": "mixed"},
                {**instance, "id": "code-a-2", "state": "starting", "instance_class": "batch"},
                {**instance, "id": "code-a-3", "state": "stopped", "instance_class": "batch"},
            ],
            "evictions": {"scaled_in": 1},
            "autoscale": {
                "scaler": "chiron",
                "dry_run": False,
                "interval_s": 5,
                "bounds": {"code-a": {"min_instances": 1, "max_instances": None}},
                "counters": {"code-a": {"started": 2, "retired": 1, "reclassed": 0, "hysteresis": 1.5}},
                "dry_run_counters": {},
                "start_failures": {"code-a": 1},
                "recent": [
                    {
                        "model": "code-a",
                        "action": "scale_out",
                        "instance": None,
                        "instance_class": "batch",
                        "count": 2,
                        "reason": "batch groups would miss their TTFT deadline",
                        "outcome": "clipped",
                        "note": "no_free_devices",
                        "config": "tp1-b32",
                    }
                ],
            },
        }
    }
    text = render(doc)
    assert "AUTOSCALE (chiron, acting, every 5.0s)" in text
    row = next(line for line in text.splitlines() if line.startswith("code-a ") and "1..∞" in line)
    assert row.split()[1:4] == ["batch=1", "mixed=1", "1..∞"]
    assert row.split()[-1] == "1.50"
    assert "CLASS" in text
    assert (
        "last decision: code-a scale_out batch x2 config tp1-b32: batch groups would miss their TTFT deadline"
        " -> clipped"
        " (no_free_devices)" in text
    )
    assert "failed starts: code-a=1" in text
    dry = {**doc["lifecycle"]["autoscale"], "dry_run": True}  # type: ignore[dict-item]
    assert "DRY RUN" in render({"lifecycle": {**doc["lifecycle"], "autoscale": dry}})


def test_every_numeric_column_says_its_unit() -> None:
    lines = render(DOC).splitlines()
    perf = next(line for line in lines if line.startswith("ENDPOINT  k1"))
    for header in (
        "k1 s/tok",
        "c1 s",
        "k2 s/tok/req",
        "c2 s/req",
        "c3 s",
        "h kv/tok",
        "j kv/req",
        "KV CAP tok",
    ):
        assert header in perf
    endpoints = next(line for line in lines if line.startswith("ENDPOINT  STATE"))
    for header in ("INFL/CAP req", "INT/BAT req", "RUN req", "WAIT req", "KV %", "GW/ENG ratio"):
        assert header in endpoints


def test_the_prefix_section_shows_each_endpoints_index() -> None:
    ep = {
        **DOC["endpoints"][0],
        "prefix": {
            "source": "precise",
            "cached_blocks": 1200,
            "capacity_blocks": 31250,
            "predicted_hit_rate": 0.61,
            "engine_hit_rate": 0.58,
            "event_lag_s": 0.004,
            "correction": 0.95,
        },
    }
    frame = render({**DOC, "endpoints": [ep]})
    assert "PREFIX CACHE" in frame
    line = next(ln for ln in frame.splitlines() if "precise" in ln)
    assert "1200/31250" in line
    assert "61%" in line
    assert "58%" in line
    assert "4.0ms" in line
    assert "PREFIX CACHE" not in render(DOC)  # no index yet: no section
