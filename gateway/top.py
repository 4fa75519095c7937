"""`berth top`: a live terminal view of the fleet (endpoints, performance models, queues, SLO
attainment over the last minute), drawn from the gateway's `GET /admin/fleet`.

Plain ANSI, no curses: it works over SSH and in any terminal. It redraws every `--interval` seconds;
`q` or Ctrl-C exits. `--once` prints one frame without escape codes and exits (scripts, tests); it
exits 1 when the gateway cannot be read. The admin token comes from `--token` or BERTH_ADMIN_TOKEN;
without one, the gateway answers loopback clients only.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any, Final, TextIO

import orjson

from gateway.batch.view import batch_lines

DEFAULT_URL: Final = "http://127.0.0.1:8080"
FLEET_PATH: Final = "/admin/fleet"
_CLEAR: Final = "\x1b[H\x1b[2J"
_HIDE_CURSOR: Final = "\x1b[?25l"
_SHOW_CURSOR: Final = "\x1b[?25h"
_BOLD: Final = "\x1b[1m"
_RED: Final = "\x1b[31m"
_RESET: Final = "\x1b[0m"


class TopError(Exception):
    """The gateway could not be read; the message says why."""


def fetch(url: str, token: str | None, *, timeout_s: float = 5.0) -> dict[str, Any]:
    """The /admin/fleet document of the gateway at `url`."""
    req = urllib.request.Request(url.rstrip("/") + FLEET_PATH, headers={"Accept": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            body = resp.read()
    except urllib.error.HTTPError as e:
        raise TopError(f"{url}: HTTP {e.code}: {_error_message(e.read())}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise TopError(f"{url}: {reason}") from None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise TopError(f"{url}: the answer is not JSON") from None
    if not isinstance(doc, dict):
        raise TopError(f"{url}: unexpected answer")
    return doc


def _error_message(body: bytes) -> str:
    try:
        doc = orjson.loads(body)
        return str(doc["error"]["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body.decode("utf-8", "replace").strip()[:200] or "no details"


# --------------------------------------------------------------------- formatting
def _secs(v: Any) -> str:
    if not isinstance(v, int | float):
        return "-"
    if v < 1.0:
        return f"{v * 1000:.0f}ms" if v >= 0.0095 else f"{v * 1000:.1f}ms"
    if v < 600:
        return f"{v:.1f}s"
    return f"{v / 60:.0f}m"


def _pct(v: Any) -> str:
    return f"{v * 100:.0f}%" if isinstance(v, int | float) else "-"


def _by_kind(kinds: Any) -> str:
    """Interactive/batch requests the gateway runs on an endpoint."""
    if not isinstance(kinds, dict):
        return "-"
    return f"{kinds.get('interactive', 0)}/{kinds.get('batch', 0)}"


def _num(v: Any, digits: int = 0) -> str:
    if not isinstance(v, int | float):
        return "-"
    return f"{v:.{digits}f}"


def _or(v: Any, default: str) -> str:
    return default if v is None else str(v)


def _sci(v: Any) -> str:
    return f"{v:.2g}" if isinstance(v, int | float) else "-"


def _uptime(v: Any) -> str:
    if not isinstance(v, int | float):
        return "-"
    s = int(v)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> Iterator[str]:
    widths = [len(h) for h in header]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    for row in (header, *rows):
        yield "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def render(doc: dict[str, Any], *, url: str = "", color: bool = False) -> str:
    """One frame as text (no cursor movement)."""
    bold, red, reset = (_BOLD, _RED, _RESET) if color else ("", "", "")
    lines: list[str] = []
    state = "draining" if doc.get("draining") else "ready" if doc.get("ready") else "NOT READY"
    lines.append(
        f"{bold}berth {doc.get('version', '?')}{reset}  {url}  policy {doc.get('policy', '?')}  "
        f"up {_uptime(doc.get('uptime_s'))}  {state}"
    )
    fo = doc.get("fail_open") or {}
    if fo.get("active"):
        lines.append(
            f"{red}FAILING OPEN: every ready endpoint's metrics are stale "
            f"(for {_secs(fo.get('since_s'))}); routing on the gateway's own counts{reset}"
        )
    endpoints: list[dict[str, Any]] = doc.get("endpoints") or []
    lines.append("")
    lines.append(f"{bold}ENDPOINTS{reset}")
    rows = []
    for e in endpoints:
        g = e.get("gauges") or {}
        lat = e.get("latency") or {}
        age = g.get("scrape_age_s")
        rows.append(
            [
                str(e.get("id")),
                str(e.get("state")),
                str(e.get("class")),
                str(e.get("group") or "-"),
                f"{e.get('inflight', 0)}/{e.get('cap', '-')}",
                _by_kind(e.get("running_by_kind")),
                _num(g.get("running")),
                _num(g.get("waiting")),
                _pct(g.get("kv_usage")),
                _secs(age) + ("" if g.get("fresh") else "!"),
                _secs(_get(lat, "ttft_s", "ewma")),
                _secs(_get(lat, "ttft_s", "p90")),
                _secs(_get(lat, "itl_s", "ewma")),
                _secs(_get(lat, "itl_s", "p99")),
                _num(lat.get("tokens_per_s"), 1),
                _ratio(_get(e, "engine_check", "ttft", "ratio")),
            ]
        )
    # Times carry their unit in each cell (45ms, 1.2s); the rest say it in the header.
    header = ["ENDPOINT", "STATE", "CLASS", "GROUP", "INFL/CAP req", "INT/BAT req", "RUN req", "WAIT req"]
    header += ["KV %", "AGE", "TTFT", "TTFTp90", "ITL", "ITLp99", "TOK/S", "GW/ENG ratio"]
    lines.extend(_table(header, rows))

    lines.append("")
    lines.append(f"{bold}PERFORMANCE MODELS{reset} (fit error: mean abs relative error; n: observations)")
    lines.append(
        "prefill s = k1 x prompt tok + c1; decode step s = (k2 x context tok + c2) x running + c3; "
        "KV tok per request = h x context tok + j"
    )
    rows = []
    for e in endpoints:
        p = e.get("perf") or {}
        pre, dec, kv = p.get("prefill") or {}, p.get("decode") or {}, p.get("kv") or {}
        perr = e.get("prediction_error") or {}
        rows.append(
            [
                str(e.get("id")),
                _sci(pre.get("k1")),
                _sci(pre.get("c1")),
                _sci(dec.get("k2")),
                _sci(dec.get("c2")),
                _sci(dec.get("c3")),
                _sci(kv.get("h")),
                _sci(kv.get("j")),
                "/".join(_pct(x.get("mape")) for x in (pre, dec, kv)),
                "/".join(_num(x.get("n")) for x in (pre, dec, kv)),
                f"{_pct(perr.get('ttft'))}/{_pct(perr.get('itl'))}",
                _num(e.get("kv_capacity_tokens")),
            ]
        )
    header = ["ENDPOINT", "k1 s/tok", "c1 s", "k2 s/tok/req", "c2 s/req", "c3 s", "h kv/tok", "j kv/req"]
    header += ["ERR % pre/dec/kv", "n pre/dec/kv", "PRED ERR % ttft/itl", "KV CAP tok"]
    lines.extend(_table(header, rows))
    lines.extend(_prefix_lines(endpoints, bold, reset))

    lines.append("")
    lines.append(f"{bold}MODELS{reset}")
    rows = []
    for name, m in sorted((doc.get("models") or {}).items()):
        queued = m.get("queued") or {}
        by_class = " ".join(f"{c}={n}" for c, n in sorted(queued.items())) or "-"
        lat = m.get("latency") or {}
        rows.append(
            [
                name,
                str(m.get("queued_total", 0)),
                by_class,
                _secs(_get(lat, "ttft_s", "p50")),
                _secs(_get(lat, "ttft_s", "p90")),
                _secs(_get(lat, "itl_s", "p50")),
                _secs(_get(lat, "itl_s", "p99")),
                _num(lat.get("tokens_per_s"), 1),
                _num(m.get("chars_per_token"), 2),
                _pct(m.get("output_tokens_error")),
                _groups(m.get("groups") or {}),
            ]
        )
    header = ["MODEL", "QUEUED req", "BY CLASS req", "TTFTp50", "TTFTp90", "ITLp50", "ITLp99", "TOK/S"]
    header += ["CHARS/TOK", "LEN ERR %", "GROUPS (endpoints, % of demand)"]
    lines.extend(_table(header, rows))

    att = doc.get("attainment") or {}
    lines.append("")
    lines.append(f"{bold}SLO ATTAINMENT{reset} (last {_num(att.get('window_s'))}s)")
    rows = []
    for cls, a in sorted((att.get("classes") or {}).items()):
        ratio = a.get("ratio")
        text = _pct1(ratio)
        if color and isinstance(ratio, int | float) and ratio < 0.9:
            text = f"{red}{text}{reset}"
        rows.append([cls, str(a.get("finished", 0)), str(a.get("met", 0)), text])
    lines.extend(_table(["CLASS", "FINISHED req", "MET req", "ATTAINMENT %"], rows))
    lines.extend(_slo_lines(doc.get("slo") or {}, bold, reset))
    lines.extend(_lifecycle_lines(doc.get("lifecycle"), bold, reset))
    lines.extend(batch_lines(doc.get("batches"), bold, reset))
    return "\n".join(lines) + "\n"


def _prefix_lines(endpoints: Sequence[Any], bold: str, reset: str) -> list[str]:
    """The prefix index per endpoint: its source, blocks held, predicted and engine-measured hit rates."""
    rows = [
        [
            str(e.get("id")),
            str(p.get("source")),
            f"{_num(p.get('cached_blocks'))}/{_num(p.get('capacity_blocks'))}",
            _pct(p.get("predicted_hit_rate")),
            _pct(p.get("engine_hit_rate")),
            _secs(p.get("event_lag_s")),
        ]
        for e in endpoints
        if (p := e.get("prefix"))
    ]
    if not rows:
        return []
    header = ["ENDPOINT", "SOURCE", "BLOCKS held/cap", "HIT % predicted", "HIT % engine", "EVENT LAG"]
    return ["", f"{bold}PREFIX CACHE{reset}", *_table(header, rows)]


def _gib(v: Any) -> str:
    return f"{v / (1 << 30):.1f}" if isinstance(v, int | float) else "-"


def _lifecycle_lines(lc: Any, bold: str, reset: str) -> list[str]:
    """Nodes (memory per device), instances and their states, load times, evictions ([lifecycle] only)."""
    if not isinstance(lc, dict):
        return []
    lines = [
        "",
        f"{bold}NODES{reset} (evictor {lc.get('evictor', '-')}; agent errors {lc.get('agent_errors', 0)})",
    ]
    rows = []
    for n in lc.get("nodes") or []:
        devs = " ".join(
            f"{d.get('name')}:{_gib(d.get('used_bytes'))}/{_gib(d.get('capacity_bytes'))}GiB"
            for d in n.get("devices") or []
        )
        rows.append(
            [str(n.get("name")), "yes" if n.get("answered") else "NO", devs or "-", str(n.get("error") or "")]
        )
    lines.extend(_table(["NODE", "ANSWERED", "MEMORY (used/capacity)", "ERROR"], rows))
    lines.append("")
    lines.append(f"{bold}INSTANCES{reset}")
    rows = [
        [
            str(i.get("id")),
            str(i.get("model")),
            str(i.get("node")),
            str(i.get("state")),
            str(i.get("instance_class") or "-"),
            ",".join(i.get("devices") or []),
            _gib(i.get("memory_bytes")),
            _secs(i.get("load_s")),
            _secs(i.get("idle_s")),
            str(i.get("inflight", 0)),
            str(i.get("reason") or ""),
        ]
        for i in lc.get("instances") or []
    ]
    header = [
        "ID",
        "MODEL",
        "NODE",
        "STATE",
        "CLASS",
        "DEVICES",
        "GIB",
        "LOAD",
        "IDLE",
        "INFLIGHT req",
        "REASON",
    ]
    lines.extend(_table(header, rows))
    loads = lc.get("loads") or {}
    if loads:
        lines.append(
            "loads: "
            + "  ".join(f"{m} n={v.get('n')} mean={_secs(v.get('mean_s'))}" for m, v in sorted(loads.items()))
        )
    waiting = lc.get("waiting_loads") or {}
    if waiting:
        lines.append(
            "waiting for a load: " + "  ".join(f"{m} {_secs(w)}" for m, w in sorted(waiting.items()))
        )
    ev = lc.get("evictions") or {}
    lines.append("stops: " + (" ".join(f"{k}={v}" for k, v in sorted(ev.items())) or "none"))
    lines.extend(_autoscale_lines(lc.get("autoscale"), lc.get("instances") or [], bold, reset))
    return lines


def _autoscale_lines(auto: Any, instances: Sequence[Any], bold: str, reset: str) -> list[str]:
    """The autoscaler: scaler, mode, serving instances by model and class, counts, the last decision."""
    if not isinstance(auto, dict):
        return []
    mode = "DRY RUN (decides, acts on nothing)" if auto.get("dry_run") else "acting"
    lines = [
        "",
        f"{bold}AUTOSCALE{reset} ({auto.get('scaler', '-')}, {mode}, every {_secs(auto.get('interval_s'))})",
    ]
    serving: dict[str, dict[str, int]] = {}
    for i in instances:
        if isinstance(i, dict) and i.get("state") in ("pending", "starting", "ready"):
            by_class = serving.setdefault(str(i.get("model")), {})
            cls = str(i.get("instance_class") or "-")
            by_class[cls] = by_class.get(cls, 0) + 1
    counters = auto.get("dry_run_counters" if auto.get("dry_run") else "counters") or {}
    bounds = auto.get("bounds") or {}
    rows = []
    for model in sorted(set(serving) | set(counters)):
        b = bounds.get(model) or {}
        c = counters.get(model) or {}
        classes = serving.get(model) or {}
        rows.append(
            [
                model,
                " ".join(f"{k}={v}" for k, v in sorted(classes.items())) or "0",
                f"{b.get('min_instances', 0)}..{_or(b.get('max_instances'), '∞')}",
                str(c.get("started", 0)),
                str(c.get("retired", 0)),
                str(c.get("reclassed", 0)),
                _num(c.get("hysteresis"), 2),
            ]
        )
    header = ["MODEL", "SERVING by class", "MIN..MAX", "STARTED", "RETIRED", "RECLASSED", "HYSTERESIS"]
    lines.extend(_table(header, rows))
    recent = auto.get("recent") or []
    if recent:
        d = recent[0]
        what = str(d.get("action"))
        if d.get("instance"):
            what += f" {d.get('instance')}"
        if d.get("instance_class"):
            what += f" {d.get('instance_class')}"
        if d.get("action") == "scale_out":
            what += f" x{d.get('count')}"
            if d.get("config"):
                what += f" config {d.get('config')}"
        note = f" ({d.get('note')})" if d.get("note") else ""
        lines.append(
            f"last decision: {d.get('model')} {what}: {d.get('reason') or '-'} -> {d.get('outcome')}{note}"
        )
    fails = auto.get("start_failures") or {}
    if fails:
        lines.append("failed starts: " + "  ".join(f"{m}={n}" for m, n in sorted(fails.items())))
    return lines


def _slo_lines(slo: dict[str, Any], bold: str, reset: str) -> list[str]:
    """Goodput per SLO class since start, admission outcomes and rejections by reason."""
    classes: dict[str, Any] = slo.get("classes") or {}
    if not classes:
        return []
    lines = ["", f"{bold}SLO CLASSES{reset} (since start; default {slo.get('default_class', '-')})"]
    rows = []
    for cls, c in classes.items():
        adm = c.get("admission") or {}
        rej = c.get("rejections") or {}
        rows.append(
            [
                cls,
                str(c.get("kind") or "-"),
                str(c.get("band") if c.get("band") is not None else "-"),
                str(c.get("finished", 0)),
                _pct1(c.get("goodput")),
                " ".join(f"{k}={v}" for k, v in sorted(adm.items())) or "-",
                " ".join(f"{k}={v}" for k, v in sorted(rej.items())) or "-",
                str(c.get("on_infeasible") or "-"),
            ]
        )
    header = ["CLASS", "KIND", "BAND", "FINISHED req", "GOODPUT %", "ADMISSION req", "REJECTED req (reason)"]
    header += ["INFEASIBLE"]
    lines.extend(_table(header, rows))
    tasks = slo.get("tasks") or {}
    if tasks:
        lines.append(
            f"tasks: {tasks.get('active', 0)} active, {tasks.get('expired', 0)} expired, "
            f"{tasks.get('evicted', 0)} evicted (max {tasks.get('max_tasks', '-')})"
        )
    return lines


def _groups(groups: dict[str, Any]) -> str:
    """`decode=4 (63%) context=2 (37%)`, or - without endpoint groups."""
    parts = [
        f"{name}={len(g.get('endpoints') or [])}"
        + (f" ({_pct(g.get('share'))})" if g.get("share") is not None else "")
        for name, g in groups.items()
    ]
    return " ".join(parts) or "-"


def _ratio(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, int | float) else "-"


def _pct1(v: Any) -> str:
    return f"{v * 100:.1f}%" if isinstance(v, int | float) else "-"


# --------------------------------------------------------------------- the loop
def run(
    url: str, token: str | None, *, once: bool, interval_s: float = 1.0, out: TextIO | None = None
) -> int:
    out = out or sys.stdout
    if once:
        try:
            doc = fetch(url, token)
        except TopError as e:
            print(f"berth top: {e}", file=sys.stderr)
            return 1
        out.write(render(doc, url=url))
        out.flush()
        return 0
    with _keys() as key_pressed:
        out.write(_HIDE_CURSOR)
        try:
            while True:
                try:
                    frame = render(fetch(url, token), url=url, color=True)
                except TopError as e:
                    frame = f"berth top: {e}\n(retrying every {interval_s:g}s; q quits)\n"
                width = shutil.get_terminal_size().columns
                # lines with escape codes are short section titles; the rest are clipped to the screen
                clipped = "\n".join(line if "\x1b" in line else line[:width] for line in frame.split("\n"))
                out.write(_CLEAR + clipped)
                out.flush()
                if key_pressed(interval_s) in ("q", "Q"):
                    return 0
        except KeyboardInterrupt:
            return 0
        finally:
            out.write(_SHOW_CURSOR + "\n")
            out.flush()


@contextlib.contextmanager
def _keys() -> Iterator[Any]:
    """A function `wait(seconds) -> key or None`: single key presses without Enter when stdin is a
    terminal (cbreak mode, restored on exit); otherwise it only waits."""
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    if fd is None:

        def sleep_only(timeout_s: float) -> str | None:
            time.sleep(timeout_s)
            return None

        yield sleep_only
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)

        def wait(timeout_s: float) -> str | None:
            ready, _, _ = select.select([fd], [], [], timeout_s)
            return os.read(fd, 1).decode("utf-8", "replace") if ready else None

        yield wait
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
