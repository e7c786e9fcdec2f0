"""Argument checks shared by every module (a leaf: it imports nothing of the package, so that
``mask``, ``philox`` and ``footprint``, which ``validate`` imports, can use it too)."""

from __future__ import annotations

import numpy as np

__all__ = ["check_int"]


def check_int(name: str, value, minimum: int | None = None, *, what: str = "an int") -> int:
    """``value`` as a Python int: a Python or NumPy integer, never a bool, at least ``minimum``.

    Raises:
        TypeError: ``value`` is not an integer (a bool and a float with an integral value included),
            the message ``"{name}: expected {what}, got {value!r}"``.
        ValueError: ``value < minimum``, the message ``"{name}: expected {what} >= {minimum}, got
            {value}"``.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected {what}, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: expected {what} >= {minimum}, got {value}")
    return value
