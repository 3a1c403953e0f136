"""The two indexes `admission.Backlog` keeps so that every early-rejection check is O(log n).

Early rejection asks, per offered request, for (1) the fair-share sum over every other backlogged
tenant, min(b_j, m * w_j / w), and (2) a tenant's own queued work that its queue's ordering serves
before the request. A scan answers either in O(tenants) or O(queued) per arrival, which an
overloaded sidecar (when early rejection matters) cannot afford. `ShareIndex` answers (1) with
log-linear buckets and Fenwick trees, `OwnOrder` answers (2) with a treap of subtree sums. They
live apart from `admission` because they are data structures with invariants of their own (and
tests of their own), independent of which policy's rule uses them. Pure and deterministic.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from fleetwarden.api.enums import Tier
from fleetwarden.fairness.request import Request

OwnKey = Callable[[Request], tuple[float, ...]]
"""The key a tenant's own queue serves its requests in (arrival breaks ties)."""
ShareWeight = Callable[[str], float | Fraction]
"""A tenant's share weight: only ratios matter (`weight_units`)."""


_SUB_BUCKETS = 16
"""`ShareIndex` buckets per octave of backlog size: its sum is exact to within 1/16."""
_EXACT_BELOW = 2 * _SUB_BUCKETS
"""Backlogs below this many tokens have a bucket each."""
_MAX_BITS = 128
"""Backlogs (per weight) of 2**128 and more share the top bucket (still a lower bound)."""
_BUCKETS = (_MAX_BITS - 4) * _SUB_BUCKETS + _SUB_BUCKETS + 1
"""Fenwick indices run 1..._BUCKETS - 1: a bucket's index is the bucket + 1, bucket 0 included."""
_WEIGHT_BITS = 30
"""Share weights count in units of 2**-30 (`weight_units`)."""
_WEIGHTED_SCALE = 1 << 80
"""A weighted backlog is bucketed by x = b * 2**80 / units, 2**50 steps per token of a tenant of
weight 1: so x and m's x stay past the exact buckets (the 1/16 holds) for any tenants whose
weights are within 2**45 of each other, and below 2**128 (the top bucket) for any real backlog."""


def _bucket(tokens: int) -> int:
    """Log-linear bucket of a backlog: 16 per octave, so each spans under 1/16 of its floor."""
    if tokens < _EXACT_BELOW:
        return tokens
    top = min(tokens.bit_length(), _MAX_BITS) - 1
    shift = top - 4
    return shift * _SUB_BUCKETS + (min(tokens, (1 << _MAX_BITS) - 1) >> shift)


def _bucket_floor(bucket: int) -> int:
    if bucket < _EXACT_BELOW:
        return bucket
    shift = bucket // _SUB_BUCKETS - 1
    return (bucket % _SUB_BUCKETS + _SUB_BUCKETS) << shift


def weight_units(weight: float | Fraction, *, up: bool) -> int:
    """A share weight in integer units of 2**-30, so sums of them stay exact as tenants come and
    go: rounded down for a tenant stored, up for the tenant asking, so the ratios w_j / w_i never
    exceed the true ones. Integer arithmetic on the exact value: no weight overflows a float. A
    stored weight under one unit is 0 units, a tenant counted as served nothing (still a lower
    bound; `admission.ahead_options` scales a config's weights so that the least is 1)."""
    try:
        numerator, denominator = weight.as_integer_ratio()  # denominator > 0
    except (OverflowError, ValueError):  # inf, nan
        numerator = denominator = 0
    if numerator <= 0:
        raise ValueError(f"a share weight must be positive and finite, got {weight}")
    units, rest = divmod(numerator << _WEIGHT_BITS, denominator)
    return units + 1 if up and rest else units


