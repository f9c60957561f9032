"""Deterministic scripted models, task lists and a run helper for the run rules.

``scripted(...)`` builds a :class:`ScriptedModel` from one small function per
role and purpose; anything not scripted answers with a harmless default
(clean task outcomes, ``continue`` at milestones, every proposed task aligned).
``run_to_end`` runs one spec under a fresh supervisor, guarded by
``anyio.fail_after``, and returns the result with its journal and replay.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from pydantic import TypeAdapter

from replan import (
    Alignment,
    Comparison,
    Critique,
    GatePolicy,
    Limits,
    MemoryStore,
    ModelRequest,
    ModelResponse,
    PlanProposal,
    ReplanOutcome,
    RunHandle,
    RunResult,
    RunSpec,
    ScriptedModel,
    Supervisor,
    Synthesis,
    Task,
    TaskDraft,
    TaskOutcome,
    TaskRunner,
    TokenUsage,
    Trigger,
    Verdict,
    tool,
)
from replan.messages import Event, MilestoneReviewed, RunStatus, ToolCall
from replan.store import RunSummary, Store

GOAL = "map the market for solid-state batteries"
SYNTHESIS = "the synthesis of every completed task"

Answer = Callable[[ModelRequest], Any]


# Answers ---------------------------------------------------------------------


def task_of(request: ModelRequest) -> Task:
    task = request.context["task"]
    assert isinstance(task, Task)
    return task


def clean(request: ModelRequest) -> TaskOutcome:
    """A success with a summary and no findings: the heuristic lets it pass."""
    task_id = task_of(request).id
    return TaskOutcome(success=True, summary=f"{task_id} done")


def with_finding(request: ModelRequest) -> TaskOutcome:
    """A success with one finding: the reviewer model must judge it."""
    task_id = task_of(request).id
    return TaskOutcome(
        success=True, summary=f"{task_id} done", findings=[f"finding of {task_id}"]
    )


def keep_going(request: ModelRequest) -> Verdict:
    return Verdict(decision="continue", rationale="on track")


def replan_verdict(
    trigger: Trigger | None = Trigger.CONTRADICTION, **fields: Any
) -> Verdict:
    fields.setdefault("rationale", "a finding contradicts the plan")
    fields.setdefault("confidence", 1.0)
    return Verdict(decision="replan", trigger=trigger, **fields)


def always_replan(request: ModelRequest) -> Verdict:
    return replan_verdict()


def first_then_continue(verdict: Verdict) -> Answer:
    """The first review answers ``verdict``; every later one continues."""

    def answer(request: ModelRequest) -> Verdict:
        if request.context["milestone_index"] == 1:
            return verdict
        return keep_going(request)

    return answer


def fresh_tasks(count: int, tag: str = "r") -> PlanProposal:
    """``count`` new independent tasks with keys unique to ``tag``."""
    return PlanProposal(
        tasks=[
            TaskDraft(key=f"{tag}{i}", description=f"revised step {tag}{i}")
            for i in range(1, count + 1)
        ],
        rationale="a revised plan",
    )


def same_size_chain(request: ModelRequest) -> PlanProposal:
    """Replace the pending tasks by as many fresh ones, in a chain."""
    pending = request.context["pending"]
    tag = f"v{len(request.context['completed'])}-"
    drafts = [
        TaskDraft(
            key=f"{tag}{i}",
            description=f"revised step {tag}{i}",
            depends_on=[f"{tag}{i - 1}"] if i > 1 else [],
        )
        for i in range(1, len(pending) + 1)
    ]
    return PlanProposal(tasks=drafts, rationale="a revised plan")


def all_aligned(request: ModelRequest) -> Alignment:
    return Alignment(aligned=[True] * len(request.context["proposed"]))


def synthesize(request: ModelRequest) -> Synthesis:
    return Synthesis(output=SYNTHESIS)


def critique(request: ModelRequest) -> Critique:
    return Critique(scores={"feasibility": 0.5}, critique="plausible")


def prefer_a(request: ModelRequest) -> Comparison:
    return Comparison(winner="a")


def evolve_unchanged(request: ModelRequest) -> PlanProposal:
    candidate = request.context["candidate"]
    assert isinstance(candidate, PlanProposal)
    return candidate


def unexpected(request: ModelRequest) -> Any:
    raise AssertionError(f"unexpected {request.role}/{request.purpose} call")


def scripted(
    *,
    execute: Answer = clean,
    milestone: Answer = keep_going,
    replan: Answer = same_size_chain,
    alignment: Answer = all_aligned,
    synthesis: Answer = synthesize,
    plan: Answer = unexpected,
    critiques: Answer = critique,
    compare: Answer = prefer_a,
    evolve: Answer = evolve_unchanged,
    latency_s: float = 0.0,
    usage: TokenUsage | Callable[[ModelRequest], TokenUsage] | None = None,
) -> ScriptedModel:
    """A scripted model answering each role and purpose with its function."""
    table: dict[tuple[str, str], Answer] = {
        ("executor", "execute"): execute,
        ("executor", "synthesize"): synthesis,
        ("reviewer", "milestone"): milestone,
        ("planner", "plan"): plan,
        ("planner", "replan"): replan,
        ("ranker", "alignment"): alignment,
        ("reviewer", "critique"): critiques,
        ("ranker", "compare"): compare,
        ("evolver", "evolve"): evolve,
    }

    def handler(request: ModelRequest) -> Any:
        return table.get((request.role, request.purpose), unexpected)(request)

    return ScriptedModel(handler, latency_s=latency_s, usage=usage)


@tool(side_effect=True)
def send_email(to: str, idempotency_key: str) -> str:
    """Email someone."""
    return "sent"


def emails_first(request: ModelRequest) -> Any:
    """The executor calls ``send_email`` (a side effect: a gate asks first),
    then reports success."""
    if request.purpose == "synthesize":
        return Synthesis(output="done")
    if not request.transcript:
        call = ToolCall(id="c1", name="send_email", arguments='{"to": "ana"}')
        return ModelResponse(tool_calls=[call])
    return TaskOutcome(success=True, summary="emailed")


# Plans -----------------------------------------------------------------------


def chain(count: int, *, milestone_at: Sequence[int] = ()) -> list[TaskDraft]:
    """``count`` tasks, each depending on the one before (ids t1..tN)."""
    return [
        TaskDraft(
            key=f"s{i}",
            description=f"step {i}",
            depends_on=[f"s{i - 1}"] if i > 1 else [],
            milestone=i in milestone_at,
        )
        for i in range(1, count + 1)
    ]


def independent(count: int) -> list[TaskDraft]:
    """``count`` tasks without dependencies (ids t1..tN)."""
    return [
        TaskDraft(key=f"s{i}", description=f"step {i}") for i in range(1, count + 1)
    ]


def spec(
    tasks: list[TaskDraft],
    *,
    gate_policy: GatePolicy | None = None,
    **limits: Any,
) -> RunSpec:
    return RunSpec(
        goal=GOAL,
        pattern="discovery",
        tasks=tasks,
        limits=Limits(**limits),
        gate_policy=gate_policy if gate_policy is not None else GatePolicy(),
    )


# Running ---------------------------------------------------------------------


@dataclass(frozen=True)
class Finished:
    """A run that ended: its result, its journal, and the journal's replay."""

    result: RunResult
    events: list[Event]
    replayed: RunResult
    elapsed_s: float

    def task(self, task_id: str) -> Task:
        for task in self.result.tasks:
            if task.id == task_id:
                return task
        raise KeyError(task_id)

    def statuses(self) -> dict[str, str]:
        return {t.id: t.status.value for t in self.result.tasks}

    def outcomes(self) -> list[ReplanOutcome]:
        return [r.outcome for r in self.result.replans]

    def reviews(self) -> list[MilestoneReviewed]:
        return [e for e in self.events if isinstance(e, MilestoneReviewed)]


