"""What stops a supervisor's task groups from outside the program's logic.

A ``KeyboardInterrupt`` (on trio, Ctrl-C lands wherever code runs: a task
function, a model call), a ``SystemExit`` or a cancellation that goes out of
one of the supervisor's tasks crosses the task groups of its pools and its
runs, each of which wraps it in a ``BaseExceptionGroup``. Let out like that,
it escapes its caller's ``except KeyboardInterrupt:``. A group that holds
nothing else is let out as the one exception it stands for.
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio


def lone_exit(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The exception to let out in place of ``group``; None to let it out.

    When every exception in ``group`` (however nested) is no ``Exception``
    (a ``KeyboardInterrupt``, a ``SystemExit``, a cancellation), the first
    that is no cancellation stands for them all (the same interrupt seen by
    several tasks), else the first cancellation. A group that holds an
    ``Exception`` is let out whole, so that no error in it is hidden.
    """
    found = list(leaves(group))
    if not found or any(isinstance(leaf, Exception) for leaf in found):
        return None
    cancelled = anyio.get_cancelled_exc_class()
    stops = [leaf for leaf in found if not isinstance(leaf, cancelled)]
    return (stops or found)[0]


def leaves(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions in ``exc``, however deeply grouped (``exc`` itself
    when it is no group)."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaves(inner)
    else:
        yield exc
