"""Finalizing a batch: its output file (answers with status 200) and error file (the other answers, and
`batch_expired` for the lines left when the window ended), in line order, fsynced before the store
records them with the batch's final record. The files are written by the store's export, off the event
loop."""

from __future__ import annotations

import asyncio
import os
from typing import BinaryIO

import msgspec

from gateway.batch.files import FileBytes
from gateway.batch.lines import expired
from gateway.batch.model import (
    PURPOSE_OUTPUT,
    BatchRecord,
    BatchStatus,
    FileRecord,
    InputLine,
    LineResult,
    new_id,
    tag_of,
)
from gateway.batch.store import BatchStore

_STAMP = {
    BatchStatus.COMPLETED: "completed_at",
    BatchStatus.EXPIRED: "expired_at",
    BatchStatus.CANCELLED: "cancelled_at",
}


async def finalize(
    store: BatchStore, files: FileBytes, rec: BatchRecord, *, now: int, file_expiry_s: int
) -> tuple[BatchRecord, int]:
    """Write and record the output and error files of `rec` (finalizing), and its final record (its
    status `rec.ending`); the final record and the lines it left expired. Raises on a failure, having
    removed what it wrote (the batch stays finalizing)."""
    ending = rec.ending or BatchStatus.COMPLETED
    out = Outputs(files, rec.id, expired=ending is BatchStatus.EXPIRED)
    try:
        files.ensure()
        await store.export(rec.id, out.write, out.unanswered if out.expired else None)
        await asyncio.to_thread(out.commit)
        written = [
            FileRecord(
                id=fid,
                owner=rec.owner,
                purpose=PURPOSE_OUTPUT,
                filename=f"{rec.id}_{kind}.jsonl",
                bytes=size,
                created_at=now,
                expires_at=now + file_expiry_s,
            )
            for kind, fid, size in out.written()
        ]
        rec = msgspec.structs.replace(
            rec,
            status=ending,
            ending=None,
            output_file_id=out.output_id if out.output_lines else None,
            error_file_id=out.error_id if out.error_lines else None,
            failed=rec.failed + out.expired_lines,
            **{_STAMP[ending]: now},
        )
        await store.finish_batch(rec, written)
    except BaseException:
        await asyncio.to_thread(out.abort, remove=True)
        raise
    return rec, out.expired_lines


class Outputs:
    def __init__(self, files: FileBytes, batch_id: str, *, expired: bool) -> None:
        self.files = files
        self.batch_id = batch_id
        self.expired = expired
        # The output files are held where the batch is: their ids carry its replica tag.
        self.output_id = new_id("file-", tag_of(batch_id))
        self.error_id = new_id("file-", tag_of(batch_id))
        self.output_lines = 0
        self.error_lines = 0
        self.expired_lines = 0
        self._out: BinaryIO | None = None
        self._err: BinaryIO | None = None
        self._sizes = {"output": 0, "error": 0}

    def write(self, r: LineResult) -> None:
        if r.ok:
            if self._out is None:
                self._out = self.files.path(self.output_id).open("wb")
            self._out.write(r.document + b"\n")
            self.output_lines += 1
            self._sizes["output"] += len(r.document) + 1
        else:
            self._error(r.document)

    def unanswered(self, x: InputLine) -> None:
        self._error(expired(x))
        self.expired_lines += 1

    def _error(self, doc: bytes) -> None:
        if self._err is None:
            self._err = self.files.path(self.error_id).open("wb")
        self._err.write(doc + b"\n")
        self.error_lines += 1
        self._sizes["error"] += len(doc) + 1

    def commit(self) -> None:
        for f in (self._out, self._err):
            if f is not None:
                f.flush()
                os.fsync(f.fileno())
                f.close()

    def abort(self, *, remove: bool = True) -> None:
        for f, fid in ((self._out, self.output_id), (self._err, self.error_id)):
            if f is not None and not f.closed:
                f.close()
            if remove:
                self.files.path(fid).unlink(missing_ok=True)

    def written(self) -> list[tuple[str, str, int]]:
        """(kind, file id, bytes) of each file written."""
        out = []
        if self.output_lines:
            out.append(("output", self.output_id, self._sizes["output"]))
        if self.error_lines:
            out.append(("error", self.error_id, self._sizes["error"]))
        return out
