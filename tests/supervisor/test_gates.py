"""Human gates: replan gates, approval gates for side effects, timeouts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from scripts import DelegatingStore

import replan
from replan import (
    Alignment,
    GateAlreadyResolved,
    GatePolicy,
    GateRequest,
    GateResolution,
    Hypothesis,
    Limits,
    MemoryStore,
    ModelRequest,
    PlanProposal,
    ReplanOutcome,
    ResolutionRefused,
    RunHandle,
    RunSpec,
    RunStatus,
    ScriptedModel,
    Supervisor,
    Synthesis,
    TaskDraft,
    TaskOutcome,
    TaskStatus,
    Trigger,
    Verdict,
    replay,
)
from replan.messages import EVENT_ADAPTER, GateOpened, GateResolved
from replan.store import RunSummary

# A plan where the first task is a milestone with a finding, so the reviewer
# is asked once while t2 and t3 are still pending.
CHAIN = [
    TaskDraft(key="a", description="survey the field", milestone=True),
    TaskDraft(key="b", description="build on the survey", depends_on=["a"]),
    TaskDraft(key="c", description="check the build", depends_on=["b"]),
]
REVISED = [
    TaskDraft(key="x", description="survey the wider field", depends_on=["t1"]),
    TaskDraft(key="y", description="build on the wider survey", depends_on=["x"]),
]


@dataclass
class Script:
    """Deterministic answers for every role; the reviewer replans once."""

    trigger: Trigger | None = Trigger.SCOPE_SHIFT
    revised: list[TaskDraft] = field(default_factory=lambda: list(REVISED))

    def __call__(self, request: ModelRequest) -> Any:
        ctx = request.context
        match (request.role, request.purpose):
            case ("planner", "replan"):
                return PlanProposal(tasks=self.revised, rationale="revised")
            case ("executor", "execute"):
                task = ctx["task"]
                findings = ["the scope is wider"] if task.key == "a" else []
                return TaskOutcome(
                    success=True, summary=f"did {task.key}", findings=findings
                )
            case ("executor", "synthesize"):
                return Synthesis(output="done")
            case ("reviewer", "milestone"):
                if ctx["milestone_index"] == 1 and self.trigger is not None:
                    return Verdict(
                        decision="replan", trigger=self.trigger, rationale="wider"
                    )
                return Verdict(decision="continue")
            case ("ranker", "alignment"):
                return Alignment(aligned=[True] * len(ctx["proposed"]))
        raise AssertionError(f"unexpected request {request.role}/{request.purpose}")


def chain_spec(**fields: Any) -> RunSpec:
    return RunSpec(goal="map the field", tasks=CHAIN, **fields)


async def until(predicate: Callable[[], object], seconds: float = 10) -> None:
    """Poll ``predicate`` until it holds (the run gives no event to wait on)."""
    with anyio.fail_after(seconds):
        while True:
            if predicate():
                return
            await anyio.sleep(0.005)


def journaled_gate(sup: Supervisor, run_id: str | None = None) -> GateRequest | None:
    """The oldest pending gate whose opening the run has journaled."""
    for gate in sup.gates.pending(run_id):
        if gate.gate_id in sup.get(gate.run_id).state.gates:
            return gate
    return None


async def next_gate(sup: Supervisor, run_id: str | None = None) -> GateRequest:
    # Waiting for the journal too keeps the tests below about one rule each;
    # the test of "listed only once journaled" is further down.
    await until(lambda: journaled_gate(sup, run_id))
    gate = journaled_gate(sup, run_id)
    assert gate is not None
    return gate


async def finish(handle: RunHandle) -> replan.RunResult:
    with anyio.fail_after(10):
        return await handle.result()


async def journal(handle: RunHandle) -> list[replan.Event]:
    with anyio.fail_after(10):
        return [event async for event in handle.events()]


def keys_of(result: replan.RunResult, ids: list[str]) -> list[str]:
    by_id = {t.id: t for t in result.tasks}
    return [by_id[i].key for i in ids]


# Replan gates ---------------------------------------------------------------


async def test_a_scope_shift_waits_at_a_gate_that_shows_the_proposed_diff() -> None:
    model = ScriptedModel(Script())
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec())
        gate = await next_gate(sup)

        assert handle.status is RunStatus.WAITING_FOR_HUMAN
        assert gate.run_id == handle.run_id
        assert gate.trigger is Trigger.SCOPE_SHIFT
        assert gate.task_id is None
        assert gate.proposal is not None
        assert gate.proposal.removed == ["t2", "t3"]
        assert gate.proposal.added == ["t4", "t5"]
        assert gate.proposal.preserved == ["t1"]
        # Nothing is applied while the gate is open.
        assert len(handle.state.versions) == 1
        assert handle.state.tasks["t2"].status is TaskStatus.PENDING

        await sup.gates.resolve(gate.gate_id, GateResolution(decision="approve"))
        await finish(handle)


async def test_approving_a_scope_shift_applies_the_replan_signed_by_the_approver() -> (
    None
):
    model = ScriptedModel(Script())
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec())
        gate = await next_gate(sup)
        await sup.gates.resolve(
            gate.gate_id, GateResolution(decision="approve", by="alice")
        )
        assert sup.gates.pending() == []
        result = await finish(handle)

    assert result.status is RunStatus.COMPLETED
    assert [r.outcome for r in result.replans] == [ReplanOutcome.APPLIED]
    assert [v.version for v in result.versions] == [1, 2]
    assert result.versions[-1].approved_by == "alice"
    assert result.versions[-1].trigger is Trigger.SCOPE_SHIFT
    status = {t.id: t.status for t in result.tasks}
    assert status == {
        "t1": TaskStatus.COMPLETED,
        "t2": TaskStatus.SUPERSEDED,
        "t3": TaskStatus.SUPERSEDED,
        "t4": TaskStatus.COMPLETED,
        "t5": TaskStatus.COMPLETED,
    }


async def test_rejecting_a_scope_shift_keeps_the_plan_and_runs_it_to_the_end() -> None:
    model = ScriptedModel(Script())
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec())
        gate = await next_gate(sup)
        await sup.gates.resolve(
            gate.gate_id, GateResolution(decision="reject", by="bob", note="no")
        )
        result = await finish(handle)

    assert result.status is RunStatus.COMPLETED
    assert [r.outcome for r in result.replans] == [ReplanOutcome.REJECTED_BY_HUMAN]
    assert [v.version for v in result.versions] == [1]
    assert [t.id for t in result.tasks] == ["t1", "t2", "t3"]
    assert all(t.status is TaskStatus.COMPLETED for t in result.tasks)
    ran = [c.context["task"].id for c in model.calls_for("executor", "execute")]
    assert ran == ["t1", "t2", "t3"]


async def test_an_edit_applies_the_edited_tasks_instead_of_the_planners() -> None:
    model = ScriptedModel(Script())
    edited = [
        TaskDraft(key="e1", description="the person's own step", depends_on=["t1"]),
    ]
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec())
        gate = await next_gate(sup)
        await sup.gates.resolve(
            gate.gate_id, GateResolution(decision="edit", tasks=edited, by="carol")
        )
        result = await finish(handle)

    assert result.status is RunStatus.COMPLETED
    assert [r.outcome for r in result.replans] == [ReplanOutcome.APPLIED]
    version = result.versions[-1]
    assert version.approved_by == "carol"
    assert keys_of(result, version.added) == ["e1"]
    assert version.removed == ["t2", "t3"]
    keys = [t.key for t in result.tasks]
    assert "x" not in keys
    assert "y" not in keys
    (e1,) = [t for t in result.tasks if t.key == "e1"]
    assert e1.status is TaskStatus.COMPLETED
    assert e1.depends_on == ["t1"]


async def test_an_edit_that_is_no_valid_plan_is_refused_and_the_gate_stays_open() -> (
    None
):
    model = ScriptedModel(Script())
    broken = [TaskDraft(key="e1", description="step", depends_on=["ghost"])]
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec())
        gate = await next_gate(sup)
        with anyio.fail_after(10), pytest.raises(replan.GateError):
            await sup.gates.resolve(
                gate.gate_id, GateResolution(decision="edit", tasks=broken)
            )
        assert [g.gate_id for g in sup.gates.pending()] == [gate.gate_id]
        assert handle.status is RunStatus.WAITING_FOR_HUMAN
        assert len(handle.state.versions) == 1

        await sup.gates.resolve(gate.gate_id, GateResolution(decision="approve"))
        result = await finish(handle)

    assert result.status is RunStatus.COMPLETED
    assert keys_of(result, result.versions[-1].added) == ["x", "y"]


async def test_resolving_an_unknown_gate_raises_gate_error() -> None:
    model = ScriptedModel(Script())
    async with Supervisor(model) as sup:
        with pytest.raises(replan.GateError):
            await sup.gates.resolve("no-such-gate", GateResolution(decision="approve"))


async def test_resolving_a_gate_twice_raises_gate_already_resolved() -> None:
    # The first answer is journaled and the gate closed: the second is told
    # the gate is resolved (and how), not that no such gate exists.
    model = ScriptedModel(Script())
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec())
        gate = await next_gate(sup)
        await sup.gates.resolve(
            gate.gate_id, GateResolution(decision="approve", by="alice")
        )
        with pytest.raises(GateAlreadyResolved, match="approve by alice"):
            await sup.gates.resolve(gate.gate_id, GateResolution(decision="reject"))
        result = await finish(handle)
    assert [r.outcome for r in result.replans] == [ReplanOutcome.APPLIED]


async def test_the_last_1024_gates_closed_are_told_resolved_to_a_late_answer() -> None:
    from datetime import UTC, datetime

    from replan.supervisor._gates import GateRegistry

    registry = GateRegistry()
    now = datetime.now(UTC)
    closed = 1025
    for i in range(closed):
        request = GateRequest(
            gate_id=f"r{i}-g1", run_id=f"r{i}", reason="?", created_at=now
        )
        registry.open(request)
        answer = GateResolution(decision="approve", by=f"p{i}")
        async with anyio.create_task_group() as tg:
            tg.start_soon(registry.answer_here, request.gate_id, answer)
            assert await registry.wait(request) == answer
            registry.close(request.gate_id)  # as the run does once journaled
    late = GateResolution(decision="reject", by="late")
    for i in range(1, closed):
        with pytest.raises(GateAlreadyResolved, match=rf"\(approve by p{i}\)$"):
            await registry.answer_here(f"r{i}-g1", late)
    # The oldest is forgotten: told no gate is open, not resolved.
    with pytest.raises(replan.GateError, match="no open gate") as oldest:
        await registry.answer_here("r0-g1", late)
    assert type(oldest.value) is replan.GateError


async def test_an_unanswered_gate_times_out_to_a_rejection_by_default() -> None:
    model = ScriptedModel(Script())
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec(limits=Limits(gate_timeout_s=0.05)))
        result = await finish(handle)
        events = await journal(handle)

    assert result.status is RunStatus.COMPLETED
    # No person rejected it: the label says who did.
    assert [r.outcome for r in result.replans] == [ReplanOutcome.REJECTED_BY_POLICY]
    assert result.replans[0].reason.startswith("rejected by policy:timeout")
    assert [v.version for v in result.versions] == [1]
    assert all(t.status is TaskStatus.COMPLETED for t in result.tasks)
    resolved = [e for e in events if isinstance(e, GateResolved)]
    assert len(resolved) == 1
    assert resolved[0].resolution.decision == "reject"
    assert resolved[0].resolution.by == "policy:timeout"


async def test_a_timeout_labelled_by_an_earlier_version_still_reads_back() -> None:
    model = ScriptedModel(Script())
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec(limits=Limits(gate_timeout_s=0.05)))
        await finish(handle)
        events = await journal(handle)
    # Written before rejected_by_policy existed: a timeout said "human".
    old = [
        EVENT_ADAPTER.validate_json(
            EVENT_ADAPTER.dump_json(e).replace(
                b'"rejected_by_policy"', b'"rejected_by_human"'
            )
        )
        for e in events
    ]
    [record] = replay(old).result().replans
    assert record.outcome is ReplanOutcome.REJECTED_BY_HUMAN
    assert record.reason.startswith("rejected by policy:timeout")


async def test_a_gate_policy_can_make_a_timeout_approve_the_replan() -> None:
    model = ScriptedModel(Script())
    spec = chain_spec(
        limits=Limits(gate_timeout_s=0.05),
        gate_policy=GatePolicy(on_timeout="approve"),
    )
    async with Supervisor(model) as sup:
        handle = await sup.submit(spec)
        result = await finish(handle)
        events = await journal(handle)

    assert result.status is RunStatus.COMPLETED
    assert [r.outcome for r in result.replans] == [ReplanOutcome.APPLIED]
    assert result.versions[-1].approved_by == "policy:timeout"
    assert keys_of(result, result.versions[-1].added) == ["x", "y"]
    resolved = [e for e in events if isinstance(e, GateResolved)]
    assert [e.resolution.by for e in resolved] == ["policy:timeout"]


async def test_a_run_waiting_at_a_gate_does_not_block_other_runs() -> None:
    model = ScriptedModel(Script())
    plain = [
        TaskDraft(key="p", description="plain step"),
        TaskDraft(key="q", description="next plain step", depends_on=["p"]),
    ]
    async with Supervisor(model) as sup:
        run_a = await sup.submit(chain_spec())
        gate = await next_gate(sup, run_a.run_id)
        run_b = await sup.submit(RunSpec(goal="something else", tasks=plain))
        result_b = await finish(run_b)

        assert result_b.status is RunStatus.COMPLETED
        assert run_a.status is RunStatus.WAITING_FOR_HUMAN
        assert [g.gate_id for g in sup.gates.pending()] == [gate.gate_id]

        await sup.gates.resolve(gate.gate_id, GateResolution(decision="approve"))
        result_a = await finish(run_a)

    assert result_a.status is RunStatus.COMPLETED
    assert result_a.replans_applied == 1


async def test_gate_on_can_make_a_contradiction_wait_for_a_person() -> None:
    model = ScriptedModel(Script(trigger=Trigger.CONTRADICTION))
    policy = GatePolicy(gate_on=frozenset({Trigger.CONTRADICTION}))
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec(gate_policy=policy))
        gate = await next_gate(sup)
        assert gate.trigger is Trigger.CONTRADICTION
        assert handle.status is RunStatus.WAITING_FOR_HUMAN
        assert len(handle.state.versions) == 1
        await sup.gates.resolve(
            gate.gate_id, GateResolution(decision="approve", by="dana")
        )
        result = await finish(handle)

    assert [r.outcome for r in result.replans] == [ReplanOutcome.APPLIED]
    assert result.versions[-1].trigger is Trigger.CONTRADICTION
    assert result.versions[-1].approved_by == "dana"


async def test_a_contradiction_applies_without_a_gate_by_default() -> None:
    model = ScriptedModel(Script(trigger=Trigger.CONTRADICTION))
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec())
        result = await finish(handle)
        events = await journal(handle)

    assert not any(isinstance(e, GateOpened) for e in events)
    assert [r.outcome for r in result.replans] == [ReplanOutcome.APPLIED]
    assert result.versions[-1].approved_by is None


async def test_an_empty_gate_on_lets_a_scope_shift_apply_without_a_gate() -> None:
    model = ScriptedModel(Script())
    policy = GatePolicy(gate_on=frozenset())
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec(gate_policy=policy))
        result = await finish(handle)
        events = await journal(handle)

    assert not any(isinstance(e, GateOpened) for e in events)
    assert result.status is RunStatus.COMPLETED
    assert [r.outcome for r in result.replans] == [ReplanOutcome.APPLIED]
    assert result.versions[-1].trigger is Trigger.SCOPE_SHIFT
    assert result.versions[-1].approved_by is None
    assert keys_of(result, result.versions[-1].added) == ["x", "y"]


# Approval gates for side effects --------------------------------------------

SIDE_EFFECTS = [
    TaskDraft(key="send", description="send the email", requires_approval=True),
    TaskDraft(key="draft", description="draft the report"),
    TaskDraft(key="log", description="log the sent email", depends_on=["send"]),
]


def executed(model: ScriptedModel, task_id: str) -> int:
    return sum(
        c.context["task"].id == task_id for c in model.calls_for("executor", "execute")
    )


async def wait_for_status(handle: RunHandle, task_id: str, status: TaskStatus) -> None:
    def reached() -> bool:
        task = handle.state.tasks.get(task_id)
        return task is not None and task.status is status

    await until(reached)


async def test_a_side_effect_task_waits_for_approval_while_independent_tasks_run() -> (
    None
):
    model = ScriptedModel(Script(trigger=None))
    async with Supervisor(model) as sup:
        handle = await sup.submit(RunSpec(goal="report by email", tasks=SIDE_EFFECTS))
        gate = await next_gate(sup)
        assert gate.task_id == "t1"
        assert gate.trigger is None
        assert gate.proposal is None
        assert handle.status is RunStatus.WAITING_FOR_HUMAN

        # The independent task runs to completion while the gate is open...
        await wait_for_status(handle, "t2", TaskStatus.COMPLETED)
        assert [g.gate_id for g in sup.gates.pending()] == [gate.gate_id]
        # ...but the side effect is never attempted before it is approved.
        assert executed(model, "t1") == 0
        assert handle.state.tasks["t1"].status is TaskStatus.PENDING
        assert handle.state.tasks["t3"].status is TaskStatus.PENDING

        await sup.gates.resolve(gate.gate_id, GateResolution(decision="approve"))
        result = await finish(handle)

    assert result.status is RunStatus.COMPLETED
    assert executed(model, "t1") == 1
    assert all(t.status is TaskStatus.COMPLETED for t in result.tasks)


async def test_a_run_reaching_a_limit_while_a_side_effect_awaits_approval_ends() -> (
    None
):
    # The approval's wait runs beside the driver: the run's end must not wait
    # for its answer.
    drafts = [
        TaskDraft(key="send", description="send the email", requires_approval=True),
        *(TaskDraft(key=f"d{i}", description=f"draft part {i}") for i in range(4)),
    ]
    model = ScriptedModel(
        Script(trigger=None), usage=replan.TokenUsage(output_tokens=10)
    )
    limits = Limits(token_budget=20, max_concurrency=1)
    async with Supervisor(model) as sup:
        handle = await sup.submit(RunSpec(goal="report", tasks=drafts, limits=limits))
        result = await finish(handle)
        assert sup.gates.pending() == []

    assert result.status is RunStatus.LIMIT_REACHED
    assert result.stop_reason is not None
    assert result.stop_reason.startswith("token_budget")
    assert executed(model, "t1") == 0
    [gate] = handle.state.gates.values()
    assert gate.request.task_id == "t1"
    assert gate.resolution is not None
    assert gate.resolution.by == "supervisor"


async def test_rejecting_a_side_effect_fails_the_task_and_skips_its_dependents() -> (
    None
):
    model = ScriptedModel(Script(trigger=None))
    async with Supervisor(model) as sup:
        handle = await sup.submit(RunSpec(goal="report by email", tasks=SIDE_EFFECTS))
        gate = await next_gate(sup)
        await sup.gates.resolve(
            gate.gate_id, GateResolution(decision="reject", by="erin")
        )
        result = await finish(handle)

    status = {t.id: t.status for t in result.tasks}
    assert status == {
        "t1": TaskStatus.FAILED,
        "t2": TaskStatus.COMPLETED,
        "t3": TaskStatus.SKIPPED,
    }
    assert executed(model, "t1") == 0
    assert executed(model, "t3") == 0
    failed = result.tasks[0].result
    assert failed is not None
    assert not failed.success
    assert "erin" in (failed.reason or "")


async def test_a_run_whose_only_task_is_rejected_aborts_like_a_failed_one() -> None:
    # Regression: a rejected side effect skipped the review, and the run
    # "completed" with a synthesis built from no results at all.
    model = ScriptedModel(Script(trigger=None))
    only = [TaskDraft(key="send", description="email it", requires_approval=True)]
    async with Supervisor(model) as sup:
        handle = await sup.submit(
            RunSpec(goal="send the report", pattern="contract", tasks=only)
        )
        gate = await next_gate(sup)
        await sup.gates.resolve(gate.gate_id, GateResolution(decision="reject"))
        result = await finish(handle)

    assert result.status is RunStatus.ABORTED
    assert "no task completed" in (result.stop_reason or "")
    assert result.output is None
    assert model.calls_for("executor", "synthesize") == []
    assert [t.status for t in result.tasks] == [TaskStatus.FAILED]


async def test_an_approval_gate_cannot_be_answered_with_an_edit() -> None:
    model = ScriptedModel(Script(trigger=None))
    async with Supervisor(model) as sup:
        handle = await sup.submit(RunSpec(goal="report by email", tasks=SIDE_EFFECTS))
        gate = await next_gate(sup)
        edit = GateResolution(
            decision="edit", tasks=[TaskDraft(key="z", description="something else")]
        )
        with anyio.fail_after(10), pytest.raises(replan.GateError):
            await sup.gates.resolve(gate.gate_id, edit)
        assert [g.gate_id for g in sup.gates.pending()] == [gate.gate_id]
        await sup.gates.resolve(gate.gate_id, GateResolution(decision="approve"))
        result = await finish(handle)
    assert all(t.status is TaskStatus.COMPLETED for t in result.tasks)


@pytest.mark.parametrize(
    ("on_timeout", "expected"),
    [
        ("reject", {"t1": TaskStatus.FAILED, "t3": TaskStatus.SKIPPED}),
        ("approve", {"t1": TaskStatus.COMPLETED, "t3": TaskStatus.COMPLETED}),
    ],
)
async def test_an_unanswered_approval_gate_applies_the_timeout_policy(
    on_timeout: Any, expected: dict[str, TaskStatus]
) -> None:
    model = ScriptedModel(Script(trigger=None))
    spec = RunSpec(
        goal="report by email",
        tasks=SIDE_EFFECTS,
        limits=Limits(gate_timeout_s=0.05),
        gate_policy=GatePolicy(on_timeout=on_timeout),
    )
    async with Supervisor(model) as sup:
        handle = await sup.submit(spec)
        result = await finish(handle)
        events = await journal(handle)

    status = {t.id: t.status for t in result.tasks}
    assert {k: status[k] for k in expected} == expected
    assert status["t2"] is TaskStatus.COMPLETED
    assert executed(model, "t1") == (1 if on_timeout == "approve" else 0)
    resolved = [e for e in events if isinstance(e, GateResolved)]
    assert [(e.resolution.decision, e.resolution.by) for e in resolved] == [
        (on_timeout, "policy:timeout")
    ]


# One gate worker, already waiting for a person at the first run's gate.
ONE_GATE_WORKER = {"human_gate": 1}
ONLY_SEND = [
    TaskDraft(key="send", description="send the email", requires_approval=True)
]


async def test_a_gate_queued_behind_busy_gate_workers_still_times_out() -> None:
    model = ScriptedModel(Script(trigger=None))
    async with Supervisor(model, workers=ONE_GATE_WORKER) as sup:
        first = await sup.submit(RunSpec(goal="email", tasks=ONLY_SEND))
        await next_gate(sup, first.run_id)
        second = await sup.submit(
            RunSpec(
                goal="email",
                tasks=ONLY_SEND,
                limits=Limits(gate_timeout_s=0.05),
                gate_policy=GatePolicy(on_timeout="approve"),
            )
        )
        result = await finish(second)
        events = await journal(second)
        assert first.status is RunStatus.WAITING_FOR_HUMAN
        await first.cancel()

    assert result.status is RunStatus.COMPLETED
    resolved = [e for e in events if isinstance(e, GateResolved)]
    assert [(e.resolution.decision, e.resolution.by) for e in resolved] == [
        ("approve", "policy:timeout")
    ]


async def test_a_gate_queued_behind_busy_gate_workers_can_be_answered() -> None:
    model = ScriptedModel(Script(trigger=None))
    async with Supervisor(model, workers=ONE_GATE_WORKER) as sup:
        first = await sup.submit(RunSpec(goal="email", tasks=ONLY_SEND))
        await next_gate(sup, first.run_id)
        second = await sup.submit(RunSpec(goal="email", tasks=ONLY_SEND))
        gate = await next_gate(sup, second.run_id)
        # (3 s, not 10: without the bug this returns at once.)
        with anyio.fail_after(3):
            await sup.gates.resolve(gate.gate_id, {"decision": "approve", "by": "ana"})
        result = await finish(second)
        # The worker is still the first run's, which waits on.
        assert first.status is RunStatus.WAITING_FOR_HUMAN
        [still] = sup.gates.pending()
        await sup.gates.resolve(still.gate_id, {"decision": "reject", "by": "ana"})
        rejected = await finish(first)

    assert result.status is RunStatus.COMPLETED
    assert result.tasks[0].status is TaskStatus.COMPLETED
    assert executed(model, "t1") == 1  # the second run's; the first's was refused
    assert rejected.tasks[0].status is TaskStatus.FAILED


def assert_closed_by_supervisor(
    handle: RunHandle, gate: GateRequest, status: str
) -> None:
    """Nothing waits on a run that ended: its state says the gate closed,
    rejected by the supervisor, and why."""
    assert handle.state.open_gates == []
    closed = handle.state.gates[gate.gate_id].resolution
    assert closed is not None
    assert (closed.decision, closed.by) == ("reject", "supervisor")
    assert closed.note == f"the run ended before the gate was answered ({status})"


async def test_cancelling_a_run_that_waits_at_a_gate_closes_the_gate() -> None:
    model = ScriptedModel(Script())
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec())
        gate = await next_gate(sup)
        with anyio.fail_after(10):
            await handle.cancel()
        result = await finish(handle)
        assert sup.gates.pending() == []
        with pytest.raises(replan.GateError):
            await sup.gates.resolve(gate.gate_id, GateResolution(decision="approve"))

    assert result.status is RunStatus.CANCELLED
    assert [v.version for v in result.versions] == [1]
    assert model.calls_for("executor", "synthesize") == []
    assert_closed_by_supervisor(handle, gate, "cancelled")


async def test_a_deadline_passing_while_a_gate_waits_closes_the_gate() -> None:
    model = ScriptedModel(Script())
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec(limits=Limits(deadline_s=0.5)))
        gate = await next_gate(sup)
        result = await finish(handle)
        assert sup.gates.pending() == []

    assert result.status is RunStatus.LIMIT_REACHED
    assert result.stop_reason == "deadline_s: 0.5s passed"
    assert [v.version for v in result.versions] == [1]
    assert model.calls_for("executor", "synthesize") == []
    assert_closed_by_supervisor(handle, gate, "limit_reached")


async def test_an_answer_to_a_gate_its_runs_end_closed_is_told_how_it_closed() -> None:
    # The gate exists, and its state says the run's end rejected it: a
    # person answering late is told that, not that there is no such gate.
    model = ScriptedModel(Script())
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec())
        gate = await next_gate(sup)
        with anyio.fail_after(10):
            await handle.cancel()
        with pytest.raises(GateAlreadyResolved) as raised:
            await sup.gates.resolve(
                gate.gate_id, GateResolution(decision="approve", by="ana")
            )
    assert str(raised.value) == (
        f"gate {gate.gate_id} is already resolved (reject by supervisor): "
        "the run ended before the gate was answered (cancelled)"
    )


async def test_a_gate_of_a_run_the_supervisor_let_go_of_is_not_told_resolved() -> None:
    # A stop leaves the run unfinished, its gate open in the journal: the
    # gate is answered after a resume, so nothing says it was resolved.
    store = MemoryStore()
    async with Supervisor(ScriptedModel(Script()), store) as sup:
        handle = await sup.submit(chain_spec())
        gate = await next_gate(sup)
        sup.stop()
    with pytest.raises(replan.GateError) as raised:
        await sup.gates.resolve(gate.gate_id, GateResolution(decision="approve"))
    assert not isinstance(raised.value, GateAlreadyResolved)
    # Nor that there is no such gate, as if its id were mistyped.
    assert str(raised.value) == (
        f"no open gate {gate.gate_id!r}: the supervisor stopped (a gate of a run "
        "it let go of unfinished is answered once a supervisor resumes the run)"
    )
    assert not handle.status.final


async def test_a_side_effect_left_unapproved_at_the_runs_end_stays_pending() -> None:
    # Its gate closes with the run, which neither runs nor fails the task.
    tasks = [TaskDraft(key="send", description="send", requires_approval=True)]
    store = MemoryStore()
    async with Supervisor(ScriptedModel(Script()), store) as sup:
        handle = await sup.submit(RunSpec(goal="email the report", tasks=tasks))
        await next_gate(sup)
        with anyio.fail_after(10):
            await handle.cancel()
        result = await finish(handle)
        replayed = await sup.replay(handle.run_id)
    [task] = result.tasks
    assert task.status is TaskStatus.PENDING
    assert handle.state.open_gates == []
    assert replayed == result


# Approval gates meeting replans ---------------------------------------------

# t1 is a milestone whose finding makes the reviewer replan; t2 is a side
# effect still waiting for approval when that replan supersedes it.
STALE = [
    TaskDraft(key="a", description="survey the field", milestone=True),
    TaskDraft(key="send", description="send the email", requires_approval=True),
    TaskDraft(key="c", description="check the survey", depends_on=["a"]),
]
NEW = [TaskDraft(key="n", description="a new step", depends_on=["t1"])]


async def test_a_run_does_not_wait_for_approval_of_a_superseded_side_effect() -> None:
    model = ScriptedModel(Script(trigger=Trigger.CONTRADICTION, revised=NEW))
    async with Supervisor(model) as sup:
        handle = await sup.submit(RunSpec(goal="survey", tasks=STALE))
        # Nobody answers the gate: the task it guards is no longer in the plan.
        # (3 s, not 10: without the bug the run takes milliseconds.)
        with anyio.fail_after(3):
            result = await handle.result()
        assert sup.gates.pending() == []

    assert result.status is RunStatus.COMPLETED
    status = {t.id: t.status for t in result.tasks}
    assert status["t2"] is TaskStatus.SUPERSEDED
    assert executed(model, "t2") == 0


class CompleteAtFirstMilestone(Script):
    """The reviewer ends the plan (``complete``) at the first milestone."""

    def __call__(self, request: ModelRequest) -> Any:
        if request.role == "reviewer":
            return Verdict(decision="complete", rationale="enough is known")
        return super().__call__(request)


async def test_a_complete_verdict_withdraws_the_approval_of_a_superseded_task() -> None:
    model = ScriptedModel(CompleteAtFirstMilestone())
    async with Supervisor(model) as sup:
        handle = await sup.submit(RunSpec(goal="survey", tasks=STALE))
        # Nobody answers the gate: `complete` superseded the task it guards.
        with anyio.fail_after(3):
            result = await handle.result()
        assert sup.gates.pending() == []

    assert result.status is RunStatus.COMPLETED
    status = {t.id: t.status for t in result.tasks}
    assert status["t2"] is TaskStatus.SUPERSEDED
    assert executed(model, "t2") == 0
    assert result.output == "done"


async def test_rejecting_a_superseded_side_effect_leaves_it_superseded() -> None:
    model = ScriptedModel(Script(trigger=Trigger.CONTRADICTION, revised=NEW))
    async with Supervisor(model) as sup:
        handle = await sup.submit(RunSpec(goal="survey", tasks=STALE))
        await wait_for_status(handle, "t2", TaskStatus.SUPERSEDED)
        await wait_for_status(handle, "t4", TaskStatus.COMPLETED)
        for gate in sup.gates.pending(handle.run_id):
            with anyio.fail_after(10):
                await sup.gates.resolve(gate.gate_id, GateResolution(decision="reject"))
        result = await finish(handle)

    status = {t.id: t.status for t in result.tasks}
    # A terminal status is never left: superseded stays superseded.
    assert status["t2"] is TaskStatus.SUPERSEDED
    assert result.status is RunStatus.COMPLETED


async def test_approving_a_side_effect_returns_while_the_run_waits_at_its_replan() -> (
    None
):
    model = ScriptedModel(Script(trigger=Trigger.SCOPE_SHIFT, revised=NEW))
    async with Supervisor(model) as sup:
        handle = await sup.submit(RunSpec(goal="survey", tasks=STALE))
        await until(lambda: len(sup.gates.pending()) == 2)
        approval, scope = sup.gates.pending()
        assert approval.task_id == "t2"
        assert scope.trigger is Trigger.SCOPE_SHIFT
        # One person answers the gates one at a time, oldest first.
        # (3 s, not 10: without the bug this returns at once.)
        with anyio.fail_after(3):
            await sup.gates.resolve(
                approval.gate_id, GateResolution(decision="approve")
            )
        assert handle.state.tasks["t2"].approved
        await sup.gates.resolve(scope.gate_id, GateResolution(decision="reject"))
        result = await finish(handle)

    assert result.status is RunStatus.COMPLETED
    assert executed(model, "t2") == 1


class SlowStore(DelegatingStore):
    """A MemoryStore whose appends take a while, as a disk's do."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())

    async def append(
        self, run_id: str, events: Sequence[replan.Event], summary: RunSummary
    ) -> None:
        await anyio.sleep(0.02)
        await self.inner.append(run_id, events, summary)


