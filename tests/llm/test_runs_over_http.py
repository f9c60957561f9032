"""Whole runs through OpenAIModel and a Chat Completions server on 127.0.0.1."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import anyio
from chat_server import Logged, Reply, answer_type, chat_server, completion, error

from replan import (
    Alignment,
    GatePolicy,
    GateResolution,
    Limits,
    MemoryStore,
    PlanProposal,
    ReplanOutcome,
    RunResult,
    RunSpec,
    RunStatus,
    Supervisor,
    Synthesis,
    TaskDraft,
    TaskOutcome,
    TaskStatus,
    Trigger,
    Verdict,
)
from replan.llm import OpenAIModel, tool
from replan.messages import GateOpened, ModelCallFailed, RetryScheduled, TaskFinished

GOAL = "Find which solid-state battery makers ship cells at scale in 2025"


def model_for(server_url: str, **options: Any) -> OpenAIModel:
    options = {"max_retries": 1, "backoff_s": 0.01, **options}
    return OpenAIModel("gpt-test", base_url=server_url, **options)


def task_id_of(logged: Logged) -> str:
    found = re.search(r"^(t\d+) \[in_progress\]", logged.text, re.M)
    assert found, "the executor prompt names its task"
    return found.group(1)


def pending_ids(logged: Logged) -> list[str]:
    return re.findall(r"^(t\d+) \[pending\]", logged.text, re.M)


def drafts(prefix: str, n: int = 3) -> list[TaskDraft]:
    return [
        TaskDraft(
            key=f"{prefix}{i}", description=f"{prefix} step {i}", milestone=i == 1
        )
        for i in range(1, n + 1)
    ]


def answers(**by_type: Any):
    """A server script answering by the requested output type."""

    def script(logged: Logged) -> Reply:
        kind = answer_type(logged)
        answer = by_type.get(kind)
        if answer is None:
            defaults = {
                "TaskOutcome": TaskOutcome(success=True, summary="done"),
                "Verdict": Verdict(decision="continue"),
                "Synthesis": Synthesis(output="the answer"),
            }
            if kind == "Alignment":
                return completion(Alignment(aligned=[True] * 10))
            return completion(defaults[kind])
        return answer(logged) if callable(answer) else answer

    return script


async def run(
    model: OpenAIModel, spec: RunSpec, *, approve: bool = False, **options: Any
) -> tuple[RunResult, list[Any], RunResult]:
    store = MemoryStore()
    async with model, Supervisor(model=model, store=store, **options) as sup:
        with anyio.fail_after(30):
            handle = await sup.submit(spec)
            if approve:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_approve_gates, sup, handle)
                    result = await handle.result()
                    tg.cancel_scope.cancel()
            else:
                result = await handle.result()
        events = await store.read(result.run_id)
        replayed = await sup.replay(result.run_id)
    return result, events, replayed


async def _approve_gates(sup: Supervisor, handle: Any) -> None:
    async for event in handle.events():
        if isinstance(event, GateOpened):
            # Listed right after gate_opened is journaled: allow that moment.
            for _ in range(100):
                if sup.gates.get(event.request.gate_id) is not None:
                    break
                await anyio.sleep(0.01)
            await sup.gates.resolve(
                event.request.gate_id, GateResolution(decision="approve", by="tester")
            )


ONE_TASK = RunSpec(goal=GOAL, tasks=[TaskDraft(key="search", description="search")])


async def test_a_task_whose_model_keeps_failing_with_500_is_retried_not_replanned() -> (
    None
):
    executor_calls = 0
    lock = threading.Lock()

    def outcome(logged: Logged) -> Reply:
        nonlocal executor_calls
        with lock:
            executor_calls += 1
            n = executor_calls
        if n <= 2:  # the whole first attempt: one try and one retry
            return error(500, "upstream overloaded")
        return completion(TaskOutcome(success=True, summary="found four makers"))

    with chat_server(answers(TaskOutcome=outcome)) as server:
        result, events, replayed = await run(model_for(server.base_url), ONE_TASK)
        kinds = [answer_type(r) for r in server.chat_requests()]
    assert result.status is RunStatus.COMPLETED
    assert kinds == ["TaskOutcome", "TaskOutcome", "TaskOutcome", "Synthesis"]
    finished = [e.outcome for e in events if isinstance(e, TaskFinished)]
    assert [o.success for o in finished] == [False, True]
    assert finished[0].transient
    assert "HTTP 500" in (finished[0].reason or "")
    assert result.tasks[0].attempts == 2
    assert result.replans == []
    assert [f.error_type for f in result.model_failures] == ["TransientModelError"]
    assert replayed == result


async def test_a_429_asking_to_wait_past_max_backoff_s_retries_the_task_after_it() -> (
    None
):
    # The server asks for more than the model waits within a call: the call
    # fails transient at once, and the task's retry waits what was asked
    # while the task that does not depend on it goes on.
    sent: list[tuple[str, float]] = []
    lock = threading.Lock()

    def outcome(logged: Logged) -> Reply:
        with lock:
            first = not any(key == "t1" for key, _ in sent)
            sent.append((task_id_of(logged), time.monotonic()))
        if task_id_of(logged) == "t1" and first:
            return error(429, "rate limited", retry_after="1")
        return completion(TaskOutcome(success=True, summary="found four makers"))

    spec = RunSpec(
        goal=GOAL,
        tasks=[
            TaskDraft(key="search", description="search"),
            TaskDraft(key="read", description="read", depends_on=["search"]),
            TaskDraft(key="other", description="an independent survey"),
        ],
    )
    with chat_server(answers(TaskOutcome=outcome)) as server:
        model = model_for(server.base_url, max_backoff_s=0.2, max_retries=3)
        result, events, replayed = await run(model, spec)
    assert result.status is RunStatus.COMPLETED
    assert [t.status for t in result.tasks] == [TaskStatus.COMPLETED] * 3
    assert result.tasks[0].attempts == 2
    times = {key: [t for k, t in sent if k == key] for key in ("t1", "t2", "t3")}
    assert len(times["t1"]) == 2  # one 429, then the retry: nothing in between
    assert times["t1"][1] - times["t1"][0] >= 0.95
    assert times["t3"][0] - times["t1"][0] < 0.5
    failed = next(
        e for e in events if isinstance(e, TaskFinished) and e.task_id == "t1"
    )
    assert failed.outcome.transient
    assert "HTTP 429" in (failed.outcome.reason or "")
    assert [e.task_id for e in events if isinstance(e, RetryScheduled)] == ["t1"]
    assert replayed == result


async def test_a_first_plan_a_429_put_off_is_asked_again_after_the_wait() -> None:
    # Before, the planner's second attempt came at once, was not even sent
    # (the hold), and the run ended failed without a plan.
    sent: list[float] = []

    def plan(logged: Logged) -> Reply:
        sent.append(time.monotonic())
        if len(sent) == 1:
            return error(429, "rate limited", retry_after="1")
        return completion(PlanProposal(tasks=drafts("p", 1), rationale="plan"))

    with chat_server(answers(PlanProposal=plan)) as server:
        model = model_for(server.base_url, max_backoff_s=0.2)
        result, events, replayed = await run(model, RunSpec(goal=GOAL))
    assert result.status is RunStatus.COMPLETED
    assert len(sent) == 2
    assert sent[1] - sent[0] >= 0.95
    (failed,) = [e for e in events if isinstance(e, ModelCallFailed)]
    assert failed.failure.retry_after_s == 1
    assert replayed == result


async def test_an_answer_invalid_after_the_reask_fails_the_task_keeping_its_text() -> (
    None
):
    bad = completion('{"success": "sort of", "summary": 3}', usage=(50, 10, 0))
    with chat_server(answers(TaskOutcome=bad)) as server:
        result, events, replayed = await run(model_for(server.base_url), ONE_TASK)
        kinds = [answer_type(r) for r in server.chat_requests()]
    assert kinds == ["TaskOutcome", "TaskOutcome"]  # asked, then re-asked once
    assert result.status is RunStatus.ABORTED  # nothing completed: nothing to build on
    assert result.tasks[0].status is TaskStatus.FAILED
    [failed] = [e for e in events if isinstance(e, ModelCallFailed)]
    assert failed.failure.error_type == "ModelOutputError"
    assert failed.failure.raw_output == '{"success": "sort of", "summary": 3}'
    assert failed.failure.task_id == "t1"
    assert result.usage.by_role["executor"].input_tokens == 100
    assert result.usage.by_role["executor"].calls == 2
    assert replayed == result


async def test_a_rejected_key_fails_the_run_after_exactly_one_request() -> None:
    with chat_server(lambda _: error(401, "Incorrect API key provided")) as server:
        result, _, replayed = await run(
            model_for(server.base_url, api_key="sk-wrong", max_retries=3),
            RunSpec(goal=GOAL),
        )
        assert len(server.chat_requests()) == 1
    assert result.status is RunStatus.FAILED
    assert "OPENAI_API_KEY" in (result.stop_reason or "")
    assert [f.error_type for f in result.model_failures] == ["ModelAuthenticationError"]
    assert replayed == result


async def test_a_rejected_key_during_a_task_also_stops_the_run_at_once() -> None:
    script = answers(TaskOutcome=error(403, "project has no access"))
    spec = RunSpec(goal=GOAL, tasks=drafts("s", 4), limits=Limits(max_concurrency=1))
    with chat_server(script) as server:
        result, _, _ = await run(model_for(server.base_url, max_retries=3), spec)
        assert len(server.chat_requests()) == 1
    assert result.status is RunStatus.FAILED
    assert "no access" in (result.stop_reason or "")


async def test_the_token_budget_stops_the_run_and_no_call_starts_after_it() -> None:
    script = answers(
        PlanProposal=completion(
            PlanProposal(tasks=drafts("s", 6)), usage=(300, 100, 0)
        ),
        TaskOutcome=completion(
            TaskOutcome(success=True, summary="ok"), usage=(300, 100, 0)
        ),
    )
    spec = RunSpec(
        goal=GOAL,
        limits=Limits(token_budget=1_000, max_concurrency=1, milestone_every=10),
    )
    with chat_server(script) as server:
        result, _, replayed = await run(model_for(server.base_url), spec)
        requests = server.chat_requests()
    # plan 400 + t1 400 = 800 < 1000; t2 takes it to 1200: nothing after that.
    assert [answer_type(r) for r in requests] == [
        "PlanProposal",
        "TaskOutcome",
        "TaskOutcome",
    ]
    assert result.status is RunStatus.LIMIT_REACHED
    assert result.stop_reason == "token_budget: 1200 of 1000 tokens used"
    assert result.usage.total.total_tokens == 1_200
    assert replayed == result


async def test_the_budget_stops_a_tool_loop_between_its_steps() -> None:
    @tool
    def search(query: str) -> str:
        """Search the trade press."""
        return f"results for {query}"

    loop = completion(
        tool_calls=[("c", "search", {"query": "cells"})], usage=(250, 50, 0)
    )
    spec = RunSpec(
        goal=GOAL,
        tasks=[TaskDraft(key="dig", description="dig")],
        limits=Limits(token_budget=1_000, max_tool_steps=20),
    )
    with chat_server(answers(TaskOutcome=loop)) as server:
        result, _, _ = await run(model_for(server.base_url), spec, tools=[search])
        requests = server.chat_requests()
    assert len(requests) == 4  # 4 x 300 tokens: the fifth step never starts
    assert result.status is RunStatus.LIMIT_REACHED
    assert result.stop_reason == "token_budget: 1200 of 1000 tokens used"
    assert result.usage.by_role["executor"].total_tokens == 1_200


async def test_tools_run_in_the_loop_and_a_failing_tool_goes_back_as_an_error() -> None:
    seen_keys: list[str] = []

    @tool
    def price(maker: str) -> str:
        """A maker's cell price."""
        raise LookupError(f"no price for {maker}")

    @tool(side_effect=True)
    def order(maker: str, cells: int, idempotency_key: str) -> str:
        """Order sample cells."""
        seen_keys.append(idempotency_key)
        return f"ordered {cells} from {maker}"

    def step(logged: Logged) -> Reply:
        tool_messages = [m for m in logged.messages if m["role"] == "tool"]
        if not tool_messages:
            return completion(tool_calls=[("p1", "price", {"maker": "QuantumScape"})])
        if len(tool_messages) == 1:
            return completion(
                tool_calls=[("o1", "order", {"maker": "QuantumScape", "cells": 12})]
            )
        return completion(
            TaskOutcome(success=True, summary=tool_messages[-1]["content"])
        )

    spec = RunSpec(goal=GOAL, tasks=[TaskDraft(key="buy", description="buy samples")])
    with chat_server(answers(TaskOutcome=step)) as server:
        result, events, replayed = await run(
            model_for(server.base_url), spec, approve=True, tools=[price, order]
        )
        executor = [
            r for r in server.chat_requests() if answer_type(r) == "TaskOutcome"
        ]
    assert result.status is RunStatus.COMPLETED
    assert len(executor) == 3
    price_result = executor[1].messages[-1]
    assert price_result["role"] == "tool"
    assert price_result["content"] == "error: LookupError: no price for QuantumScape"
    assert result.tasks[0].result.summary == "ordered 12 from QuantumScape"
    [gate] = [e.request for e in events if isinstance(e, GateOpened)]
    assert gate.task_id == "t1"
    assert gate.tool_call is not None
    assert gate.tool_call.name == "order"
    assert seen_keys == [f"{result.run_id}:t1:s2c0"]
    assert replayed == result


