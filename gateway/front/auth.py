"""The front's auth phase: which tenant a request's API key belongs to, and 401 when one is required.

A key is read from `Authorization: Bearer KEY`, else from `api-key: KEY` (what Azure-style OpenAI SDKs
send). With `[auth] required = true` a request without a key, or with a key of no tenant, gets 401
invalid_api_key in the OpenAI shape (with `WWW-Authenticate: Bearer`); otherwise such a request is
served as "anonymous" (no tenant defaults, no tenant limits). Neither the key nor its hash is ever
logged or echoed.
"""

from __future__ import annotations

from typing import Final

from aiohttp import hdrs
from multidict import CIMultiDictProxy, istr

from gateway.admission.slo import Tenant, presented_key
from gateway.core import errors
from gateway.front.services import RequestSettings

API_KEY_HEADER: Final = "api-key"
_API_KEY: Final = istr(API_KEY_HEADER)  # looked up without folding its case on every request
WWW_AUTHENTICATE: Final = {"WWW-Authenticate": 'Bearer realm="berth"'}


def authenticate(settings: RequestSettings, headers: CIMultiDictProxy[str]) -> Tenant | None:
    """The request's tenant (None: anonymous); raises 401 when [auth] requires a tenant's key."""
    authorization = headers.get(hdrs.AUTHORIZATION)
    api_key = headers.get(_API_KEY)
    tenant = settings.tenants.lookup(authorization, api_key)
    if tenant is None and settings.auth_required:
        if presented_key(authorization, api_key) is None:
            raise errors.unauthorized(
                "this gateway needs an API key: send 'Authorization: Bearer <key>' (or 'api-key: <key>')"
            )
        raise errors.unauthorized("invalid API key")
    return tenant
