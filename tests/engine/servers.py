"""The real-engine tier's servers, without pytest: the engine venv's python, the tiny model, a vLLM
server on CPU and berth in front of it, each a subprocess in its own process group whose output is
drained into a log file. `conftest.py` wraps these in session fixtures; `loadgen.bench.predict_real`
uses them directly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ENGINE_DIR: Final = Path(__file__).resolve().parent
REPO_ROOT: Final = ENGINE_DIR.parent.parent
MODEL_BUILDER: Final = ENGINE_DIR / "build_tiny_model.py"
SETUP_SCRIPT: Final = ENGINE_DIR / "setup_engine_env.sh"
DEFAULT_ENGINE_VENV: Final = Path.home() / ".cache" / "berth" / "engine-venv"

MODEL_NAME: Final = "tiny-llama"
# A sampling parameter of vLLM's, sent through the SDK's extra_body: with it a random model always
# runs to max_tokens, so token counts and finish reasons are exact.
IGNORE_EOS: Final = {"ignore_eos": True}
# The one CPU core vLLM runs on; berth and the tests have the others.
ENGINE_CPU: Final = "0"
# vLLM's context limit for the tiny model (at most build_tiny_model.MAX_POSITIONS).
MAX_MODEL_LEN: Final = 4608
# max_tokens of a stream a test cuts short or watches while it runs: at the ~300 tokens a second of the
# tiny model on one core it runs for ~13 s, several of berth's 2-s scrapes.
LONG_MAX_TOKENS: Final = 4096


# vLLM on 2 CPU cores is ready after 25-65 s (more on a cold disk cache); allow plenty for slow CI.
VLLM_READY_TIMEOUT_S: Final = 300.0
# uvicorn's line once vLLM's app has started; its socket accepts a moment later, hence a /health check.
VLLM_READY_LINE: Final = b"Application startup complete"
VLLM_HEALTH_AFTER_READY_S: Final = 30.0
BERTH_READY_TIMEOUT_S: Final = 60.0
MODEL_BUILD_TIMEOUT_S: Final = 300.0
STOP_GRACE_S: Final = 30.0
HTTP_TIMEOUT_S: Final = 10.0
POLL_INTERVAL_S: Final = 0.1


class ServerStartError(Exception):
    pass


class ManagedProcess:
    """A server subprocess in its own process group; a thread drains its output into a log file.

    Draining matters beyond logging: a server whose stdout pipe fills up blocks. The thread also turns
    the server's output into an event (`ready_line` seen, or output closed because it exited), which
    is what the callers wait on instead of sleeping.
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        env: dict[str, str],
        log_path: Path,
        ready_line: bytes | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self._ready_line = ready_line
        self._saw_ready_line = False
        self._ready_or_closed = threading.Event()
        log_path.write_bytes(f"$ {' '.join(argv)}\n".encode())
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,  # its own process group: stop() reaches vLLM's engine-core child too
        )
        self._reader = threading.Thread(target=self._drain, name=f"{name}-output", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _drain(self) -> None:
        assert self._proc.stdout is not None
        with self._proc.stdout as out, self.log_path.open("ab") as log:
            for line in out:
                log.write(line)
                log.flush()
                if self._ready_line is not None and not self._saw_ready_line and self._ready_line in line:
                    self._saw_ready_line = True
                    self._ready_or_closed.set()
        self._ready_or_closed.set()

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as e:
            return f"(no log: {e})"
        return "\n".join(text.splitlines()[-lines:])

    def _failure(self, what: str) -> ServerStartError:
        code = self._proc.poll()
        state = "still running" if code is None else f"exited with code {code}"
        return ServerStartError(
            f"{self.name} {what} ({state}); log: {self.log_path}\n--- last lines ---\n{self.log_tail()}"
        )

    def wait_for_ready_line(self, timeout_s: float) -> None:
        """Block until the server prints its ready line; fail fast if it exits first."""
        if not self._ready_or_closed.wait(timeout_s):
            raise self._failure(f"did not print {self._ready_line!r} within {timeout_s:.0f} s")
        if not self._saw_ready_line:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(STOP_GRACE_S)  # its output closed: it is exiting; get the exit code
            raise self._failure("closed its output before it was ready")

    def poll_until(self, what: str, check: Callable[[], bool], timeout_s: float) -> None:
        """Bounded poll of an external server's state, for states the server announces on no channel.

        Only for facts a server exposes solely over HTTP when asked (berth's /readyz, a gauge on
        /metrics): there is no event to await, so ask every POLL_INTERVAL_S until `timeout_s`.
        The pause between asks is a wait on the server process itself, so a crash ends it at once.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if check():
                return
            if time.monotonic() >= deadline:
                raise self._failure(f"never reached: {what} (waited {timeout_s:.0f} s)")
            try:
                self._proc.wait(POLL_INTERVAL_S)
            except subprocess.TimeoutExpired:
                continue
            raise self._failure(f"exited while waiting for: {what}")

    def stop(self) -> None:
        """SIGTERM the process group; after STOP_GRACE_S, SIGKILL whatever is left of it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(STOP_GRACE_S)
        with contextlib.suppress(ProcessLookupError):
            # The leader if it ignored SIGTERM, or a child (vLLM's engine core) that outlived it.
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        self._reader.join(STOP_GRACE_S)


@dataclass(frozen=True)
class RunningServer:
    name: str
    base_url: str  # http://127.0.0.1:PORT, no trailing slash
    process: ManagedProcess

    def get(self, path: str) -> tuple[int, str]:
        return http_get(self.base_url + path)

    def metrics(self) -> str:
        status, body = self.get("/metrics")
        assert status == 200, f"{self.name} /metrics answered {status}: {body[:200]}"
        return body


def http_get(url: str, timeout_s: float = HTTP_TIMEOUT_S) -> tuple[int, str]:
    """(status, body); a connection failure is status 0."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, ""


def http_post_json(url: str, body: dict[str, object], timeout_s: float = 60.0) -> dict[str, object]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        decoded: dict[str, object] = json.loads(resp.read())
        return decoded


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def engine_env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):  # the project venv's, not the engine's
        env.pop(var, None)
    env.update(
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB, the minimum
        VLLM_CPU_OMP_THREADS_BIND=ENGINE_CPU,  # the worker's one thread, on the engine's core
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
    engine_python: Path, model_dir: Path, log_path: Path, *, max_num_seqs: int = 4
) -> RunningServer:
    """vLLM's OpenAI server on CPU serving the tiny model as MODEL_NAME, ready (its /health answers)."""
    port = free_port()
    # `vllm serve` does not work with the vllm-cpu distribution; the module entry point does.
    # All of vLLM on core 0 (ENGINE_CPU): on CPU it busy-polls (its worker spins, its engine core
    # loops), and spread over both cores of a 2-core machine it starved berth and the test client for
    # seconds at a time (its own API server too, which then sent a whole stream in one burst at the end).
    argv = [
        "taskset", "-c", ENGINE_CPU,
        str(engine_python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", MODEL_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", "bfloat16",
        "--max-model-len", str(MAX_MODEL_LEN),
        "--enforce-eager",
        "--max-num-seqs", str(max_num_seqs),
    ]  # fmt: skip
    proc = ManagedProcess("vllm", argv, env=engine_env(), log_path=log_path, ready_line=VLLM_READY_LINE)
    server = RunningServer("vllm", f"http://127.0.0.1:{port}", proc)
    try:
        proc.wait_for_ready_line(VLLM_READY_TIMEOUT_S)
        # uvicorn prints the line a moment before its socket accepts: confirm over HTTP.
        proc.poll_until(
            "vllm /health answers 200", lambda: server.get("/health")[0] == 200, VLLM_HEALTH_AFTER_READY_S
        )
    except ServerStartError:
        proc.stop()
        raise
    return server


def start_berth(
    endpoint: str,
    log_path: Path,
    *,
    extra_args: Sequence[str] = (),
    python: str = sys.executable,
    cwd: Path = REPO_ROOT,
) -> RunningServer:
    """`python -m gateway.cli serve` in front of `endpoint` ("URL,engine=.."), ready (its /readyz is 200:
    config loaded and the engine scraped as ready)."""
    port = free_port()
    argv = [
        python, "-m", "gateway.cli", "serve",
        "--listen", f"127.0.0.1:{port}",
        "--endpoint", endpoint,
        "--log-level", "info",
        *extra_args,
    ]  # fmt: skip
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = ManagedProcess("berth", argv, env=env, log_path=log_path, cwd=cwd)
    server = RunningServer("berth", f"http://127.0.0.1:{port}", proc)
    try:
        proc.poll_until(
            "berth /readyz answers 200", lambda: server.get("/readyz")[0] == 200, BERTH_READY_TIMEOUT_S
        )
    except ServerStartError:
        proc.stop()
        raise
    return server
