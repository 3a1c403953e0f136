"""Forecasting tests run statsmodels fits: pin OpenBLAS to one thread before numpy loads.

Threads fighting over CI's two busy cores make the fits 5-10x slower. This only takes effect if
numpy is not imported yet; `make test`/CI should export it too (docs/forecasting.md).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
