"""The dispatcher: turns capacity signals into leased items, engine calls and committed results.

Per target, every `signal_interval_s`:

1. read the target's utilisation (shared targets; spot targets need none);
2. ask the pure `release_plan` how many items this signal releases: the release rule's count only
   if the reading is fresh (`fresh_reading`: newer than the target's last release, which a
   Prometheus reading is only a scrape interval later), promoted items in any case;
3. claim them from the target's (model, region) queue in one store transaction (leased until
   now + `lease_s`);
4. send each to the target in its own task, at tier `niw`, or `iw-n` once promoted;
5. turn the answer into a settlement with the pure `settle` (result or retry after backoff) and
   hand it to the committer, which writes settlements in groups, one transaction each.

Dispatch is at least once: a crash between 4 and 5 leaves the item leased; recovery re-queues
it, and the store refuses the second result of an item already settled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from fleetwarden.batch.clock import Clock
from fleetwarden.batch.config import DispatchConfig, TargetConfig
from fleetwarden.batch.engine import Sender
from fleetwarden.batch.metrics import BatchMetrics
from fleetwarden.batch.policy import (
    EngineFailure,
    EngineReply,
    RetryPolicy,
    fresh_reading,
    release_plan,
    settle,
    tier_for,
)
from fleetwarden.batch.records import ClaimedItem, ItemResult, Settlement
from fleetwarden.batch.results import error_line
from fleetwarden.batch.runner import StoreRunner
from fleetwarden.batch.store.base import Promotion, StoreError
from fleetwarden.batch.utilisation import UtilisationSource
from fleetwarden.scaling.niw_release import ReleaseRule

log = logging.getLogger(__name__)
_T = TypeVar("_T")
MAX_TRACKED_INTERRUPTIONS = 65_536
"""Items whose interruptions the dispatcher remembers (see `Dispatcher._count_interruption`)."""


@dataclass(slots=True)
class Target:
    """A target and its live state."""

    config: TargetConfig
    source: UtilisationSource | None
    in_flight: int = 0
    last_utilisation: float | None = None
    last_release_at: float | None = None
    """When a signal last claimed items for this target: a reading older than that cannot show
    them yet (see `fresh_reading`)."""
    rule: ReleaseRule | None = None
    """The target's own release rule; None uses the dispatcher's (the config's `release`)."""

    @property
    def reading_max_age_s(self) -> float:
        """How old the data behind this target's utilisation reading can be (its source's
        `max_age_s`; 0 without a configured source)."""
        spec = self.config.utilisation
        return spec.max_age_s if spec is not None else 0.0


class Committer:
    """Writes settlements in groups: one transaction (one fsync) for up to `batch_size`."""

    def __init__(
        self, runner: StoreRunner, clock: Clock, batch_size: int, metrics: BatchMetrics | None
    ) -> None:
        self._runner = runner
        self._clock = clock
        self._batch_size = batch_size
        self._metrics = metrics
        self._queue: asyncio.Queue[Settlement] = asyncio.Queue()

    def put(self, settlement: Settlement) -> None:
        self._queue.put_nowait(settlement)

    async def flush(self) -> None:
        """Wait until everything put so far is committed."""
        await self._queue.join()

    async def run(self) -> None:
        while True:
            group = [await self._queue.get()]
            while len(group) < self._batch_size and not self._queue.empty():
                group.append(self._queue.get_nowait())
            try:
                await self._commit_or_split(group)
            except Exception:
                # The loop must outlive a bug: the group's items stay leased, their leases run
                # out and they run again, whereas a dead committer would stop all progress.
                log.exception(
                    "committing %d results failed; their items will run again", len(group)
                )
            finally:
                for _ in group:
                    self._queue.task_done()

    async def _commit_or_split(self, group: list[Settlement]) -> None:
        """Commit `group`; if the store refuses it with anything but a StoreError (a result it
        cannot take, which would fail the same way on every retry), commit each settlement on
        its own, so one bad result costs only its own item, never the group's healthy ones."""
        try:
            await self._commit(group)
        except Exception as exc:
            if len(group) == 1:
                if group[0].result is None:
                    await self._requeue(group[0], exc)
                else:
                    await self._commit_as_error(group[0], exc)
                return
            log.exception("committing %d results failed; committing them one by one", len(group))
            for settlement in group:
                await self._commit_or_split([settlement])

    async def _requeue(self, settlement: Settlement, exc: Exception) -> None:
        """A refused retry has no result to fail with: recording an error line would end an item
        the engine only failed transiently. Its lease is given back instead (`BatchStore.requeue`),
        its attempt too if it was interrupted, so it is claimable at once rather than when the
        lease runs out (`lease_s`) with an attempt it never spent; a plain retry's attempt counts
        and only its backoff is lost. The store takes the lease back only under the item's token,
        so a result is still written exactly once. If the store refuses that too, the item stays
        leased, as after a crash: recovery re-queues it when its lease runs out."""
        item = settlement.item
        log.error(
            "the retry of %s/%s cannot be stored (%s: %s); sending it back to its queue",
            item.batch_id, item.custom_id, type(exc).__name__, exc,
        )  # fmt: skip
        store = self._runner.store
        try:
            requeued = await self._stored(lambda now: store.requeue(item, settlement.refund, now))
        except Exception:
            log.exception(
                "%s/%s cannot be sent back either; it runs again when its lease runs out",
                item.batch_id, item.custom_id,
            )  # fmt: skip
            return
        if self._metrics is not None:
            self._metrics.settled(settlement, requeued)

    async def _refund_stale(self, settlement: Settlement) -> None:
        """An interrupted attempt committed after its lease ran out is refused as stale, yet
        still owes its refund: recovery re-queued the item counting the attempt as a crash's.
        Never raises: the group it follows is committed and must not be split and re-run."""
        item, store = settlement.item, self._runner.store
        try:
            await self._stored(lambda now: store.requeue(item, True, now))
        except Exception:
            log.exception("the attempt of %s/%s cannot be refunded", item.batch_id, item.custom_id)

    async def _commit_as_error(self, settlement: Settlement, exc: Exception) -> None:
        """Record an item whose result the store cannot take as an error line: written once,
        instead of its lease running out and the item running again until its batch expires."""
        item = settlement.item
        log.error(
            "the result of %s/%s cannot be stored (%s: %s); recording an error line instead",
            item.batch_id, item.custom_id, type(exc).__name__, exc,
        )  # fmt: skip
        line = error_line(
            item.batch_id,
            item.idx,
            item.custom_id,
            "internal_error",
            f"the result of this request could not be stored ({type(exc).__name__})",
        )
        await self._commit([Settlement(item, ItemResult(False, line))])

    async def _commit(self, group: list[Settlement]) -> None:
        """Commit until the store takes it: results are never dropped while the process lives
        (if it dies, the leases run out and the items run again)."""
        store = self._runner.store
        applied = await self._stored(lambda now: store.settle(group, now))
        for settlement, ok in zip(group, applied, strict=True):
            if self._metrics is not None:
                self._metrics.settled(settlement, ok)
            if settlement.refund and not ok:
                await self._refund_stale(settlement)

    async def _stored(self, write: Callable[[float], _T]) -> _T:
        """Run `write(now)` on the store thread until it does not fail with a StoreError (the
        store is down: nothing was changed, so trying again is safe)."""
        delay = 0.1
        while True:
            try:
                return await self._runner.call(write, self._clock.now())
            except StoreError as exc:
                log.warning("writing to the store failed, retrying: %s", exc)
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)


