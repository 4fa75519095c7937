"""berth's fitted performance model in front of a real vLLM on CPU (a benchmark: prints figures).

    berth-loadgen bench predict-real --out DIR      # about 2 minutes (vLLM starts in ~1)

Setup, the same as the real-engine tier (`tests/engine`; both start their servers with
`loadgen.vllm_server` and `loadgen.harness`): the engine venv's python (``$BERTH_ENGINE_PYTHON``, else
``~/.cache/berth/engine-venv``; without it this says how to build it and exits 2), the tiny random
Llama built locally, vLLM's OpenAI server on CPU with ``--max-num-seqs`` (4), and berth in front of it
as a subprocess (``python -m gateway.cli serve --endpoint URL,engine=vllm``, ``[telemetry]
refit_interval_s`` = ``--refit-s``, ``[scrape] interval_s`` = ``--scrape-s``: a KV observation comes
from a scrape).

Load: ``--requests`` streaming chat requests with prompts of 16..``--max-prompt`` tokens and outputs of
16..``--max-output`` tokens (both log-uniform; outputs fixed with ignore_eos), in four equal closed-loop
phases of 1, 2, 4 and 8 concurrent clients: the engine runs batches of one to four, and in the last
phase requests queue inside it. Prompts are sized in tokens from a first request's usage (the tiny
model's tokenizer is its own).

Figures: what berth reports on ``/admin/fleet`` after its next refit: the fitted prefill, decode and
KV coefficients, each part's fit error (MAPE of its observations under the coefficients; there is no
true model to compare with, and CPU timing is noisy) and observation count, the prediction error of
the coefficients in force on the observations as they came, and the engine cross-checks.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import shlex
import string
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import orjson

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.skeleton import run_bench
from loadgen.harness import RunningServer, ServerStartError, start_berth
from loadgen.vllm_server import (
    IGNORE_EOS,
    MODEL_NAME,
    build_tiny_model,
    find_engine_python,
    no_engine_venv,
    start_vllm,
)

CONCURRENCY: Final = (1, 2, 4, 8)
REFIT_WAIT_S: Final = 60.0
CALIBRATION_CHARS: Final = 2000
_clock = time.perf_counter


@dataclass(slots=True)
class Request:
    prompt_chars: int
    output: int
    prompt_tokens: int | None = None  # the engine's usage
    tokens: int = 0
    ttft_s: float | None = None
    error: str | None = None


def words(rng: random.Random, chars: int) -> str:
    letters = string.ascii_lowercase
    out: list[str] = []
    size = 0
    while size < chars:
        w = "".join(rng.choice(letters) for _ in range(rng.randint(2, 9)))
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:chars]


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return round(math.exp(rng.uniform(math.log(lo), math.log(hi))))


async def send(session: aiohttp.ClientSession, url: str, req: Request, salt: int) -> None:
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": words(random.Random(salt), req.prompt_chars)}],
        "max_tokens": req.output,
        "min_tokens": req.output,
        "stream": True,
        "stream_options": {"include_usage": True},
        **IGNORE_EOS,
    }
    start = _clock()
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                req.error = f"http_{resp.status}: {(await resp.text())[:200]}"
                return
            async for line in resp.content:
                if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                    continue
                obj = orjson.loads(line[5:])
                choices = obj.get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    if req.ttft_s is None:
                        req.ttft_s = _clock() - start
                    req.tokens += 1
                usage = obj.get("usage")
                if usage:
                    req.prompt_tokens = int(usage["prompt_tokens"])
    except (aiohttp.ClientError, orjson.JSONDecodeError) as e:
        req.error = type(e).__name__


async def closed_loop(
    session: aiohttp.ClientSession, url: str, reqs: list[Request], concurrency: int, salt: int
) -> None:
    """`concurrency` clients, each sending its next request when its last one is done."""
    todo = iter(enumerate(reqs))

    async def client() -> None:
        for i, r in todo:  # the clients share one iterator
            await send(session, url, r, salt + i)

    async with asyncio.TaskGroup() as tg:
        for k in range(concurrency):
            tg.create_task(client(), name=f"client-{k}")


async def run_phases(url: str, phases: Sequence[tuple[int, list[Request]]], seed: int) -> None:
    timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        salt = seed * 100_000
        for concurrency, reqs in phases:
            print(f"  {len(reqs)} requests, {concurrency} at a time", file=sys.stderr)
            await closed_loop(session, url, reqs, concurrency, salt)
            salt += len(reqs)


def wait_for_refit(berth: RunningServer) -> dict[str, Any]:
    """/admin/fleet once berth has refitted after this call."""
    start = _clock()
    while True:
        status, body = berth.get("/admin/fleet")
        if status != 200:
            raise RuntimeError(f"berth /admin/fleet answered {status}: {body[:200]}")
        doc: dict[str, Any] = orjson.loads(body)
        age = doc["telemetry"]["last_refit_age_s"]
        if age is not None and age < _clock() - start:
            return doc
        if _clock() - start > REFIT_WAIT_S:
            raise RuntimeError(f"berth did not refit within {REFIT_WAIT_S:.0f} s")
        time.sleep(0.25)


async def run(args: argparse.Namespace, engine_python: Path, logs: Path) -> dict[str, Any]:
    print("tiny model ...", file=sys.stderr)
    model_dir, _ = await asyncio.to_thread(build_tiny_model, engine_python)
    print(f"vLLM (--max-num-seqs {args.max_num_seqs}) ...", file=sys.stderr)
    vllm = await asyncio.to_thread(
        start_vllm, engine_python, model_dir, logs / "vllm.log", max_num_seqs=args.max_num_seqs
    )
    try:
        config = logs / "gateway.toml"
        config.write_text(
            f"[telemetry]\nrefit_interval_s = {args.refit_s}\n\n[scrape]\ninterval_s = {args.scrape_s}\n"
        )
        berth = await asyncio.to_thread(
            start_berth, f"{vllm.base_url},engine=vllm", logs / "berth.log", extra_args=["-c", str(config)]
        )
        try:
            # chars per token of this tokenizer, from one request's usage (it also warms the engine up)
            probe = Request(CALIBRATION_CHARS, 16)
            await run_phases(berth.base_url, [(1, [probe])], args.seed + 1)
            if probe.prompt_tokens is None:
                raise RuntimeError(f"the calibration request failed: {probe.error}")
            chars_per_token = CALIBRATION_CHARS / probe.prompt_tokens
            rng = random.Random(args.seed)
            per_phase = max(1, args.requests // len(CONCURRENCY))
            phases = [
                (
                    c,
                    [
                        Request(
                            round(log_uniform(rng, 16, args.max_prompt) * chars_per_token),
                            log_uniform(rng, 16, args.max_output),
                        )
                        for _ in range(per_phase)
                    ],
                )
                for c in CONCURRENCY
            ]
            wall0 = _clock()
            print(f"{per_phase * len(CONCURRENCY)} requests through {berth.base_url}", file=sys.stderr)
            await run_phases(berth.base_url, phases, args.seed)
            wall = _clock() - wall0
            doc = await asyncio.to_thread(wait_for_refit, berth)
        finally:
            await asyncio.to_thread(berth.process.stop)
    finally:
        await asyncio.to_thread(vllm.process.stop)
    reqs = [r for _, rs in phases for r in rs]
    [ep] = doc["endpoints"]
    ttfts = sorted(r.ttft_s for r in reqs if r.ttft_s is not None)
    return {
        "command": " ".join(["berth-loadgen bench predict-real", *map(shlex.quote, sys.argv[1:])]),
        "settings": {
            k: getattr(args, k)
            for k in ("requests", "max_prompt", "max_output", "max_num_seqs", "refit_s", "scrape_s", "seed")
        },
        "perf": ep["perf"],
        "prediction_error": ep["prediction_error"],
        "engine_check": ep["engine_check"],
        "kv_capacity_tokens": ep["kv_capacity_tokens"],
        "latency": ep["latency"],
        "requests": len(reqs),
        "errors": [r.error for r in reqs if r.error is not None],
        "chars_per_token": chars_per_token,
        "prompt_tokens": [min(r.prompt_tokens or 0 for r in reqs), max(r.prompt_tokens or 0 for r in reqs)],
        "output_tokens": [min(r.tokens for r in reqs), max(r.tokens for r in reqs)],
        "client_ttft_p50_s": ttfts[len(ttfts) // 2] if ttfts else None,
        "wall_s": wall,
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def render(result: dict[str, Any]) -> str:
    perf, err, s = result["perf"], result["prediction_error"], result["settings"]
    pre, dec, kv, tput = perf["prefill"], perf["decode"], perf["kv"], perf["throughput"]
    checks = result["engine_check"]
    lines = [
        f"$ {result['command']}",
        f"vLLM CPU, tiny Llama, --max-num-seqs {s['max_num_seqs']}: {result['requests']} streaming requests "
        f"({len(result['errors'])} errors), prompts {'..'.join(map(str, result['prompt_tokens']))} tokens, "
        f"outputs {'..'.join(map(str, result['output_tokens']))}, concurrency "
        f"{'/'.join(map(str, CONCURRENCY))}; wall {result['wall_s']:.0f} s",
        "",
        f"{'part':<9} {'coefficients (seconds, tokens)':<48} {'fit error':>9} {'n':>5}",
        *(
            f"{name:<9} {coefs:<48} {_pct(part['mape']):>9} {part['n']:>5}"
            for name, part, coefs in (
                ("prefill", pre, f"k1 {pre['k1']:.4g}  c1 {pre['c1']:.4g}"),
                ("decode", dec, f"k2 {dec['k2']:.4g}  c2 {dec['c2']:.4g}  c3 {dec['c3']:.4g}"),
                ("kv", kv, f"h {kv['h']:.4g}  j {kv['j']:.4g}"),
            )
        ),
        f"throughput  thr1 {tput['thr1']:.4g} tok/s  alpha {tput['alpha']:.4g}  beta {tput['beta']:.4g}",
        "",
        f"prediction error of the coefficients in force (EWMA): prefill {_pct(err['ttft'])}, "
        f"decode {_pct(err['itl'])}",
        "engine cross-check (gateway mean / vLLM mean): "
        + ", ".join(
            f"{q} {c['ratio']:.2f}" if c["ratio"] is not None else f"{q} -" for q, c in checks.items()
        )
        + f"; KV capacity {result['kv_capacity_tokens']} tokens",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="berth-loadgen bench predict-real", description=__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--max-prompt", type=int, default=1200, help="longest prompt, tokens")
    ap.add_argument("--max-output", type=int, default=256, help="longest output, tokens")
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--refit-s", type=float, default=2.0, help="berth's [telemetry] refit_interval_s")
    ap.add_argument(
        "--scrape-s", type=float, default=0.25, help="berth's [scrape] interval_s (KV observations)"
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--logs", type=Path, default=None, help="keep the servers' logs here")
    ap.add_argument("--out", type=Path, default=Path("bench-out/predict-real"), help="report directory")
    args = ap.parse_args(argv)
    engine_python = find_engine_python()
    if engine_python is None:
        print(no_engine_venv("berth-loadgen bench predict-real"), file=sys.stderr)
        return 2

    def measure(a: argparse.Namespace) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="berth-predict-real-") as tmp:
            logs = a.logs or Path(tmp)
            logs.mkdir(parents=True, exist_ok=True)
            result = asyncio.run(run(a, engine_python, logs))
        print(render(result))
        return result

    return run_bench(
        BENCHMARKS["predict-real"],
        args,
        measure,
        report=lambda r: (r, "```\n" + render(r) + "\n```"),
        failures=(ServerStartError,),
    )


if __name__ == "__main__":
    raise SystemExit(main())