async def test_a_side_effect_call_rejected_at_the_gate_never_runs() -> None:
    ran: list[str] = []

    @tool(side_effect=True)
    def send_email(to: str) -> str:
        """Email someone."""
        ran.append(to)
        return "sent"

    def step(logged: Logged) -> Reply:
        tool_messages = [m for m in logged.messages if m["role"] == "tool"]
        if not tool_messages:
            return completion(
                tool_calls=[("e1", "send_email", {"to": "ceo@example.com"})]
            )
        return completion(
            TaskOutcome(success=False, reason=tool_messages[-1]["content"])
        )

    spec = RunSpec(
        goal=GOAL,
        tasks=[TaskDraft(key="mail", description="mail the CEO")],
        limits=Limits(gate_timeout_s=0.2),
    )
    with chat_server(answers(TaskOutcome=step)) as server:
        result, _, _ = await run(model_for(server.base_url), spec, tools=[send_email])
    assert ran == []
    assert "not approved by policy:timeout" in (result.tasks[0].result.reason or "")


async def test_a_discovery_run_replans_once_for_each_trigger_over_http() -> None:
    triggers = [
        Trigger.CONTRADICTION,
        Trigger.OBSOLESCENCE,
        Trigger.SCOPE_SHIFT,
        Trigger.NEW_CRITICAL_PATH,
    ]
    reviews = 0
    replans = 0
    lock = threading.Lock()

    def review(logged: Logged) -> Reply:
        nonlocal reviews
        with lock:
            reviews += 1
            n = reviews
        if n > len(triggers):
            return completion(Verdict(decision="complete", rationale="answered"))
        return completion(
            Verdict(
                decision="replan",
                trigger=triggers[n - 1],
                rationale=f"finding {n} changes the plan",
                confidence=0.9,
                corroborating_sources=2,
                affected_tasks=pending_ids(logged),
            ),
            usage=(400, 60, 0),
        )

    def plan(logged: Logged) -> Reply:
        nonlocal replans
        if "revising a plan" not in logged.text:
            return completion(PlanProposal(tasks=drafts("first")), usage=(300, 80, 0))
        with lock:
            replans += 1
            n = replans
        return completion(
            PlanProposal(tasks=drafts(f"rev{n}-"), rationale=f"revision {n}"),
            usage=(700, 120, 100),
        )

    def execute(logged: Logged) -> Reply:
        task_id = task_id_of(logged)
        return completion(
            TaskOutcome(
                success=True,
                summary=f"{task_id} done",
                findings=[f"{task_id} saw news"],
            ),
            usage=(200, 40, 0),
        )

    script = answers(
        Verdict=review,
        PlanProposal=plan,
        TaskOutcome=execute,
        Alignment=lambda logged: completion(Alignment(aligned=[True, True, True])),
    )
    spec = RunSpec(
        goal=GOAL,
        limits=Limits(max_replans=4, max_concurrency=1),
        gate_policy=GatePolicy(gate_on=frozenset({Trigger.SCOPE_SHIFT})),
    )
    with chat_server(script) as server:
        result, _, replayed = await run(model_for(server.base_url), spec, approve=True)
        requests = server.chat_requests()
    assert result.status is RunStatus.COMPLETED, result.stop_reason
    assert [(r.trigger, r.outcome) for r in result.replans] == [
        (t, ReplanOutcome.APPLIED) for t in triggers
    ]
    assert len(result.versions) == 5
    assert result.versions[3].approved_by == "tester"  # the scope shift
    replan_prompts = [r for r in requests if "revising a plan" in r.text]
    assert len(replan_prompts) == 4
    for sent, trigger in zip(replan_prompts, triggers, strict=True):
        assert GOAL in sent.text
        assert f"Trigger: {trigger.value}" in sent.text
        assert "saw news" in sent.text  # findings reach the planner
        assert sent.body["temperature"] == 0
    assert result.output == "the answer"
    planner = result.usage.by_role["planner"]
    assert planner.calls == 5
    assert result.replanning_tokens == 4 * (700 + 120) + 4 * (100 + 20)
    assert result.cost_to_discovery == result.replanning_tokens / 4
    assert replayed == result


