"""Numbers read from users' files (traces, engine profiles, tenant weights), checked one way.

Why a module of its own: the obvious checks let bad values through. NaN compares false with
everything, so `value < 0` accepts it, and an arrival or a duration of NaN or infinity never comes
due, so the event loop waits for it forever; `int()` truncates 10.9 to 10 and takes `True` for 1;
`float()` of a string accepts "nan" and "inf". Every reader of such files calls these and wraps the
message with where the value was (a row and column, a field), so a bad value is one clear error,
never a hang, a silently changed number or NaN in a report.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml


class InputValueError(ValueError):
    """One value is unusable; the message says why but not where (the caller adds that)."""


def read_yaml(path: Path) -> Any:
    """The parsed YAML (or JSON) of a user's file; InputValueError in one line when the file is
    missing, not UTF-8 text or not YAML, rather than the tracebacks those raise."""
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputValueError(f"cannot read: {' '.join(reason.split())}") from exc


def finite_number(value: object, *, minimum: float = 0.0, above: bool = False) -> float:
    """`value` (a number, or a string of one, as CSV cells are) as a finite float >= `minimum`
    (> `minimum` if `above`); InputValueError otherwise. Booleans are not numbers here."""
    bound = f"> {minimum:g}" if above else f">= {minimum:g}"
    problem = InputValueError(f"must be a finite number {bound}, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise problem
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise problem from None
    if not math.isfinite(number) or number < minimum or (above and number == minimum):
        raise problem
    return number


def whole_number(value: object, *, minimum: int) -> int:
    """`value` as an int >= `minimum`; InputValueError otherwise.

    Integral floats (10.0, also "10.0" and "1e3" as strings) are accepted: a column with a gap
    becomes float in pandas and parquet, and its values are still counts. A fraction (10.9) or a
    boolean is refused, where `int()` would truncate it or read it as 1."""
    problem = InputValueError(f"must be a whole number >= {minimum}, got {value!r}")
    number: int
    if isinstance(value, bool):
        raise problem
    if isinstance(value, int):
        number = value
    elif isinstance(value, float):
        number = _integral(value, problem)
    elif isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            try:
                as_float = float(value)
            except ValueError:
                raise problem from None
            number = _integral(as_float, problem)
    else:
        raise problem
    if number < minimum:
        raise problem
    return number


def _integral(value: float, problem: InputValueError) -> int:
    if not value.is_integer():  # also NaN and infinities
        raise problem
    return int(value)
