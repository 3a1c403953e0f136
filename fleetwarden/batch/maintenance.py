"""Background work that moves batches between statuses, each step one store transaction.

- validate: `validating` batches are checked line by line and either start (every item queued)
  or fail (every bad line named); after a restart, batches still validating are checked again;
- recover: leases that ran out (lost dispatches, retries whose backoff is over) go back to the
  queue;
- expire: batches past their completion window settle their unfinished items as expired;
- finalise: batches with nothing left open get their output and error files and final status;
- observe: the backlog gauges are refreshed from the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from fleetwarden.batch.clock import Clock
from fleetwarden.batch.config import BatchServiceConfig
from fleetwarden.batch.metrics import BatchMetrics
from fleetwarden.batch.records import BatchRecord, LineError, QueueKey
from fleetwarden.batch.results import item_id
from fleetwarden.batch.runner import StoreRunner
from fleetwarden.batch.store.assemble import validation_error_file
from fleetwarden.batch.store.base import StoreError
from fleetwarden.batch.validation import (
    InputLimits,
    InvalidInput,
    ValidInput,
    split_lines,
    validate_input,
)

log = logging.getLogger(__name__)

MAX_REPORTED_ERRORS = 1000
"""`errors.data` of a failed batch lists at most this many lines; the error file lists all."""

REGION_METADATA_KEY = "region"
"""Batch metadata key that pins the batch to a region (a fleetwarden extension); without it the
model's first configured region (its home) takes the batch."""


def resolve_region(
    config: BatchServiceConfig, model: str, metadata: dict[str, str]
) -> QueueKey | LineError:
    """The queue a validated batch joins."""
    regions = config.regions(model)
    wanted = metadata.get(REGION_METADATA_KEY)
    if wanted is None:
        return QueueKey(model, regions[0])
    if wanted not in regions:
        return LineError(
            "region_not_served",
            f"model {model!r} is not served in region {wanted!r}; regions: {', '.join(regions)}",
            None,
            f"metadata.{REGION_METADATA_KEY}",
        )
    return QueueKey(model, wanted)


def _error_lines(batch: BatchRecord, content: bytes, errors: tuple[LineError, ...]) -> list[str]:
    """One error-file line per problem, with the line's custom_id where it can be read."""
    raw_lines = split_lines(content)
    out = []
    for n, error in enumerate(errors):
        custom_id = None
        if error.line is not None and 0 < error.line <= len(raw_lines):
            try:
                parsed = json.loads(raw_lines[error.line - 1])
            except (UnicodeDecodeError, json.JSONDecodeError):
                parsed = None
            if isinstance(parsed, dict) and isinstance(parsed.get("custom_id"), str):
                custom_id = parsed["custom_id"]
        key = error.line - 1 if error.line is not None else -1 - n
        out.append(
            json.dumps(
                {
                    "id": item_id(batch.id, key),
                    "custom_id": custom_id,
                    "response": None,
                    "error": error.to_dict(),
                },
                separators=(",", ":"),
            )
        )
    return out


class Maintenance:
    """Runs the steps above every `maintenance_interval_s`, or at once when woken."""

    def __init__(
        self,
        runner: StoreRunner,
        config: BatchServiceConfig,
        clock: Clock,
        metrics: BatchMetrics | None = None,
    ) -> None:
        self._runner = runner
        self._config = config
        self._clock = clock
        self._metrics = metrics
        self._wake = asyncio.Event()
        self._limits = InputLimits(config.limits.max_line_bytes, config.limits.max_lines)

    def wake(self) -> None:
        """Run the next round now (a batch was created)."""
        self._wake.set()

    async def validate_pending(self) -> list[str]:
        """Validate every batch in `validating`; returns the ids handled."""
        store = self._runner.store
        handled = []
        for batch_id in await self._runner.call(store.validating_batches):
            batch = await self._runner.call(store.get_batch, batch_id)
            if batch is None:
                continue
            content = await self._runner.call(store.file_content, batch.input_file_id)
            if content is None:
                checked: ValidInput | InvalidInput = InvalidInput(
                    (LineError("file_not_found", "the input file was deleted", None),)
                )
                content = b""
            else:
                checked = await asyncio.to_thread(
                    validate_input,
                    content,
                    batch.endpoint,
                    self._limits,
                    self._config.models(),
                )
            now = self._clock.now()
            if isinstance(checked, ValidInput):
                queue = resolve_region(self._config, checked.model, batch.metadata)
                if isinstance(queue, QueueKey):
                    await self._runner.call(store.start_batch, batch_id, queue, checked.items, now)
                    handled.append(batch_id)
                    continue
                checked = InvalidInput((queue,))
            error_file, error_content = validation_error_file(
                batch, _error_lines(batch, content, checked.errors), now
            )
            reported = list(checked.errors[:MAX_REPORTED_ERRORS])
            if len(checked.errors) > MAX_REPORTED_ERRORS:
                more = len(checked.errors) - MAX_REPORTED_ERRORS
                reported.append(LineError("too_many_errors", f"{more} more in the error file"))
            await self._runner.call(
                store.fail_batch, batch_id, reported, error_file, error_content, now
            )
            handled.append(batch_id)
        return handled

    async def run_once(self) -> None:
        """One round of every step."""
        store = self._runner.store
        await self.validate_pending()
        await self._runner.call(store.recover_leases, self._clock.now())
        expired = await self._runner.call(store.expire_batches, self._clock.now())
        for batch_id in expired:
            log.info("batch %s expired", batch_id)
        await self._runner.call(store.finalize_batches, self._clock.now())
        if self._metrics is not None:
            now = self._clock.now()
            snapshot = await self._runner.call(
                store.backlog, now, self._config.metrics.due_buckets_s
            )
            self._metrics.observe_backlog(snapshot, now)

    async def run(self) -> None:
        interval = self._config.dispatch.maintenance_interval_s
        while True:
            self._wake.clear()  # before the round: a wake during it triggers the next one
            try:
                await self.run_once()
            except StoreError as exc:
                log.warning("maintenance round failed: %s", exc)
            except Exception:  # a dead loop would stop validation, expiry and finalisation
                log.exception("maintenance round failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=interval)