async def test_a_gate_is_listed_only_once_its_opening_is_journaled() -> None:
    model = ScriptedModel(Script())
    store = SlowStore()
    async with Supervisor(model, store) as sup:
        handle = await sup.submit(chain_spec())
        with anyio.fail_after(10):
            while not (pending := sup.gates.pending()):
                await anyio.lowlevel.checkpoint()
        # The moment a person can see the gate, the run waits for them and
        # the journal knows why: a crash now must not lose the gate.
        status = handle.status
        journaled = [e.kind for e in await store.read(handle.run_id)]
        await sup.gates.resolve(pending[0].gate_id, GateResolution(decision="reject"))
        await finish(handle)

    assert status is RunStatus.WAITING_FOR_HUMAN
    assert "gate_opened" in journaled


# Answers the gate refuses, and answers at once ------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"decision": "approve", "by": "\udfff"}, "by"),
        ({"decision": "reject", "note": "why \ud800 not"}, "note"),
        (
            {
                "decision": "edit",
                "tasks": [TaskDraft(key="e", description="d", depends_on=["\udc00"])],
            },
            "tasks.0.depends_on.0",
        ),
    ],
    ids=["by", "note", "task"],
)
async def test_an_answer_the_journal_cannot_store_is_refused_and_the_gate_stays_open(
    fields: dict[str, Any], field: str
) -> None:
    # A lone UTF-16 surrogate: JSON can carry it, no UTF-8 journal can store it.
    model = ScriptedModel(Script())
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec())
        gate = await next_gate(sup)
        with anyio.fail_after(10), pytest.raises(ResolutionRefused) as refused:
            await sup.gates.resolve(gate.gate_id, GateResolution(**fields))
        assert refused.value.field == field
        assert "surrogate" in str(refused.value)
        assert isinstance(refused.value, replan.GateError)
        assert [g.gate_id for g in sup.gates.pending()] == [gate.gate_id]
        assert handle.status is RunStatus.WAITING_FOR_HUMAN

        await sup.gates.resolve(gate.gate_id, GateResolution(decision="approve"))
        result = await finish(handle)
    assert result.status is RunStatus.COMPLETED


