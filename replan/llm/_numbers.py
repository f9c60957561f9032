"""Checks of numeric options: whole numbers and finite numbers in range.

Kept apart from the retry policy, which needs the ``openai`` package, so
that a scripted model checks its options without loading it.
"""

from __future__ import annotations

import math
import operator
from numbers import Real
from typing import SupportsIndex

from .._errors import ConfigurationError


def whole_number(field: str, value: object, *, minimum: int) -> int:
    """``value`` as an int, if it is a whole number (not a bool) from
    ``minimum``.

    Raises:
        ConfigurationError: naming ``field``.
    """
    if isinstance(value, bool) or not isinstance(value, SupportsIndex):
        raise ConfigurationError(field, f"must be a whole number, not {value!r}")
    number = operator.index(value)
    if number < minimum:
        raise ConfigurationError(field, f"must be at least {minimum}, not {number}")
    return number


def finite_number(
    field: str, value: object, *, minimum: float, above: bool = False
) -> float:
    """``value`` as a float, if it is a finite number (not a bool) from
    ``minimum`` (or above it, with ``above``).

    Raises:
        ConfigurationError: naming ``field``.
    """
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ConfigurationError(field, f"must be a number, not {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ConfigurationError(field, f"must be a finite number, not {number}")
    if number < minimum or (above and number == minimum):
        bound = "more than" if above else "at least"
        raise ConfigurationError(field, f"must be {bound} {minimum:g}, not {number:g}")
    return number
