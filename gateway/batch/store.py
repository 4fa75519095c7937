"""What the runner and the routes need from durable state: the `BatchStore` protocol.

One implementation ships: `SqliteBatchStore`, embedded, one database file in the batch directory. The
protocol is what a cluster-wide store implements to share batches between replicas. Its contract:
- every method is a whole transaction: after it returns, its change survives a crash of the process;
- `record_result` stores a line's answer at most once (a second answer of the same line is ignored and
  changes no count), so a line that ran again after a crash appears once in the output;
- `owner` scopes the lookups the routes make: another owner's file or batch is not found (None);
- pages are in line order (`pending`, `answers`, `unanswered`) or newest first (`list_*`, and `page_*` by
  (created_at, id), the order a list merged from several replicas' stores follows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeAlias

from gateway.batch.model import BatchRecord, FileRecord, InputLine, LineResult

#: A position in the order that pages merged from several stores follow (cluster mode): a record's
#: (created_at, id); a page starts after (or, newest first, before) it.
PageKey: TypeAlias = tuple[int, str]


class BatchStore(Protocol):
    async def open(self) -> None:
        """Create or open the state; idempotent."""

    async def close(self) -> None: ...

    # ----------------------------------------------------------------- files
    async def add_file(self, rec: FileRecord) -> None: ...

    async def get_file(self, owner: str | None, file_id: str) -> FileRecord | None:
        """The file, if `owner` owns it (None: any owner)."""

    async def list_files(
        self, owner: str, *, purpose: str | None, after: str | None, limit: int, ascending: bool
    ) -> tuple[list[FileRecord], bool]:
        """A page of `owner`'s files after the file `after`, and whether more follow."""

    async def page_files(
        self, owner: str, *, purpose: str | None, key: PageKey | None, limit: int, ascending: bool
    ) -> tuple[list[FileRecord], bool]:
        """Like `list_files`, ordered by (created_at, id) and starting past the key `key` (exclusive):
        pages that several replicas' stores merge into one list."""

    async def delete_file(self, owner: str | None, file_id: str) -> FileRecord | None:
        """Forget the file (None: not found); the caller removes its bytes."""

    async def expired_files(self, now: int) -> list[FileRecord]:
        """Files past their expiry that no unfinished batch reads."""

    async def file_ids(self) -> set[str]: ...

    # ----------------------------------------------------------------- batches
    async def add_batch(self, rec: BatchRecord) -> None: ...

    async def get_batch(self, owner: str | None, batch_id: str) -> BatchRecord | None: ...

    async def list_batches(
        self, owner: str, *, after: str | None, limit: int
    ) -> tuple[list[BatchRecord], bool]: ...

    async def page_batches(
        self, owner: str, *, key: PageKey | None, limit: int
    ) -> tuple[list[BatchRecord], bool]:
        """Like `list_batches`, newest first by (created_at, id), older than the key `key`."""

    async def put_batch(self, rec: BatchRecord) -> None:
        """Replace the batch's record (its status, timestamps, errors); the answer counts stay the
        store's (answers recorded meanwhile count)."""

    async def unfinished(self) -> list[BatchRecord]:
        """Every batch not in a final status, oldest first."""

    async def start_batch(self, rec: BatchRecord, lines: Sequence[InputLine]) -> None:
        """Store a validated batch's lines and its record (in_progress) at once."""

    # ----------------------------------------------------------------- lines and answers
    async def pending(self, batch_id: str, after_line: int, limit: int) -> list[InputLine]:
        """Lines after `after_line` without an answer."""

    async def record_result(self, batch_id: str, result: LineResult) -> BatchRecord | None:
        """Store a line's answer and count it; the updated record (None: already answered)."""

    async def export(
        self,
        batch_id: str,
        write: Callable[[LineResult], None],
        unanswered: Callable[[InputLine], None] | None,
    ) -> None:
        """Call `write` with every answer in line order, then `unanswered` (if given) with every line
        left without one. Runs off the event loop: the callbacks may block on disk writes."""

    async def finish_batch(self, rec: BatchRecord, files: Sequence[FileRecord]) -> None:
        """Store the batch's final record and its output files, and drop its lines and answers."""
