"""Model-level load series from the ServeGen traces (`../shared/data/servegen/`).

ServeGen (Alibaba Bailian) publishes, per client and 10-minute window, the request rate
(`servegen_client_rates_10min.parquet`) and, per client and 6-hour window, token-length statistics
(`servegen_client_token_stats.parquet`). The forecaster wants one series per model, so this module
sums the clients of a model per window.

Two facts of the data shape the loader:

- Windows where the whole model's rate is near zero are collection gaps upstream, not idleness
  (17 h in m-mid, 1 h in m-small; the upstream hourly file counts them as `gap_windows`). They
  become NaN here: a forecaster that learned those zeros would plan to switch a fleet off.
- Token statistics are missing for 55 of the largest clients (30 to 55 % of a model's requests).
  For tokens/s those clients get the rate-weighted mean tokens per request of the model's other
  clients in the same 6-hour window, so the tokens/s series is an estimate; requests/s is exact.

The data is read in place and never copied into the repository; callers (tests, the simulator)
must cope with the folder being absent (`available()`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow.compute as pc
import pyarrow.parquet as pq

from fleetwarden.forecasting.series import FloatArray, Series

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "servegen"
"""`../shared/data/servegen` next to the repository checkout."""

RATES_FILE = "servegen_client_rates_10min.parquet"
TOKENS_FILE = "servegen_client_token_stats.parquet"
WINDOW_S = 600.0
"""The rate windows: ServeGen reports one rate per client per 10 minutes."""
TOKEN_WINDOW_S = 21_600
"""The token-statistics windows: one length distribution per client per 6 hours."""
LANGUAGE_MODELS = ("m-large", "m-mid", "m-small")
"""The models with 10 days of data; the reasoning and multimodal ones have a single day."""
GAP_FRACTION = 0.05
"""A window whose model-wide rate is below this fraction of the model's median is a gap. The real
gaps are 0 to 25 req/s against medians of 1100 to 1600; the quietest real window of any model is
above 40 % of its median, so the threshold has room on both sides."""


class Unit(enum.StrEnum):
    REQUESTS_PER_S = "requests/s"
    TOKENS_PER_S = "tokens/s"
    """Input plus output tokens per second, as SageServe's TPS."""


class ServeGenError(ValueError):
    """The data folder or a model in it is missing or unreadable."""


@dataclass(frozen=True)
class ModelSeries:
    model: str
    unit: Unit
    series: Series
    gap_windows: int
    """Windows turned into NaN as upstream collection gaps."""


def available(root: Path = DEFAULT_ROOT) -> bool:
    """Whether the rate file is present (tests skip when it is not)."""
    return (root / RATES_FILE).is_file()


def load_model_series(
    model: str,
    unit: Unit = Unit.REQUESTS_PER_S,
    *,
    root: Path = DEFAULT_ROOT,
    gap_fraction: float = GAP_FRACTION,
) -> ModelSeries:
    """The model's load per 10-minute window, clients summed, collection gaps as NaN."""
    t_s, client, rate = _read_rates(root, model)
    windows = np.unique(t_s)
    start = float(windows.min())
    slot = np.round((t_s - start) / WINDOW_S).astype(np.int64)
    n = int(slot.max()) + 1
    if unit is Unit.TOKENS_PER_S:
        weight = rate * _tokens_per_request(root, model, t_s, client, rate)
    else:
        weight = rate
    total = np.zeros(n)
    np.add.at(total, slot, weight)
    requests = np.zeros(n)
    np.add.at(requests, slot, rate)
    present = np.zeros(n, dtype=bool)
    present[slot] = True
    # Gaps are judged on requests/s, the quantity upstream measured directly.
    gap = ~present | (requests < gap_fraction * float(np.median(requests[present])))
    total[gap] = np.nan
    series = Series(start_s=start, step_s=WINDOW_S, values=tuple(total.tolist()))
    return ModelSeries(model=model, unit=unit, series=series, gap_windows=int(gap.sum()))


