"""Argument checks shared by public entry points; each error names the argument.

Every type test of the library lives here. ``bool`` is an ``int`` subclass in
Python, so ``is_integer`` / ``is_real`` exclude it (``True`` is never a count or a
score); ``real_number`` and ``bool_like`` also accept NumPy scalars and 0-d
NumPy/torch values, which is what user code computing a score or a condition
with those libraries hands over::

    from llamppl.validation import check_positive_int, real_number
    n = check_positive_int("n_particles", n)
    log_w = real_number("score(log_w)", log_w)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

__all__ = [
    "is_integer",
    "is_real",
    "real_number",
    "bool_like",
    "check_positive_int",
    "check_nonnegative_int",
    "check_unit_interval",
    "check_finite",
    "check_real_range",
    "check_list",
]


def is_integer(value: object) -> bool:
    """True for Python/NumPy integers, False for ``bool`` and everything else."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def is_real(value: object) -> bool:
    """True for Python/NumPy real numbers (ints included), False for ``bool`` and everything else."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _zero_dim(value: object) -> tuple[object, str] | None:
    """``(item, dtype kind)`` of a 0-d NumPy array or torch tensor, else None.

    The kind is NumPy's letter: ``b`` bool, ``i``/``u`` integer, ``f`` float, ``c`` complex.
    """
    if isinstance(value, np.ndarray):
        return (value.item(), value.dtype.kind) if value.ndim == 0 else (None, "shape")
    if type(value).__module__.startswith("torch") and hasattr(value, "dim"):
        if value.dim() != 0:
            return None, "shape"
        dtype = value.dtype
        if str(dtype) == "torch.bool":
            kind = "b"
        else:
            kind = "c" if dtype.is_complex else "f" if dtype.is_floating_point else "i"
        return value.item(), kind
    return None


def _describe(array: object) -> str:
    shape, dtype = tuple(getattr(array, "shape", ())), getattr(array, "dtype", "?")
    return f"a {type(array).__name__} of dtype {dtype} and shape {shape}"


def real_number(name: str, value: object) -> float:
    """``value`` as a float if it is a real number, else a ``TypeError`` naming ``name``.

    Accepted: Python ``int``/``float`` (and other ``numbers.Real``), NumPy real
    scalars, 0-d NumPy arrays and torch tensors of a real dtype. Refused: ``bool``
    (write ``condition`` for a constraint), strings, complex numbers and arrays or
    tensors with elements — a silent ``float("1")`` would score text.
    """
    if is_real(value):
        return float(value)
    zero_dim = _zero_dim(value)
    if zero_dim is not None and zero_dim[1] in ("i", "u", "f"):
        return float(zero_dim[0])
    what = _describe(value) if zero_dim else repr(value)
    raise TypeError(
        f"{name} must be a real number (int, float, NumPy scalar or 0-d real tensor), got {what}"
    )


def bool_like(name: str, value: object) -> bool:
    """``value`` as a bool if it is one, else a ``TypeError`` naming ``name``.

    Accepted: Python ``bool``, ``numpy.bool_``, and 0-d NumPy arrays or torch
    tensors of bool dtype. Refused: numbers (``0.5`` is not a truth value),
    strings (``"no"`` is truthy), ``None`` and tensors with more than one element.
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    zero_dim = _zero_dim(value)
    if zero_dim is not None and zero_dim[1] == "b":
        return bool(zero_dim[0])
    what = _describe(value) if zero_dim else repr(value)
    raise TypeError(
        f"{name} must be a bool (Python, NumPy or a 0-d bool tensor), got {what}"
        "; compare explicitly, e.g. condition(x > 0) or condition(bool(mask.all()))"
    )


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` as an int >= 1, else raise naming ``name``."""
    if not is_integer(value):
        raise TypeError(f"{name} must be a positive integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)


def check_nonnegative_int(name: str, value: object) -> int:
    """Return ``value`` as an int >= 0, else raise naming ``name``."""
    if not is_integer(value):
        raise TypeError(f"{name} must be a non-negative integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value}")
    return int(value)


def check_finite(name: str, value: object) -> float:
    """Return ``value`` as a finite float, else raise naming ``name``."""
    if not is_real(value):
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
    if not is_real(value):
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
