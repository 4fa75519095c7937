"""The bytes of uploaded and written files, one file each under `<batch dir>/files/`, named by file id.

Uploads are streamed to a `.part` file (at most `max_bytes`, never held in memory) and renamed into
place once whole; the store records a file only after that. Files on disk without a record (a crash
between the two, or while berth wrote an output file) are removed by `sweep`. Disk writes run off the
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO, Final

from gateway.batch.model import InputLine

PART: Final = ".part"
WRITE_CHUNK: Final = 1 << 20  # bytes gathered before one write to disk


class FileTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"file exceeds the limit of {limit} bytes")
        self.limit = limit


class FileBytes:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, file_id: str) -> Path:
        return self.root / file_id

    def ensure(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def upload(self, file_id: str, max_bytes: int) -> Upload:
        """A streamed upload of file `file_id`."""
        return Upload(self.path(file_id), max_bytes)

    async def remove(self, file_id: str) -> None:
        await asyncio.to_thread(_unlink, self.path(file_id))

    async def read_lines(self, file_id: str, lines: Iterable[InputLine]) -> list[bytes]:
        """The bytes of `lines` of a file, in order."""
        return await asyncio.to_thread(_read_at, self.path(file_id), list(lines))

    def sweep(self, known: set[str]) -> list[str]:
        """Remove files without a record and leftover uploads; the names removed (blocking: at start)."""
        removed: list[str] = []
        if not self.root.is_dir():
            return removed
        for p in self.root.iterdir():
            if p.name.endswith(PART) or p.name not in known:
                _unlink(p)
                removed.append(p.name)
        return removed


class Upload:
    """One file being written: `write` chunks as they come, then `commit` (or `abort`)."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.part = path.with_name(path.name + PART)
        self.max_bytes = max_bytes
        self.size = 0
        self._buf: list[bytes] = []
        self._buffered = 0
        self._f: BinaryIO | None = None

    async def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise FileTooLarge(self.max_bytes)
        self._buf.append(chunk)
        self._buffered += len(chunk)
        if self._buffered >= WRITE_CHUNK:
            await self._flush()

    async def _flush(self) -> None:
        data = b"".join(self._buf)
        self._buf.clear()
        self._buffered = 0
        await asyncio.to_thread(self._write, data)

    def _write(self, data: bytes) -> None:
        if self._f is None:
            self.part.parent.mkdir(parents=True, exist_ok=True)
            self._f = self.part.open("wb")
        self._f.write(data)

    async def commit(self) -> None:
        """The whole file on disk (fsynced) under its final name."""
        await self._flush()
        await asyncio.to_thread(self._commit)

    def _commit(self) -> None:
        if self._f is None:
            self._write(b"")
        assert self._f is not None
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        self._f = None
        self.part.replace(self.path)

    async def abort(self) -> None:
        await asyncio.to_thread(self._abort)

    def _abort(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
        _unlink(self.part)


def _unlink(p: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        p.unlink()


def _read_at(path: Path, lines: list[InputLine]) -> list[bytes]:
    out: list[bytes] = []
    with path.open("rb") as f:
        for x in lines:
            f.seek(x.offset)
            out.append(f.read(x.length))
    return out
