"""The running batches as the admin document shows them (`GET /admin/fleet`, `batches`) and as
`berth top` draws them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gateway.batch.model import BatchRecord


def batches_document(running: Iterable[tuple[BatchRecord, int]], now: float) -> list[dict[str, Any]]:
    """One entry per batch being run: its progress, lines in flight and the time left in its window."""
    return [
        {
            "id": rec.id,
            "tenant": rec.owner,
            "endpoint": rec.endpoint,
            "model": rec.model,
            "status": rec.status.value,
            "total": rec.total,
            "completed": rec.completed,
            "failed": rec.failed,
            "in_flight": in_flight,
            "output_tokens": rec.output_tokens,
            "window_left_s": round(rec.expires_at - now, 1),
        }
        for rec, in_flight in running
    ]


def batch_lines(batches: Any, bold: str, reset: str) -> list[str]:
    """`berth top`'s BATCHES table (nothing when no batch runs)."""
    if not isinstance(batches, list) or not batches:
        return []
    header = [
        "BATCH",
        "TENANT",
        "MODEL",
        "STATUS",
        "DONE",
        "FAILED",
        "TOTAL",
        "PROGRESS %",
        "IN FLIGHT",
        "WINDOW LEFT",
    ]
    rows = []
    for b in batches:
        total = b.get("total") or 0
        done = (b.get("completed") or 0) + (b.get("failed") or 0)
        rows.append(
            [
                str(b.get("id")),
                str(b.get("tenant")),
                str(b.get("model") or "-"),
                str(b.get("status")),
                str(b.get("completed")),
                str(b.get("failed")),
                str(total),
                f"{100.0 * done / total:.1f}" if total else "-",
                str(b.get("in_flight")),
                _left(b.get("window_left_s")),
            ]
        )
    return ["", f"{bold}BATCHES{reset}", *_table(header, rows)]


def _left(v: Any) -> str:
    if not isinstance(v, int | float):
        return "-"
    if v <= 0:
        return "ended"
    h, rest = divmod(int(v), 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