async def test_of_two_answers_at_once_the_second_finds_the_gate_already_resolved() -> (
    None
):
    model = ScriptedModel(Script())
    outcomes: dict[str, BaseException | None] = {}

    async def answer(by: str) -> None:
        resolution = GateResolution(decision="approve", by=by)
        try:
            await sup.gates.resolve(gate.gate_id, resolution)
        except replan.GateError as exc:
            outcomes[by] = exc
        else:
            outcomes[by] = None

    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec())
        gate = await next_gate(sup)
        # Both start before the run journals the first answer.
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(answer, "alice")
                tg.start_soon(answer, "bob")
        result = await finish(handle)

    winners = [by for by, error in outcomes.items() if error is None]
    losers = [error for error in outcomes.values() if error is not None]
    assert len(winners) == 1
    assert len(losers) == 1
    assert isinstance(losers[0], GateAlreadyResolved)
    # The loser is told which answer stands, as a late answer is.
    assert f"(approve by {winners[0]})" in str(losers[0])
    assert result.versions[-1].approved_by == winners[0]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"decision": "edit", "hypotheses": [Hypothesis(statement="x")]}, "hypotheses"),
        (
            {
                "decision": "edit",
                "tasks": [TaskDraft(key="e", description="d", depends_on=["ghost"])],
            },
            "tasks",
        ),
    ],
    ids=["hypotheses", "tasks"],
)
async def test_an_edit_a_replan_gate_refuses_names_the_field_it_refuses(
    fields: dict[str, Any], field: str
) -> None:
    model = ScriptedModel(Script())
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec())
        gate = await next_gate(sup)
        with anyio.fail_after(10), pytest.raises(ResolutionRefused) as refused:
            await sup.gates.resolve(gate.gate_id, GateResolution(**fields))
        assert refused.value.field == field
        await sup.gates.resolve(gate.gate_id, GateResolution(decision="approve"))
        await finish(handle)


