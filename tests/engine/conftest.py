"""The real-engine tier: berth in front of a real vLLM server on CPU serving a tiny random Llama.

Needs the engine venv (`tests/engine/setup_engine_env.sh`, which `make test` runs) and its python in
`BERTH_ENGINE_PYTHON`; without it every test here is skipped. One vLLM server and one berth run for
the whole session. Server output goes to log files under pytest's basetemp; a server that fails to
start fails its fixture with the tail of its log.

`BERTH_ENGINE_TARGET=vllm` points the OpenAI clients straight at vLLM instead of berth (tests that
are about berth itself are skipped then): it proves these fixtures and tests on their own.
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
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import openai
import pytest

ENGINE_DIR: Final = Path(__file__).resolve().parent
REPO_ROOT: Final = ENGINE_DIR.parent.parent
MODEL_BUILDER: Final = ENGINE_DIR / "build_tiny_model.py"

MODEL_NAME: Final = "tiny-llama"
# A sampling parameter of vLLM's, sent through the SDK's extra_body: with it a random model always
# runs to max_tokens, so token counts and finish reasons are exact.
IGNORE_EOS: Final = {"ignore_eos": True}

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

SKIP_REASON: Final = (
    "real-engine tier: BERTH_ENGINE_PYTHON is not set. Run `make test`, or "
    "`bash tests/engine/setup_engine_env.sh` and then "
    "`BERTH_ENGINE_PYTHON=$HOME/.cache/berth/engine-venv/bin/python .venv/bin/pytest tests/engine`"
)


# How long each piece of the tier took to come up, for the terminal summary (CI logs).
STARTUP_TIMES: Final = pytest.StashKey[dict[str, float]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[STARTUP_TIMES] = {}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    times = config.stash.get(STARTUP_TIMES, {})
    if times:
        terminalreporter.write_line(
            "engine tier startup: " + ", ".join(f"{what} {secs:.1f} s" for what, secs in times.items())
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # This hook sees the whole session's items; touch only this directory's. It runs before pytest's
    # own `-m` deselection (conftest hooks run before built-in ones), so `-m "not engine"` works.
    engine_python = os.environ.get("BERTH_ENGINE_PYTHON")
    for item in items:
        if ENGINE_DIR not in item.path.resolve().parents:
            continue
        item.add_marker(pytest.mark.engine)
        if not engine_python:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


# ------------------------------------------------------------------------------- processes
class ServerStartError(Exception):
    pass


class ManagedProcess:
    """A server subprocess in its own process group; a thread drains its output into a log file.

    Draining matters beyond logging: a server whose stdout pipe fills up blocks. The thread also turns
    the server's output into an event (`ready_line` seen, or output closed because it exited), which
    is what the fixtures wait on instead of sleeping.
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


def _engine_env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):  # the project venv's, not the engine's
        env.pop(var, None)
    env.update(
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB, the minimum
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        PYTHONUNBUFFERED="1",
    )
    return env


# -------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def engine_python() -> Path:
    raw = os.environ.get("BERTH_ENGINE_PYTHON")
    if not raw:
        pytest.skip(SKIP_REASON)
    # Not resolved: bin/python is a symlink to the base interpreter, and the venv is where it sits.
    path = Path(os.path.abspath(raw))
    if not os.access(path, os.X_OK):
        pytest.fail(f"BERTH_ENGINE_PYTHON={raw} is not an executable; run tests/engine/setup_engine_env.sh")
    return path


@pytest.fixture(scope="session")
def engine_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine-logs")


