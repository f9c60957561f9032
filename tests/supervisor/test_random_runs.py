"""Whole runs under random plans, limits and model answers keep the run rules.

Each example draws a pattern, a plan, limits near their edges and a script of
what the model answers (task outcomes, verdicts, proposals, alignment flags,
gate answers), runs it through a ``Supervisor`` with a ``ScriptedModel``, and
checks what must hold of every run, whatever happens in it (DESIGN §4): it
ends with a final status, its journal replays to its result (and its row, its
live event stream and the gates listed agree with it), finished tasks
never change, the replan ceiling holds, no more than ``max_concurrency``
attempts run at once, contract runs keep their plan, a hybrid boundary fires
once, the usage is what the model answered, every event round-trips through
JSON, a failed task's dependents are skipped, and a task that succeeded never
runs again; also when the run is cancelled, or its supervisor stops and
another resumes it, or the application that embeds the supervisor cancels
the scope that owns it (or a Ctrl-C stops it) at any moment: then nothing
of it is left running, and another supervisor resumes its runs.

Search for new examples with ``pytest --hypothesis-profile=explore
--hypothesis-seed=N`` (see conftest.py).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import hypothesis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripts import EVENT, GOAL, by_role, send_email, stream, task_of

from replan import (
    Alignment,
    Comparison,
    Critique,
    GateError,
    GatePolicy,
    GateResolution,
    Limits,
    MemoryStore,
    ModelError,
    ModelRequest,
    ModelResponse,
    PlanProposal,
    RunResult,
    RunSpec,
    ScriptedModel,
    Supervisor,
    SupervisorError,
    Synthesis,
    Task,
    TaskDraft,
    TaskOutcome,
    TaskStatus,
    TokenUsage,
    TransientModelError,
    Trigger,
    Verdict,
    apply,
    replay,
    tool,
)
from replan.messages import (
    Event,
    PlanCreated,
    ReplanApplied,
    ReplanOutcome,
    RunStatus,
    ToolCall,
)
from replan.store import RunSummary, SQLiteStore, Store
from replan.supervisor import RunState

FINISHED = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.SKIPPED})
UNFINISHED = [RunStatus.RUNNING, RunStatus.WAITING_FOR_HUMAN]

# Scenarios -------------------------------------------------------------------

OUTCOMES = [
    *["finding"] * 5,
    *["clean"] * 3,
    "transient",
    "fail",
    "empty",
    "malformed",
    "malformed_once",
    "model_error",
    "retry_after",
    "hang",
    "search",
    "email",
]
"""What the executor answers for one attempt of one task."""

PROPOSALS = [
    "valid",
    "valid",
    "on_completed",
    "empty",
    "cyclic",
    "dangling",
    "duplicate",
    "on_failed",
    "unachievable",
    "malformed",
    "on_any",
    "side_effects",
]
"""What the planner proposes when asked for a revision or a boundary."""

GATE_ANSWERS = ["approve", "reject", "none", "edit"]

EMBEDDED = [
    "outer",
    "outer_call",
    "outer_drain",
    "drain_cut",
    "outer_gate",
    "interrupt",
]
"""Interrupts that come from the application around the supervisor."""

INTERRUPTS = ["none", "none", "stop", "cancel", "drain"]
"""Interrupts of the supervisor's own (``none``: none)."""


class Interrupted(BaseException):
    """Ctrl-C as trio lets it land in running code (a ``KeyboardInterrupt``,
    which on asyncio would stop the event loop rather than go on out)."""


@dataclass(frozen=True)
class Review:
    decision: str
    trigger: Trigger | None = None
    confidence: float = 1.0
    sources: int = 2
    affect: int = 2
    broken: bool = False
    """A malformed answer instead of the verdict."""
    slow: int = 0
    """Attempts of the review that take longer than ``call_timeout_s``."""


