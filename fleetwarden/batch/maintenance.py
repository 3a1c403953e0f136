"""Background work that moves batches between statuses, each step one store transaction.

- validate: `validating` batches are checked line by line and either start (every item queued)
  or fail (every bad line named); after a restart, batches still validating are checked again;
- recover: leases that ran out (lost dispatches, retries whose backoff is over) go back to the
  queue;
- expire: batches past their completion window settle their unfinished items as expired;
- finalise: batches with nothing left open get their output and error files and final status;
- observe: the backlog gauges are refreshed from the store.

Maintenance is shared by every tenant, so nothing one batch does may stop it: each batch is
validated in isolation (a batch whose validation or start fails unexpectedly is failed with an
`internal_error`, logged, and the others go on), and each step runs even when an earlier step of
the round failed. Store errors are transient: the batch or step is simply tried again next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable

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
    JsonLineError,
    ValidInput,
    parse_json_line,
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
    """One error-file line per problem, with the line's custom_id where it can be read.

    The file is split only when some problem names a line: a file refused whole (too many
    lines, deleted, unknown model) may be huge, and splitting it costs a bytes object per line.
    """
    raw_lines = split_lines(content) if any(e.line is not None for e in errors) else []
    out = []
    for n, error in enumerate(errors):
        custom_id = None
        if error.line is not None and 0 < error.line <= len(raw_lines):
            try:
                parsed = parse_json_line(raw_lines[error.line - 1])
            except JsonLineError:
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
        """Validate every batch in `validating`; returns the ids handled (started or failed)."""
        handled = []
        for batch_id in await self._runner.call(self._runner.store.validating_batches):
            try:
                if await self._validate(batch_id):
                    handled.append(batch_id)
            except StoreError as exc:
                log.warning("validating batch %s failed, retrying next round: %s", batch_id, exc)
            except Exception as exc:
                # Not the store and not the input (bad lines are errors, not exceptions): a bug
                # that would hit this batch every round. Fail it so the others keep moving.
                log.exception("validating batch %s failed; failing the batch", batch_id)
                if await self._fail_internally(batch_id, exc):
                    handled.append(batch_id)
        return handled

    async def _validate(self, batch_id: str) -> bool:
        """Start or fail one validating batch; False if it was gone or no longer validating."""
        store = self._runner.store
        batch = await self._runner.call(store.get_batch, batch_id)
        if batch is None:
            return False
        content = await self._runner.call(store.file_content, batch.input_file_id)
        if content is None:
            checked: ValidInput | InvalidInput = InvalidInput(
                (LineError("file_not_found", "the input file was deleted", None),)
            )
            content = b""
        else:
            checked = await asyncio.to_thread(
                validate_input, content, batch.endpoint, self._limits, self._config.models()
            )
        now = self._clock.now()
        if isinstance(checked, ValidInput):
            queue = resolve_region(self._config, checked.model, batch.metadata)
            if isinstance(queue, QueueKey):
                return await self._runner.call(
                    store.start_batch, batch_id, queue, checked.items, now
                )
            checked = InvalidInput((queue,))
        # On a worker thread: a file with per-line problems may still be large to split.
        lines = await asyncio.to_thread(_error_lines, batch, content, checked.errors)
        error_file, error_content = validation_error_file(batch, lines, now)
        reported = list(checked.errors[:MAX_REPORTED_ERRORS])
        if len(checked.errors) > MAX_REPORTED_ERRORS:
            more = len(checked.errors) - MAX_REPORTED_ERRORS
            reported.append(LineError("too_many_errors", f"{more} more in the error file"))
        return await self._runner.call(
            store.fail_batch, batch_id, reported, error_file, error_content, now
        )

    async def _fail_internally(self, batch_id: str, exc: Exception) -> bool:
        """Fail a batch that validation or starting could not handle; False if that failed
        too (logged; the next round tries the batch again)."""
        error = LineError(
            "internal_error",
            f"the batch could not be validated or started ({type(exc).__name__}); "
            "nothing ran. Retrying will not help; report it to the service's operators",
        )
        try:
            return await self._runner.call(
                self._runner.store.fail_batch, batch_id, [error], None, b"", self._clock.now()
            )
        except Exception:
            log.exception("failing batch %s failed too", batch_id)
            return False

    async def run_once(self) -> None:
        """One round of every step; a failing step is logged and the next one still runs."""
        steps: tuple[tuple[str, Callable[[], Awaitable[object]]], ...] = (
            ("validate", self.validate_pending),
            ("recover", self._recover),
            ("expire", self._expire),
            ("finalise", self._finalise),
            ("observe", self._observe),
        )
        for name, step in steps:
            try:
                await step()
            except StoreError as exc:
                log.warning("maintenance step %s failed: %s", name, exc)
            except Exception:  # one broken step must not stop the others (or later rounds)
                log.exception("maintenance step %s failed", name)

    async def _recover(self) -> None:
        await self._runner.call(self._runner.store.recover_leases, self._clock.now())

    async def _expire(self) -> None:
        expired = await self._runner.call(self._runner.store.expire_batches, self._clock.now())
        for batch_id in expired:
            log.info("batch %s expired", batch_id)

    async def _finalise(self) -> None:
        await self._runner.call(self._runner.store.finalize_batches, self._clock.now())

    async def _observe(self) -> None:
        if self._metrics is None:
            return
        now = self._clock.now()
        snapshot = await self._runner.call(
            self._runner.store.backlog, now, self._config.metrics.due_buckets_s
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
