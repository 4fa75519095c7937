"""The live batch figure's pieces that need no processes: the input file (the simulated run's lines as
Batch API lines), berth's [batch] settings for the run, and the batch's throughput from its polls."""

from __future__ import annotations

import tomllib
from pathlib import Path

import orjson
import pytest

from loadgen.bench.scheduling import batch_sim, classes
from loadgen.bench.scheduling.batch_live import BatchWatch, LiveConfig, batch_file, gateway_text
from loadgen.bench.scheduling.classes_live_setup import fleet_specs


def test_the_input_file_is_the_simulated_runs_lines() -> None:
    cfg = LiveConfig(Path("."), lines=5, duration_s=10.0)
    lines = [orjson.loads(x) for x in batch_file(cfg).splitlines()]
    sim = batch_sim.batch_lines(cfg.sim(), 0)
    assert [x["custom_id"] for x in lines] == [f"line-{i}" for i in range(5)]
    for x, t in zip(lines, sim, strict=True):
        assert (x["method"], x["url"]) == ("POST", "/v1/chat/completions")
        n = t.calls[0].output_tokens
        assert (x["body"]["max_tokens"], x["body"]["min_tokens"], x["body"]["ignore_eos"]) == (n, n, True)
        assert x["body"]["model"] == classes.MODEL
        assert "stream" not in x["body"]


def test_berth_runs_the_batch_with_the_lines_in_flight_asked() -> None:
    cfg = LiveConfig(Path("."), lines=5, in_flight=256, speed=2.0)
    urls = [f"http://127.0.0.1:{9000 + i}" for i in range(len(fleet_specs()))]
    doc = tomllib.loads(gateway_text(urls, 8080, policy=Path("p.toml"), cfg=cfg, batch_dir=Path("/b")))
    assert doc["batch"] == {"dir": "/b", "max_lines_in_flight": 256, "retry_s": 0.5}
    assert len(doc["endpoints"]) == len(urls)


def test_the_batch_throughput_counts_each_poll_s_new_tokens() -> None:
    w = BatchWatch(polls=[(0.0, 0, 0), (10.0, 300, 1), (35.0, 900, 3), (61.0, 1200, 4)])
    assert w.rate(30.0) == [(0.0, 10.0), (30.0, 20.0), (60.0, 10.0)]
    assert BatchWatch().rate(30.0) == []


def test_a_bad_speed_is_refused() -> None:
    with pytest.raises(ValueError, match="speed"):
        LiveConfig(Path("."), speed=0.0)
