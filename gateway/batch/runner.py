"""The batch runner: validates new batches, feeds their lines to the gateway as capacity frees, records
each answer durably, and finalizes a batch into its output and error files.

This module holds the Batches API's operations (create, cancel, get, and what the admin document reads);
the feeding, its durability and a batch's ending are `gateway.batch.feeder`'s, `BatchRunner`'s base.
"""

from __future__ import annotations

import asyncio
import math

import msgspec
import structlog

from gateway.batch.feeder import FINALIZE_RETRY_S, ActiveBatch, BatchFeeder, BatchSettings
from gateway.batch.model import BATCH_ENDPOINTS, PURPOSE_BATCH, BatchRecord, BatchStatus, new_id
from gateway.batch.refusals import check_expires_after, check_metadata, file_not_found
from gateway.batch.validate import window_seconds
from gateway.core import errors

log = structlog.get_logger("berth.batch")

__all__ = ["FINALIZE_RETRY_S", "BatchRunner", "BatchSettings"]


class BatchRunner(BatchFeeder):
    """The batch runner (see the module doc): `BatchFeeder` and the API's operations."""

    # ----------------------------------------------------------------- the API's operations
    async def create(
        self,
        owner: str,
        input_file_id: object,
        endpoint: object,
        completion_window: object,
        metadata: object,
        *,
        output_expires_after: object = None,
    ) -> BatchRecord:
        """A new batch, validated (failed with its line errors, or in progress); BerthError when the
        request itself is wrong."""
        if not isinstance(input_file_id, str) or not input_file_id:
            raise errors.bad_request("'input_file_id' is required", param="input_file_id")
        if endpoint not in BATCH_ENDPOINTS:
            raise errors.bad_request(
                f"'endpoint' must be one of {', '.join(BATCH_ENDPOINTS)}, got {str(endpoint)[:100]!r}",
                param="endpoint",
            )
        assert isinstance(endpoint, str)
        try:
            window_s = window_seconds(completion_window, self.settings.max_window_s)
        except ValueError as e:
            raise errors.bad_request(f"'completion_window' {e}", param="completion_window") from None
        assert isinstance(completion_window, str)
        meta = check_metadata(metadata)
        output_expiry_s = check_expires_after(output_expires_after, "output_expires_after")
        await self.ensure_open()
        f = await self.store.get_file(owner, input_file_id)
        if f is None:
            raise file_not_found(input_file_id)
        if f.purpose != PURPOSE_BATCH:
            raise errors.bad_request(
                f"file {input_file_id} has purpose {f.purpose!r}, not 'batch'", param="input_file_id"
            )
        now = int(self.wall())
        rec = BatchRecord(
            id=new_id("batch_", self.settings.id_tag),
            owner=owner,
            endpoint=endpoint,
            input_file_id=input_file_id,
            completion_window=completion_window.strip(),
            window_s=window_s,
            status=BatchStatus.VALIDATING,
            created_at=now,
            expires_at=now + math.ceil(window_s),
            metadata=meta,
            output_expiry_s=output_expiry_s,
        )
        await self.store.add_batch(rec)
        return await self._validate(rec)

    async def cancel(self, owner: str, batch_id: str) -> BatchRecord | None:
        """Cancel a batch (None: not found for `owner`); a batch already ending is returned as it is."""
        await self.ensure_open()
        rec = await self.store.get_batch(owner, batch_id)
        if rec is None:
            return None
        a = self._active.get(batch_id)
        if a is not None:
            rec = a.rec
        if rec.status not in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS):
            return rec
        rec = msgspec.structs.replace(rec, status=BatchStatus.CANCELLING, cancelling_at=int(self.wall()))
        await self.store.put_batch(rec)
        if a is None:
            a = self._active[batch_id] = ActiveBatch(rec)
        a.rec = msgspec.structs.replace(a.rec, status=rec.status, cancelling_at=rec.cancelling_at)
        log.info("batch_cancelling", batch_id=batch_id, running=len(a.running))
        self.poke()
        return a.rec

    async def get(self, owner: str, batch_id: str) -> BatchRecord | None:
        await self.ensure_open()
        a = self._active.get(batch_id)
        if a is not None and a.rec.owner == owner:
            return a.rec
        return await self.store.get_batch(owner, batch_id)

    async def wait_ended(self, batch_id: str) -> None:
        """Return once the batch is in a final status (at once when it is not being run)."""
        if batch_id in self._active:
            await self._ended.setdefault(batch_id, asyncio.Event()).wait()

    def running(self) -> list[BatchRecord]:
        """The batches being run now (their counts newer than the store's last write)."""
        return [a.rec for a in self._active.values()]

    def progress(self) -> list[tuple[BatchRecord, int]]:
        """Each batch being run, and its lines in flight (for the admin document and `berth top`)."""
        return [(a.rec, len(a.running)) for a in self._active.values()]