class Dispatcher:
    """Releases queued items to targets as their capacity signals allow."""

    def __init__(
        self,
        runner: StoreRunner,
        targets: Sequence[Target],
        sender: Sender,
        clock: Clock,
        rule: ReleaseRule,
        retry: RetryPolicy,
        settings: DispatchConfig,
        metrics: BatchMetrics | None = None,
    ) -> None:
        self.targets = list(targets)
        self._runner = runner
        self._sender = sender
        self._clock = clock
        self._rule = rule
        self._retry = retry
        self._settings = settings
        self.committer = Committer(runner, clock, settings.commit_batch, metrics)
        self._sends: set[asyncio.Task[None]] = set()
        self._interruptions: OrderedDict[str, int] = OrderedDict()
        self._loops: list[asyncio.Task[None]] = []

    async def signal(self, target: Target) -> list[ClaimedItem]:
        """Handle one capacity signal from `target`; returns the items it released."""
        read_at = self._clock.now()  # before the read: the reading is no newer than this
        utilisation = await target.source.utilisation() if target.source else None
        target.last_utilisation = utilisation
        free = target.config.max_in_flight - target.in_flight
        rule = target.rule or self._rule  # the one resolution: claim and tiers both follow it
        fresh = fresh_reading(read_at, target.reading_max_age_s, target.last_release_at)
        plan = release_plan(target.config.kind, rule, utilisation, free, fresh)
        if plan.limit <= 0 or (plan.by_deadline <= 0 and plan.promoted <= 0):
            return []
        now = self._clock.now()
        items = await self._runner.call(
            self._runner.store.claim,
            target.config.queue,
            by_deadline=plan.by_deadline,
            promoted=plan.promoted,
            limit=plan.limit,
            lease_until=now + self._settings.lease_s,
            promotion=Promotion.of(rule, now),
        )
        if items:
            target.last_release_at = now
        for item in items:
            target.in_flight += 1
            task = asyncio.create_task(self._dispatch(target, item, rule))
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)
        return items

    async def _dispatch(self, target: Target, item: ClaimedItem, rule: ReleaseRule) -> None:
        """Send `item`, claimed under `rule`, to `target` and hand its settlement to the committer."""
        try:
            tier = tier_for(rule, item.created_at, self._clock.now(), item.deadline)
            try:
                outcome: EngineReply | EngineFailure = await self._sender.send(
                    target.config, item, tier
                )
            except Exception as exc:
                # A sender bug must not strand the item: it would be re-leased and fail again
                # forever. As a failure it is retried, then reported in the error file.
                log.exception("dispatching %s/%s failed", item.batch_id, item.custom_id)
                outcome = EngineFailure(f"dispatch error: {type(exc).__name__}: {exc}")
            mid_request = isinstance(outcome, EngineFailure) and outcome.mid_request
            count = self._count_interruption(item) if mid_request else 0
            settlement = settle(item, outcome, self._retry, self._clock.now(), count)
            if settlement.result is not None:
                self._interruptions.pop(item.member, None)
            self.committer.put(settlement)
        finally:
            target.in_flight -= 1

    def _count_interruption(self, item: ClaimedItem) -> int:
        """This item's interruptions so far, this one included (see `RetryPolicy`).

        Kept in memory, most recent last and at most `MAX_TRACKED_INTERRUPTIONS` items: a restart
        forgets the counts, which only delays the cap, and an item finished by another replica
        ages out instead of staying forever.
        """
        count = self._interruptions.pop(item.member, 0) + 1
        self._interruptions[item.member] = count
        if len(self._interruptions) > MAX_TRACKED_INTERRUPTIONS:
            self._interruptions.popitem(last=False)
        return count

    async def drain(self) -> None:
        """Wait for every dispatched item to be answered and its settlement committed."""
        while self._sends:
            await asyncio.gather(*list(self._sends), return_exceptions=True)
        await self.committer.flush()

    async def _loop(self, target: Target) -> None:
        interval = self._settings.signal_interval_s
        while True:
            try:
                await self.signal(target)
            except StoreError as exc:
                log.warning("signal from %s: %s", target.config.name, exc)
            except Exception:  # a dead loop would silently stop this target's dispatch
                log.exception("signal from %s failed", target.config.name)
            await asyncio.sleep(interval)

    def start(self, signal_loops: bool = True) -> None:
        """Start the committer and, unless a test drives `signal` itself, one loop per target."""
        self._loops.append(asyncio.create_task(self.committer.run(), name="batch-committer"))
        for target in self.targets if signal_loops else ():
            name = f"batch-signal-{target.config.name}"
            self._loops.append(asyncio.create_task(self._loop(target), name=name))

    async def stop(self, grace_s: float) -> None:
        """Stop signalling, give in-flight items `grace_s` to finish and commit, then stop.

        Items still running after the grace period stay leased; the next start re-queues them.
        """
        committer, signal_loops = self._loops[:1], self._loops[1:]
        for task in signal_loops:
            task.cancel()
        await asyncio.gather(*signal_loops, return_exceptions=True)
        if self._sends:
            _done, pending = await asyncio.wait(list(self._sends), timeout=grace_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if committer:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.committer.flush(), timeout=max(grace_s, 1.0))
            committer[0].cancel()
            await asyncio.gather(*committer, return_exceptions=True)
        self._loops.clear()
