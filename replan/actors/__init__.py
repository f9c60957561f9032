"""The six actors and the small runtime they share."""

from __future__ import annotations

from ._evolver import Evolver as Evolver
from ._executor import Executor as Executor
from ._executor import TaskContext as TaskContext
from ._executor import TaskRunner as TaskRunner
from ._human_gate import HumanGate as HumanGate
from ._planner import Planner as Planner
from ._ranker import Ranker as Ranker
from ._reviewer import Reviewer as Reviewer
from ._runtime import Actor as Actor
from ._runtime import ActorContext as ActorContext
from ._runtime import ActorPool as ActorPool
from ._runtime import Envelope as Envelope
from ._runtime import PoolStatistics as PoolStatistics
from ._runtime import ReplySlot as ReplySlot
from ._runtime import mark_request_failed as mark_request_failed
from ._runtime import waiting_for_a_person as waiting_for_a_person

__all__ = (
    "Actor",
    "ActorContext",
    "ActorPool",
    "Envelope",
    "Evolver",
    "Executor",
    "HumanGate",
    "Planner",
    "PoolStatistics",
    "Ranker",
    "ReplySlot",
    "Reviewer",
    "TaskContext",
    "TaskRunner",
    "mark_request_failed",
    "waiting_for_a_person",
)