def _read_rates(root: Path, model: str) -> tuple[FloatArray, FloatArray, FloatArray]:
    path = root / RATES_FILE
    if not path.is_file():
        raise ServeGenError(f"{path} not found (ServeGen data is read from ../shared/data)")
    table = pq.read_table(
        path, columns=["model", "client_id", "t_s", "rate_rps"], filters=[("model", "=", model)]
    )
    if table.num_rows == 0:
        known = pc.unique(pq.read_table(path, columns=["model"]).column("model")).to_pylist()
        raise ServeGenError(f"model {model!r} not in {path.name}; known: {sorted(known)}")
    rate = np.nan_to_num(table.column("rate_rps").to_numpy().astype(np.float64), nan=0.0)
    return (
        table.column("t_s").to_numpy().astype(np.float64),
        table.column("client_id").to_numpy().astype(np.float64),
        np.clip(rate, 0.0, None),
    )


def _tokens_per_request(
    root: Path, model: str, t_s: FloatArray, client: FloatArray, rate: FloatArray
) -> FloatArray:
    """Mean input+output tokens per request for every (client, 10-minute window) row.

    Known: the client's own statistics for the enclosing 6-hour window, else the client's mean over
    its windows. Unknown clients: the rate-weighted mean of the known ones in the same window.
    """
    path = root / TOKENS_FILE
    if not path.is_file():
        raise ServeGenError(f"{path} not found (needed for tokens/s)")
    table = pq.read_table(
        path,
        columns=["model", "client_id", "t_s", "field", "mean"],
        filters=[("model", "=", model), ("field", "in", ["input_tokens", "output_tokens"])],
    )
    # Tokens per request of a (client, 6-hour window): mean input + mean output.
    stat_key = _key(
        table.column("client_id").to_numpy().astype(np.int64),
        table.column("t_s").to_numpy().astype(np.int64) // TOKEN_WINDOW_S,
    )
    keys, where = np.unique(stat_key, return_inverse=True)
    per_window = np.zeros(keys.size)
    np.add.at(per_window, where, table.column("mean").to_numpy().astype(np.float64))
    stat_clients = keys // _WINDOWS_PER_CLIENT
    clients, client_where = np.unique(stat_clients, return_inverse=True)
    client_mean = np.bincount(client_where, weights=per_window) / np.bincount(client_where)

    client_ids = client.astype(np.int64)
    token_window = t_s.astype(np.int64) // TOKEN_WINDOW_S
    tokens = np.full(t_s.size, np.nan)
    by_client = _lookup(clients, client_mean, client_ids)
    tokens = np.where(np.isnan(by_client), tokens, by_client)
    by_window = _lookup(keys, per_window, _key(client_ids, token_window))
    tokens = np.where(np.isnan(by_window), tokens, by_window)
    # Fill the unknown clients per 6-hour window with the known clients' rate-weighted mean.
    known_rows = ~np.isnan(tokens)
    overall = _weighted_mean(tokens[known_rows], rate[known_rows])
    for w in np.unique(token_window):
        rows = token_window == w
        fill = _weighted_mean(tokens[rows & known_rows], rate[rows & known_rows])
        tokens[rows & ~known_rows] = fill if np.isfinite(fill) else overall
    filled: FloatArray = np.nan_to_num(tokens, nan=0.0)
    return filled


_WINDOWS_PER_CLIENT = 1 << 20
"""Key space per client for (client, window) keys: far more 6-hour windows than any trace has."""


def _key(client: npt.NDArray[np.int64], window: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    return client * _WINDOWS_PER_CLIENT + window


def _lookup(
    keys: npt.NDArray[np.int64], values: FloatArray, wanted: npt.NDArray[np.int64]
) -> FloatArray:
    """`values[keys == wanted]` for every wanted key (keys sorted and unique); NaN when absent."""
    if keys.size == 0:
        return np.full(wanted.size, np.nan)
    at = np.clip(np.searchsorted(keys, wanted), 0, keys.size - 1)
    return np.where(keys[at] == wanted, values[at], np.nan)


def _weighted_mean(values: FloatArray, weights: FloatArray) -> float:
    total = float(weights.sum())
    if total > 0:
        return float((values * weights).sum() / total)
    return float(values.mean()) if values.size else float("nan")
