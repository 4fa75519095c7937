"""`berth-loadgen bench prefix --live`'s process plumbing with the engine simulator only (no real peers
in the suite): berth in front of a fresh simulated fleet with prefix caching, the engines' hit counters
read back; a peer whose command dies at start is reported and the others still run."""

from __future__ import annotations

import stat
from pathlib import Path

import orjson
import pytest

from loadgen.bench.scheduling import prefix_live
from loadgen.cli import main as loadgen_main


def _fake_peer(root: Path, venv: str, command: str) -> None:
    bin_dir = root / venv / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / command
    script.write_text("#!/bin/sh\necho 'cannot start here' >&2\nexit 3\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    (root / venv / ".installed").write_text("fake\n")


def test_berth_runs_live_and_a_dead_peer_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    peers = tmp_path / "peers"
    _fake_peer(peers, "vllm-router-0.1.17", "vllm-router")
    monkeypatch.setattr(prefix_live, "PEER_CACHE", peers)
    monkeypatch.setattr(prefix_live, "LIVE_PROFILE", "test-fast")  # short answers: the plumbing only
    out = tmp_path / "out"
    argv = [
        "bench",
        "prefix",
        "--live",
        "--routers",
        "vllm-router-cache_aware,berth,berth-precise",
        "--out",
        str(out),
    ]
    argv += ["--workloads", "sharegpt-like", "--loads", "0.5", "--duration", "4", "--endpoints", "2"]
    assert loadgen_main(argv) == 0
    runs = {r["router"]: r for r in orjson.loads((out / "report.json").read_bytes())["runs"]}
    assert "error" in runs["vllm-router-cache_aware"]
    for name in ("berth", "berth-precise"):
        assert "error" not in runs[name], runs[name]
    gw = (out / "live" / "berth-precise" / "gateway.toml").read_text()
    assert 'source = "precise"' in gw
    assert 'kv_events = "tcp://127.0.0.1:' in gw
    assert runs["berth-precise"]["prefix_sources"] == {"precise": 2}  # the engines' events flowed
    assert runs["berth"]["prefix_sources"] == {"approximate": 2}
    berth = runs["berth"]
    assert berth["requests"] > 0
    assert berth["errors"] == 0
    assert berth["queried_tokens"] > 0
    assert 0.0 <= berth["hit_rate"] <= 1.0
    assert (out / "live" / "berth" / "router.log").exists()
    assert (out / "live" / "berth" / "sim.log").exists()
    md = (out / "report.md").read_text()
    assert "| vllm-router-cache_aware | did not run:" in md
    assert "| berth | " in md


def test_peer_command_lines() -> None:
    peer = prefix_live.PEERS["sglang-router-cache_aware"]
    argv = prefix_live.peer_argv(peer, Path("/v"), 8000, 8001, ["http://a", "http://b"])
    assert argv[:3] == ["/v/bin/python", "-m", "sglang_router.launch_router"]
    assert argv[-3:] == ["--worker-urls", "http://a", "http://b"]
    assert "cache_aware" in argv
    assert "8000" in argv
    assert "8001" in argv
