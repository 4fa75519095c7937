"""The batch runner's feeder: opening and resuming the store, validating a new batch, feeding lines to
the gateway as capacity frees, recording each answer durably, and finalizing a batch into its output
and error files. `gateway.batch.runner.BatchRunner` is this with the Batches API's operations on top.

Feeding: at most `max_lines_in_flight` lines of all batches are in the gateway (its queue or an engine)
at once, read from the store a page at a time, the batch whose window ends first before the others: a
50,000-line batch never has more than that many requests in memory. A line the gateway has no room for
(queue full, a tenant's limit, no ready endpoint) is tried again, until its window ends.

Durability: a line's answer is committed before it counts; a restart (after SIGTERM or SIGKILL) resumes
every unfinished batch from the store, feeding only the lines without an answer, so a line answered
before the crash appears once in the output and a line in flight at the crash runs again.

Ending: when every line has an answer the batch is `completed`; at the window's end, what runs is
aborted and the lines without an answer go to the error file as `batch_expired` (`expired`); a cancel
stops feeding, aborts what runs and keeps what finished (`cancelled`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import msgspec
import structlog

from gateway.batch.files import FileBytes
from gateway.batch.finalize import finalize
from gateway.batch.lines import LineAnswer, LineRequest, LineRunner, answered
from gateway.batch.metrics import BatchMetrics
from gateway.batch.model import BatchRecord, BatchStatus, InputLine, LineError
from gateway.batch.store import BatchStore
from gateway.batch.validate import Scan, body_of, scan
from gateway.core.tasks import TaskSupervisor

log = structlog.get_logger("berth.batch")

FINALIZE_RETRY_S: Final = 30.0  # after finalizing failed (a full disk)
FILE_SWEEP_S: Final = 60.0  # between two looks for expired files


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """[batch], resolved."""

    dir: Path
    max_lines_in_flight: int = 64
    max_file_bytes: int = 200 * 1024 * 1024
    max_lines: int = 50_000
    file_expiry_s: int = 30 * 86400
    max_window_s: float = 30 * 86400.0
    retry_s: float = 1.0
    # Cluster mode: this replica's tag in the ids of the files and batches it makes (model.replica_tag).
    id_tag: str = ""


class _NotNow(Exception):
    """A line the gateway had no room for, while it takes no lines at all (it drains)."""


@dataclass(eq=False)
class ActiveBatch:
    """A batch being run: its record (the store's, counts included) and what of it is being fed."""

    rec: BatchRecord
    cursor: int = 0  # the last line fed
    exhausted: bool = False  # no line after the cursor lacks an answer
    running: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    retry_at: float = 0.0  # finalizing failed: not again before this (unix seconds)


class BatchFeeder:
    """The runner's engine room (`BatchRunner` adds the API's operations): its life, validation,
    feeding and finalizing."""

    def __init__(
        self,
        store: BatchStore,
        settings: BatchSettings,
        lines: LineRunner,
        metrics: BatchMetrics,
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.settings = settings
        self.files = FileBytes(settings.dir / "files")
        self.lines = lines
        self.metrics = metrics
        self.wall = wall  # unix seconds: windows and expiries (tests drive it)
        self._active: dict[str, ActiveBatch] = {}
        self._tasks = TaskSupervisor()
        self._wake = asyncio.Event()
        self._room = asyncio.Condition()  # lines waiting to be tried again (`_attempt`)
        self._opened = False
        self._open_lock = asyncio.Lock()
        self._next_sweep = 0.0
        self._ended: dict[str, asyncio.Event] = {}  # batches someone waits for (`wait_ended`)

    @property
    def db_path(self) -> Path:
        return self.settings.dir / "batch.sqlite3"

    # ----------------------------------------------------------------- life
    async def ensure_open(self) -> None:
        """Open (creating on first use) the store; resume what it holds."""
        if self._opened:
            return
        async with self._open_lock:
            if not self._opened:
                await self._open()

    async def _open(self) -> None:
        await self.store.open()
        removed = await asyncio.to_thread(self.files.sweep, await self.store.file_ids())
        if removed:
            log.info("batch_files_swept", files=len(removed))
        for rec in await self.store.unfinished():
            answered = rec.completed + rec.failed
            log.info("batch_resumed", batch_id=rec.id, status=rec.status.value, answered=answered)
            self._active[rec.id] = ActiveBatch(rec)
        self._opened = True
        self.poke()

    async def run(self) -> None:
        """The feeder (a supervised task): resumes the store found on disk, then feeds until cancelled."""
        if self.db_path.exists():
            await self.ensure_open()
        while True:
            self._wake.clear()
            timeout = await self.step() if self._opened else None
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def drain(self, timeout_s: float) -> None:
        """Let the lines in flight finish, for up to `timeout_s` (no new line starts: the gateway is
        draining); those still running after it are aborted by `close` and run again after a restart."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while any(a.running for a in self._active.values()):
                    await asyncio.wait([t for a in self._active.values() for t in a.running.values()])

    async def close(self) -> None:
        await self._tasks.close()  # lines in flight: aborted, run again after a restart
        if self._opened:
            await self.store.close()

    def poke(self) -> None:
        """Look again now (a line ended, a batch came, a test moved the clock)."""
        self._wake.set()

    # ----------------------------------------------------------------- validation
    async def _validate(self, rec: BatchRecord) -> BatchRecord:
        path = self.files.path(rec.input_file_id)
        check = self.lines.checker()
        try:
            found = await asyncio.to_thread(scan, path, rec.endpoint, self.settings.max_lines, check)
        except OSError as e:
            found = Scan()
            found.errors.append(
                LineError(
                    code="input_file_unreadable", message=f"the input file cannot be read: {e.strerror or e}"
                )
            )
        problems = found.errors
        now = int(self.wall())
        if problems:
            rec = msgspec.structs.replace(
                rec, status=BatchStatus.FAILED, failed_at=now, errors=tuple(problems)
            )
            await self.store.put_batch(rec)
            self.metrics.finished.labels(rec.status.value).inc()
            log.info("batch_failed", batch_id=rec.id, errors=len(problems), first=problems[0].message)
            return rec
        rec = msgspec.structs.replace(
            rec, status=BatchStatus.IN_PROGRESS, in_progress_at=now, total=len(found.lines), model=found.model
        )
        await self.store.start_batch(rec, found.lines)
        self._active[rec.id] = ActiveBatch(rec)
        log.info("batch_started", batch_id=rec.id, lines=rec.total, endpoint=rec.endpoint, owner=rec.owner)
        self.poke()
        return rec

    # ----------------------------------------------------------------- feeding
    async def step(self) -> float | None:
        """End, finalize and feed what is due; seconds until the next timed look (None: none due)."""
        now = self.wall()
        order = sorted(self._active.values(), key=lambda a: (a.rec.expires_at, a.rec.created_at))
        for a in order:
            await self._advance(a, now)
        free = self.settings.max_lines_in_flight - sum(len(a.running) for a in self._active.values())
        accepting = self.lines.accepting()
        if accepting:
            for a in order:
                if free <= 0:
                    break
                if a.rec.status is BatchStatus.IN_PROGRESS and not a.exhausted:
                    free -= await self._feed(a, free)
        self.metrics.in_flight.set(sum(len(a.running) for a in self._active.values()))
        self.metrics.active.set(len(self._active))
        if now >= self._next_sweep:
            self._next_sweep = now + FILE_SWEEP_S
            await self._expire_files(int(now))
        due: list[float] = [
            a.rec.expires_at for a in self._active.values() if a.rec.status is BatchStatus.IN_PROGRESS
        ]
        due += [a.retry_at for a in self._active.values() if a.retry_at]
        due.append(self._next_sweep)
        if not accepting and any(not a.exhausted for a in self._active.values()):
            due.append(now + self.settings.retry_s)  # look again when the gateway may be ready
        return max(0.0, min(due) - now)

    async def _advance(self, a: ActiveBatch, now: float) -> None:
        rec = a.rec
        status = rec.status
        if status is BatchStatus.VALIDATING:  # cut short by a restart
            del self._active[rec.id]
            await self._validate(rec)
            return
        if status is BatchStatus.IN_PROGRESS and now >= rec.expires_at:
            await self._begin_end(a, BatchStatus.EXPIRED)
        elif status is BatchStatus.CANCELLING:
            await self._begin_end(a, BatchStatus.CANCELLED)
        elif status is BatchStatus.IN_PROGRESS and not a.running and rec.completed + rec.failed >= rec.total:
            await self._begin_end(a, BatchStatus.COMPLETED)
        elif status is BatchStatus.IN_PROGRESS and not a.running and a.exhausted:
            # Lines without an answer behind the cursor (their answer could not be written): from the top.
            a.cursor, a.exhausted = 0, False
        if a.rec.status is BatchStatus.FINALIZING and not a.running and now >= a.retry_at:
            await self._finalize(a)

    async def _begin_end(self, a: ActiveBatch, ending: BatchStatus) -> None:
        """Stop the batch's lines and mark it finalizing (ending as `ending`)."""
        for task in a.running.values():
            task.cancel()
        a.rec = msgspec.structs.replace(
            a.rec, status=BatchStatus.FINALIZING, finalizing_at=int(self.wall()), ending=ending
        )
        await self.store.put_batch(a.rec)
        if a.running:
            await asyncio.gather(*a.running.values(), return_exceptions=True)

    async def _feed(self, a: ActiveBatch, free: int) -> int:
        pending = await self.store.pending(a.rec.id, a.cursor, free + len(a.running))
        if len(pending) < free + len(a.running):
            a.exhausted = True
        pending = [x for x in pending if x.line not in a.running][:free]  # not twice at once
        if not pending:
            return 0
        a.cursor = pending[-1].line
        try:
            bodies = await self.files.read_lines(a.rec.input_file_id, pending)
        except OSError as e:
            log.error("batch_input_unreadable", batch_id=a.rec.id, error=str(e))
            a.cursor, a.exhausted, a.retry_at = pending[0].line - 1, False, self.wall() + FINALIZE_RETRY_S
            return 0
        for x, raw in zip(pending, bodies, strict=True):
            name = f"batch-line:{a.rec.id}:{x.line}"
            a.running[x.line] = self._tasks.spawn(
                name, functools.partial(self._line, a, x, raw), restart=False
            )
        return len(pending)

    async def _line(self, a: ActiveBatch, x: InputLine, raw: bytes) -> None:
        rid = f"{a.rec.id}-{x.line}"
        try:
            body = body_of(raw)
            answer = await self._attempt(a, body, rid)
            result = answered(x, answer, rid)
            rec = await self.store.record_result(a.rec.id, result)
            if rec is not None:
                a.rec = _with_counts(a.rec, rec)
                self.metrics.lines.labels("ok" if result.ok else "error").inc()
                self.metrics.tokens.labels("input").inc(result.input_tokens)
                self.metrics.tokens.labels("output").inc(result.output_tokens)
        except _NotNow:  # the gateway stopped taking lines (a drain): fed again when it takes them
            a.cursor = min(a.cursor, x.line - 1)
            a.exhausted = False
        except Exception:
            # Not answered (the store failed to write it: a full disk): fed again later.
            log.exception("batch_line_failed", batch_id=a.rec.id, line=x.line)
            a.cursor = min(a.cursor, x.line - 1)
            a.exhausted = False
        finally:
            a.running.pop(x.line, None)
            self.poke()
            async with self._room:  # held only for an instant by anyone: no wait here
                self._room.notify(1)

    async def _attempt(self, a: ActiveBatch, body: bytes, rid: str) -> LineAnswer:
        while True:
            rec = a.rec
            answer = await self.lines.run(
                LineRequest(rec.owner, rec.endpoint, body, float(rec.expires_at), rid)
            )
            if answer.retry_after_s is None:
                return answer
            self.metrics.retries.inc()
            if not self.lines.accepting():
                raise _NotNow
            # Until the refusal's Retry-After, or sooner when a line ends (its seat, queue place or
            # token charge is free then): one waiter is woken per line that ends.
            async with self._room:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(answer.retry_after_s, self.settings.retry_s)):
                        await self._room.wait()

    # ----------------------------------------------------------------- finalizing
    async def _finalize(self, a: ActiveBatch) -> None:
        ending = a.rec.ending or BatchStatus.COMPLETED
        try:
            rec, expired_lines = await finalize(
                self.store,
                self.files,
                a.rec,
                now=int(self.wall()),
                file_expiry_s=a.rec.output_expiry_s or self.settings.file_expiry_s,
            )
        except Exception as e:  # a full disk (OSError, or the store's own error): tried again later
            a.retry_at = self.wall() + FINALIZE_RETRY_S
            self.metrics.finalize_failures.inc()
            log.error("batch_finalize_failed", batch_id=a.rec.id, error=str(e), retry_s=FINALIZE_RETRY_S)
            return
        del self._active[rec.id]
        ended = self._ended.pop(rec.id, None)
        if ended is not None:
            ended.set()
        self.metrics.finished.labels(ending.value).inc()
        if expired_lines:
            self.metrics.lines.labels("expired").inc(expired_lines)
        log.info(
            "batch_finished", batch_id=rec.id, status=ending.value, completed=rec.completed, failed=rec.failed
        )

    async def _expire_files(self, now: int) -> None:
        for f in await self.store.expired_files(now):
            await self.store.delete_file(None, f.id)
            await self.files.remove(f.id)
            log.info("batch_file_expired", file_id=f.id)


def _with_counts(rec: BatchRecord, stored: BatchRecord) -> BatchRecord:
    """`rec` (the runner's, whose status may be newer) with the counts of the store's record."""
    return msgspec.structs.replace(
        rec,
        completed=stored.completed,
        failed=stored.failed,
        input_tokens=stored.input_tokens,
        cached_tokens=stored.cached_tokens,
        output_tokens=stored.output_tokens,
    )
