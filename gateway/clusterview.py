"""`berth cluster`: each replica's view of its cluster, from its `GET /admin/cluster` (members, leader and
fencing token, the Redis link and its round trip, each shared piece's fallback state).

`--url` may be given once per replica (default $BERTH_URL or http://127.0.0.1:8080); `--json` prints the
documents as they came. Exit status 1 when a replica cannot be read or is not in cluster mode. The admin
token comes from `--token` or BERTH_ADMIN_TOKEN, as for `berth top`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Final, TextIO

import orjson

from gateway.core.admin_read import AdminReadError, read_admin

CLUSTER_PATH: Final = "/admin/cluster"


def fetch(url: str, token: str | None, *, timeout_s: float = 5.0) -> dict[str, Any] | None:
    """The `cluster` part of /admin/cluster at `url` (None: that gateway is not in cluster mode)."""
    doc = read_admin(url, CLUSTER_PATH, token, timeout_s=timeout_s)
    if "cluster" not in doc:
        raise AdminReadError(f"{url}: unexpected answer")
    got = doc["cluster"]
    return got if isinstance(got, dict) else None


def render(url: str, doc: dict[str, Any]) -> list[str]:
    """One replica's view, as lines of text."""
    rtt = doc.get("redis_rtt_ms")
    since = doc.get("since_last_beat_s")
    lines = [
        f"replica {doc['name']} ({url})",
        f"  redis     {doc['redis']}  {doc['redis_state']}"
        + ("" if rtt is None else f"  rtt {rtt:.2f} ms")
        + f"  beats {doc['beats']}"
        + ("" if since is None else f" (last {since:.2f} s ago)"),
    ]
    if doc.get("redis_last_error"):
        lines.append(f"  error     {doc['redis_last_error']}")
    members = doc.get("members") or []
    lines.append(f"  members   {' '.join(members) if members else '-'} ({len(members)})")
    role = "leader" if doc.get("is_leader") else "follower"
    token = doc.get("fencing_token")
    lines.append(
        f"  leader    {doc.get('leader') or '-'}  fencing token {'-' if token is None else token}"
        f"  this replica: {role}"
    )
    fb = doc.get("fallback") or {}
    lines.append("  fallback  " + "  ".join(f"{k}={v}" for k, v in fb.items()))
    lim = doc.get("limits")
    if lim:
        held = ", ".join(f"{t}: {n}" for t, n in lim.get("seats_held", {}).items()) or "none"
        lines.append(
            f"  limits    seats held {held}  pending releases {lim['pending_releases']}"
            f"  local decisions {lim['fallback_admits']}  refused {lim['refused_while_down']}"
            f"  (local share 1/{lim['replicas']})"
        )
    return lines


def run(urls: Sequence[str], token: str | None, *, as_json: bool = False, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    status = 0
    docs: dict[str, Any] = {}
    for url in urls:
        try:
            doc = fetch(url, token)
        except AdminReadError as e:
            print(f"berth cluster: {e}", file=sys.stderr)
            status = 1
            continue
        if doc is None:
            print(
                f"berth cluster: {url}: not in cluster mode (no [cluster] in its gateway.toml)",
                file=sys.stderr,
            )
            status = 1
            continue
        docs[url] = doc
        if not as_json:
            print("\n".join(render(url, doc)), file=out)
    if as_json:
        out.write(orjson.dumps(docs, option=orjson.OPT_INDENT_2).decode() + "\n")
    return status
