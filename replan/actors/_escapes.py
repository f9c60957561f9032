"""What user code (a task function, a tool) lets out that is no ``Exception``."""

from __future__ import annotations

from ._runtime import _stray_cancellation


async def escaped(exc: BaseException, who: str) -> Exception | None:
    """The failure to report when ``who`` (``"the task function"``) let out
    ``exc``, which is no ``Exception``; None when ``exc`` must go on (a
    cancellation sent to the attempt, a ``KeyboardInterrupt``).

    A ``sys.exit()`` (a command-line helper's, argparse's) ends the call,
    not the application. A cancellation that nothing sent (asyncio code that
    awaited a task something else cancelled) is the code's failure too: let
    out, it would count as a crash of the executor, and a few such tasks
    would stop the role for every run.
    """
    if isinstance(exc, SystemExit):
        return RuntimeError(f"{who} called sys.exit({exc.code!r})")
    if await _stray_cancellation(exc):
        return RuntimeError(
            f"{who} raised a cancellation that nothing had asked for "
            f"({type(exc).__name__})"
        )
    return None
