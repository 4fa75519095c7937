"""The records of the Files and Batches API and their OpenAI shapes (the official SDK's `FileObject`,
`Batch`, `BatchRequestCounts`, `BatchError`, `BatchUsage`)."""

from __future__ import annotations

import enum
import hashlib
import os
from typing import Any, Final

import msgspec

#: The routes a batch may run (a batch runs one of them for every line).
BATCH_ENDPOINTS: Final = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
#: The purpose of uploaded input files and of the files berth writes.
PURPOSE_BATCH: Final = "batch"
PURPOSE_OUTPUT: Final = "batch_output"


class BatchStatus(enum.StrEnum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


#: Statuses a batch never leaves.
FINAL: Final = frozenset(
    {BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED}
)


#: Hex digits of a replica's tag in the ids it makes (cluster mode).
TAG_HEX: Final = 8
_RANDOM_HEX: Final = 24


def new_id(prefix: str, tag: str = "") -> str:
    """An unguessable id: `prefix`, the replica's `tag` (cluster mode: `replica_tag`; else empty) and 24
    random hex digits (another tenant cannot find an id by counting)."""
    return f"{prefix}{tag}{os.urandom(_RANDOM_HEX // 2).hex()}"


def replica_tag(name: str) -> str:
    """The tag that names replica `name` in the ids it makes: the id says which replica holds the file or
    batch, so any replica finds its owner without a lookup."""
    return hashlib.blake2b(name.encode(), digest_size=TAG_HEX // 2).hexdigest()


def tag_of(object_id: str) -> str:
    """The replica tag in an id made by `new_id` (empty: an id made without one, or not berth's)."""
    for prefix in ("batch_", "file-"):
        if object_id.startswith(prefix):
            rest = object_id[len(prefix) :]
            if len(rest) == TAG_HEX + _RANDOM_HEX and all(c in _HEX for c in rest):
                return rest[:TAG_HEX]
    return ""


_HEX: Final = frozenset("0123456789abcdef")


class FileRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    owner: str  # the tenant that uploaded it (or that created the batch that wrote it)
    purpose: str
    filename: str
    bytes: int
    created_at: int  # unix seconds
    expires_at: int | None = None

    def document(self) -> dict[str, Any]:
        """The OpenAI `FileObject`."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


class LineError(msgspec.Struct, frozen=True, kw_only=True):
    """One problem of a batch (the OpenAI `BatchError`): `line` is 1-based, None for the whole batch."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    owner: str
    endpoint: str
    input_file_id: str
    completion_window: str  # as the client wrote it ("24h", or a berth extension such as "90m")
    window_s: float
    status: BatchStatus
    created_at: int
    expires_at: int
    metadata: dict[str, str] | None = None
    model: str | None = None  # the model of the first line
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: tuple[LineError, ...] = ()
    total: int = 0
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    # The final status a finalizing batch ends in (completed, expired or cancelled): kept so that a
    # restart in the middle of finalizing ends it the same way. Not part of the OpenAI object.
    ending: BatchStatus | None = None
    output_expiry_s: int | None = None  # output_expires_after.seconds; None: [batch] file_expiry_s

    def document(self) -> dict[str, Any]:
        """The OpenAI `Batch` object."""
        errors = None
        if self.errors:
            errors = {"object": "list", "data": [msgspec.to_builtins(e) for e in self.errors]}
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "model": self.model,
            "errors": errors,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status.value,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": self.in_progress_at,
            "expires_at": self.expires_at,
            "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at,
            "failed_at": self.failed_at,
            "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "usage": {
                "input_tokens": self.input_tokens,
                "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": self.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.input_tokens + self.output_tokens,
            },
            "metadata": self.metadata,
        }


class InputLine(msgspec.Struct, frozen=True, array_like=True):
    """Where one valid input line lies in its file (its bytes are read when it is fed)."""

    line: int  # 1-based
    custom_id: str
    offset: int
    length: int


class LineResult(msgspec.Struct, frozen=True, kw_only=True):
    """A line's answer, as it goes into the output file (`ok`) or the error file."""

    line: int
    ok: bool
    document: bytes  # one JSON line of the output or error file, without its newline
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
