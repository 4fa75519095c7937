"""`loadgen.harness` with real child processes: readiness, failing fast with the log's tail, watched
output lines, and the stop."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from loadgen.harness import ManagedProcess, ServerStartError, free_port, http_get, start_server

PY = sys.executable


def test_a_server_is_ready_once_its_path_answers_200_and_stops(tmp_path: Path) -> None:
    port = free_port()
    argv = [PY, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    server = start_server(
        "files", argv, port=port, log_path=tmp_path / "files.log", ready_path="/", timeout_s=30
    )
    try:
        assert server.get("/")[0] == 200
        assert server.process.returncode is None
    finally:
        server.process.stop()
    assert server.process.wait(timeout_s=0) == -signal.SIGTERM  # it stopped at the first, gentle, signal
    server.process.stop()  # idempotent
    assert http_get(server.base_url + "/", timeout_s=2.0)[0] == 0
    assert (tmp_path / "files.log").read_text().startswith(f"$ {PY} -m http.server")


def test_a_server_that_exits_first_fails_at_once_with_its_log(tmp_path: Path) -> None:
    argv = [PY, "-c", "print('bad config: no endpoints', flush=True); raise SystemExit(2)"]
    with pytest.raises(ServerStartError) as err:
        # a deadline far beyond the test's patience: only the process's exit can end the wait in time
        start_server(
            "early", argv, port=free_port(), log_path=tmp_path / "e.log", ready_path="/", timeout_s=600
        )
    text = str(err.value)
    assert "early exited while waiting for" in text
    assert "exited with code 2" in text
    assert "bad config: no endpoints" in text


def test_watched_lines_are_returned_as_they_are_printed(tmp_path: Path) -> None:
    script = (
        "import signal, sys\n"
        "print('starting', flush=True)\n"
        "for i in range(2): print(f'endpoint {i} at http://127.0.0.1:{9000 + i}', flush=True)\n"
        "sys.stdin.read()\n"  # stdin is /dev/null: returns at once; then serve 'forever'
        "signal.pause()\n"  # a server: runs until the harness stops it
    )
    with ManagedProcess("sim", [PY, "-c", script], log_path=tmp_path / "s.log", watch=b" at http://") as proc:
        lines = proc.wait_for_lines(2, timeout_s=30)
        assert [line.rsplit(" at ", 1)[1] for line in lines] == [
            "http://127.0.0.1:9000",
            "http://127.0.0.1:9001",
        ]
    assert proc.returncode is not None
    assert "starting" in (tmp_path / "s.log").read_text()


def test_output_that_closes_before_the_lines_fails_at_once(tmp_path: Path) -> None:
    script = "print('one at http://127.0.0.1:1', flush=True); raise SystemExit(1)"
    proc = ManagedProcess("sim", [PY, "-c", script], log_path=tmp_path / "s.log", watch=b" at http://")
    try:
        with pytest.raises(ServerStartError, match=r"closed its output after 1 of 2 lines") as err:
            proc.wait_for_lines(2, timeout_s=600)
    finally:
        proc.stop()
    assert "exited with code 1" in str(err.value)
