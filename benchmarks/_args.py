"""Argument types shared by the benchmark scripts: bad sizes fail at parse time with a clear message."""

from __future__ import annotations

import argparse


def _int_at_least(low: int, what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {low}, got {text!r}"
            ) from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    parse.__doc__ = f"An integer >= {low} ({what})."
    return parse


positive_int = _int_at_least(1, "particles, tokens, runs, sizes")
nonnegative_int = _int_at_least(0, "seeds, ramp lengths, move counts")


def positive_float(text: str) -> float:
    """A finite number > 0 (temperatures, exponents)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {value}")
    return value
