"""Driving on the runs a journal failure let go of, without driving one twice.

When an append fails (a full disk, a PostgreSQL restart), the supervisor
lets go of the run: it stays unfinished in the journal, driven by nobody.
Every ``redrive_interval_s`` the daemon looks for such runs and resumes
them (:meth:`Supervisor._drive_on`): the runs the journal holds unfinished
that this daemon does not drive. On a SQLite journal it holds the journal's
lease alone, so no other live daemon drives them. A PostgreSQL journal
leases its runs one by one: the scan claims those nobody holds, which
includes the runs of a daemon that died once their leases expired, and
leaves alone those another live daemon holds.

A journal that keeps failing lets go of the runs driven on again: the scan
then looks half as often each time, down to :data:`BACKOFF` intervals
apart, and says so once per streak of failures, and once more when the
journal works again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from .._errors import SupervisorError

if TYPE_CHECKING:
    from ..supervisor import Supervisor
    from ._service import Daemon

logger = logging.getLogger("replan.daemon")

BACKOFF = 16
"""A failing journal's scans come at most this many intervals apart..."""
MAX_DELAY_S = 600.0
"""...and at most this many seconds apart (or one interval, if longer)."""


async def redrive_loop(daemon: Daemon) -> None:
    """Scan every ``redrive_interval_s`` until cancelled or the daemon drains."""
    interval = daemon.settings.redrive_interval_s
    if not interval:
        return
    longest = max(interval, min(BACKOFF * interval, MAX_DELAY_S))
    scan = Scan()
    delay = interval
    while True:
        await anyio.sleep(delay)
        try:
            supervisor = daemon.supervisor
            works = await scan.once(supervisor)
        except SupervisorError:
            return  # draining: the runs left wait in the journal
        delay = interval if works else min(2 * delay, longest)


class Scan:
    """One daemon's scans: what the last one drove on, and whether the
    journal has been failing since."""

    def __init__(self) -> None:
        self.driven: list[str] = []
        """The runs the last scan drove on."""
        self.failing: str | None = None
        """What went wrong, while the journal keeps failing."""

    async def once(self, supervisor: Supervisor) -> bool:
        """Drive on the runs let go of; False while the journal fails.

        Raises:
            SupervisorError: the supervisor is stopping.
        """
        problem = None
        for run_id in self.driven:
            crash = supervisor._crash(run_id)
            if crash is not None:
                problem = f"run {run_id} was let go of again: {_describe(crash)}"
                break
        self.driven = []
        try:
            handles = await supervisor._drive_on()
        except SupervisorError:
            raise
        except Exception as exc:
            # The journal cannot be read (the server is down), or another
            # daemon holds a SQLite journal's lease: left as they are until
            # the next scan.
            logger.debug("the scan for runs let go of failed", exc_info=True)
            problem = problem or _describe(exc)
            handles = []
        self.driven = [h.run_id for h in handles]
        if problem is not None:
            if self.failing is None:
                logger.warning(
                    "the journal is failing; unfinished runs it let go of are "
                    "driven on once it works again (looking less often "
                    "meanwhile): %s",
                    problem,
                )
            self.failing = problem
            return False
        if self.failing is not None:
            self.failing = None
            logger.warning("the journal works again")
        if handles:
            logger.info(
                "drove on %d unfinished run(s) nobody drove: %s",
                len(handles),
                ", ".join(self.driven),
            )
        return True


def _describe(exc: BaseException) -> str:
    # A driver's failure comes out of its task groups wrapped.
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"
