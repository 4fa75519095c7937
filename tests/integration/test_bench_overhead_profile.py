"""The CPU-per-request A/B (`berth-loadgen diag overhead-profile`) end to end, short: two berth trees
(this checkout twice) and the bare proxy behind the same upstream, every run counted."""

from __future__ import annotations

from pathlib import Path

import orjson

from loadgen.diag import overhead_profile
from loadgen.harness import REPO_ROOT


def test_a_short_ab_run_measures_every_tree_and_the_bare_proxy(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    argv = ["--tree", f"a={REPO_ROOT}", "--tree", f"b={REPO_ROOT}", "--rounds", "2", "--duration", "0.4",
            "--warmup", "0.1", "--concurrency", "8", "--out", str(out)]  # fmt: skip
    assert overhead_profile.main(argv) == 0
    doc = orjson.loads(out.read_bytes())
    assert set(doc["summary"]) == {"bare", "a", "b"}
    assert {(r["round"], r["config"]) for r in doc["runs"]} == {
        (r, c) for r in (0, 1) for c in ("bare", "a", "b")
    }
    for r in doc["runs"]:
        assert r["errors"] == 0, r
        assert r["completed"] > 0, r
        assert r["us_per_request"] > 0, r
    assert "minus_first_median" in doc["summary"]["b"]
    assert doc["summary"]["a"]["over_bare_median"] > 0
    assert doc["trees"] == {"a": str(REPO_ROOT), "b": str(REPO_ROOT)}


def test_a_stream_run_counts_cpu_per_chunk(tmp_path: Path) -> None:
    out = tmp_path / "stream.json"
    argv = ["--stream", "--tree", f"a={REPO_ROOT}", "--rounds", "1", "--duration", "0.6",
            "--warmup", "0.1", "--concurrency", "4", "--chunks", "10", "--chunk-interval-ms", "2",
            "--out", str(out)]  # fmt: skip
    assert overhead_profile.main(argv) == 0
    doc = orjson.loads(out.read_bytes())
    for r in doc["runs"]:
        assert r["errors"] == 0, r
        assert r["completed"] > 4 * 10, r  # chunks (of several streams) received in the window, not streams
        assert r["us_per_request"] > 0, r
        assert r["ttfc_ms"] > 0, r
    assert "per streamed chunk" in doc["table"]
    assert set(doc["ttfc_ms"]) == {"bare", "a"}
    assert "Time to first chunk" in doc["table"]