async def test_a_side_effect_call_with_arguments_no_journal_can_store_never_runs() -> (
    None
):
    # JSON lets a model send a lone UTF-16 surrogate; no journal can keep it:
    # the arguments are refused before any gate, and the run goes on.
    ran: list[str] = []

    @tool(side_effect=True)
    def send_email(to: str) -> str:
        """Email someone."""
        ran.append(to)
        return "sent"

    def step(logged: Logged) -> Reply:
        tool_messages = [m for m in logged.messages if m["role"] == "tool"]
        if not tool_messages:
            return completion(tool_calls=[("e1", "send_email", {"to": "\udfff"})])
        return completion(
            TaskOutcome(success=False, reason=tool_messages[-1]["content"])
        )

    spec = RunSpec(goal=GOAL, tasks=[TaskDraft(key="mail", description="mail")])
    with chat_server(answers(TaskOutcome=step)) as server:
        result, events, replayed = await run(
            model_for(server.base_url), spec, approve=True, tools=[send_email]
        )
    assert ran == []
    assert not [e for e in events if isinstance(e, GateOpened)]
    reason = result.tasks[0].result.reason or ""
    assert reason.startswith("error: invalid arguments: arguments: Invalid JSON")
    assert "surrogate" in reason
    assert replayed == result


async def test_a_run_that_completed_no_task_names_why_its_tasks_failed() -> None:
    # The executor's endpoint answers 404 (a wrong deployment name): the run
    # aborted with "no task completed", and the 404 showed only in the
    # task's line above it.
    script = answers(TaskOutcome=error(404, "no such deployment"))
    with chat_server(script) as server:
        result, _, _ = await run(model_for(server.base_url), ONE_TASK)
    assert result.status is RunStatus.ABORTED
    assert result.stop_reason == (
        "no task completed: there are no results to build on; t1 failed: "
        f"{server.base_url}/ (gpt-test): HTTP 404: no such deployment: check "
        "the model name and the base URL"
    )
