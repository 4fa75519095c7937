"""`SqliteBatchStore`: the embedded `BatchStore`, one SQLite database (the standard library's `sqlite3`)
in the batch directory.

Every call runs on one worker thread of its own, never on the event loop: SQLite calls block (on disk,
on fsync), and one thread owning the one connection serializes the transactions without locks. A call
is a whole transaction in one function (`_tx`), so no other call's statements interleave with it
(with an async wrapper such as aiosqlite every statement is its own await, and a transaction spanning
several would have to be guarded by hand). WAL journal with `synchronous=NORMAL`: a committed
transaction survives the process being killed (SIGKILL), which is the crash this store is built for.

Records are kept as msgspec JSON documents beside the columns they are looked up by.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec

from gateway.batch.model import FINAL, BatchRecord, FileRecord, InputLine, LineResult
from gateway.batch.store import PageKey

T = TypeVar("T")

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY, id TEXT UNIQUE NOT NULL, owner TEXT NOT NULL, purpose TEXT NOT NULL,
    expires_at INTEGER, doc BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY, id TEXT UNIQUE NOT NULL, owner TEXT NOT NULL, final INTEGER NOT NULL,
    doc BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT NOT NULL, offset INTEGER NOT NULL,
    length INTEGER NOT NULL, PRIMARY KEY (batch_id, line)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS answers (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, ok INTEGER NOT NULL, doc BLOB NOT NULL,
    PRIMARY KEY (batch_id, line)) WITHOUT ROWID;
"""
#: Lines after a given one without an answer, in line order.
_PENDING: Final = """
SELECT l.line, l.custom_id, l.offset, l.length FROM lines l
WHERE l.batch_id = ? AND l.line > ?
  AND NOT EXISTS (SELECT 1 FROM answers a WHERE a.batch_id = l.batch_id AND a.line = l.line)
ORDER BY l.line LIMIT ?
"""
_PAGE: Final = 512  # answers read per query while exporting

#: A record's creation time, read from its document (the cluster-wide order of pages: created_at, id).
_CREATED: Final = "json_extract(CAST(doc AS TEXT), '$.created_at')"

_enc = msgspec.json.Encoder()
_file = msgspec.json.Decoder(FileRecord)
_batch = msgspec.json.Decoder(BatchRecord)


class SqliteBatchStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="berth-batch-store")

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        db = self._db
        if db is None:
            raise RuntimeError("the batch store is not open")
        with db:  # commits on success, rolls back on an exception
            yield db

    # ----------------------------------------------------------------- life
    async def open(self) -> None:
        await self._call(self._open)

    def _open(self) -> None:
        if self._db is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        db.isolation_level = "DEFERRED"  # transactions begin implicitly; `with db` commits them
        self._db = db

    async def close(self) -> None:
        await self._call(self._close)
        self._thread.shutdown(wait=True)

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    # ----------------------------------------------------------------- files
    async def add_file(self, rec: FileRecord) -> None:
        await self._call(self._add_files, (rec,))

    def _add_files(self, recs: Sequence[FileRecord]) -> None:
        with self._tx() as db:
            self._insert_files(db, recs)

    @staticmethod
    def _insert_files(db: sqlite3.Connection, recs: Sequence[FileRecord]) -> None:
        db.executemany(
            "INSERT INTO files (id, owner, purpose, expires_at, doc) VALUES (?, ?, ?, ?, ?)",
            [(r.id, r.owner, r.purpose, r.expires_at, _enc.encode(r)) for r in recs],
        )

    async def get_file(self, owner: str | None, file_id: str) -> FileRecord | None:
        return await self._call(self._get_file, owner, file_id)

    def _get_file(self, owner: str | None, file_id: str) -> FileRecord | None:
        with self._tx() as db:
            row = db.execute("SELECT owner, doc FROM files WHERE id = ?", (file_id,)).fetchone()
        if row is None or (owner is not None and row[0] != owner):
            return None
        return _file.decode(row[1])

    async def list_files(
        self, owner: str, *, purpose: str | None, after: str | None, limit: int, ascending: bool
    ) -> tuple[list[FileRecord], bool]:
        return await self._call(self._list_files, owner, purpose, after, limit, ascending)

    def _list_files(
        self, owner: str, purpose: str | None, after: str | None, limit: int, ascending: bool
    ) -> tuple[list[FileRecord], bool]:
        where, args = ["owner = ?"], [owner]
        if purpose is not None:
            where.append("purpose = ?")
            args.append(purpose)
        order = "ASC" if ascending else "DESC"
        if after is not None:
            where.append(f"seq {'>' if ascending else '<'} (SELECT seq FROM files WHERE id = ?)")
            args.append(after)
        sql = f"SELECT doc FROM files WHERE {' AND '.join(where)} ORDER BY seq {order} LIMIT ?"
        with self._tx() as db:
            rows = db.execute(sql, (*args, limit + 1)).fetchall()
        return [_file.decode(r[0]) for r in rows[:limit]], len(rows) > limit

    async def page_files(
        self, owner: str, *, purpose: str | None, key: PageKey | None, limit: int, ascending: bool
    ) -> tuple[list[FileRecord], bool]:
        return await self._call(self._page, "files", owner, purpose, (key, limit, ascending))

    async def delete_file(self, owner: str | None, file_id: str) -> FileRecord | None:
        return await self._call(self._delete_file, owner, file_id)

    def _delete_file(self, owner: str | None, file_id: str) -> FileRecord | None:
        rec = self._get_file(owner, file_id)
        if rec is not None:
            with self._tx() as db:
                db.execute("DELETE FROM files WHERE id = ?", (file_id,))
        return rec

    async def expired_files(self, now: int) -> list[FileRecord]:
        return await self._call(self._expired_files, now)

    def _expired_files(self, now: int) -> list[FileRecord]:
        busy = {b.input_file_id for b in self._unfinished()}
        with self._tx() as db:
            rows = db.execute(
                "SELECT doc FROM files WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,)
            ).fetchall()
        return [f for f in (_file.decode(r[0]) for r in rows) if f.id not in busy]

    async def file_ids(self) -> set[str]:
        return await self._call(self._file_ids)

    def _file_ids(self) -> set[str]:
        with self._tx() as db:
            return {r[0] for r in db.execute("SELECT id FROM files")}

    # ----------------------------------------------------------------- batches
    async def add_batch(self, rec: BatchRecord) -> None:
        await self._call(self._add_batch, rec)

    def _add_batch(self, rec: BatchRecord) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO batches (id, owner, final, doc) VALUES (?, ?, ?, ?)",
                (rec.id, rec.owner, rec.status in FINAL, _enc.encode(rec)),
            )

    async def get_batch(self, owner: str | None, batch_id: str) -> BatchRecord | None:
        return await self._call(self._get_batch, owner, batch_id)

    def _get_batch(self, owner: str | None, batch_id: str) -> BatchRecord | None:
        with self._tx() as db:
            row = db.execute("SELECT owner, doc FROM batches WHERE id = ?", (batch_id,)).fetchone()
        if row is None or (owner is not None and row[0] != owner):
            return None
        return _batch.decode(row[1])

    async def list_batches(
        self, owner: str, *, after: str | None, limit: int
    ) -> tuple[list[BatchRecord], bool]:
        return await self._call(self._list_batches, owner, after, limit)

    def _list_batches(self, owner: str, after: str | None, limit: int) -> tuple[list[BatchRecord], bool]:
        sql = "SELECT doc FROM batches WHERE owner = ?"
        args: tuple[object, ...] = (owner,)
        if after is not None:
            sql += " AND seq < (SELECT seq FROM batches WHERE id = ?)"
            args = (owner, after)
        with self._tx() as db:
            rows = db.execute(sql + " ORDER BY seq DESC LIMIT ?", (*args, limit + 1)).fetchall()
        return [_batch.decode(r[0]) for r in rows[:limit]], len(rows) > limit

    async def page_batches(
        self, owner: str, *, key: PageKey | None, limit: int
    ) -> tuple[list[BatchRecord], bool]:
        return await self._call(self._page, "batches", owner, None, (key, limit, False))

    def _page(
        self, table: str, owner: str, purpose: str | None, at: tuple[PageKey | None, int, bool]
    ) -> tuple[list[Any], bool]:
        key, limit, ascending = at
        where: list[str] = ["owner = ?"]
        args: list[object] = [owner]
        if purpose is not None:
            where.append("purpose = ?")
            args.append(purpose)
        cmp, order = (">", "ASC") if ascending else ("<", "DESC")
        if key is not None:
            where.append(f"({_CREATED}, id) {cmp} (?, ?)")
            args += [key[0], key[1]]
        sql = (
            f"SELECT doc FROM {table} WHERE {' AND '.join(where)} "
            f"ORDER BY {_CREATED} {order}, id {order} LIMIT ?"
        )
        with self._tx() as db:
            rows = db.execute(sql, (*args, limit + 1)).fetchall()
        dec = _file if table == "files" else _batch
        return [dec.decode(r[0]) for r in rows[:limit]], len(rows) > limit

    async def put_batch(self, rec: BatchRecord) -> None:
        """Replace the batch's record, keeping the counts the store holds (see `BatchStore`)."""
        await self._call(self._put_batch, rec)

    def _put_batch(self, rec: BatchRecord) -> None:
        # The counts are the store's: answers recorded since the caller read `rec` must not be undone.
        with self._tx() as db:
            row = db.execute("SELECT doc FROM batches WHERE id = ?", (rec.id,)).fetchone()
            if row is not None:
                now = _batch.decode(row[0])
                rec = msgspec.structs.replace(
                    rec,
                    completed=now.completed,
                    failed=now.failed,
                    input_tokens=now.input_tokens,
                    cached_tokens=now.cached_tokens,
                    output_tokens=now.output_tokens,
                )
            self._update(db, rec)

    @staticmethod
    def _update(db: sqlite3.Connection, rec: BatchRecord) -> None:
        db.execute(
            "UPDATE batches SET final = ?, doc = ? WHERE id = ?",
            (rec.status in FINAL, _enc.encode(rec), rec.id),
        )

    async def unfinished(self) -> list[BatchRecord]:
        return await self._call(self._unfinished)

    def _unfinished(self) -> list[BatchRecord]:
        with self._tx() as db:
            rows = db.execute("SELECT doc FROM batches WHERE final = 0 ORDER BY seq").fetchall()
        return [_batch.decode(r[0]) for r in rows]

    async def start_batch(self, rec: BatchRecord, lines: Sequence[InputLine]) -> None:
        await self._call(self._start_batch, rec, lines)

    def _start_batch(self, rec: BatchRecord, lines: Sequence[InputLine]) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM lines WHERE batch_id = ?", (rec.id,))  # a validation cut short before
            db.executemany(
                "INSERT INTO lines (batch_id, line, custom_id, offset, length) VALUES (?, ?, ?, ?, ?)",
                [(rec.id, x.line, x.custom_id, x.offset, x.length) for x in lines],
            )
            self._update(db, rec)

    # ----------------------------------------------------------------- lines and answers
    async def pending(self, batch_id: str, after_line: int, limit: int) -> list[InputLine]:
        return await self._call(self._pending, batch_id, after_line, limit)

    def _pending(self, batch_id: str, after_line: int, limit: int) -> list[InputLine]:
        with self._tx() as db:
            rows = db.execute(_PENDING, (batch_id, after_line, limit)).fetchall()
        return [InputLine(*r) for r in rows]

    async def record_result(self, batch_id: str, result: LineResult) -> BatchRecord | None:
        return await self._call(self._record_result, batch_id, result)

    def _record_result(self, batch_id: str, r: LineResult) -> BatchRecord | None:
        with self._tx() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO answers (batch_id, line, ok, doc) VALUES (?, ?, ?, ?)",
                (batch_id, r.line, r.ok, r.document),
            )
            if cur.rowcount != 1:
                return None
            row = db.execute("SELECT doc FROM batches WHERE id = ?", (batch_id,)).fetchone()
            rec = _batch.decode(row[0])
            rec = msgspec.structs.replace(
                rec,
                completed=rec.completed + r.ok,
                failed=rec.failed + (not r.ok),
                input_tokens=rec.input_tokens + r.input_tokens,
                cached_tokens=rec.cached_tokens + r.cached_tokens,
                output_tokens=rec.output_tokens + r.output_tokens,
            )
            self._update(db, rec)
        return rec

    async def export(
        self,
        batch_id: str,
        write: Callable[[LineResult], None],
        unanswered: Callable[[InputLine], None] | None,
    ) -> None:
        await self._call(self._export, batch_id, write, unanswered)

    def _export(
        self,
        batch_id: str,
        write: Callable[[LineResult], None],
        unanswered: Callable[[InputLine], None] | None,
    ) -> None:
        last = 0
        while True:
            with self._tx() as db:
                rows = db.execute(
                    "SELECT line, ok, doc FROM answers WHERE batch_id = ? AND line > ? ORDER BY line LIMIT ?",
                    (batch_id, last, _PAGE),
                ).fetchall()
            for line, ok, doc in rows:
                write(LineResult(line=line, ok=bool(ok), document=doc))
            if len(rows) < _PAGE:
                break
            last = rows[-1][0]
        if unanswered is None:
            return
        last = 0
        while True:
            pending = self._pending(batch_id, last, _PAGE)
            for x in pending:
                unanswered(x)
            if len(pending) < _PAGE:
                return
            last = pending[-1].line

    async def finish_batch(self, rec: BatchRecord, files: Sequence[FileRecord]) -> None:
        await self._call(self._finish_batch, rec, files)

    def _finish_batch(self, rec: BatchRecord, files: Sequence[FileRecord]) -> None:
        with self._tx() as db:
            self._insert_files(db, files)
            self._update(db, rec)
            db.execute("DELETE FROM answers WHERE batch_id = ?", (rec.id,))
            db.execute("DELETE FROM lines WHERE batch_id = ?", (rec.id,))
