"""The arguments of the supervisor's, a handle's and the gates' methods,
checked before anything is read or changed, so that a wrong one is told as
a :class:`ConfigurationError` naming it rather than as whatever error it
would cause deep inside (a ``TypeError`` comparing it, a driver's error
binding it)."""

from __future__ import annotations

import math
import operator
from typing import SupportsIndex

from .._errors import ConfigurationError


def an_id(value: object, field: str) -> str:
    """``value``, an id (of a run, of a gate): a string.

    Raises:
        ConfigurationError: it is no string (field ``field``).
    """
    if not isinstance(value, str):
        raise ConfigurationError(field, f"a string expected, not {_kind(value)}")
    return value


def a_seq(value: object, field: str) -> int:
    """``value``, a position in a run's journal: a whole number from 0.

    Raises:
        ConfigurationError: it is no whole number (``True``, ``1.5``,
            ``"3"``), or it is below 0 (field ``field``).
    """
    if isinstance(value, bool) or not isinstance(value, SupportsIndex):
        raise ConfigurationError(
            field, f"a whole number from 0 expected, not {_kind(value)}"
        )
    seq = operator.index(value)  # an int, or one as numpy has them
    if seq < 0:
        raise ConfigurationError(field, f"a whole number from 0 expected, not {seq}")
    return seq


def seconds(value: object, field: str) -> float:
    """``value``, a number of seconds: an int or a float, not NaN (an
    infinity waits for good, a negative number not at all).

    Raises:
        ConfigurationError: it is no number (``True``, ``"10"``), NaN, or
            an int too large for a float (field ``field``).
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(field, f"a number of seconds, not {_kind(value)}")
    try:
        found = float(value)
    except OverflowError:
        raise ConfigurationError(
            field, "a number of seconds, not one too large for a float"
        ) from None
    if math.isnan(found):
        raise ConfigurationError(field, "a number of seconds, not nan")
    return found


def _kind(value: object) -> str:
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    if isinstance(value, str) and len(value) <= 40:
        return repr(value)
    return type(value).__name__
