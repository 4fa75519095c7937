"""`berth serve` as a real process: systemd notify protocol, SIGHUP reload, SIGTERM drain, `berth check`.

The notify socket is one the test owns; every wait is on a datagram, a log line or an HTTP answer.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from loadgen.harness import ManagedProcess, free_port, serve_argv
from tests.integration.fake_engine import FakeEngine

POLICY_OK = 'name = "p1"\n[ordering]\nplugin = "fcfs"\n[placement]\npicker = { plugin = "round-robin" }\n'


class NotifySocket:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)

    async def next(self) -> str:
        loop = asyncio.get_running_loop()
        data = await loop.sock_recv(self.sock, 4096)
        return data.decode()

    async def until(self, needle: str) -> list[str]:
        """Datagrams up to and including the first that contains `needle`."""
        seen = []
        while True:
            msg = await asyncio.wait_for(self.next(), 60)
            seen.append(msg)
            if needle in msg:
                return seen


@pytest.fixture
async def engine() -> AsyncIterator[tuple[FakeEngine, str]]:
    eng = FakeEngine(tokens=20)
    srv = TestServer(eng.app(), handler_cancellation=True)
    await srv.start_server()
    yield eng, str(srv.make_url("")).rstrip("/")
    await srv.close()


def _start(
    tmp_path: Path, engine_url: str, server: str = ""
) -> tuple[ManagedProcess, NotifySocket, str, Path]:
    port = free_port()
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY_OK)
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(
        f'[server]\nlisten = "127.0.0.1:{port}"\ndrain_timeout_s = 20\n{server}'
        f'[policy]\nfile = "policy.toml"\n[[endpoints]]\nurl = "{engine_url}"\nengine = "vllm"\n'
    )
    notify = NotifySocket(tmp_path / "notify.sock")
    env = {**os.environ, "NOTIFY_SOCKET": str(notify.path)}
    argv = serve_argv(cfg, tmp_path / "batch")
    proc = ManagedProcess("berth", argv, log_path=tmp_path / "berth.log", env=env)
    return proc, notify, f"http://127.0.0.1:{port}", policy


async def test_notify_ready_reload_and_drain(tmp_path: Path, engine: tuple[FakeEngine, str]) -> None:
    eng, url = engine
    proc, notify, base, policy = _start(tmp_path, url)
    try:
        assert "READY=1" in (await notify.until("READY=1"))[-1]
        async with aiohttp.ClientSession() as s:
            async with s.get(base + "/readyz") as r:
                assert r.status == 200

            # an invalid policy is rejected: old config keeps serving, counter counts it
            policy.write_text('name = "p2"\n[ordering]\nplugin = "no-such-ordering"\n')
            proc.send_signal(signal.SIGHUP)
            msgs = await notify.until("READY=1")
            assert any(m.startswith("RELOADING=1") for m in msgs)
            async with s.get(base + "/metrics") as r:
                text = await r.text()
            assert 'berth_config_reloads_total{result="rejected"} 1.0' in text

            # a valid one is applied
            policy.write_text(POLICY_OK.replace("p1", "p2"))
            proc.send_signal(signal.SIGHUP)
            await notify.until("READY=1")
            async with s.get(base + "/metrics") as r:
                text = await r.text()
            assert 'berth_config_reloads_total{result="ok"} 1.0' in text

            # SIGTERM drains: a stream in flight finishes, then the process exits 0
            hold = asyncio.Event()
            eng.hold = hold
            eng.started.clear()
            body = orjson.dumps(
                {"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "x"}]}
            )
            call = asyncio.ensure_future(s.post(base + "/v1/chat/completions", data=body))
            await eng.started.wait()
            proc.send_signal(signal.SIGTERM)
            await notify.until("STOPPING=1")
            hold.set()
            resp = await call
            payload = await resp.read()
            assert resp.status == 200
            assert payload.endswith(b"data: [DONE]\n\n")
        assert await asyncio.to_thread(proc.wait, 60) == 0
    finally:
        await asyncio.to_thread(proc.stop)
        notify.sock.close()


async def test_sigterm_answers_newcomers_503_until_the_listener_closes(
    tmp_path: Path, engine: tuple[FakeEngine, str]
) -> None:
    """Found by the soak: requests already queued for the listener at SIGTERM were reset when it closed.
    Through the accept grace they get a precise 503 `shutting_down`; a second SIGTERM ends the grace."""
    _, url = engine
    proc, notify, base, _ = _start(tmp_path, url, server="accept_grace_s = 300\n")
    try:
        await notify.until("READY=1")
        proc.send_signal(signal.SIGTERM)
        await notify.until("STOPPING=1")
        body = orjson.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x"}]})
        async with aiohttp.ClientSession() as s:
            async with s.post(base + "/v1/chat/completions", data=body) as r:
                assert r.status == 503
                assert (await r.json())["error"]["code"] == "shutting_down"
            async with s.get(base + "/readyz") as r:
                assert r.status == 503
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 60) == 0
    finally:
        await asyncio.to_thread(proc.stop)
        notify.sock.close()


@pytest.mark.parametrize(
    ("text", "code", "needle"),
    [
        (POLICY_OK, 0, "ok"),
        (
            '[ordering]\nplugin = "fcfs"\n[placement]\npicker = { plugin = "max-score" }\nbogus = 1\n',
            1,
            "bogus",
        ),
        ('[server]\nlisten = "nowhere"\n', 1, "server.listen"),
        ("", 1, "empty file"),
        (POLICY_OK, 0, "ok (policy file)"),
    ],
    ids=["valid-policy", "unknown-key", "bad-listen", "empty", "says-the-kind"],
)
async def test_berth_check_exit_codes(tmp_path: Path, text: str, code: int, needle: str) -> None:
    path = tmp_path / "file.toml"
    path.write_text(text)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli",
        "check",
        "-c",
        str(path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == code
    assert needle in (out + err).decode()