async def run_to_end(
    model: ScriptedModel,
    run_spec: RunSpec,
    *,
    task_runner: TaskRunner | None = None,
    timeout_s: float = 10,
) -> Finished:
    """Run ``run_spec`` under a fresh supervisor until it ends."""
    started = time.monotonic()
    with anyio.fail_after(timeout_s):
        async with Supervisor(model, MemoryStore(), task_runner=task_runner) as sup:
            handle = await sup.submit(run_spec)
            result = await handle.result()
            elapsed = time.monotonic() - started
            events = await sup.store.read(handle.run_id)
            replayed = await sup.replay(handle.run_id)
    return Finished(result, events, replayed, elapsed)


def executed_ids(model: ScriptedModel) -> list[str]:
    """Ids of the tasks the executor model was asked to run, in call order."""
    return [task_of(c).id for c in model.calls_for("executor", "execute")]


class DelegatingStore:
    """A Store that passes every call to ``inner``; tests override ``append``."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    async def append(
        self, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        await self.inner.append(run_id, events, summary)

    async def read(self, run_id: str, after: int = 0) -> list[Event]:
        return await self.inner.read(run_id, after)

    async def get_run(self, run_id: str) -> RunSummary | None:
        return await self.inner.get_run(run_id)

    async def list_runs(
        self,
        *,
        statuses: Sequence[RunStatus] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[RunSummary]:
        return await self.inner.list_runs(statuses=statuses, limit=limit, offset=offset)

    async def aclose(self) -> None:
        await self.inner.aclose()


# What the random-run property tests share ---------------------------------

EVENT: TypeAdapter[Event] = TypeAdapter(Event)
"""Any journal event, for the JSON round trip every event must survive."""


async def stream(handle: RunHandle, into: list[Event], ended: anyio.Event) -> None:
    """Collect the run's live events into ``into``; set ``ended`` after."""
    into.extend([event async for event in handle.events()])
    ended.set()


def by_role(usage: dict[str, TokenUsage]) -> dict[str, tuple[int, int, int]]:
    """Tokens in, tokens out and calls of each role that used any."""
    return {
        role: (u.input_tokens, u.output_tokens, u.calls)
        for role, u in usage.items()
        if u.calls or u.total_tokens
    }
