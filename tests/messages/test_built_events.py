"""Events the supervisor builds without validating are the events validation
builds: same values, same fields set, the same journal bytes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from replan import ScriptedModel
from replan.actors._calls import call_model
from replan.llm import ModelRequest
from replan.messages import (
    MESSAGE_ADAPTER,
    Event,
    ExecuteReply,
    ExecuteRequest,
    MilestoneReviewed,
    ModelCall,
    Task,
    TaskDraft,
    TaskFinished,
    TaskOutcome,
    TaskStarted,
    TokenUsage,
    UsageRecorded,
    Verdict,
    event_json,
    read_event,
)
from replan.messages._base import built
from replan.messages._events import built_event

AT = datetime(2026, 11, 26, 12, 30, 1, 123456, tzinfo=UTC)
OUTCOME = TaskOutcome(success=True, summary="done", findings=["a fact"])
USAGE = TokenUsage(input_tokens=12, output_tokens=3, calls=1, cost=0.5)

CASES: list[tuple[type[Event], dict[str, Any]]] = [
    (TaskStarted, {"task_id": "t1", "attempt": 1}),
    (TaskFinished, {"task_id": "t1", "outcome": OUTCOME}),
    (TaskFinished, {"task_id": "t2", "outcome": OUTCOME, "usage": USAGE}),
    (TaskFinished, {"task_id": "t3", "outcome": TaskOutcome(success=False)}),
    (UsageRecorded, {"role": "reviewer", "purpose": "milestone", "usage": USAGE}),
    # A kind that is validated as usual.
    (
        MilestoneReviewed,
        {"index": 1, "verdict": Verdict(decision="continue"), "by": "model"},
    ),
]


@pytest.mark.parametrize(("cls", "fields"), CASES)
def test_a_built_event_is_the_event_validation_builds(
    cls: type[Event], fields: dict[str, Any]
) -> None:
    built = built_event(cls, 7, AT, fields)
    validated = cls(seq=7, at=AT, **fields)

    assert type(built) is cls
    assert built == validated
    assert list(built.__dict__) == list(validated.__dict__)
    assert built.model_fields_set == validated.model_fields_set
    assert event_json(built) == event_json(validated)
    assert read_event(event_json(built)) == validated
    # Immutable like any message.
    with pytest.raises(ValueError, match="frozen"):
        built.seq = 8  # type: ignore[misc]


@pytest.mark.parametrize(
    "fields",
    [{"task_id": "t1"}, {"task_id": "t1", "attempt": 1, "extra": True}],
)
def test_a_built_event_with_a_missing_or_unknown_field_is_refused(
    fields: dict[str, Any],
) -> None:
    with pytest.raises(TypeError, match="TaskStarted"):
        built_event(TaskStarted, 1, AT, fields)


def test_built_actor_messages_are_those_validation_builds() -> None:
    task = Task(id="t2", key="k", description="d", depends_on=["t1"])
    call = built(ModelCall, {"role": "executor", "purpose": "execute", "usage": USAGE})
    assert call == ModelCall(role="executor", purpose="execute", usage=USAGE)

    reply = built(ExecuteReply, {"outcome": OUTCOME, "calls": [call]})
    assert reply == ExecuteReply(outcome=OUTCOME, calls=[call])
    assert reply.model_fields_set == {"outcome", "calls"}
    # A default factory gives each message its own list.
    assert reply.failures == []
    assert reply.failures is not built(ExecuteReply, {"outcome": OUTCOME}).failures

    context = {"goal": "g", "task": task, "dependency_results": {"t1": OUTCOME}}
    fields: dict[str, Any] = {"context": context, "task": task, "max_tool_steps": 8}
    request = built(ExecuteRequest, fields)
    validated = ExecuteRequest(**fields)
    assert request == validated
    assert MESSAGE_ADAPTER.dump_json(request) == MESSAGE_ADAPTER.dump_json(validated)


def test_a_message_with_validators_is_not_built_without_them() -> None:
    with pytest.raises(TypeError, match="TaskDraft has validators"):
        built(TaskDraft, {"key": " ", "description": " "})


def test_a_built_model_request_is_the_one_validation_builds() -> None:
    fields: dict[str, Any] = {
        "role": "executor",
        "purpose": "execute",
        "output_type": TaskOutcome,
        "temperature": 0.2,
        "run_id": "r1",
        "task_id": "t1",
        "context": {"goal": "g"},
        "tools": [],
        "transcript": [],
    }
    request = built(ModelRequest, fields)
    validated = ModelRequest(**fields)
    assert request == validated
    assert list(request.__dict__) == list(validated.__dict__)
    assert request.model_fields_set == validated.model_fields_set


async def test_a_model_that_changes_its_request_s_context_changes_no_one_else_s() -> (
    None
):
    def handler(request: ModelRequest) -> Verdict:
        request.context["seen"] = True
        return Verdict(decision="continue")

    context: dict[str, Any] = {"goal": "g"}
    verdict, _ = await call_model(
        ScriptedModel(handler),
        role="reviewer",
        purpose="milestone",
        output_type=Verdict,
        context=context,
        temperature=0,
        run_id="r1",
    )
    assert verdict.decision == "continue"
    assert context == {"goal": "g"}
