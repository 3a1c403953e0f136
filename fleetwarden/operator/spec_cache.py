"""Parsed specs kept per object, so an unchanged object is validated once, not on every reconcile.

Why: every ModelDeployment reconcile re-derives pool accounting and served-name conflicts from
every ModelDeployment's spec, and every RegionPool reconcile does the same, so validating each spec
with pydantic (about 70 us for a typical ModelDeployment) on every pass made one reconcile linear
and a whole-fleet change quadratic in the fleet (docs/performance.md).

What a hit requires, and why that is the right key:

- The parse reads `spec` and nothing else: not labels, annotations or status. Only the spec has
  to match, and anything else (resourceVersion, which every status write bumps, our own included)
  would make nearly every lookup a miss.
- One slot per object, addressed by (namespace, name). It remembers the uid and
  `metadata.generation` it was filled for, and a hit needs both to match: a re-created object
  (new uid) or an edited one (new generation; the API server bumps it on every spec change of a
  custom resource) is parsed again, and replaces the slot, so old generations never pile up.
- uid and generation are not enough on their own, so the spec itself is compared too, first by
  identity and then by equality. Structural-schema defaults are applied when the API server reads
  an object from etcd, so a CRD upgrade that adds or changes a default changes the spec the
  operator sees without bumping the generation; and objects made in Python (tests, hand-made
  views) carry whatever generation they were given, usually none or always 1. Identity is the
  common case and O(1): Kopf's index keeps one ObjectRecord, hence one spec dict, per object until
  that object has an event. Equality is the fallback (a C-level compare of a few dozen values,
  about 2 us, against about 70 us to validate); after an equal hit the slot keeps the newer dict,
  so the next lookup of that record is an identity hit again. A hash of the spec would not help:
  canonical JSON of a spec costs about as much as validating it. Equality is JSON equality (key
  order and 1 / 1.0 / true are not told apart): the API server serialises an unchanged object the
  same way every time, and pydantic's lax mode maps 1, 1.0 and true to the same value for every
  field type the specs use, so equal specs parse to equal results.

Bounded three ways: `forget` when an object is deleted, `retain` on every periodic resync (drops
the slots of objects no longer listed, i.e. deletions whose event was missed), and an LRU cap of
`max_entries` slots as the backstop for callers outside the operator's loop. A fleet larger than
the cap just misses more (back to a parse per lookup), never returns a wrong parse.

What is returned is shared by every caller: the spec models are frozen pydantic models, `Parsed`
is a frozen dataclass, and nothing mutates their lists and dicts. The stored spec is the record's
own dict, not a copy; `ObjectRecord` is an immutable snapshot and no code mutates its `spec`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, Protocol, TypeVar

V = TypeVar("V")
SlotKey = tuple[str | None, str]
"""(namespace, name); namespace None for cluster-scoped objects."""


class SpecSource(Protocol):
    """What the cache reads of an object (`fleet.ObjectRecord` has it; a Protocol avoids a cycle)."""

    @property
    def namespace(self) -> str | None: ...

    @property
    def name(self) -> str: ...

    @property
    def uid(self) -> str: ...

    @property
    def generation(self) -> int | None: ...

    @property
    def spec(self) -> Mapping[str, Any]: ...


class _Slot(Generic[V]):
    """One object's last parse and what it was parsed from."""

    __slots__ = ("generation", "raw", "uid", "value")

    def __init__(self, uid: str, generation: int | None, raw: Mapping[str, Any], value: V) -> None:
        self.uid = uid
        self.generation = generation
        self.raw = raw
        self.value = value


class SpecCache(Generic[V]):
    """At most `max_entries` parses, one per (namespace, name), least recently used evicted first.

    Thread-safe: lookups and stores take a lock (the parse itself runs outside it). The operator
    parses on its event loop, but the hourly planner and `fleetwarden plan` run work on other
    threads, and a torn LRU update would be a bug that is hard to see.
    """

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._slots: OrderedDict[SlotKey, _Slot[V]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, key: object) -> bool:
        """Whether (namespace, name) has a slot."""
        return key in self._slots

    def get(self, record: SpecSource, parse: Callable[[Mapping[str, Any]], V]) -> V:
        """`parse(record.spec)`, or the result kept from an earlier call on the same spec."""
        key = (record.namespace, record.name)
        raw = record.spec
        with self._lock:
            slot = self._slots.get(key)
            if (
                slot is not None
                and slot.uid == record.uid
                and slot.generation == record.generation
                and (slot.raw is raw or slot.raw == raw)
            ):
                slot.raw = raw
                self._slots.move_to_end(key)
                return slot.value
        value = parse(raw)
        with self._lock:
            self._slots[key] = _Slot(record.uid, record.generation, raw, value)
            self._slots.move_to_end(key)
            while len(self._slots) > self.max_entries:
                self._slots.popitem(last=False)
        return value

    def forget(self, namespace: str | None, name: str) -> None:
        """Drop an object's slot (it was deleted)."""
        with self._lock:
            self._slots.pop((namespace, name), None)

    def retain(self, live: Iterable[SlotKey]) -> None:
        """Drop every slot not in `live`: objects deleted without our seeing the event."""
        keep = set(live)
        with self._lock:
            for key in [k for k in self._slots if k not in keep]:
                del self._slots[key]

    def clear(self) -> None:
        with self._lock:
            self._slots.clear()
