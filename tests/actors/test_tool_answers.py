"""Which journaled answers to tool calls stand for an attempt run again."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from replan import GateResolution, TaskOutcome, tool
from replan.actors._tool_answers import StandingAnswers, interrupted_answers
from replan.messages import (
    Event,
    GateOpened,
    GateRequest,
    GateResolved,
    TaskFinished,
    TaskInterrupted,
    TaskStarted,
    ToolCall,
)
from replan.store import ToolEffectRecord

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@tool(side_effect=True)
def send_email(to: str, cc: list[str] | None = None) -> str:
    """Email someone."""
    return f"sent to {to}"


TOOLS = {"send_email": send_email}


class Journal:
    """Builds a run's events in order."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.gates = 0

    def add(self, cls: type[Any], **fields: Any) -> None:
        self.events.append(cls(seq=len(self.events) + 1, at=NOW, **fields))

    def started(self, task: str = "t1", attempt: int = 1) -> None:
        self.add(TaskStarted, task_id=task, attempt=attempt)

    def interrupted(self, task: str = "t1") -> None:
        self.add(TaskInterrupted, task_id=task)

    def finished(self, task: str = "t1") -> None:
        outcome = TaskOutcome(success=False, transient=True, reason="flaky")
        self.add(TaskFinished, task_id=task, outcome=outcome)

    def asked(self, to: str, task: str = "t1") -> str:
        self.gates += 1
        gate_id = f"r-g{self.gates}"
        call = ToolCall(id="c0", name="send_email", arguments=f'{{"to": "{to}"}}')
        request = GateRequest(
            gate_id=gate_id,
            run_id="r",
            reason="side effects",
            task_id=task,
            tool_call=call,
            created_at=NOW,
        )
        self.add(GateOpened, request=request)
        return gate_id

    def answered(self, gate_id: str, decision: str, by: str = "ana") -> None:
        resolution = GateResolution(decision=decision, by=by)  # type: ignore[arg-type]
        self.add(GateResolved, gate_id=gate_id, resolution=resolution)


def decided(journal: Journal, attempt: int = 1) -> list[tuple[str, str]]:
    return [
        (a.gate_id, a.resolution.decision)
        for a in interrupted_answers(journal.events, "t1", attempt)
    ]


def test_answers_given_to_the_attempt_going_on_do_not_stand() -> None:
    journal = Journal()
    journal.started()
    journal.answered(journal.asked("ana"), "approve")
    assert decided(journal) == []


def test_answers_of_the_runs_a_stop_cut_short_stand_in_order() -> None:
    journal = Journal()
    journal.started()
    journal.answered(journal.asked("ana"), "reject")
    journal.answered(journal.asked("bo"), "approve")
    journal.interrupted()
    journal.started()
    journal.answered(journal.asked("cy"), "approve")  # the run going on
    assert decided(journal) == [("r-g1", "reject"), ("r-g2", "approve")]


def test_answers_of_every_earlier_run_of_the_attempt_stand() -> None:
    journal = Journal()
    journal.started()
    journal.answered(journal.asked("ana"), "approve")
    journal.interrupted()
    journal.started()
    journal.answered(journal.asked("bo"), "approve")
    journal.interrupted()
    journal.started()
    assert decided(journal) == [("r-g1", "approve"), ("r-g2", "approve")]


def test_withdrawn_and_unanswered_gates_and_other_tasks_are_left_out() -> None:
    journal = Journal()
    journal.started()
    journal.started("t2")
    journal.answered(journal.asked("ana", task="t2"), "approve")
    journal.answered(journal.asked("bo"), "reject", by="supervisor")
    journal.asked("cy")
    journal.answered(journal.asked("di"), "reject", by="policy:timeout")
    journal.interrupted()
    journal.started()
    assert decided(journal) == [("r-g4", "reject")]


def test_a_later_attempt_does_not_inherit_the_answers_of_an_earlier_one() -> None:
    journal = Journal()
    journal.started()
    journal.answered(journal.asked("ana"), "approve")
    journal.finished()
    journal.started(attempt=2)
    assert decided(journal, attempt=2) == []
    journal.interrupted()
    journal.started(attempt=2)
    assert decided(journal, attempt=2) == []
    assert decided(journal, attempt=1) == []


def test_the_attempt_asked_for_must_be_the_one_started_last() -> None:
    journal = Journal()
    journal.started()
    journal.answered(journal.asked("ana"), "approve")
    journal.interrupted()
    journal.started()
    assert decided(journal, attempt=2) == []


def answers_for(*calls: tuple[str, str]) -> Journal:
    journal = Journal()
    journal.started()
    for to, decision in calls:
        journal.answered(journal.asked(to), decision)
    journal.interrupted()
    journal.started()
    return journal


def test_each_answer_is_taken_once_by_the_same_call() -> None:
    journal = answers_for(("ana", "approve"), ("bo", "reject"), ("ana", "reject"))
    answers = interrupted_answers(journal.events, "t1", 1)
    standing = StandingAnswers(answers, [], TOOLS)
    ana = send_email.parse('{"to": "ana"}')
    bo = send_email.parse('{"to": "bo"}')
    assert standing.take("other_tool", ana) is None
    first = standing.take("send_email", ana)
    assert first is not None
    assert (first.gate_id, first.resolution.decision) == ("r-g1", "approve")
    second = standing.take("send_email", ana)
    assert second is not None
    assert second.gate_id == "r-g3"
    assert standing.take("send_email", ana) is None
    third = standing.take("send_email", bo)
    assert third is not None
    assert third.gate_id == "r-g2"


def test_arguments_match_as_validated_values() -> None:
    journal = Journal()
    journal.started()
    call = ToolCall(id="c0", name="send_email", arguments='{"cc": [], "to": "ana"}')
    journal.add(
        GateOpened,
        request=GateRequest(
            gate_id="r-g1",
            run_id="r",
            reason="side effects",
            task_id="t1",
            tool_call=call,
            created_at=NOW,
        ),
    )
    journal.answered("r-g1", "approve")
    journal.interrupted()
    journal.started()
    answers = interrupted_answers(journal.events, "t1", 1)
    standing = StandingAnswers(answers, [], TOOLS)
    assert standing.take("send_email", send_email.parse('{"to": "ana"}')) is None
    taken = standing.take("send_email", send_email.parse('{"to": "ana", "cc": []}'))
    assert taken is not None


def test_no_answer_stands_for_a_call_the_ledger_holds_a_record_of() -> None:
    journal = answers_for(("ana", "approve"), ("bo", "reject"), ("ana", "approve"))
    answers = interrupted_answers(journal.events, "t1", 1)
    started = ToolEffectRecord(
        key="r:t1:s1c0", task_id="t1", tool="send_email", arguments={"to": "ana"}
    )
    standing = StandingAnswers(answers, [started], TOOLS)
    assert standing.take("send_email", send_email.parse('{"to": "ana"}')) is None
    bo = standing.take("send_email", send_email.parse('{"to": "bo"}'))
    assert bo is not None
    assert bo.resolution.decision == "reject"


def test_an_answer_for_a_tool_no_longer_offered_stands_for_nothing() -> None:
    journal = answers_for(("ana", "approve"))
    answers = interrupted_answers(journal.events, "t1", 1)
    standing = StandingAnswers(answers, [], {})
    assert standing.take("send_email", send_email.parse('{"to": "ana"}')) is None
