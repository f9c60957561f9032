from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, model_validator

from .._errors import ConfigurationError
from ._base import Frozen
from ._explore import Hypothesis
from ._plan import PlanVersion, Trigger
from ._task import TaskDraft
from ._tool import ToolCall


class GateRequest(Frozen):
    """A question for a person: why the run stopped, and what would change."""

    kind: Literal["gate_request"] = "gate_request"
    gate_id: str
    run_id: str
    reason: str
    trigger: Trigger | None = None
    """The replan trigger; None when the gate guards a side-effect task."""
    proposal: PlanVersion | None = None
    """The proposed change as a diff (replan gates)."""
    task_id: str | None = None
    """The task whose side effect needs approval (approval gates)."""
    hypotheses: list[Hypothesis] | None = None
    """The selection a person reviews (explore runs)."""
    tool_call: ToolCall | None = None
    """The side-effect tool call a running task asks to make (tool gates)."""
    created_at: datetime
    expires_at: datetime | None = None
    on_timeout: Literal["approve", "reject"] = "reject"


POLICY_TIMEOUT = "policy:timeout"
"""``GateResolution.by`` of a gate that expired unanswered: the gate policy's
``on_timeout`` decided, no person."""


class GateResolution(Frozen):
    """A person's (or the timeout policy's) answer to a gate."""

    kind: Literal["gate_resolution"] = "gate_resolution"
    decision: Literal["approve", "reject", "edit"]
    tasks: list[TaskDraft] | None = None
    """The replacement tasks, for ``edit``."""
    hypotheses: list[Hypothesis] | None = None
    """A person's own hypotheses, for ``edit`` at an explore review gate:
    they join the tournament."""
    by: str = "human"
    """Who decided (a user name, or ``policy:timeout``)."""
    note: str = ""

    @model_validator(mode="after")
    def _edit_has_tasks(self) -> GateResolution:
        # ConfigurationError names the field the check is about, which
        # pydantic cannot tell for a check over the whole model.
        if self.decision == "edit" and not (self.tasks or self.hypotheses):
            # Which one the gate takes is the gate's to know; name the one
            # carried (``hypotheses=[]`` at an explore review), tasks if none.
            carried = self.hypotheses is not None and self.tasks is None
            raise ConfigurationError(
                "hypotheses" if carried else "tasks",
                "an edit resolution needs the edited tasks (a plan's gate) "
                "or hypotheses (an explore review)",
            )
        if self.decision != "edit" and (
            self.tasks is not None or self.hypotheses is not None
        ):
            field = "tasks" if self.tasks is not None else "hypotheses"
            raise ConfigurationError(
                field, "only an edit resolution carries tasks or hypotheses"
            )
        return self


class GateInfo(Frozen):
    """A gate and its resolution, as listed by the gate registry."""

    kind: Literal["gate_info"] = "gate_info"
    request: GateRequest
    resolution: GateResolution | None = None
    resolved_at: datetime | None = Field(default=None)
