from __future__ import annotations

import graphlib
import typing
from datetime import UTC, date, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from replan import (
    ConfigurationError,
    GatePolicy,
    GateResolution,
    Limits,
    RunSpec,
    TaskDraft,
    Trigger,
)
from replan.llm import ModelPrice
from replan.messages import (
    MESSAGE_ADAPTER,
    Hypothesis,
    Message,
    PlanProposal,
    Task,
    TaskOutcome,
    TaskStatus,
    TokenUsage,
    Verdict,
)
from replan.messages._spec import check_drafts


def _message_types() -> list[type[BaseModel]]:
    union = typing.get_args(Message)[0]
    return list(typing.get_args(union))


def test_every_message_kind_is_distinct() -> None:
    kinds = [t.model_fields["kind"].default for t in _message_types()]
    assert len(kinds) == len(set(kinds))


@pytest.mark.parametrize(
    "message",
    [
        Task(id="t1", key="a", description="d", result=TaskOutcome(success=True)),
        TaskDraft(key="a", description="d", depends_on=["t1"]),
        PlanProposal(tasks=[TaskDraft(key="a", description="d")], rationale="r"),
        Verdict(decision="replan", trigger="scope_shift", confidence=0.5),
        GateResolution(decision="edit", tasks=[TaskDraft(key="a", description="d")]),
    ],
)
def test_messages_round_trip_through_the_union(message: BaseModel) -> None:
    again = MESSAGE_ADAPTER.validate_json(MESSAGE_ADAPTER.dump_json(message))  # type: ignore[arg-type]
    assert again == message
    assert type(again) is type(message)


def test_messages_are_frozen() -> None:
    task = Task(id="t1", key="a", description="d")
    with pytest.raises(ValidationError):
        task.status = "completed"  # type: ignore[misc]


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError):
        TaskOutcome.model_validate({"success": True, "sucess": False})


@pytest.mark.parametrize("number", [float("inf"), float("-inf"), float("nan")])
def test_numbers_that_json_cannot_hold_are_refused(number: float) -> None:
    # JSON would store null: the journal could never be read back.
    with pytest.raises(ValidationError, match="finite number"):
        TokenUsage(cost=number)
    with pytest.raises(ValidationError, match="finite number"):
        Verdict(decision="continue", confidence=number)
    with pytest.raises(ValidationError, match="finite number"):
        ModelPrice(input=number, output=1.0)


