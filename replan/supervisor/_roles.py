"""The six actor pools a supervisor runs, and how a run asks them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from ..actors import ActorPool
from ..messages import (
    AlignmentReply,
    AlignmentRequest,
    CritiqueReply,
    CritiqueRequest,
    EvolveReply,
    EvolveRequest,
    ExecuteReply,
    ExecuteRequest,
    ExploreReply,
    ExploreRequest,
    GateRequest,
    GateResolution,
    PlanReply,
    PlanRequest,
    RankReply,
    RankRequest,
    ReviewReply,
    ReviewRequest,
    SynthesizeReply,
    SynthesizeRequest,
)

T = TypeVar("T")

ROLES = ("planner", "executor", "reviewer", "ranker", "evolver", "human_gate")

DEFAULT_WORKERS = {
    "planner": 8,
    "executor": 32,
    "reviewer": 8,
    "ranker": 8,
    "evolver": 8,
    # A worker waits as long as a person does: many gates may be open at once.
    "human_gate": 256,
}


@dataclass(frozen=True, slots=True)
class Roles:
    planner: ActorPool[PlanRequest | ExploreRequest, PlanReply | ExploreReply]
    executor: ActorPool[
        ExecuteRequest | SynthesizeRequest, ExecuteReply | SynthesizeReply
    ]
    reviewer: ActorPool[
        ReviewRequest | CritiqueRequest | ExploreRequest,
        ReviewReply | CritiqueReply | ExploreReply,
    ]
    ranker: ActorPool[
        AlignmentRequest | RankRequest | ExploreRequest,
        AlignmentReply | RankReply | ExploreReply,
    ]
    evolver: ActorPool[EvolveRequest | ExploreRequest, EvolveReply | ExploreReply]
    human_gate: ActorPool[GateRequest, GateResolution]

    def all(self) -> list[ActorPool[Any, Any]]:
        return [
            self.planner,
            self.executor,
            self.reviewer,
            self.ranker,
            self.evolver,
            self.human_gate,
        ]


def expect(reply: object, kind: type[T]) -> T:
    """Narrow a pool's union reply to the type the request implies."""
    if not isinstance(reply, kind):
        raise TypeError(f"expected {kind.__name__}, got {type(reply).__name__}")
    return reply
