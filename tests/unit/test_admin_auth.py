"""Who may use the admin API: a bearer token when one is configured, else loopback clients only."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from gateway.core.errors import BerthError
from gateway.front.admin import authorize, is_loopback


@pytest.mark.parametrize(
    ("remote", "loopback"),
    [
        pytest.param("127.0.0.1", True, id="v4"),
        pytest.param("127.8.9.10", True, id="v4-net"),
        pytest.param("::1", True, id="v6"),
        pytest.param("::ffff:127.0.0.1", True, id="v4-mapped"),
        pytest.param("10.0.0.7", False, id="private"),
        pytest.param("::ffff:10.0.0.7", False, id="v4-mapped-remote"),
        pytest.param("2001:db8::1", False, id="v6-remote"),
        pytest.param("", False, id="empty"),
        pytest.param(None, False, id="unknown"),
        pytest.param("not-an-ip", False, id="garbage"),
    ],
)
def test_is_loopback(remote: str | None, loopback: bool) -> None:
    assert is_loopback(remote) is loopback


def _request(remote: str, authorization: str | None = None) -> web.Request:
    headers = {"Authorization": authorization} if authorization is not None else None
    return make_mocked_request("GET", "/admin/fleet", headers=headers).clone(remote=remote)


@pytest.mark.parametrize(
    ("token", "remote", "authorization", "status"),
    [
        pytest.param("", "127.0.0.1", None, None, id="no-token-loopback"),
        pytest.param("", "10.0.0.7", None, 403, id="no-token-remote"),
        pytest.param("", "10.0.0.7", "Bearer guess", 403, id="no-token-remote-any-bearer"),
        pytest.param("s3cret", "10.0.0.7", "Bearer s3cret", None, id="token-remote"),
        pytest.param("s3cret", "127.0.0.1", "bearer s3cret", None, id="scheme-case-insensitive"),
        pytest.param("s3cret", "127.0.0.1", None, 401, id="token-missing-even-on-loopback"),
        pytest.param("s3cret", "10.0.0.7", "Bearer wrong", 401, id="token-wrong"),
        pytest.param("s3cret", "10.0.0.7", "Basic s3cret", 401, id="wrong-scheme"),
        pytest.param("s3cret", "10.0.0.7", "Bearer ", 401, id="empty-bearer"),
    ],
)
def test_authorize(token: str, remote: str, authorization: str | None, status: int | None) -> None:
    req = _request(remote, authorization)
    if status is None:
        authorize(req, token)
        return
    with pytest.raises(BerthError) as e:
        authorize(req, token)
    assert e.value.status == status
    assert e.value.body()["error"]["code"] == ("invalid_api_key" if status == 401 else "forbidden")
