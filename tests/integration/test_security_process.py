"""`berth serve` as a real process with every secret in play: client keys (required, from gateway.toml
and a keys file), engine keys from the environment and from a private file (one of them wrong), the
ops listener; then SIGHUP and SIGTERM. Its whole log output (at debug level) is grepped for the keys:
none may appear, and the refused engine key is reported once as engine_auth_failed."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
from pathlib import Path

import aiohttp
import orjson

from loadgen.engine_sim.fleet import SimFleet
from loadgen.engine_sim.lengths import LengthDist
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.harness import ManagedProcess, free_port, serve_argv
from tests.integration.test_daemon_process import NotifySocket

CLIENT_KEY = "sk-client-key-4b1d"
KEYS_FILE_KEY = "sk-from-keys-file-77aa"
WRONG_CLIENT_KEY = "sk-wrong-client-9e9e"
ENGINE_KEY_A = "engine-a-secret-1234"
ENGINE_KEY_B = "engine-b-secret-5678"
WRONG_ENGINE_KEY = "engine-b-wrong-0000"
SECRETS = (CLIENT_KEY, KEYS_FILE_KEY, WRONG_CLIENT_KEY, ENGINE_KEY_A, ENGINE_KEY_B, WRONG_ENGINE_KEY)


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _spec(model: str, key: str) -> EndpointSpec:
    return EndpointSpec(
        models=(model,),
        profile="test-fast",
        load_time_s=0.0,
        output_len=LengthDist("fixed", 4.0),
        api_key=key,
    )


async def test_no_key_reaches_the_logs(tmp_path: Path) -> None:
    port, ops_port = free_port(), free_port()
    async with SimFleet([_spec("model-a", ENGINE_KEY_A), _spec("model-b", ENGINE_KEY_B)]) as fleet:
        url_a, url_b = fleet.urls
        (tmp_path / "keys.toml").write_text(f'[[keys]]\ntenant = "team"\nsha256 = "{_sha(KEYS_FILE_KEY)}"\n')
        key_b = tmp_path / "engine-b.key"
        key_b.write_text(WRONG_ENGINE_KEY + "\n")
        key_b.chmod(0o600)
        cfg = tmp_path / "gateway.toml"
        cfg.write_text(
            f'[server]\nlisten = "127.0.0.1:{port}"\nlog_level = "debug"\nadmin_token = "adm"\n'
            f'[ops]\nlisten = "127.0.0.1:{ops_port}"\n'
            '[auth]\nrequired = true\nkeys_file = "keys.toml"\n'
            f'[[tenants]]\nname = "team"\napi_key_sha256 = ["{_sha(CLIENT_KEY)}"]\nmax_concurrency = 8\n'
            f'[[endpoints]]\nid = "a"\nurl = "{url_a}"\nengine = "vllm"\napi_key_env = "ENGINE_A_KEY"\n'
            f'[[endpoints]]\nid = "b"\nurl = "{url_b}"\nengine = "vllm"\nmodels = ["model-b"]\n'
            'api_key_file = "engine-b.key"\n'
        )
        notify = NotifySocket(tmp_path / "notify.sock")
        env = {**os.environ, "NOTIFY_SOCKET": str(notify.path), "ENGINE_A_KEY": ENGINE_KEY_A}
        env.pop("BERTH_ADMIN_TOKEN", None)
        argv = serve_argv(cfg, tmp_path / "batch")
        log = tmp_path / "berth.log"
        proc = ManagedProcess("berth", argv, log_path=log, env=env)
        base = f"http://127.0.0.1:{port}"
        try:
            await notify.until("READY=1")
            async with aiohttp.ClientSession() as s:

                async def chat(model: str, key: str | None, stream: bool = False) -> int:
                    body = orjson.dumps(
                        {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
                    )
                    headers = {"Authorization": f"Bearer {key}"} if key else {}
                    async with s.post(base + "/v1/chat/completions", data=body, headers=headers) as r:
                        await r.read()
                        return r.status

                for stream in (False, True):
                    assert await chat("model-a", CLIENT_KEY, stream) == 200
                    assert await chat("model-a", KEYS_FILE_KEY, stream) == 200
                    assert await chat("model-a", WRONG_CLIENT_KEY, stream) == 401
                    assert await chat("model-a", None, stream) == 401
                    assert await chat("model-b", CLIENT_KEY, stream) == 502  # engine b refuses berth's key
                async with s.get(base + "/metrics") as r:
                    assert r.status == 404  # on the ops listener only
                async with s.get(f"http://127.0.0.1:{ops_port}/metrics") as r:
                    assert r.status == 200
                    assert 'berth_endpoint_auth_failed{endpoint="b"} 1.0' in await r.text()
                proc.send_signal(signal.SIGHUP)
                await notify.until("READY=1")
                assert await chat("model-a", KEYS_FILE_KEY) == 200
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(proc.wait, 60) == 0
        finally:
            await asyncio.to_thread(proc.stop)
            notify.sock.close()
    text = log.read_text()
    assert '"event":"serving"' in text
    assert '"event":"config_reloaded"' in text
    assert text.count('"event":"engine_auth_failed"') == 1
    assert text.count('"event":"request"') == 11
    for secret in SECRETS:
        assert secret not in text, secret