@dataclass(frozen=True)
class Scenario:
    pattern: str
    plan: tuple[tuple[frozenset[int], bool, bool], ...]
    """Each task's dependencies among earlier ones, milestone, needs approval."""
    given_tasks: bool
    """The spec carries the plan; else the planner answers it."""
    outcomes: tuple[str, ...]
    reviews: tuple[Review, ...]
    proposals: tuple[tuple[str, int], ...]
    """A kind of proposal and how many tasks it has."""
    flags: tuple[tuple[bool, ...], ...]
    """Alignment answers: flags given for the proposed tasks, in order."""
    gates: tuple[str, ...]
    limits: Limits
    gate_on: frozenset[Trigger]
    on_timeout: str
    tokens: int
    """Tokens per model call (input and output each)."""
    latency_s: float
    spread_s: float
    """How much longer some tasks take than others."""
    runs: int
    """Runs of the same spec at once, on one supervisor."""
    sqlite: bool
    interrupt: str
    """``none``; ``cancel`` the first run, or ``stop`` or ``drain`` the
    supervisor (its runs are then resumed by another), once ``at`` events
    of the first run are journaled. Or the application that embeds the
    supervisor cancels the scope that owns it (its runs are then resumed by
    another, ``resume=True``): ``outer`` once ``at`` events of the first
    run are journaled, ``outer_call`` at a model call (``at`` says which),
    ``outer_drain`` while ``drain()`` waits for the calls in flight (or
    ``drain_cut``: it cancels that drain alone, which stops the supervisor),
    ``outer_gate`` while ``gates.resolve()`` waits for its answer to be
    journaled; or ``interrupt``: that model call raises a
    ``BaseException`` that is no cancellation (Ctrl-C), which stops the
    supervisor."""
    at: int
    serve: bool
    """The application starts ``sup.serve`` in a task group of its own
    (else ``async with``)."""


def _plan(
    size: int,
) -> st.SearchStrategy[tuple[tuple[frozenset[int], bool, bool], ...]]:
    def task(index: int) -> st.SearchStrategy[tuple[frozenset[int], bool, bool]]:
        deps = (
            st.just(frozenset[int]())
            if index == 0
            else st.frozensets(st.integers(0, index - 1), max_size=2)
        )
        return st.tuples(
            deps,
            st.integers(0, 4).map(lambda n: n == 0),
            st.integers(0, 9).map(lambda n: n == 0),
        )

    return st.tuples(*(task(i) for i in range(size)))


replan_review = st.builds(
    Review,
    decision=st.just("replan"),
    trigger=st.sampled_from([*Trigger, None]),
    confidence=st.sampled_from([1.0, 0.7, 0.5]),
    sources=st.integers(0, 3).map(lambda n: 3 - n),
    affect=st.integers(0, 3).map(lambda n: 3 - n),
)
# Most reviews ask for a replan, so that runs go through the guards.
reviews = st.one_of(
    *[replan_review] * 4,
    st.sampled_from(
        [
            Review("continue"),
            Review("continue"),
            Review("complete"),
            Review("abort"),
            Review("continue", broken=True),
            Review("continue", slow=1),
            Review("complete", slow=3),
        ]
    ),
)


@st.composite
def limits(draw: st.DrawFn) -> Limits:
    return Limits(
        max_replans=draw(st.integers(0, 3).map(lambda n: 3 - n)),
        max_iterations=draw(st.sampled_from([6, 4, 2, 1])),
        max_task_executions=draw(st.sampled_from([200, 200, 40, 8, 1])),
        max_task_attempts=draw(st.integers(1, 3)),
        retry_backoff_s=0,
        max_concurrency=draw(st.integers(1, 5)),
        milestone_every=draw(st.integers(1, 4)),
        token_budget=draw(st.sampled_from([None, None, 400, 120, 30])),
        min_corroboration=draw(st.integers(0, 2)),
        replan_candidates=draw(st.integers(1, 3)),
        gate_timeout_s=0.01,
        task_timeout_s=0.05,
        call_timeout_s=0.1,
        deadline_s=draw(st.sampled_from([None, None, None, 0.05, 0.2])),
    )


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    size = draw(st.integers(1, 25))
    return Scenario(
        pattern=draw(st.sampled_from(["discovery", "contract", "hybrid"])),
        plan=draw(_plan(size)),
        given_tasks=draw(st.integers(0, 3).map(lambda n: n > 0)),
        outcomes=tuple(
            draw(st.lists(st.sampled_from(OUTCOMES), min_size=1, max_size=12))
        ),
        reviews=tuple(draw(st.lists(reviews, min_size=1, max_size=8))),
        proposals=tuple(
            draw(
                st.lists(
                    st.tuples(st.sampled_from(PROPOSALS), st.integers(0, 4)),
                    min_size=1,
                    max_size=5,
                )
            )
        ),
        flags=tuple(
            draw(
                st.lists(
                    st.lists(st.integers(0, 4).map(lambda n: n > 0), max_size=5).map(
                        tuple
                    ),
                    min_size=1,
                    max_size=4,
                )
            )
        ),
        gates=tuple(
            draw(st.lists(st.sampled_from(GATE_ANSWERS), min_size=1, max_size=4))
        ),
        limits=draw(limits()),
        gate_on=draw(
            st.one_of(
                st.just(frozenset({Trigger.SCOPE_SHIFT})),
                st.frozensets(st.sampled_from(list(Trigger))),
            )
        ),
        on_timeout=draw(st.sampled_from(["approve", "reject"])),
        tokens=draw(st.sampled_from([1, 5, 0])),
        latency_s=draw(st.sampled_from([0.0, 0.0, 0.001])),
        spread_s=draw(st.sampled_from([0.0, 0.001, 0.003])),
        runs=draw(st.integers(1, 3).map(lambda n: 1 if n < 3 else 2)),
        sqlite=draw(st.integers(0, 5).map(lambda n: n == 0)),
        interrupt=draw(st.sampled_from(INTERRUPTS) | st.sampled_from(EMBEDDED)),
        at=draw(st.integers(2, 40)),
        serve=draw(st.booleans()),
    )