@pytest.mark.parametrize("by", ["", "  ", "\u200b", "\t\u2060"])
async def test_an_answer_that_names_no_one_is_refused_and_the_gate_stays_open(
    by: str,
) -> None:
    # The journal keeps who decided each gate: an answer must say who.
    model = ScriptedModel(Script())
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec())
        gate = await next_gate(sup)
        with anyio.fail_after(10), pytest.raises(ResolutionRefused) as refused:
            await sup.gates.resolve(gate.gate_id, {"decision": "approve", "by": by})
        assert refused.value.field == "by"
        assert [g.gate_id for g in sup.gates.pending()] == [gate.gate_id]
        await sup.gates.resolve(gate.gate_id, {"decision": "approve", "by": "al"})
        result = await finish(handle)
    assert result.versions[-1].approved_by == "al"


async def test_an_edit_with_a_blank_task_is_refused_and_the_gate_stays_open() -> None:
    # A task with a blank description is nothing the executor can do.
    model = ScriptedModel(Script())
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec())
        gate = await next_gate(sup)
        edit = {
            "decision": "edit",
            "by": "al",
            "tasks": [{"key": "e", "description": " "}],
        }
        with anyio.fail_after(10), pytest.raises(ResolutionRefused) as refused:
            await sup.gates.resolve(gate.gate_id, edit)
        assert refused.value.field == "tasks.0.description"
        assert "must not be blank" in str(refused.value)
        assert [g.gate_id for g in sup.gates.pending()] == [gate.gate_id]
        await sup.gates.resolve(gate.gate_id, {"decision": "approve", "by": "al"})
        result = await finish(handle)
    assert result.status is RunStatus.COMPLETED


