"""Retention: fold or delete finished runs older than the configured age."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from ..store import JournalConflict, JournalCorrupt
from ..supervisor import fold_journal, snapshot

if TYPE_CHECKING:
    from ._service import Daemon

logger = logging.getLogger("replan.daemon")

BATCH = 100
"""Runs handled per store query; a pass goes on until none is left."""


async def retention_loop(daemon: Daemon) -> None:
    """Apply retention every ``retention_interval_s`` until cancelled."""
    settings = daemon.settings
    if settings.retention == "off":
        return
    while True:
        try:
            await apply_retention(daemon)
        except Exception:
            # A bad pass must not stop the daemon; the next one tries again.
            outage = daemon.journal_outage
            if outage is None:
                logger.exception("retention pass failed")
            else:
                # The journal's outage, not a bug: one line, as the
                # store's and the runs' own outage lines.
                logger.warning(
                    "retention pass skipped: the journal cannot be reached "
                    "(%s); the next pass tries again",
                    outage,
                )
        await anyio.sleep(settings.retention_interval_s)


async def apply_retention(daemon: Daemon) -> int:
    """One pass: compact or delete every expired run. Returns how many."""
    settings = daemon.settings
    store = daemon.store
    cutoff = datetime.now(UTC) - timedelta(seconds=settings.retention_age_s)
    deleting = settings.retention == "delete"
    handled = 0
    # Runs whose journal cannot be read back are logged once and left as
    # they are, as a resume leaves them: one must not hold up the others.
    unreadable = daemon.unreadable
    while True:
        limit = BATCH + len(unreadable)
        run_ids = await store.finished_before(
            cutoff, include_compacted=deleting, limit=limit
        )
        before = handled
        for run_id in run_ids:
            if deleting:
                await store.delete_run(run_id)
                daemon.counters.deleted += 1
            elif run_id in unreadable:
                continue
            else:
                try:
                    events = await store.read(run_id)
                    state = fold_journal(run_id, events)
                except JournalCorrupt as exc:
                    logger.error("run %s is not compacted: %s", run_id, exc)
                    unreadable.add(run_id)
                    continue
                try:
                    await store.compact_run(run_id, snapshot(state, len(events)))
                except JournalConflict:
                    continue
                daemon.counters.compacted += 1
            if daemon._supervisor is not None:
                daemon._supervisor.forget(run_id)
            handled += 1
            await anyio.lowlevel.checkpoint()
        if len(run_ids) < limit or handled == before:
            if handled:
                # What the pass deleted grew the WAL: copied back and
                # truncated now rather than at the next append.
                store.checkpoint_soon()
            return handled
