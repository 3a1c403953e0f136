"""Per-tenant counter families rendered in slices, so a scrape never stalls the relay.

The sidecar counts tokens and requests per (tenant, application, tier, kind or outcome): with a
thousand tenants that is about 4,000 series. `prometheus_client` collected and formatted them in
89 ms per scrape here (26 ms to collect, 63 ms to format), on the event loop that relays every
token: each scrape held every stream and every new request back that long. These families are
therefore plain dictionaries of numbers, their label text escaped once per series, and a scrape
takes a snapshot of the values (one dictionary copy) and formats it in slices that the `/metrics`
handler writes with a turn of the event loop between them.

`collect()` still yields a `prometheus_client` family, for tests and tools that read counters
that way; the sidecar's own registry does not include these families (that is the point).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

SLICE_SERIES = 500
"""Series formatted per slice: about 0.3 ms of work here, between two turns of the loop."""


def escape_label_value(value: str) -> str:
    """A label value as the text exposition format writes it (`\\`, `"` and newline escaped)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> bytes:
    """A counter's value as Python writes a float (`5.0`, `1234567.0`, `1e+21`): valid
    exposition numbers (counters are finite and never negative)."""
    return repr(float(value)).encode()


class TenantCounters(Collector):
    """One counter family: `inc` is a dictionary update; `slices` renders a snapshot in pieces."""

    def __init__(
        self,
        name: str,
        documentation: str,
        constant_labels: Mapping[str, str],
        label_names: Sequence[str],
    ) -> None:
        self.name = name.removesuffix("_total")
        self.documentation = documentation
        self._constant = dict(constant_labels)
        self._label_names = tuple(label_names)
        if set(self._constant) & set(self._label_names):
            raise ValueError("a label cannot be both constant and variable")
        sample = f"{self.name}_total"
        self._header = (
            f"# HELP {sample} {_escape_help(documentation)}\n# TYPE {sample} counter\n"
        ).encode()
        self._sample = sample
        self._values: dict[tuple[str, ...], float] = {}
        self._prefixes: dict[tuple[str, ...], bytes] = {}
        """Per series, its sample line up to the value: `name{labels} `, escaped once."""

    def inc(self, key: tuple[str, ...], amount: float = 1) -> None:
        """Add `amount` (>= 0) to the series of `key`, one value per label name, in order."""
        if amount < 0:
            raise ValueError("counters only go up")
        values = self._values
        if key in values:
            values[key] += amount
            return
        if len(key) != len(self._label_names):
            raise ValueError(f"expected {len(self._label_names)} label values, got {len(key)}")
        pairs = sorted([*self._constant.items(), *zip(self._label_names, key, strict=True)])
        labels = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in pairs)  # sorted by name,
        self._prefixes[key] = f"{self._sample}{{{labels}}} ".encode()  # as prometheus_client does
        values[key] = amount

    def value(self, key: tuple[str, ...]) -> float:
        return self._values.get(key, 0.0)

    def __len__(self) -> int:
        return len(self._values)

    def slices(self, series_per_slice: int = SLICE_SERIES) -> Iterator[bytes]:
        """The family's exposition text, a snapshot taken at the first slice, in pieces."""
        snapshot = list(self._values.items())
        prefixes = self._prefixes
        yield self._header
        for start in range(0, len(snapshot), series_per_slice):
            yield b"".join(
                prefixes[key] + _number(value) + b"\n"
                for key, value in snapshot[start : start + series_per_slice]
            )

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            self.name, self.documentation, labels=[*self._constant, *self._label_names]
        )
        constant = list(self._constant.values())
        for key, value in self._values.items():
            family.add_metric([*constant, *key], value)
        yield family


__all__ = ["SLICE_SERIES", "TenantCounters", "escape_label_value"]