async def test_an_edit_at_an_approval_gate_names_the_decision() -> None:
    model = ScriptedModel(Script(trigger=None))
    async with Supervisor(model) as sup:
        handle = await sup.submit(RunSpec(goal="report by email", tasks=SIDE_EFFECTS))
        gate = await next_gate(sup)
        edit = GateResolution(
            decision="edit", tasks=[TaskDraft(key="z", description="z")]
        )
        with anyio.fail_after(10), pytest.raises(ResolutionRefused) as refused:
            await sup.gates.resolve(gate.gate_id, edit)
        assert refused.value.field == "decision"
        await sup.gates.resolve(gate.gate_id, GateResolution(decision="approve"))
        await finish(handle)


async def test_an_answer_may_be_given_as_a_mapping_of_its_fields() -> None:
    model = ScriptedModel(Script())
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec())
        gate = await next_gate(sup)
        with anyio.fail_after(10):
            await sup.gates.resolve(gate.gate_id, {"decision": "approve", "by": "al"})
        result = await finish(handle)
    assert result.status is RunStatus.COMPLETED
    assert result.versions[-1].approved_by == "al"


@pytest.mark.parametrize(
    ("answer", "field", "problem"),
    [
        ("approve", "resolution", "expected a GateResolution or a mapping"),
        ({"decision": "maybe"}, "decision", "Input should be"),
        ({"decision": "approve", "shout": 1}, "shout", "Extra inputs"),
    ],
    ids=["a string", "a bad decision", "an unknown field"],
)
async def test_an_answer_that_is_no_resolution_is_refused_naming_the_field(
    answer: object, field: str, problem: str
) -> None:
    model = ScriptedModel(Script())
    async with Supervisor(model) as sup:
        handle = await sup.submit(chain_spec())
        gate = await next_gate(sup)
        with anyio.fail_after(10), pytest.raises(ResolutionRefused) as refused:
            await sup.gates.resolve(gate.gate_id, answer)  # type: ignore[arg-type]
        assert (refused.value.field, problem in str(refused.value)) == (field, True)
        assert [g.gate_id for g in sup.gates.pending()] == [gate.gate_id]
        await sup.gates.resolve(gate.gate_id, GateResolution(decision="reject"))
        await finish(handle)