def test_limits_and_the_gate_policy_default_to_the_documented_values() -> None:
    assert Limits().model_dump() == {
        "max_replans": 3,
        "max_iterations": 20,
        "max_task_executions": 200,
        "max_task_attempts": 2,
        "retry_backoff_s": 0.25,
        "max_concurrency": 4,
        "milestone_every": 3,
        "token_budget": None,
        "replan_reserve": 0.2,
        "min_confidence": 0.7,
        "min_corroboration": 2,
        "deadline_s": None,
        "gate_timeout_s": None,
        "replan_candidates": 1,
        "max_tool_steps": 8,
        "task_timeout_s": None,
        "call_timeout_s": None,
    }
    policy = GatePolicy()
    assert policy.gate_on == {Trigger.SCOPE_SHIFT}
    assert policy.on_timeout == "reject"


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: Limits(max_replans=-1), "max_replans"),
        (lambda: Limits(replan_reserve=1.5), "replan_reserve"),
        # Past any float: the budget guards would raise OverflowError mid-run.
        (lambda: Limits(token_budget=10**400), "token_budget"),
        (lambda: RunSpec(goal=""), "goal"),
        (lambda: RunSpec(goal="   "), "goal"),
        (
            lambda: RunSpec(goal="g", limits={"max_concurrency": 0}),
            "limits.max_concurrency",
        ),
        (lambda: RunSpec(goal="g", pattern="nope"), "pattern"),
        (lambda: RunSpec(goal="g", tasks=[]), "tasks"),
        (
            lambda: RunSpec(
                goal="g",
                tasks=[
                    TaskDraft(key="a", description="a", depends_on=["b"]),
                    TaskDraft(key="b", description="b", depends_on=["a"]),
                ],
            ),
            "tasks",
        ),
        (
            lambda: RunSpec(
                goal="g",
                tasks=[
                    TaskDraft(key="a", description="a"),
                    TaskDraft(key="a", description="b"),
                ],
            ),
            "tasks",
        ),
        (
            lambda: RunSpec(goal="g", gate_policy={"on_timeout": "maybe"}),
            "gate_policy.on_timeout",
        ),
    ],
)
def test_invalid_settings_raise_a_configuration_error_naming_the_field(
    build: typing.Callable[[], object], field: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        build()
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")


YEAR_S = 366 * 86_400.0


@pytest.mark.parametrize(
    ("field", "lowest", "highest"),
    [
        ("max_replans", 0, 100),
        ("max_iterations", 1, 10_000),
        ("milestone_every", 1, 10_000),
        ("max_task_executions", 1, 10**6),
        ("max_task_attempts", 1, 20),
        ("max_concurrency", 1, 1_000),
        ("min_corroboration", 0, 1_000),
        ("replan_candidates", 1, 16),
        ("max_tool_steps", 1, 100),
        ("retry_backoff_s", 0.0, 60.0),
        ("token_budget", 1, 10**15),
        ("deadline_s", 0.001, YEAR_S),
        ("gate_timeout_s", 0.001, YEAR_S),
        ("task_timeout_s", 0.001, YEAR_S),
        ("call_timeout_s", 0.001, YEAR_S),
    ],
)
def test_each_limit_takes_the_range_the_readme_gives_and_no_more(
    field: str, lowest: float, highest: float
) -> None:
    assert getattr(Limits(**{field: lowest}), field) == lowest
    assert getattr(Limits(**{field: highest}), field) == highest
    below = lowest - 1 if isinstance(lowest, int) else 0.0 if lowest else -0.001
    for wrong in (below, highest + 1):
        with pytest.raises(ConfigurationError) as caught:
            Limits(**{field: wrong})
        assert caught.value.field == field


def test_an_edit_resolution_needs_tasks() -> None:
    with pytest.raises(ValidationError, match="needs the edited tasks"):
        GateResolution(decision="edit")


@pytest.mark.parametrize(
    ("carried", "field"),
    [
        ({"hypotheses": []}, "hypotheses"),
        ({"tasks": []}, "tasks"),
        ({}, "tasks"),
    ],
)
def test_an_empty_edit_is_refused_naming_the_field_it_carries(
    carried: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        GateResolution.model_validate({"decision": "edit", **carried})
    problem = ConfigurationError.from_validation(caught.value)
    assert problem.field == field
    assert problem.problem == (
        "an edit resolution needs the edited tasks (a plan's gate) "
        "or hypotheses (an explore review)"
    )


@pytest.mark.parametrize("statement", ["", "   ", "\n\t"])
def test_a_hypothesis_statement_must_not_be_blank(statement: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Hypothesis(statement=statement)
    assert ConfigurationError.from_validation(caught.value).field == "statement"


@pytest.mark.parametrize("field", ["key", "description"])
@pytest.mark.parametrize("blank", ["   ", "\n\t"])
def test_a_task_draft_with_a_blank_key_or_description_is_refused(
    field: str, blank: str
) -> None:
    # A blank description is no task to execute, and a blank key none that
    # another task can name; the spec's tasks say which one.
    draft = {"key": "k", "description": "d", field: blank}
    with pytest.raises(ValidationError) as caught:
        TaskDraft.model_validate(draft)
    assert ConfigurationError.from_validation(caught.value).field == field
    with pytest.raises(ConfigurationError) as refused:
        RunSpec(goal="g", pattern="contract", tasks=[draft])
    assert refused.value.field == f"tasks.0.{field}"
    assert "must not be blank" in str(refused.value)


def test_datetimes_in_events_keep_their_timezone() -> None:
    from replan.messages import EVENT_ADAPTER, TaskStarted

    event = TaskStarted(
        seq=2, at=datetime(2026, 1, 1, tzinfo=UTC), task_id="t1", attempt=1
    )
    assert EVENT_ADAPTER.validate_json(EVENT_ADAPTER.dump_json(event)) == event


def test_evolve_is_model_copy_with_an_update_and_leaves_the_original_alone() -> None:
    task = Task(id="t1", key="metrics", description="Pull latency per service")
    outcome = TaskOutcome(success=True, summary="p99 doubled")
    done = task.evolve(status=TaskStatus.COMPLETED, result=outcome)
    assert done == task.model_copy(
        update={"status": TaskStatus.COMPLETED, "result": outcome}
    )
    assert (
        done.model_dump_json()
        == task.model_copy(
            update={"status": TaskStatus.COMPLETED, "result": outcome}
        ).model_dump_json()
    )
    assert task.status is TaskStatus.PENDING
    assert task.result is None
    assert {"status", "result"} <= done.model_fields_set
    with pytest.raises(ValidationError):
        done.status = TaskStatus.FAILED  # type: ignore[misc]


def test_evolved_copies_share_their_fields_set_and_model_copy_leaves_it_alone() -> None:
    first = Task(id="t1", key="a", description="d").evolve(status=TaskStatus.FAILED)
    second = Task(id="t2", key="b", description="e").evolve(status=TaskStatus.FAILED)
    shared = first.__pydantic_fields_set__
    assert second.__pydantic_fields_set__ is shared
    before = set(shared)
    changed = first.model_copy(update={"attempts": 2})
    assert "attempts" in changed.model_fields_set
    assert shared == before  # model_copy copied it before adding to it
    assert second.model_fields_set == before


@settings(max_examples=200, deadline=None)
@given(edges=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=20))
def test_drafts_are_refused_exactly_when_their_dependencies_have_a_cycle(
    edges: list[tuple[int, int]],
) -> None:
    # graphlib is the reference: it finds a cycle (self-loops included)
    # exactly where check_drafts must refuse, naming the tasks in one.
    graph: dict[str, list[str]] = {f"k{i}": [] for i in range(8)}
    for task, dep in edges:
        graph[f"k{task}"].append(f"k{dep}")
    drafts = [
        TaskDraft(key=key, description="d", depends_on=deps)
        for key, deps in graph.items()
    ]
    in_cycle = _a_task_in_a_cycle(graph)
    if in_cycle is None:
        check_drafts(drafts, known=frozenset())
    else:
        with pytest.raises(ValueError, match="in a cycle") as caught:
            check_drafts(drafts, known=frozenset())
        assert in_cycle in str(caught.value)


def _a_task_in_a_cycle(graph: dict[str, list[str]]) -> str | None:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as cycle:
        return str(cycle.args[1][0])
    return None


@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=10**9),
            st.integers(min_value=0, max_value=10**9),
            st.integers(min_value=0, max_value=10**9),
            st.integers(min_value=0, max_value=10**6),
            st.floats(min_value=0, max_value=1e6),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_a_sum_of_usages_is_the_usage_validation_would_build(
    counts: list[tuple[int, int, int, int, float]],
) -> None:
    usages = [
        TokenUsage(input_tokens=i, output_tokens=o, cached_tokens=c, calls=n, cost=cost)
        for i, o, c, n, cost in counts
    ]

    total = usages[0]
    for usage in usages[1:]:
        total = total + usage

    expected = TokenUsage(
        input_tokens=sum(u.input_tokens for u in usages),
        output_tokens=sum(u.output_tokens for u in usages),
        cached_tokens=sum(u.cached_tokens for u in usages),
        calls=sum(u.calls for u in usages),
        cost=total.cost,  # float sums depend on their order; checked below
    )
    assert total == expected
    assert total.cost == pytest.approx(sum(u.cost for u in usages))
    # Every field is there (a field added to TokenUsage must be summed too).
    assert total.__dict__.keys() == TokenUsage().__dict__.keys()
    assert TokenUsage.model_validate_json(total.model_dump_json()) == total


@pytest.mark.parametrize(
    ("metadata", "field", "problem"),
    [
        ({"a": [1, {"b": float("inf")}]}, "metadata.a.1.b", "not a finite number"),
        ({"float": float("nan")}, "metadata.float", "not a finite number"),
        ({"when": {"day": date(2026, 11, 26)}}, "metadata.when.day", "a date"),
        ({"ids": {1: "one"}}, "metadata.ids", "key 1 is not a string"),
    ],
)
def test_metadata_that_is_no_json_is_refused_naming_its_path(
    metadata: dict[str, Any], field: str, problem: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        RunSpec(goal="g", metadata=metadata)
    assert caught.value.field == field
    assert problem in caught.value.problem


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"explore": {"temperature": 0.3}}, "explore"),
        ({"safety_policy": {"blocked_terms": ["bioweapon"]}}, "safety_policy"),
    ],
)
def test_explore_settings_given_to_a_plan_run_are_refused_naming_them(
    settings: dict[str, Any], field: str
) -> None:
    # A plan run reads neither: taken, they would be ignored without a word.
    with pytest.raises(ConfigurationError) as caught:
        RunSpec.model_validate({"goal": "g", **settings})
    assert caught.value.field == field
    assert "kind='explore'" in caught.value.problem
    explore = RunSpec.model_validate({"goal": "g", "kind": "explore", **settings})
    assert explore.kind == "explore"
    # A plan run's spec as the journal keeps it (defaults spelt out) reads back.
    plan = RunSpec(goal="g")
    assert RunSpec.model_validate_json(plan.model_dump_json()) == plan


@pytest.mark.parametrize("pattern", ["contract", "hybrid"])
def test_an_explore_run_with_a_plan_pattern_is_refused_naming_it(pattern: str) -> None:
    # An explore run follows no plan pattern: one given would be ignored.
    with pytest.raises(ConfigurationError) as caught:
        RunSpec.model_validate({"goal": "g", "kind": "explore", "pattern": pattern})
    assert caught.value.field == "pattern"
    spec = RunSpec(goal="g", kind="explore")
    assert RunSpec.model_validate_json(spec.model_dump_json()) == spec
