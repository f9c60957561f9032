"""replan: supervised actors for LLM agents that replan safely.

The public API, re-exported from the subpackages::

    async with Supervisor(model=ScriptedModel(handler)) as sup:
        handle = await sup.submit(RunSpec(goal="..."))
        result = await handle.result()
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ._errors import ActorCrashed as ActorCrashed
from ._errors import ActorError as ActorError
from ._errors import ActorStopped as ActorStopped
from ._errors import ActorTimeout as ActorTimeout
from ._errors import BudgetExhausted as BudgetExhausted
from ._errors import ConfigurationError as ConfigurationError
from ._errors import GateAlreadyResolved as GateAlreadyResolved
from ._errors import GateError as GateError
from ._errors import JournalConflict as JournalConflict
from ._errors import JournalCorrupt as JournalCorrupt
from ._errors import JournalUnavailable as JournalUnavailable
from ._errors import LeaseLost as LeaseLost
from ._errors import ModelAuthenticationError as ModelAuthenticationError
from ._errors import ModelError as ModelError
from ._errors import ModelOutputError as ModelOutputError
from ._errors import ModelRefusal as ModelRefusal
from ._errors import ReplanError as ReplanError
from ._errors import ResolutionRefused as ResolutionRefused
from ._errors import RunDrivenElsewhere as RunDrivenElsewhere
from ._errors import SupervisorError as SupervisorError
from ._errors import TransientModelError as TransientModelError
from ._errors import UnknownRunError as UnknownRunError
from ._lazy import lazy_getattr as _lazy_getattr
from ._version import __version__ as __version__
from .actors import TaskContext as TaskContext
from .actors import TaskRunner as TaskRunner
from .llm import Model as Model
from .llm import ModelPrice as ModelPrice
from .llm import ModelRequest as ModelRequest
from .llm import ModelResponse as ModelResponse
from .llm import PromptRegistry as PromptRegistry
from .llm import ScriptedModel as ScriptedModel
from .llm import Tool as Tool
from .llm import tool as tool
from .messages import Alignment as Alignment
from .messages import Comparison as Comparison
from .messages import ContextAnalysis as ContextAnalysis
from .messages import Critique as Critique
from .messages import DiscoveryBrief as DiscoveryBrief
from .messages import Event as Event
from .messages import EvidenceItem as EvidenceItem
from .messages import ExploreSettings as ExploreSettings
from .messages import GatePolicy as GatePolicy
from .messages import GateRequest as GateRequest
from .messages import GateResolution as GateResolution
from .messages import Hypothesis as Hypothesis
from .messages import HypothesisBatch as HypothesisBatch
from .messages import HypothesisReview as HypothesisReview
from .messages import Limits as Limits
from .messages import ModelFailure as ModelFailure
from .messages import PlanProposal as PlanProposal
from .messages import PlanVersion as PlanVersion
from .messages import ReplanOutcome as ReplanOutcome
from .messages import ReplanRecord as ReplanRecord
from .messages import RunResult as RunResult
from .messages import RunSpec as RunSpec
from .messages import RunStatus as RunStatus
from .messages import SafetyPolicy as SafetyPolicy
from .messages import Synthesis as Synthesis
from .messages import Task as Task
from .messages import TaskDraft as TaskDraft
from .messages import TaskOutcome as TaskOutcome
from .messages import TaskStatus as TaskStatus
from .messages import TokenUsage as TokenUsage
from .messages import ToolCall as ToolCall
from .messages import Trigger as Trigger
from .messages import Usage as Usage
from .messages import ValidationBatch as ValidationBatch
from .messages import ValidationPlan as ValidationPlan
from .messages import Verdict as Verdict
from .store import MemoryStore as MemoryStore
from .store import SQLiteStore as SQLiteStore
from .store import Store as Store
from .supervisor import RunHandle as RunHandle
from .supervisor import RunState as RunState
from .supervisor import Supervisor as Supervisor
from .supervisor import SupervisorTotals as SupervisorTotals
from .supervisor import apply as apply
from .supervisor import replay as replay

logging.getLogger("replan").addHandler(logging.NullHandler())

if TYPE_CHECKING:
    from .llm import OpenAIModel as OpenAIModel
    from .store import PostgresStore as PostgresStore


# The OpenAI adapter (and the openai package) and the PostgreSQL journal
# (psycopg, the ``postgres`` extra) load on first use.
_LAZY = {"OpenAIModel": ".llm", "PostgresStore": ".store"}


if not TYPE_CHECKING:
    __getattr__ = _lazy_getattr(__name__, _LAZY, globals())


__all__ = (
    "ActorCrashed",
    "ActorError",
    "ActorStopped",
    "ActorTimeout",
    "Alignment",
    "BudgetExhausted",
    "Comparison",
    "ConfigurationError",
    "ContextAnalysis",
    "Critique",
    "DiscoveryBrief",
    "Event",
    "EvidenceItem",
    "ExploreSettings",
    "GateAlreadyResolved",
    "GateError",
    "GatePolicy",
    "GateRequest",
    "GateResolution",
    "Hypothesis",
    "HypothesisBatch",
    "HypothesisReview",
    "JournalConflict",
    "JournalCorrupt",
    "JournalUnavailable",
    "LeaseLost",
    "Limits",
    "MemoryStore",
    "Model",
    "ModelAuthenticationError",
    "ModelError",
    "ModelFailure",
    "ModelOutputError",
    "ModelPrice",
    "ModelRefusal",
    "ModelRequest",
    "ModelResponse",
    "OpenAIModel",
    "PlanProposal",
    "PlanVersion",
    "PostgresStore",
    "PromptRegistry",
    "ReplanError",
    "ReplanOutcome",
    "ReplanRecord",
    "ResolutionRefused",
    "RunDrivenElsewhere",
    "RunHandle",
    "RunResult",
    "RunSpec",
    "RunState",
    "RunStatus",
    "SQLiteStore",
    "SafetyPolicy",
    "ScriptedModel",
    "Store",
    "Supervisor",
    "SupervisorError",
    "SupervisorTotals",
    "Synthesis",
    "Task",
    "TaskContext",
    "TaskDraft",
    "TaskOutcome",
    "TaskRunner",
    "TaskStatus",
    "TokenUsage",
    "Tool",
    "ToolCall",
    "TransientModelError",
    "Trigger",
    "UnknownRunError",
    "Usage",
    "ValidationBatch",
    "ValidationPlan",
    "Verdict",
    "__version__",
    "apply",
    "replay",
    "tool",
)