# The scripted world ------------------------------------------------------------


@tool
def search(to: str) -> str:
    """Search for someone."""
    return f"found {to}"


@dataclass
class World:
    """The model of one scenario: deterministic answers, and a count of what
    it handed out."""

    scenario: Scenario
    handed: dict[tuple[str, str], TokenUsage] = field(default_factory=dict)
    """Tokens handed out, by run and role."""
    running: Counter[str] = field(default_factory=Counter)
    most_running: Counter[str] = field(default_factory=Counter)
    replans_asked: Counter[str] = field(default_factory=Counter)
    alignments_asked: Counter[str] = field(default_factory=Counter)
    reviews_asked: Counter[tuple[str, int]] = field(default_factory=Counter)
    succeeded: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Successful answers handed out, by run and task id."""
    calls: int = 0
    outer: anyio.CancelScope | None = None
    """The application's scope around the supervisor, which ``outer_call``
    cancels at a model call."""

    def model(self) -> ScriptedModel:
        return ScriptedModel(
            self.answer, latency_s=self.scenario.latency_s, usage=self.usage
        )

    def supervisor(self, store: Store, *, resume: bool = False) -> Supervisor:
        return Supervisor(
            self.model(), store, tools=[search, send_email], resume=resume
        )

    def usage(self, request: ModelRequest) -> TokenUsage:
        # Called once the answer is in: it is what the model handed out.
        tokens = self.scenario.tokens
        usage = TokenUsage(input_tokens=tokens, output_tokens=tokens, calls=1)
        key = (request.run_id or "", request.role)
        had = self.handed.get(key)
        self.handed[key] = usage if had is None else had + usage
        return usage

    async def answer(self, request: ModelRequest) -> Any:
        self.calls += 1
        if self.calls == 1 + self.scenario.at % 12 and self.outer is not None:
            if self.scenario.interrupt == "interrupt":
                raise Interrupted
            # The answer is still given (the cancel lands at the call's next
            # checkpoint, if it has one).
            self.outer.cancel()
        match request.role, request.purpose:
            case "executor", "execute":
                return await self.attempt(request)
            case "executor", "synthesize":
                return Synthesis(output="the synthesis")
            case "reviewer", "milestone":
                return await self.milestone(request)
            case "planner", "plan":
                return self.first_plan(request)
            case "planner", "replan" | "boundary":
                return self.revision(request)
            case "ranker", "alignment":
                return self.alignment(request)
            case "reviewer", "critique":
                return Critique(scores={"feasibility": 0.5}, critique="plausible")
            case "ranker", "compare":
                return Comparison(winner="b" if request.context["b_index"] else "a")
            case "evolver", "evolve":
                return request.context["candidate"]
        raise AssertionError(f"unexpected {request.role}/{request.purpose} call")

    def execute(self, request: ModelRequest) -> Any:
        task = task_of(request)
        outcomes = self.scenario.outcomes
        kind = outcomes[(int(task.id[1:]) * 3 + task.attempts) % len(outcomes)]
        match kind:
            case "clean":
                return TaskOutcome(success=True, summary=f"{task.id} done")
            case "finding":
                return TaskOutcome(
                    success=True, summary=f"{task.id} done", findings=[f"{task.id}!"]
                )
            case "empty":
                return TaskOutcome(success=True, summary="")
            case "transient":
                return TaskOutcome(success=False, transient=True, reason="429")
            case "fail":
                return TaskOutcome(success=False, reason=f"{task.id} failed")
            case "malformed":
                return {"success": "perhaps"}
            case "malformed_once":
                if "answer_problem" in request.context:
                    return TaskOutcome(success=True, summary=f"{task.id} at last")
                return Verdict(decision="continue")
            case "model_error":
                raise ModelError("the model could not answer")
            case "retry_after":
                raise TransientModelError("429", retry_after=0.001)
            case "search" | "email" if not request.transcript:
                name = "search" if kind == "search" else "send_email"
                call = ToolCall(id="c1", name=name, arguments='{"to": "ana"}')
                return ModelResponse(tool_calls=[call], usage=self.usage(request))
            case "search" | "email":
                return TaskOutcome(
                    success=True, summary=f"{task.id} done", findings=[kind]
                )
        raise AssertionError(kind)

    async def attempt(self, request: ModelRequest) -> Any:
        """One attempt's answer, counted as running while it runs (an
        attempt that ``task_timeout_s`` cut short too, until it stops)."""
        run, task = request.run_id or "", task_of(request)
        timeout = self.scenario.limits.task_timeout_s
        assert timeout is not None
        self.running[run] += 1
        self.most_running[run] = max(self.most_running[run], self.running[run])
        try:
            # Tasks take different times: they finish out of order, while
            # the run reviews, replans or waits at a gate.
            await anyio.sleep(self.scenario.spread_s * (int(task.id[1:]) * 7 % 4))
            outcomes = self.scenario.outcomes
            kind = outcomes[(int(task.id[1:]) * 3 + task.attempts) % len(outcomes)]
            if kind == "hang":
                # Running until task_timeout_s cuts it short.
                await anyio.sleep(timeout / 2 + 1)
                return TaskOutcome(success=True, summary=f"{task.id} late")
            answer = self.execute(request)
            if isinstance(answer, TaskOutcome) and answer.success:
                self.succeeded[run, task.id] += 1
            return answer
        finally:
            self.running[run] -= 1

    async def milestone(self, request: ModelRequest) -> Any:
        reviews = self.scenario.reviews
        index = request.context["milestone_index"] - 1
        review = reviews[index] if index < len(reviews) else Review("continue")
        run = request.run_id or ""
        self.reviews_asked[run, index] += 1
        if self.reviews_asked[run, index] <= review.slow:
            await anyio.sleep(1)  # past call_timeout_s
        if review.broken:
            return {"decision": "maybe"}
        if review.decision != "replan":
            return Verdict(decision=review.decision, rationale="scripted")  # type: ignore[arg-type]
        pending = [t.id for t in request.context["pending"]]
        return Verdict(
            decision="replan",
            trigger=review.trigger,
            rationale="scripted replan",
            confidence=review.confidence,
            corroborating_sources=review.sources,
            affected_tasks=pending[: review.affect],
        )

    def first_plan(self, request: ModelRequest) -> Any:
        if "plan_problem" in request.context or self.scenario.proposals[0][0] in (
            "valid",
            "on_completed",
        ):
            return PlanProposal(tasks=first_drafts(self.scenario))
        return self.revision(request)

    def revision(self, request: ModelRequest) -> Any:
        proposals = self.scenario.proposals
        run = request.run_id or ""
        kind, size = proposals[self.replans_asked[run] % len(proposals)]
        self.replans_asked[run] += 1
        tag = f"p{self.replans_asked[run]}-"
        completed: list[Task] = request.context.get("completed", [])
        drafts = [
            TaskDraft(
                key=f"{tag}{i}",
                description=f"revised {tag}{i}",
                depends_on=[f"{tag}{i - 1}"] if i % 2 else [],
                milestone=i == size - 1,
            )
            for i in range(size)
        ]
        match kind:
            case "valid":
                pass
            case "on_completed":
                if completed and drafts:
                    drafts[0] = drafts[0].model_copy(
                        update={"depends_on": [completed[-1].id]}
                    )
            case "empty":
                drafts = []
            case "cyclic":
                drafts = [
                    TaskDraft(key=f"{tag}a", description="a", depends_on=[f"{tag}b"]),
                    TaskDraft(key=f"{tag}b", description="b", depends_on=[f"{tag}a"]),
                ]
            case "dangling":
                drafts.append(
                    TaskDraft(key=f"{tag}x", description="x", depends_on=["nowhere"])
                )
            case "duplicate":
                drafts = [
                    TaskDraft(key=f"{tag}d", description="d"),
                    TaskDraft(key=f"{tag}d", description="d again"),
                ]
            case "on_failed":
                failed = [
                    t.id
                    for t in request.context.get("pending", []) + list(completed)
                    if t.status is not TaskStatus.COMPLETED
                ]
                drafts.append(
                    TaskDraft(
                        key=f"{tag}f",
                        description="f",
                        depends_on=failed[:1] or ["t1"],
                    )
                )
            case "on_any" if drafts:
                # Any task of the run: running, pending, superseded, failed...
                other = f"t{1 + (self.replans_asked[run] * 5) % 12}"
                drafts[-1] = drafts[-1].model_copy(update={"depends_on": [other]})
            case "side_effects":
                drafts = [
                    d.model_copy(update={"requires_approval": True}) for d in drafts
                ]
            case "unachievable":
                return PlanProposal(tasks=drafts, achievable=False, rationale="no way")
            case "malformed":
                return {"tasks": "many"}
        return PlanProposal(tasks=drafts, rationale=f"scripted {kind}")

    def alignment(self, request: ModelRequest) -> Alignment:
        flags = self.scenario.flags
        run = request.run_id or ""
        given = flags[self.alignments_asked[run] % len(flags)]
        self.alignments_asked[run] += 1
        proposed = len(request.context["proposed"])
        if "answer_problem" in request.context:
            given = (*given, *[True] * proposed)
        return Alignment(aligned=list(given[:proposed]) if proposed else [])


def first_drafts(scenario: Scenario) -> list[TaskDraft]:
    return [
        TaskDraft(
            key=f"s{i}",
            description=f"step {i}",
            depends_on=[f"s{d}" for d in sorted(after)],
            milestone=milestone,
            requires_approval=approval,
        )
        for i, (after, milestone, approval) in enumerate(scenario.plan)
    ]


def gate_answer(kind: str, request: Any) -> GateResolution | None:
    match kind:
        case "approve":
            return GateResolution(decision="approve", by="ana")
        case "reject":
            return GateResolution(decision="reject", by="ana", note="no")
        case "edit" if request.proposal is not None:
            drafts = [TaskDraft(key="e1", description="edited step")]
            return GateResolution(decision="edit", tasks=drafts, by="ana")
        case "edit":
            return GateResolution(decision="approve", by="ana")
    return None  # left to its timeout


async def answer_gates(
    sup: Supervisor, scenario: Scenario, outer: anyio.CancelScope | None = None
) -> None:
    """Answer each gate as the scenario says, in the order they open; with
    ``outer``, cancel it while the first answer waits to be journaled."""
    seen: set[str] = set()
    while True:
        for request in sup.gates.pending():
            if request.gate_id in seen:
                continue
            kind = scenario.gates[len(seen) % len(scenario.gates)]
            seen.add(request.gate_id)
            resolution = gate_answer(kind, request)
            if resolution is not None and outer is not None:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(resolve, sup, request.gate_id, resolution)
                    for _ in range(scenario.at % 3):
                        await anyio.lowlevel.checkpoint()
                    outer.cancel()
            elif resolution is not None:
                await resolve(sup, request.gate_id, resolution)
        await anyio.sleep(0.001)


async def resolve(sup: Supervisor, gate_id: str, resolution: GateResolution) -> None:
    # Refused when it timed out first, or the run ended.
    with contextlib.suppress(GateError):
        await sup.gates.resolve(gate_id, resolution)


# Running and checking ----------------------------------------------------------


def spec_of(scenario: Scenario) -> RunSpec:
    given = scenario.given_tasks or scenario.pattern == "hybrid"
    return RunSpec(
        goal=GOAL,
        pattern=scenario.pattern,  # type: ignore[arg-type]
        tasks=first_drafts(scenario) if given else None,
        limits=scenario.limits,
        gate_policy=GatePolicy(
            gate_on=scenario.gate_on,
            on_timeout=scenario.on_timeout,  # type: ignore[arg-type]
        ),
    )


@dataclass(frozen=True)
class Ran:
    result: RunResult
    events: list[Event]
    replayed: RunResult
    world: World
    streamed: list[Event] | None
    """The events ``handle.events()`` gave, live (None: the run was
    resumed)."""
    summary: RunSummary | None
    open_gates: list[str]
    """Gates of the run the supervisor still lists once it ended."""


async def run_scenario(scenario: Scenario) -> list[Ran]:
    """Run the scenario's runs; with an interrupt, the first run's events
    say when, and a stopped supervisor's runs are resumed by another."""
    world = World(scenario)
    results: dict[str, RunResult] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "runs.db") if scenario.sqlite else MemoryStore()
        with anyio.fail_after(20):
            async with store:
                if scenario.interrupt in EMBEDDED:
                    return await run_embedded(world, store)
                async with (
                    world.supervisor(store) as sup,
                    anyio.create_task_group() as tg,
                ):
                    tg.start_soon(answer_gates, sup, scenario)
                    handles = [
                        await sup.submit(spec_of(scenario))
                        for _ in range(scenario.runs)
                    ]
                    run_ids = [h.run_id for h in handles]
                    streamed: dict[str, list[Event]] = {}
                    ended: list[anyio.Event] = []
                    if scenario.interrupt in ("none", "cancel"):
                        for handle in handles:
                            streamed[handle.run_id] = []
                            ended.append(anyio.Event())
                            tg.start_soon(
                                stream, handle, streamed[handle.run_id], ended[-1]
                            )
                    if scenario.interrupt != "none":
                        async for event in handles[0].events():
                            if event.seq >= scenario.at:
                                break
                    if scenario.interrupt == "cancel":
                        await handles[0].cancel()
                    if scenario.interrupt == "drain":
                        await sup.drain(0.02)
                    if scenario.interrupt in ("none", "cancel"):
                        for handle in handles:
                            results[handle.run_id] = await handle.result()
                        with anyio.fail_after(5):  # the streams end too
                            for stream_ended in ended:
                                await stream_ended.wait()
                    open_gates = [g.run_id for g in sup.gates.pending()]
                    tg.cancel_scope.cancel()
                if not results:
                    async with (
                        world.supervisor(store) as sup,
                        anyio.create_task_group() as tg,
                    ):
                        tg.start_soon(answer_gates, sup, scenario)
                        for run_id in run_ids:
                            handle = await sup.resume(run_id)
                            results[run_id] = await handle.result()
                        open_gates = [g.run_id for g in sup.gates.pending()]
                        tg.cancel_scope.cancel()
                return [
                    Ran(
                        results[run_id],
                        await store.read(run_id),
                        await sup.replay(run_id),
                        world,
                        streamed.get(run_id),
                        await store.get_run(run_id),
                        [g for g in open_gates if g == run_id],
                    )
                    for run_id in run_ids
                ]