@pytest.fixture(scope="session")
def tiny_model_dir(engine_python: Path, pytestconfig: pytest.Config) -> Path:
    """The tiny model, built once per version of build_tiny_model.py and cached beside the engine venv."""
    venv = engine_python.parent.parent
    cache = venv.parent if (venv / "pyvenv.cfg").exists() else Path.home() / ".cache" / "berth"
    digest = hashlib.sha256(MODEL_BUILDER.read_bytes()).hexdigest()[:12]
    model_dir = cache / f"tiny-llama-{digest}"
    # The builder renames a complete directory into place, so existing means complete.
    if (model_dir / "config.json").exists():
        return model_dir
    started = time.monotonic()
    result = subprocess.run(
        [str(engine_python), str(MODEL_BUILDER), str(model_dir)],
        env=_engine_env(),
        capture_output=True,
        text=True,
        timeout=MODEL_BUILD_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(
            f"building the tiny model failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    pytestconfig.stash[STARTUP_TIMES]["model build"] = time.monotonic() - started
    return model_dir


@pytest.fixture(scope="session")
def vllm_server(
    engine_python: Path, tiny_model_dir: Path, engine_logs: Path, pytestconfig: pytest.Config
) -> Iterator[RunningServer]:
    port = free_port()
    started = time.monotonic()
    # `vllm serve` does not work with the vllm-cpu distribution; the module entry point does.
    argv = [
        str(engine_python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(tiny_model_dir),
        "--served-model-name", MODEL_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", "bfloat16",
        "--max-model-len", "2048",
        "--enforce-eager",
        "--max-num-seqs", "4",  # small, so a burst queues (vllm:num_requests_waiting)
    ]  # fmt: skip
    proc = ManagedProcess(
        "vllm", argv, env=_engine_env(), log_path=engine_logs / "vllm.log", ready_line=VLLM_READY_LINE
    )
    server = RunningServer("vllm", f"http://127.0.0.1:{port}", proc)
    try:
        proc.wait_for_ready_line(VLLM_READY_TIMEOUT_S)
        # uvicorn prints the line a moment before its socket accepts: confirm over HTTP.
        proc.poll_until(
            "vllm /health answers 200", lambda: server.get("/health")[0] == 200, VLLM_HEALTH_AFTER_READY_S
        )
    except ServerStartError as e:
        proc.stop()
        pytest.fail(str(e), pytrace=False)
    pytestconfig.stash[STARTUP_TIMES]["vllm ready"] = time.monotonic() - started
    yield server
    proc.stop()


@pytest.fixture(scope="session")
def berth_server(
    vllm_server: RunningServer, engine_logs: Path, pytestconfig: pytest.Config
) -> Iterator[RunningServer]:
    port = free_port()
    started = time.monotonic()
    argv = [
        sys.executable, "-m", "gateway.cli", "serve",
        "--listen", f"127.0.0.1:{port}",
        "--endpoint", f"{vllm_server.base_url},engine=vllm",
        "--log-level", "info",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = ManagedProcess("berth", argv, env=env, log_path=engine_logs / "berth.log", cwd=REPO_ROOT)
    server = RunningServer("berth", f"http://127.0.0.1:{port}", proc)
    try:
        # Ready once its config is loaded and it has scraped vLLM as ready: only /readyz says so.
        proc.poll_until(
            "berth /readyz answers 200", lambda: server.get("/readyz")[0] == 200, BERTH_READY_TIMEOUT_S
        )
    except ServerStartError as e:
        proc.stop()
        pytest.fail(str(e), pytrace=False)
    pytestconfig.stash[STARTUP_TIMES]["berth ready"] = time.monotonic() - started
    yield server
    proc.stop()


def _target_name() -> str:
    target = os.environ.get("BERTH_ENGINE_TARGET", "berth")
    if target not in ("berth", "vllm"):
        pytest.fail(f"BERTH_ENGINE_TARGET must be 'berth' or 'vllm', not {target!r}")
    return target


@pytest.fixture(scope="session")
def api_server(request: pytest.FixtureRequest) -> RunningServer:
    """The server the OpenAI clients talk to: berth (default), or vLLM with BERTH_ENGINE_TARGET=vllm."""
    server: RunningServer = request.getfixturevalue(f"{_target_name()}_server")
    return server


@pytest.fixture(scope="session")
def berth(request: pytest.FixtureRequest) -> RunningServer:
    """berth itself, for tests about the gateway; skipped when the clients target vLLM directly."""
    if _target_name() != "berth":
        pytest.skip("BERTH_ENGINE_TARGET=vllm: the clients bypass berth")
    server: RunningServer = request.getfixturevalue("berth_server")
    return server


@pytest.fixture(scope="session")
def openai_client(api_server: RunningServer) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{api_server.base_url}/v1", api_key="test", max_retries=0, timeout=120)
    yield client
    client.close()


@pytest.fixture
async def async_openai_client(api_server: RunningServer) -> AsyncIterator[openai.AsyncOpenAI]:
    # Function-scoped: its connection pool belongs to the test's event loop.
    client = openai.AsyncOpenAI(
        base_url=f"{api_server.base_url}/v1", api_key="test", max_retries=0, timeout=120
    )
    yield client
    await client.close()


@pytest.fixture(scope="session")
def vllm_metrics_text(vllm_server: RunningServer) -> str:
    """Real vLLM's /metrics text after at least one finished request (so the request series exist)."""
    http_post_json(
        f"{vllm_server.base_url}/v1/completions",
        {"model": MODEL_NAME, "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0, **IGNORE_EOS},
    )
    return vllm_server.metrics()
