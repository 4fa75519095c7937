"""What a Files or Batches request is refused with, in the OpenAI error shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from gateway.core import errors
from gateway.core.errors import BerthError

MAX_METADATA: Final = 16
MIN_EXPIRY_S: Final = 3600
MAX_EXPIRY_S: Final = 30 * 86400


def _not_found(what: str, ident: str, param: str) -> BerthError:
    return errors.object_not_found(f"No such {what} object: {ident[:100]}", param)


def file_not_found(file_id: str) -> BerthError:
    return _not_found("File", file_id, "id")


def batch_not_found(batch_id: str) -> BerthError:
    return _not_found("Batch", batch_id, "batch_id")


def check_metadata(metadata: object) -> dict[str, str] | None:
    """A batch's `metadata`: at most 16 string values, keys up to 64 characters, values up to 512."""
    if metadata is None:
        return None
    if (
        not isinstance(metadata, Mapping)
        or len(metadata) > MAX_METADATA
        or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in metadata.items()
        )
    ):
        raise errors.bad_request(
            f"'metadata' must be an object of at most {MAX_METADATA} string values (keys up to 64 "
            "characters, values up to 512)",
            param="metadata",
        )
    return dict(metadata)


def check_expires_after(value: object, param: str) -> int | None:
    """`{"anchor": "created_at", "seconds": N}` (N from 3600 to 2592000): N; None when not given."""
    if value is None:
        return None
    seconds = value.get("seconds") if isinstance(value, Mapping) else None
    if (
        not isinstance(value, Mapping)
        or value.get("anchor") != "created_at"
        or isinstance(seconds, bool)
        or not isinstance(seconds, int)
        or not MIN_EXPIRY_S <= seconds <= MAX_EXPIRY_S
    ):
        raise errors.bad_request(
            f'\'{param}\' must be {{"anchor": "created_at", "seconds": N}} with N from {MIN_EXPIRY_S} '
            f"to {MAX_EXPIRY_S}",
            param=param,
        )
    return seconds