class ShareIndex:
    """Tenants' backlogs b_j and share weights w_j (units; 1 each unweighted), for the sum over
    them of min(b_j, m * w_j / w) in O(log): what each is served while one of weight w is served m.

    Tenants are bucketed (log-linear) by x_j = b_j / w_j, scaled to an integer, and Fenwick trees
    sum weights and backlogs per bucket. With M = m / w: below M's bucket x_j < M and a tenant adds
    b_j; above it, exactly m * w_j / w; in it, w_j times the bucket's floor, at most 1/16 short.
    The total is one exact fraction, floored once: a lower bound (whatever the weights), within
    1/16 and a token while the weights are within 2**45 of each other (an exact sum needs the
    tenants in order, a scan per arrival), never decreasing when a backlog or m grows, which
    keeps rejection monotone in the backlog ahead.
    """

    __slots__ = ("_scale", "_sum", "_total", "_units", "_units_at")

    def __init__(self, *, weighted: bool = False) -> None:
        self._scale = _WEIGHTED_SCALE if weighted else 1
        self._units = [0] * _BUCKETS
        self._sum = [0] * _BUCKETS
        self._units_at = [0] * _BUCKETS
        self._total = 0

    def _index(self, tokens: int, units: int) -> int:
        if units == 0:  # x_j is infinite: above every m, and served m * 0
            return _BUCKETS - 1
        return _bucket(tokens * self._scale // units) + 1

    def _add(self, tokens: int, units: int, sign: int) -> None:
        index = self._index(tokens, units)
        weight = sign * units
        self._units_at[index] += weight
        self._total += weight
        weights, sums, delta = self._units, self._sum, sign * tokens
        while index < _BUCKETS:
            weights[index] += weight
            sums[index] += delta
            index += index & -index

    def move(self, old: int, new: int, units: int = 1) -> None:
        """A tenant's backlog went from `old` to `new` tokens (0: not backlogged)."""
        if old > 0:
            self._add(old, units, -1)
        if new > 0:
            self._add(new, units, 1)

    def sum_min(self, m: int, exclude: int, units: int = 1, exclude_units: int = 1) -> int:
        """Lower bound of the sum of min(b_j, m * w_j / w), w being `units`, over the tenants but
        one, whose backlog is `exclude` (0: none; it may exceed m) and weight `exclude_units`."""
        if m <= 0 or self._total == 0:
            return 0
        scale = self._scale
        top = self._index(m, units)
        floor = _bucket_floor(top - 1)
        below_units = below_sum = 0
        index = top - 1
        weights, sums = self._units, self._sum
        while index > 0:
            below_units += weights[index]
            below_sum += sums[index]
            index -= index & -index
        at = self._units_at[top]
        above = self._total - below_units - at
        # Over the denominator scale * units: below exact, at the bucket's floor, above m w_j / w.
        total = below_sum * scale * units + floor * at * units + m * above * scale
        if exclude > 0:
            excluded = self._index(exclude, exclude_units)
            if excluded < top:
                total -= exclude * scale * units
            else:
                total -= (floor * units if excluded == top else m * scale) * exclude_units
        return max(0, total // (scale * units))


class _Node:
    """A queued request in a treap of `OwnOrder`: its key and work, and its subtree's work."""

    __slots__ = ("key", "left", "priority", "right", "total", "work")

    def __init__(self, key: tuple[float, ...], work: int) -> None:
        self.key, self.work, self.total = key, work, work
        z = (int(key[-1]) * 0x9E3779B97F4A7C15) & _MASK64  # splitmix64 of the seq: a fixed
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64  # pseudo-random priority
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        self.priority = z ^ (z >> 31)
        self.left: _Node | None = None
        self.right: _Node | None = None


_MASK64 = (1 << 64) - 1


def _pull(node: _Node) -> _Node:
    left, right = node.left, node.right
    node.total = node.work + (left.total if left else 0) + (right.total if right else 0)
    return node


def _split(node: _Node | None, key: tuple[float, ...]) -> tuple[_Node | None, _Node | None]:
    """The keys below `key`, and the rest."""
    if node is None:
        return None, None
    if node.key < key:
        node.right, rest = _split(node.right, key)
        return _pull(node), rest
    below, node.left = _split(node.left, key)
    return below, _pull(node)


def _merge(low: _Node | None, high: _Node | None) -> _Node | None:
    if low is None or high is None:
        return low or high
    if low.priority > high.priority:
        low.right = _merge(low.right, high)
        return _pull(low)
    high.left = _merge(low, high.left)
    return _pull(high)


def _insert(node: _Node | None, new: _Node) -> _Node:
    if node is None:
        return new
    if new.priority > node.priority:
        new.left, new.right = _split(node, new.key)
        return _pull(new)
    if new.key < node.key:
        node.left = _insert(node.left, new)
    else:
        node.right = _insert(node.right, new)
    return _pull(node)


def _delete(node: _Node | None, key: tuple[float, ...]) -> _Node | None:
    if node is None or node.key == key:
        return None if node is None else _merge(node.left, node.right)
    if key < node.key:
        node.left = _delete(node.left, key)
    else:
        node.right = _delete(node.right, key)
    return _pull(node)


class OwnOrder:
    """Each tenant's queued work per band in the order its queue serves it: a treap keyed by
    (key, seq) with subtree sums, so a change, and the work before a request, are O(log)
    (expected: priorities are hashed from the seq, which keeps it pure and deterministic, and the
    depth logarithmic whatever order the keys arrive in). Keys are unique (a seq is); removing a
    request that is not queued changes nothing."""

    __slots__ = ("_key", "_roots")

    def __init__(self, key: OwnKey) -> None:
        self._key = key
        self._roots: dict[tuple[str, Tier], _Node] = {}

    def change(self, band: Tier, request: Request, work: int | None) -> None:
        """Queue `request` with `work`, or (None) remove it."""
        scope, key = (request.tenant, band), (*self._key(request), request.seq)
        root = self._roots.pop(scope, None)
        root = _insert(root, _Node(key, work)) if work is not None else _delete(root, key)
        if root is not None:
            self._roots[scope] = root

    def ahead(self, band: Tier, request: Request) -> int:
        """The tenant's work in `band` that its queue serves before `request`."""
        scope = (request.tenant, band)
        key, node, total = (*self._key(request), request.seq), self._roots.get(scope), 0
        while node is not None:
            if node.key < key:
                total += node.work + (node.left.total if node.left else 0)
                node = node.right
            else:
                node = node.left
        return total