async def run_embedded(world: World, store: Store) -> list[Ran]:
    """Run the scenario's runs under a supervisor the application embeds and
    cancels (or interrupts) as the scenario says; nothing of it is left
    running then, and another supervisor, ``resume=True``, takes up every
    run left unfinished."""
    scenario = world.scenario
    before = live_tasks()
    with anyio.CancelScope() as outer:
        world.outer = outer
        try:
            if scenario.serve:
                await serve_embedded(world, store, outer)
            else:
                async with world.supervisor(store) as sup:
                    await embedded_body(world, sup, outer)
        except Interrupted:
            # As itself, not in a group, out of `async with`.
            assert scenario.interrupt == "interrupt"
    world.outer = None
    assert live_tasks() == before, "tasks left running after the cancel"
    assert not +world.running, f"attempts left running: {world.running}"
    run_ids = [s.run_id for s in reversed(await store.list_runs())]
    assert 1 <= len(run_ids) <= scenario.runs
    await check_left(store, run_ids)
    unfinished = await store.list_runs(statuses=UNFINISHED)
    # How often the cancel cut a run short (--hypothesis-show-statistics).
    hypothesis.event(
        f"{scenario.interrupt}: {'a run' if unfinished else 'no run'} left"
    )

    if scenario.at % 3 == 0:
        await resume_cut_short(world, store)
        assert live_tasks() == before, "tasks left running after the cancel"
        assert not +world.running, f"attempts left running: {world.running}"
        await check_left(store, run_ids)

    results: dict[str, RunResult] = {}
    async with (
        world.supervisor(store, resume=True) as sup,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(answer_gates, sup, scenario)
        for handle in sup.handles():
            results[handle.run_id] = await handle.result()
        open_gates = [g.run_id for g in sup.gates.pending()]
        tg.cancel_scope.cancel()
    return [
        Ran(
            results[run_id] if run_id in results else await sup.replay(run_id),
            await store.read(run_id),
            await sup.replay(run_id),
            world,
            None,
            await store.get_run(run_id),
            [g for g in open_gates if g == run_id],
        )
        for run_id in run_ids
    ]


async def serve_embedded(world: World, store: Store, outer: anyio.CancelScope) -> None:
    """``await task_group.start(sup.serve)`` in the application's own task
    group: an interrupt comes out of it in that group alone."""
    raised: BaseExceptionGroup[BaseException] | None = None
    try:
        async with anyio.create_task_group() as app:
            sup = world.supervisor(store)
            await app.start(sup.serve)
            await embedded_body(world, sup, outer)
    except BaseExceptionGroup as group:
        raised = group
    if raised is not None:
        assert world.scenario.interrupt == "interrupt"
        # Beside the cancel of the application's own body, on trio.
        rest = raised.split((Interrupted, anyio.get_cancelled_exc_class()))[1]
        assert rest is None, repr(raised)
        assert raised.subgroup(Interrupted) is not None, repr(raised)


async def embedded_body(
    world: World, sup: Supervisor, outer: anyio.CancelScope
) -> None:
    """What the application does with its supervisor until it cancels
    ``outer`` (or the model does, or interrupts it)."""
    scenario = world.scenario
    async with anyio.create_task_group() as tg:
        gate = outer if scenario.interrupt == "outer_gate" else None
        tg.start_soon(answer_gates, sup, scenario, gate)
        handles = [await sup.submit(spec_of(scenario)) for _ in range(scenario.runs)]
        if scenario.interrupt in ("outer", "outer_drain", "drain_cut"):
            async for event in handles[0].events():
                if event.seq >= scenario.at:
                    break
        if scenario.interrupt == "outer_drain":
            tg.start_soon(sup.drain, 0.02 if scenario.at % 2 else 1.0)
            await checkpoints(scenario.at % 5)
        if scenario.interrupt == "drain_cut":
            with anyio.CancelScope() as cut:
                async with anyio.create_task_group() as draining:
                    draining.start_soon(sup.drain, 1.0)
                    await checkpoints(scenario.at % 5)
                    cut.cancel()
        if scenario.interrupt not in ("outer", "outer_drain"):
            # Cancelled (or interrupted) at a model call or a gate's answer;
            # or every run ended first. An interrupt, or the drain cut short,
            # stops the supervisor, and its runs did not finish (the cancel
            # of the group may come after that news).
            stopped = SupervisorError if scenario.interrupt in STOPS else ()
            for handle in handles:
                with contextlib.suppress(stopped):
                    await handle.result()
        if scenario.interrupt == "drain_cut":
            tg.cancel_scope.cancel()  # the gates are answered no more
            return  # the supervisor stopped: serve() has ended
        outer.cancel()
        await anyio.lowlevel.checkpoint()
        raise AssertionError("not cancelled")


STOPS = ("interrupt", "drain_cut")


async def check_left(store: Store, run_ids: list[str]) -> None:
    """What a cancel left in the journal: each run's row says what its
    events replay to, and they follow each other."""
    for run_id in run_ids:
        events = await store.read(run_id)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        summary = await store.get_run(run_id)
        assert summary is not None
        state = replay(events)
        assert (summary.status, summary.last_seq) == (state.status, len(events))


async def checkpoints(count: int) -> None:
    for _ in range(count):
        await anyio.lowlevel.checkpoint()


async def resume_cut_short(world: World, store: Store) -> None:
    """A supervisor that resumes the runs, ``resume=True``, which the
    application cancels soon after it starts (while it takes them up, say)."""
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:

            async def cancel() -> None:
                await checkpoints(world.scenario.at % 13)
                scope.cancel()

            tg.start_soon(cancel)
            async with world.supervisor(store, resume=True) as sup:
                tg.start_soon(answer_gates, sup, world.scenario)
                await anyio.sleep_forever()


def live_tasks() -> int:
    """How many tasks the event loop runs, this one included."""
    return len(anyio.get_running_tasks())


def check(scenario: Scenario, ran: Ran) -> None:
    result, events, limits = ran.result, ran.events, scenario.limits
    world, run = ran.world, result.run_id

    # It ends, with a reason unless it completed, and replays to its result.
    assert result.status.final
    if result.status.value != "completed":
        assert result.stop_reason, result
    assert ran.replayed == result
    # Its row and its stream say the same; nothing waits on it.
    assert ran.summary is not None
    assert (ran.summary.status, ran.summary.last_seq) == (result.status, len(events))
    if ran.streamed is not None:
        assert ran.streamed == events
    assert not ran.open_gates, "a finished run lists open gates"

    # Every event round-trips through JSON.
    for event in events:
        assert EVENT.validate_json(EVENT.dump_json(event)) == event

    # Finished tasks never change, event by event.
    finished: dict[str, Task] = {}
    state: RunState | None = None
    boundaries = 0
    for event in events:
        state = apply(state, event)
        if isinstance(event, PlanCreated) and event.boundary:
            boundaries += 1
        if isinstance(event, ReplanApplied):
            assert scenario.pattern != "contract", "a contract run replanned"
            assert state.phase != "collection", "a replan while collecting"
        for task_id, task in state.tasks.items():
            if task_id in finished:
                assert essence(task) == essence(finished[task_id]), (
                    f"{event.kind} changed finished task {task_id}"
                )
            elif task.status in FINISHED:
                finished[task_id] = task
    assert state is not None
    assert state.result() == result

    # ... nor across plan versions.
    for version in result.versions:
        for task in version.tasks_before:
            if task.id in finished and task.status in FINISHED:
                assert essence(task) == essence(finished[task.id])

    # The ceilings hold.
    applied = [r for r in result.replans if r.outcome is ReplanOutcome.APPLIED]
    assert len(applied) <= limits.max_replans
    assert result.task_executions <= limits.max_task_executions
    assert all(t.attempts <= limits.max_task_attempts for t in result.tasks)
    assert world.most_running[run] <= limits.max_concurrency
    assert state.reviews <= limits.max_iterations
    assert boundaries <= 1

    # Contract runs keep their plan; hybrid runs replan only after the boundary.
    tasks = {t.id: t for t in result.tasks}
    if scenario.pattern == "contract":
        assert len(result.versions) <= 1
        assert not any(t.status is TaskStatus.SUPERSEDED for t in result.tasks)
    if scenario.pattern == "hybrid":
        for record in applied:
            assert boundaries == 1, record

    # A failed task's dependents never run; completed tasks had their
    # dependencies completed.
    for task in result.tasks:
        if task.status is TaskStatus.COMPLETED:
            for dep in task.depends_on:
                assert tasks[dep].status is TaskStatus.COMPLETED, (task.id, dep)
        for dep in task.depends_on:
            if tasks[dep].status in (TaskStatus.FAILED, TaskStatus.SKIPPED):
                assert task.status in (TaskStatus.SKIPPED, TaskStatus.SUPERSEDED), (
                    f"{task.id} is {task.status.value}, {dep} is "
                    f"{tasks[dep].status.value}"
                )
    if result.status.value == "completed":
        assert not any(
            t.status in (TaskStatus.PENDING, TaskStatus.IN_PROGRESS)
            for t in result.tasks
        )
        assert result.output == "the synthesis"

    # A task that succeeded is not run again (a resumed run takes it from
    # the journal or the effect ledger).
    again = {t: n for (r, t), n in world.succeeded.items() if r == run and n > 1}
    assert not again, f"tasks run again after they succeeded: {again}"

    # The usage is what the model answered, role by role.
    handed = {role: u for (r, role), u in world.handed.items() if r == run}
    assert by_role(result.usage.by_role) == by_role(handed)


def essence(task: Task) -> tuple[object, ...]:
    return (task.status, task.result, task.description, task.depends_on, task.attempts)


def run_and_check(scenario: Scenario, backend: str) -> list[Ran]:
    runs = anyio.run(run_scenario, scenario, backend=backend)
    for ran in runs:
        check(scenario, ran)
    return runs


# About 12 s a backend; the same examples each time (the deterministic
# profile of conftest.py).
@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@given(scenario=scenarios())
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
def test_random_runs_keep_the_run_rules(backend: str, scenario: Scenario) -> None:
    run_and_check(scenario, backend)