async def test_a_gate_closed_before_a_gate_worker_takes_it_crashes_no_worker() -> None:
    # The run took the answer (or ended) while the gate's request still sat in
    # the human gate role's mailbox: the worker that takes it late answers a
    # rejection on the supervisor's behalf and keeps serving. A crash here
    # counted toward the role's restart limit: enough such races stopped the
    # role, and every run waiting at a gate failed with it.
    from datetime import UTC, datetime

    from replan.actors import ActorPool
    from replan.actors._human_gate import HumanGate
    from replan.supervisor._gates import GATE_CLOSED, GateRegistry

    registry = GateRegistry()
    request = GateRequest(
        gate_id="run-g1",
        run_id="run",
        reason="approve the change",
        created_at=datetime.now(UTC),
    )
    registry.open(request)
    registry.close(request.gate_id)
    pool: ActorPool[GateRequest, GateResolution] = ActorPool(
        "human_gate", lambda: HumanGate(registry), workers=1, max_restarts=0
    )
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            answer = await pool.ask(request, run_id="run")
            assert (answer.decision, answer.by, answer.note) == (
                "reject",
                "supervisor",
                GATE_CLOSED,
            )
            stats = pool.statistics()
            assert (stats.restarts, stats.stop_reason) == (0, None)
            tg.cancel_scope.cancel()


def test_closing_a_run_s_gates_does_not_look_through_every_other_run_s() -> None:
    # Each run's end (and a stop, for every run) closed its gates by looking
    # through all open gates: a daemon stopping with thousands of runs at
    # their gates took seconds per thousand, growing with the square.
    import time
    from datetime import UTC, datetime

    from replan.supervisor._gates import GateRegistry

    registry = GateRegistry()
    runs = 10_000
    now = datetime.now(UTC)
    for i in range(runs):
        registry.open(
            GateRequest(gate_id=f"r{i}-g1", run_id=f"r{i}", reason="?", created_at=now)
        )
    registry.open(GateRequest(gate_id="r0-g2", run_id="r0", reason="?", created_at=now))
    assert [g.gate_id for g in registry.pending("r0")] == ["r0-g1", "r0-g2"]
    started = time.perf_counter()
    for i in range(runs - 1):
        registry.close_run(f"r{i}", "the run ended")
    took = time.perf_counter() - started
    assert [g.gate_id for g in registry.pending()] == [f"r{runs - 1}-g1"]
    assert registry.pending("r0") == []
    assert took < 2.0, f"closing {runs} runs' gates took {took:.1f} s"
