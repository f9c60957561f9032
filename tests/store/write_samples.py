"""Small events and run rows for tests of the SQLite journal's write path."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from replan.messages import RunStatus, TaskStarted
from replan.store import RunSummary

T0 = datetime(2026, 1, 5, 8, 30, tzinfo=UTC)


def started(seq: int) -> TaskStarted:
    """Event ``seq`` of a run: task ``t{seq}`` started."""
    return TaskStarted(
        seq=seq, at=T0 + timedelta(seconds=seq), task_id=f"t{seq}", attempt=1
    )


def summary(
    seq: int, status: RunStatus = RunStatus.RUNNING, *, run_id: str = "run-1"
) -> RunSummary:
    """The run's row once event ``seq`` is journaled."""
    return RunSummary(
        run_id=run_id,
        goal="walk the chain",
        kind="plan",
        pattern="discovery",
        status=status,
        created_at=T0,
        updated_at=T0 + timedelta(seconds=seq),
        last_seq=seq,
        stop_reason="done" if status.final else None,
    )
