"""Argument checks shared by public entry points; each error names the argument."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

__all__ = [
    "check_positive_int",
    "check_nonnegative_int",
    "check_unit_interval",
    "check_finite",
    "check_real_range",
    "check_list",
]


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` as an int >= 1, else raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)


def check_nonnegative_int(name: str, value: object) -> int:
    """Return ``value`` as an int >= 0, else raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a non-negative integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value}")
    return int(value)


def check_finite(name: str, value: object) -> float:
    """Return ``value`` as a finite float, else raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def check_real_range(
    name: str, value: object, lo: float, hi: float, *, lo_open: bool = False
) -> float:
    """Return ``value`` as a finite float in [lo, hi] (or (lo, hi] with ``lo_open``), else raise naming ``name``.

    ``hi = math.inf`` means no upper bound (the message then says ``>= lo`` or ``> lo``).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if not (math.isfinite(v) and (v > lo if lo_open else v >= lo) and v <= hi):
        allowed = (
            f"{'>' if lo_open else '>='} {lo:g}"
            if hi == math.inf
            else f"in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
        )
        raise ValueError(f"{name} must be a finite number {allowed}, got {value}")
    return v


def check_unit_interval(
    name: str, value: object, *, open_left: bool = True, open_right: bool = False
) -> float:
    """Return ``value`` as a float in (0, 1] (bounds configurable), else raise naming ``name``."""
    v = check_finite(name, value)
    lo_ok = v > 0 if open_left else v >= 0
    hi_ok = v < 1 if open_right else v <= 1
    if not (lo_ok and hi_ok):
        lo, hi = "(0" if open_left else "[0", "1)" if open_right else "1]"
        raise ValueError(f"{name} must lie in {lo}, {hi}, got {v}")
    return v


def check_list(name: str, value: object, min_len: int, purpose: str) -> list:
    """Return ``value`` as a list of at least ``min_len`` items (not a bare string), else raise naming ``name``.

    ``purpose`` completes the message, e.g. ``"two prompts to intersect"``.
    """
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a list, got {type(value).__name__}")
    if len(value) < min_len:
        raise ValueError(f"{name} must hold at least {purpose}, got {len(value)}")
    return list(value)
