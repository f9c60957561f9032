"""The supervisor: run state, the rules of a run, and the pools it governs."""

from __future__ import annotations

from ._decide import (
    budget_spent as budget_spent,
)
from ._decide import (
    drifted as drifted,
)
from ._decide import (
    guard_replan as guard_replan,
)
from ._decide import (
    heuristic_verdict as heuristic_verdict,
)
from ._decide import (
    milestone_due as milestone_due,
)
from ._decide import (
    phase_gate as phase_gate,
)
from ._decide import (
    ready_tasks as ready_tasks,
)
from ._forwarding import Forwarded as Forwarded
from ._gates import GateRegistry as GateRegistry
from ._handle import RunHandle as RunHandle
from ._state import RunState as RunState
from ._state import apply as apply
from ._state import fold_journal as fold_journal
from ._state import replay as replay
from ._state import snapshot as snapshot
from ._supervisor import Supervisor as Supervisor
from ._supervisor import SupervisorTotals as SupervisorTotals
from ._versions import build_version as build_version

__all__ = (
    "Forwarded",
    "GateRegistry",
    "RunHandle",
    "RunState",
    "Supervisor",
    "SupervisorTotals",
    "apply",
    "budget_spent",
    "build_version",
    "drifted",
    "fold_journal",
    "guard_replan",
    "heuristic_verdict",
    "milestone_due",
    "phase_gate",
    "ready_tasks",
    "replay",
    "snapshot",
)
