"""The counting model (see counting_model.py), in a daemon whose SQLite
journal fails its appends while a file exists, as on a full disk.

Loaded by the daemon under test as ``--model python:full_disk_model:model``;
``REPLAN_TEST_DISK_FULL`` names the file. The effect ledger keeps working
(its rows are small), so an attempt whose end the journal missed is taken
from it, not run again.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from typing import Any

import anyio
import counting_model

from replan import ScriptedModel
from replan.messages import Event
from replan.store import RunSummary, SQLiteStore


def model(settings: Any) -> ScriptedModel:
    full = os.environ["REPLAN_TEST_DISK_FULL"]
    append = SQLiteStore.append

    async def append_unless_full(
        self: SQLiteStore, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        if await anyio.Path(full).exists():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        await append(self, run_id, events, summary)

    SQLiteStore.append = append_unless_full  # type: ignore[method-assign]
    return counting_model.model(settings)
