from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from ._base import Frozen
from ._explore import (
    ContextAnalysis,
    DiscoveryBrief,
    Hypothesis,
    HypothesisBatch,
    ValidationBatch,
)
from ._gate import GateRequest, GateResolution
from ._plan import (
    Alignment,
    Comparison,
    Critique,
    PlanProposal,
    PlanVersion,
    ReplanRecord,
    Synthesis,
    Verdict,
)
from ._result import ModelFailure, RunResult, TokenUsage, Usage
from ._task import Task, TaskDraft, TaskOutcome
from ._tool import ToolCall, ToolExchange, ToolResult


class ModelCall(Frozen):
    """The usage of one model call made while answering a request."""

    kind: Literal["model_call"] = "model_call"
    role: str
    purpose: str
    usage: TokenUsage


class _Request(Frozen):
    context: dict[str, Any] = Field(default_factory=dict)
    """Structured inputs for the model (see ``ModelRequest.context``)."""
    token_allowance: int | None = None
    """Tokens the handler may still spend (the run's budget left). A handler
    that makes several model calls starts none once it is spent, and answers
    with what it has, marked ``cut_short``."""


class PlanRequest(_Request):
    """Ask the planner for a plan (``plan``, ``replan`` or ``boundary``)."""

    kind: Literal["plan_request"] = "plan_request"
    purpose: Literal["plan", "replan", "boundary"]
    candidates: int = 1


class PlanReply(Frozen):
    kind: Literal["plan_reply"] = "plan_reply"
    proposals: list[PlanProposal]
    cut_short: bool = False
    calls: list[ModelCall] = Field(default_factory=list)


class ExecuteRequest(_Request):
    kind: Literal["execute_request"] = "execute_request"
    task: Task
    max_tool_steps: int = 8
    """Model calls the task's tool loop may make (``Limits.max_tool_steps``)."""


class ExecuteReply(Frozen):
    kind: Literal["execute_reply"] = "execute_reply"
    outcome: TaskOutcome
    calls: list[ModelCall] = Field(default_factory=list)
    failures: list[ModelFailure] = Field(default_factory=list)
    """Model calls that failed for good while running the task."""


class SynthesizeRequest(_Request):
    kind: Literal["synthesize_request"] = "synthesize_request"


class SynthesizeReply(Frozen):
    kind: Literal["synthesize_reply"] = "synthesize_reply"
    synthesis: Synthesis
    calls: list[ModelCall] = Field(default_factory=list)


class ReviewRequest(_Request):
    kind: Literal["review_request"] = "review_request"


class ReviewReply(Frozen):
    kind: Literal["review_reply"] = "review_reply"
    verdict: Verdict
    calls: list[ModelCall] = Field(default_factory=list)


class CritiqueRequest(_Request):
    """Score candidates; the reviewer answers one critique per candidate."""

    kind: Literal["critique_request"] = "critique_request"
    candidates: list[PlanProposal]


class CritiqueReply(Frozen):
    kind: Literal["critique_reply"] = "critique_reply"
    critiques: list[Critique]
    cut_short: bool = False
    calls: list[ModelCall] = Field(default_factory=list)


class AlignmentRequest(_Request):
    kind: Literal["alignment_request"] = "alignment_request"


class AlignmentReply(Frozen):
    kind: Literal["alignment_reply"] = "alignment_reply"
    alignment: Alignment
    calls: list[ModelCall] = Field(default_factory=list)


class RankRequest(_Request):
    """Order candidates by a pairwise tournament."""

    kind: Literal["rank_request"] = "rank_request"
    candidates: list[PlanProposal]


class RankReply(Frozen):
    kind: Literal["rank_reply"] = "rank_reply"
    order: list[int]
    """Candidate indexes, best first."""
    wins: list[int]
    """Pairwise wins per candidate, by index."""
    comparisons: list[Comparison] = Field(default_factory=list)
    cut_short: bool = False
    calls: list[ModelCall] = Field(default_factory=list)


class EvolveRequest(_Request):
    kind: Literal["evolve_request"] = "evolve_request"
    candidate: PlanProposal
    critiques: list[Critique]


class EvolveReply(Frozen):
    kind: Literal["evolve_reply"] = "evolve_reply"
    proposal: PlanProposal
    calls: list[ModelCall] = Field(default_factory=list)


ExplorePurpose = Literal[
    "gaps", "hypotheses", "validation", "critique", "compare", "evolve"
]
"""What an explore run asks a role: planner ``gaps``, ``hypotheses`` and
``validation``; reviewer ``critique``; ranker ``compare``; evolver ``evolve``."""


class ExploreRequest(_Request):
    """One model call of an explore run, answered by the role it is sent to."""

    kind: Literal["explore_request"] = "explore_request"
    purpose: ExplorePurpose
    temperature: float | None = None
    """None: the role's own temperature."""
    lenses: list[str] = Field(default_factory=list)
    """For ``critique``: the lenses every score set must cover."""


ExploreOutput = Annotated[
    ContextAnalysis | HypothesisBatch | ValidationBatch | Critique | Comparison,
    Field(discriminator="kind"),
]


class ExploreReply(Frozen):
    """The answer, or None with the errors of a malformed answer asked twice."""

    kind: Literal["explore_reply"] = "explore_reply"
    output: ExploreOutput | None = None
    errors: list[str] = Field(default_factory=list)
    calls: list[ModelCall] = Field(default_factory=list)


class ActorFailure(Frozen):
    """The typed report of a handler that raised instead of answering."""

    kind: Literal["actor_failure"] = "actor_failure"
    role: str
    error_type: str
    message: str
    model_failure: ModelFailure | None = None
    """Set when the handler raised a model error: its usage, raw text and
    whether it is transient or ends the run."""


Request = (
    PlanRequest
    | ExecuteRequest
    | SynthesizeRequest
    | ReviewRequest
    | CritiqueRequest
    | AlignmentRequest
    | RankRequest
    | EvolveRequest
    | ExploreRequest
    | GateRequest
)
Reply = (
    PlanReply
    | ExecuteReply
    | SynthesizeReply
    | ReviewReply
    | CritiqueReply
    | AlignmentReply
    | RankReply
    | EvolveReply
    | ExploreReply
    | GateResolution
    | ActorFailure
)

Message = Annotated[
    Request
    | Reply
    | Task
    | TaskDraft
    | TaskOutcome
    | PlanProposal
    | PlanVersion
    | ReplanRecord
    | Verdict
    | Critique
    | Alignment
    | Comparison
    | Synthesis
    | Hypothesis
    | HypothesisBatch
    | ContextAnalysis
    | ValidationBatch
    | DiscoveryBrief
    | RunResult
    | TokenUsage
    | Usage
    | ModelCall
    | ModelFailure
    | ToolCall
    | ToolResult
    | ToolExchange,
    Field(discriminator="kind"),
]
"""Anything that crosses a channel, the journal or the HTTP API."""

MESSAGE_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)
"""(De)serializes any :data:`Message`. ``RunSpec`` travels inside events (its
own ``kind`` field names the run kind); events have ``EVENT_ADAPTER``."""
