"""`make bench-vllm`'s own verdict on vLLM's result (the run itself needs the engine venv)."""

from __future__ import annotations

import argparse
from pathlib import Path

from loadgen.bench.reliability.vllm_bench import berth_counts, client_argv, summary

METRICS = """\
# HELP berth_requests_total Requests by outcome
# TYPE berth_requests_total counter
berth_requests_total{model="tiny-llama",outcome="ok"} 49.0
berth_requests_total{model="other",outcome="ok"} 1.0
berth_requests_total{model="tiny-llama",outcome="engine_rejected"} 2.0
berth_requests_created{model="tiny-llama",outcome="ok"} 1.7e9
"""


def test_berth_counts_sum_outcomes_over_models() -> None:
    assert berth_counts(METRICS) == {"ok": 50.0, "engine_rejected": 2.0}


def test_the_verdict_needs_every_request_completed_and_counted_ok_by_berth() -> None:
    result = {"completed": 50, "failed": 0, "output_throughput": 322.97, "mean_ttft_ms": 89.5}
    text, ok = summary(result, {"ok": 50.0}, 50)
    assert ok
    assert text.splitlines()[0] == "vllm bench serve against berth: 50 of 50 requests completed, 0 failed"
    assert "output throughput 323.0 tok/s" in text
    assert not summary({"completed": 49, "failed": 1}, {"ok": 49.0}, 50)[1]
    assert not summary(result, {"ok": 40.0}, 50)[1]  # the client saw more than berth served


def test_the_client_runs_through_the_shim_against_berth(tmp_path: Path) -> None:
    args = argparse.Namespace(
        backend="openai-chat", input_len=64, output_len=8, num_prompts=10, request_rate=5.0,
        max_concurrency=2, seed=3, extra=["--percentile-metrics", "ttft"],
    )  # fmt: skip
    argv = client_argv(Path("/venv/bin/python"), args, "http://127.0.0.1:9", tmp_path / "tok", tmp_path)
    shim = Path(__file__).resolve().parents[2] / "loadgen" / "vllm_cli.py"
    assert argv[:4] == ["/venv/bin/python", str(shim), "bench", "serve"]

    def value(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert value("--base-url") == "http://127.0.0.1:9"
    assert value("--endpoint") == "/v1/chat/completions"
    assert value("--tokenizer") == str(tmp_path / "tok")
    assert value("--dataset-name") == "random"
    assert argv[-2:] == ["--percentile-metrics", "ttft"]
