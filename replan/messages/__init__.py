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
from ._actors import ExploreOutput as ExploreOutput
from ._actors import ExplorePurpose as ExplorePurpose
from ._actors import ExploreReply as ExploreReply
from ._actors import ExploreRequest as ExploreRequest
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
from ._events import ModelCallFailed as ModelCallFailed
from ._events import PlanCreated as PlanCreated
from ._events import ReplanApplied as ReplanApplied
from ._events import ReplanRefused as ReplanRefused
from ._events import RetryScheduled as RetryScheduled
from ._events import RunCompacted as RunCompacted
from ._events import RunFinished as RunFinished
from ._events import RunSubmitted as RunSubmitted
from ._events import TaskFinished as TaskFinished
from ._events import TaskInterrupted as TaskInterrupted
from ._events import TaskStarted as TaskStarted
from ._events import TraceStarted as TraceStarted
from ._events import TraceSuspended as TraceSuspended
from ._events import UsageRecorded as UsageRecorded
from ._events import event_json as event_json
from ._events import read_event as read_event
from ._explore import DEFAULT_THRESHOLDS as DEFAULT_THRESHOLDS
from ._explore import LENSES as LENSES
from ._explore import Cluster as Cluster
from ._explore import ComparisonRecord as ComparisonRecord
from ._explore import ContextAnalysis as ContextAnalysis
from ._explore import DiscoveryBrief as DiscoveryBrief
from ._explore import EloRating as EloRating
from ._explore import EvidenceItem as EvidenceItem
from ._explore import ExploreSettings as ExploreSettings
from ._explore import Hypothesis as Hypothesis
from ._explore import HypothesisBatch as HypothesisBatch
from ._explore import HypothesisReview as HypothesisReview
from ._explore import Rejection as Rejection
from ._explore import SafetyFinding as SafetyFinding
from ._explore import SafetyPolicy as SafetyPolicy
from ._explore import SelectedHypothesis as SelectedHypothesis
from ._explore import ValidationBatch as ValidationBatch
from ._explore import ValidationPlan as ValidationPlan
from ._explore_events import BriefIssued as BriefIssued
from ._explore_events import ContextExplored as ContextExplored
from ._explore_events import CycleFinished as CycleFinished
from ._explore_events import ExploreErrorRecorded as ExploreErrorRecorded
from ._explore_events import ExploreEvent as ExploreEvent
from ._explore_events import GoalScreened as GoalScreened
from ._explore_events import HypothesesAdded as HypothesesAdded
from ._explore_events import HypothesesClustered as HypothesesClustered
from ._explore_events import HypothesesCompared as HypothesesCompared
from ._explore_events import HypothesesReviewed as HypothesesReviewed
from ._explore_events import HypothesisCritiqued as HypothesisCritiqued
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
from ._result import REPLANNING_PURPOSES as REPLANNING_PURPOSES
from ._result import ModelFailure as ModelFailure
from ._result import RunResult as RunResult
from ._result import RunStatus as RunStatus
from ._result import TokenUsage as TokenUsage
from ._result import Usage as Usage
from ._spec import MAX_METADATA_DEPTH as MAX_METADATA_DEPTH
from ._spec import GatePolicy as GatePolicy
from ._spec import Limits as Limits
from ._spec import RunSpec as RunSpec
from ._spec import check_drafts as check_drafts
from ._task import EXECUTOR_CRASHED as EXECUTOR_CRASHED
from ._task import TERMINAL_STATUSES as TERMINAL_STATUSES
from ._task import Task as Task
from ._task import TaskDraft as TaskDraft
from ._task import TaskOutcome as TaskOutcome
from ._task import TaskStatus as TaskStatus
from ._tool import ToolCall as ToolCall
from ._tool import ToolExchange as ToolExchange
from ._tool import ToolResult as ToolResult

__all__ = (
    "DEFAULT_THRESHOLDS",
    "EVENT_ADAPTER",
    "EXECUTOR_CRASHED",
    "LENSES",
    "MAX_METADATA_DEPTH",
    "MESSAGE_ADAPTER",
    "REPLANNING_PURPOSES",
    "TERMINAL_STATUSES",
    "ActorFailure",
    "Alignment",
    "AlignmentReply",
    "AlignmentRequest",
    "BriefIssued",
    "Cluster",
    "Comparison",
    "ComparisonRecord",
    "ContextAnalysis",
    "ContextExplored",
    "Critique",
    "CritiqueReply",
    "CritiqueRequest",
    "CycleFinished",
    "DiscoveryBrief",
    "EloRating",
    "Event",
    "EvidenceItem",
    "EvolveReply",
    "EvolveRequest",
    "ExecuteReply",
    "ExecuteRequest",
    "ExploreErrorRecorded",
    "ExploreEvent",
    "ExploreOutput",
    "ExplorePurpose",
    "ExploreReply",
    "ExploreRequest",
    "ExploreSettings",
    "GateInfo",
    "GateOpened",
    "GatePolicy",
    "GateRequest",
    "GateResolution",
    "GateResolved",
    "GoalScreened",
    "HypothesesAdded",
    "HypothesesClustered",
    "HypothesesCompared",
    "HypothesesReviewed",
    "Hypothesis",
    "HypothesisBatch",
    "HypothesisCritiqued",
    "HypothesisReview",
    "Limits",
    "Message",
    "MilestoneReviewed",
    "ModelCall",
    "ModelCallFailed",
    "ModelFailure",
    "PlanCreated",
    "PlanProposal",
    "PlanReply",
    "PlanRequest",
    "PlanVersion",
    "RankReply",
    "RankRequest",
    "Rejection",
    "ReplanApplied",
    "ReplanOutcome",
    "ReplanRecord",
    "ReplanRefused",
    "Reply",
    "Request",
    "RetryScheduled",
    "ReviewReply",
    "ReviewRequest",
    "RunCompacted",
    "RunFinished",
    "RunResult",
    "RunSpec",
    "RunStatus",
    "RunSubmitted",
    "SafetyFinding",
    "SafetyPolicy",
    "SelectedHypothesis",
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
    "ToolCall",
    "ToolExchange",
    "ToolResult",
    "TraceStarted",
    "TraceSuspended",
    "Trigger",
    "Usage",
    "UsageRecorded",
    "ValidationBatch",
    "ValidationPlan",
    "Verdict",
    "check_drafts",
    "event_json",
    "read_event",
)
