"""The typed messages actors, the journal and the HTTP API exchange."""

from __future__ import annotations

from ._actors import MESSAGE_ADAPTER as MESSAGE_ADAPTER
from ._actors import ActorFailure as ActorFailure
from ._actors import AlignmentReply as AlignmentReply
from ._actors import AlignmentRequest as AlignmentRequest
from ._actors import CritiqueReply as CritiqueReply
from ._actors import CritiqueRequest as CritiqueRequest
from ._actors import EvolveReply as EvolveReply
from ._actors import EvolveRequest as EvolveRequest
from ._actors import ExecuteReply as ExecuteReply
from ._actors import ExecuteRequest as ExecuteRequest
from ._actors import Message as Message
from ._actors import ModelCall as ModelCall
from ._actors import PlanReply as PlanReply
from ._actors import PlanRequest as PlanRequest
from ._actors import RankReply as RankReply
from ._actors import RankRequest as RankRequest
from ._actors import Reply as Reply
from ._actors import Request as Request
from ._actors import ReviewReply as ReviewReply
from ._actors import ReviewRequest as ReviewRequest
from ._actors import SynthesizeReply as SynthesizeReply
from ._actors import SynthesizeRequest as SynthesizeRequest
from ._events import EVENT_ADAPTER as EVENT_ADAPTER
from ._events import Event as Event
from ._events import GateOpened as GateOpened
from ._events import GateResolved as GateResolved
from ._events import MilestoneReviewed as MilestoneReviewed
from ._events import PlanCreated as PlanCreated
from ._events import ReplanApplied as ReplanApplied
from ._events import ReplanRefused as ReplanRefused
from ._events import RunCompacted as RunCompacted
from ._events import RunFinished as RunFinished
from ._events import RunSubmitted as RunSubmitted
from ._events import TaskFinished as TaskFinished
from ._events import TaskInterrupted as TaskInterrupted
from ._events import TaskStarted as TaskStarted
from ._events import UsageRecorded as UsageRecorded
from ._gate import GateInfo as GateInfo
from ._gate import GateRequest as GateRequest
from ._gate import GateResolution as GateResolution
from ._plan import Alignment as Alignment
from ._plan import Comparison as Comparison
from ._plan import Critique as Critique
from ._plan import PlanProposal as PlanProposal
from ._plan import PlanVersion as PlanVersion
from ._plan import ReplanOutcome as ReplanOutcome
from ._plan import ReplanRecord as ReplanRecord
from ._plan import Synthesis as Synthesis
from ._plan import Trigger as Trigger
from ._plan import Verdict as Verdict
from ._result import RunResult as RunResult
from ._result import RunStatus as RunStatus
from ._result import TokenUsage as TokenUsage
from ._result import Usage as Usage
from ._spec import GatePolicy as GatePolicy
from ._spec import Limits as Limits
from ._spec import RunSpec as RunSpec
from ._spec import check_drafts as check_drafts
from ._task import TERMINAL_STATUSES as TERMINAL_STATUSES
from ._task import Task as Task
from ._task import TaskDraft as TaskDraft
from ._task import TaskOutcome as TaskOutcome
from ._task import TaskStatus as TaskStatus

__all__ = (
    "EVENT_ADAPTER",
    "MESSAGE_ADAPTER",
    "TERMINAL_STATUSES",
    "ActorFailure",
    "Alignment",
    "AlignmentReply",
    "AlignmentRequest",
    "Comparison",
    "Critique",
    "CritiqueReply",
    "CritiqueRequest",
    "Event",
    "EvolveReply",
    "EvolveRequest",
    "ExecuteReply",
    "ExecuteRequest",
    "GateInfo",
    "GateOpened",
    "GatePolicy",
    "GateRequest",
    "GateResolution",
    "GateResolved",
    "Limits",
    "Message",
    "MilestoneReviewed",
    "ModelCall",
    "PlanCreated",
    "PlanProposal",
    "PlanReply",
    "PlanRequest",
    "PlanVersion",
    "RankReply",
    "RankRequest",
    "ReplanApplied",
    "ReplanOutcome",
    "ReplanRecord",
    "ReplanRefused",
    "Reply",
    "Request",
    "ReviewReply",
    "ReviewRequest",
    "RunCompacted",
    "RunFinished",
    "RunResult",
    "RunSpec",
    "RunStatus",
    "RunSubmitted",
    "Synthesis",
    "SynthesizeReply",
    "SynthesizeRequest",
    "Task",
    "TaskDraft",
    "TaskFinished",
    "TaskInterrupted",
    "TaskOutcome",
    "TaskStarted",
    "TaskStatus",
    "TokenUsage",
    "Trigger",
    "Usage",
    "UsageRecorded",
    "Verdict",
    "check_drafts",
)
