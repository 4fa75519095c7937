"""The real-engine tier: berth in front of a real vLLM server on CPU serving a tiny random Llama.

Needs the engine venv (`tests/engine/setup_engine_env.sh`, which `make test` runs) and its python in
`BERTH_ENGINE_PYTHON`; without it every test here is skipped. One vLLM server and one berth run for
the whole session, started by `loadgen.vllm_server` and `loadgen.harness` (the benchmarks against a
real engine start theirs the same way). Server output goes to log files under pytest's basetemp; a
server that fails to start fails its fixture with the tail of its log.

`BERTH_ENGINE_TARGET=vllm` points the OpenAI clients straight at vLLM instead of berth (tests that
are about berth itself are skipped then): it proves these fixtures and tests on their own.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Final

import openai
import pytest

from loadgen.harness import RunningServer, ServerStartError, http_post_json, start_berth
from loadgen.vllm_server import IGNORE_EOS, MODEL_NAME, build_tiny_model, start_vllm

__all__ = [
    "IGNORE_EOS",
    "LONG_MAX_TOKENS",
    "MODEL_NAME",
    "RunningServer",
]  # what the tests import from here

ENGINE_DIR: Final = Path(__file__).resolve().parent
# max_tokens of a stream a test cuts short or watches while it runs: at the ~300 tokens a second of the
# tiny model on one core it runs for ~13 s, several of berth's 2-s scrapes.
LONG_MAX_TOKENS: Final = 4096

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
    started = time.monotonic()
    try:
        model_dir, built = build_tiny_model(engine_python)
    except ServerStartError as e:
        pytest.fail(str(e))
    if built:
        pytestconfig.stash[STARTUP_TIMES]["model build"] = time.monotonic() - started
    return model_dir


@pytest.fixture(scope="session")
def vllm_server(
    engine_python: Path, tiny_model_dir: Path, engine_logs: Path, pytestconfig: pytest.Config
) -> Iterator[RunningServer]:
    started = time.monotonic()
    try:
        # max-num-seqs small, so a burst queues (vllm:num_requests_waiting)
        server = start_vllm(engine_python, tiny_model_dir, engine_logs / "vllm.log", max_num_seqs=4)
    except ServerStartError as e:
        pytest.fail(str(e), pytrace=False)
    pytestconfig.stash[STARTUP_TIMES]["vllm ready"] = time.monotonic() - started
    yield server
    server.process.stop()


@pytest.fixture(scope="session")
def berth_server(
    vllm_server: RunningServer, engine_logs: Path, pytestconfig: pytest.Config
) -> Iterator[RunningServer]:
    started = time.monotonic()
    try:
        # Ready once its config is loaded and it has scraped vLLM as ready: only /readyz says so.
        server = start_berth(f"{vllm_server.base_url},engine=vllm", engine_logs / "berth.log")
    except ServerStartError as e:
        pytest.fail(str(e), pytrace=False)
    pytestconfig.stash[STARTUP_TIMES]["berth ready"] = time.monotonic() - started
    yield server
    server.process.stop()


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
