"""The public API: embedding, event streams, cancellation, errors."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from scripts import DelegatingStore

import replan
from replan import (
    ConfigurationError,
    ExploreSettings,
    JournalUnavailable,
    Limits,
    MemoryStore,
    ModelRequest,
    PlanProposal,
    RunHandle,
    RunSpec,
    RunStatus,
    ScriptedModel,
    Supervisor,
    SupervisorError,
    Synthesis,
    TaskDraft,
    TaskOutcome,
    TaskStatus,
    UnknownRunError,
)
from replan.messages import (
    MAX_METADATA_DEPTH,
    Event,
    RunFinished,
    RunSubmitted,
    TaskFinished,
)
from replan.store import RunSummary, SQLiteStore

PLAN = [
    TaskDraft(key="a", description="first step"),
    TaskDraft(key="b", description="second step", depends_on=["a"]),
    TaskDraft(key="c", description="third step", depends_on=["b"]),
]


def answers(
    execute: Callable[[ModelRequest], Awaitable[TaskOutcome]] | None = None,
) -> Callable[[ModelRequest], Awaitable[Any]]:
    """A model that plans PLAN, runs every task cleanly and synthesizes."""

    async def handler(request: ModelRequest) -> Any:
        match (request.role, request.purpose):
            case ("planner", "plan"):
                return PlanProposal(tasks=PLAN, rationale="three steps")
            case ("executor", "execute"):
                if execute is not None:
                    return await execute(request)
                return TaskOutcome(success=True, summary="ok")
            case ("executor", "synthesize"):
                return Synthesis(output="all done")
        raise AssertionError(f"unexpected request {request.role}/{request.purpose}")

    return handler


async def until(predicate: Callable[[], object], seconds: float = 10) -> None:
    """Poll ``predicate`` until it holds (the run gives no event to wait on)."""
    with anyio.fail_after(seconds):
        while True:
            if predicate():
                return
            await anyio.sleep(0.005)


class Blocker:
    """An executor that blocks until released (or forever), and reports
    when its handler starts and when its ``finally`` runs."""

    def __init__(self, *, forever: bool = False) -> None:
        self.forever = forever
        self.release = anyio.Event()
        self.started = 0
        self.cleaned_up = 0

    async def __call__(self, request: ModelRequest) -> TaskOutcome:
        self.started += 1
        try:
            if self.forever:
                await anyio.sleep_forever()
            await self.release.wait()
            return TaskOutcome(success=True, summary="ok")
        finally:
            self.cleaned_up += 1

    async def wait_started(self) -> None:
        await until(lambda: self.started)


async def finish(handle: RunHandle) -> replan.RunResult:
    with anyio.fail_after(10):
        return await handle.result()


async def collect(handle: RunHandle) -> list[replan.Event]:
    with anyio.fail_after(10):
        return [event async for event in handle.events()]


def seqs(events: list[replan.Event]) -> list[int]:
    return [e.seq for e in events]


# Embedding ------------------------------------------------------------------


async def test_async_with_supervisor_runs_a_plan_to_completion() -> None:
    model = ScriptedModel(answers())
    async with Supervisor(model) as sup:
        handle = await sup.submit(RunSpec(goal="three steps"))
        result = await finish(handle)

    assert result.status is RunStatus.COMPLETED
    assert result.output == "all done"
    assert [t.key for t in result.tasks] == ["a", "b", "c"]
    assert all(t.status is TaskStatus.COMPLETED for t in result.tasks)
    assert handle.status is RunStatus.COMPLETED


async def test_serve_in_an_application_task_group_runs_a_plan_to_completion() -> None:
    model = ScriptedModel(answers())
    sup = Supervisor(model)
    async with anyio.create_task_group() as tg:
        await tg.start(sup.serve)
        handle = await sup.submit(RunSpec(goal="three steps"))
        result = await finish(handle)
        tg.cancel_scope.cancel()

    assert result.status is RunStatus.COMPLETED
    assert result.output == "all done"
    with pytest.raises(SupervisorError):
        await sup.submit(RunSpec(goal="too late"))


# Event streams --------------------------------------------------------------


async def test_a_late_subscriber_gets_the_whole_history_from_seq_1() -> None:
    model = ScriptedModel(answers())
    async with Supervisor(model) as sup:
        handle = await sup.submit(RunSpec(goal="three steps"))
        await finish(handle)
        events = await collect(handle)
        journaled = await sup.store.read(handle.run_id)

    assert seqs(events) == list(range(1, len(events) + 1))
    assert events[0].kind == "run_submitted"
    assert isinstance(events[-1], RunFinished)
    assert events[-1].status is RunStatus.COMPLETED
    assert events == journaled
    assert len(events) == handle.state.seq


async def test_events_after_a_seq_start_right_after_it() -> None:
    model = ScriptedModel(answers())
    async with Supervisor(model) as sup:
        handle = await sup.submit(RunSpec(goal="three steps"))
        await finish(handle)
        with anyio.fail_after(10):
            tail = [event async for event in handle.events(after=3)]
        everything = await collect(handle)

    assert seqs(tail) == list(range(4, len(everything) + 1))
    assert tail == everything[3:]


class ReadCountingStore(DelegatingStore):
    """Counts the reads of the journal."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())
        self.reads = 0

    async def read(self, run_id: str, after: int = 0) -> list[Event]:
        self.reads += 1
        return await super().read(run_id, after)


@pytest.mark.parametrize("after", ["3", None, 1.5, True, float("nan"), -1, [3]])
async def test_events_after_a_wrong_seq_name_after_before_reading(after: Any) -> None:
    # A bare TypeError from deep inside ('<' not supported between 'str'
    # and 'int'), at the first read; 1.5 read from 1.5 on SQLite.
    store = ReadCountingStore()
    async with Supervisor(ScriptedModel(answers()), store) as sup:
        handle = await sup.submit(RunSpec(goal="three steps"))
        await finish(handle)
        store.reads = 0
        with pytest.raises(ConfigurationError) as caught:
            handle.events(after=after)
    assert caught.value.field == "after"
    if after == "3":
        assert str(caught.value) == "after: a whole number from 0 expected, not '3'"
    assert store.reads == 0


async def refused_field(call: Callable[[], object]) -> str:
    """The field the ConfigurationError of ``call()`` (awaited) names."""
    try:
        answer = call()
        if isinstance(answer, Awaitable):
            await answer
    except ConfigurationError as exc:
        return exc.field
    raise AssertionError("not refused")


@pytest.mark.parametrize("run_id", [None, 3, b"r", ["r"]])
async def test_a_run_id_that_is_no_string_is_named_by_every_method(
    run_id: Any,
) -> None:
    # A bare TypeError ('unhashable type: list'), an AttributeError from the
    # gate id's parsing, a driver's error binding it, or for None and 3
    # "unknown run", as if a run could have such an id.
    store = ReadCountingStore()
    async with Supervisor(ScriptedModel(answers()), store) as sup:
        by_run: list[Callable[[], object]] = [
            lambda: sup.resume(run_id),
            lambda: sup.replay(run_id),
            lambda: sup.cancel(run_id),
            lambda: sup.get(run_id),
            lambda: sup.forget(run_id),
            lambda: sup.drives(run_id),
        ]
        if run_id is not None:  # None: a new id, every run's gates
            by_run.append(lambda: sup.submit(RunSpec(goal="g"), run_id=run_id))
            by_run.append(lambda: sup.gates.pending(run_id))
        by_gate: list[Callable[[], object]] = [
            lambda: sup.gates.get(run_id),
            lambda: sup.gates.resolve(run_id, {"decision": "approve", "by": "a"}),
        ]
        fields = [await refused_field(call) for call in [*by_run, *by_gate]]
        assert fields == ["run_id"] * len(by_run) + ["gate_id"] * len(by_gate)
        assert store.reads == 0
        assert await store.list_runs() == []


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_events_of_a_run_deleted_meanwhile_end_instead_of_spinning(
    kind: str, tmp_path: Path
) -> None:
    store = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "j.db")
    async with store, Supervisor(ScriptedModel(answers()), store) as sup:
        handle = await sup.submit(RunSpec(goal="three steps"))
        await finish(handle)
        stream = handle.events()
        await store.delete_run(handle.run_id)  # retention, before the reader
        with anyio.fail_after(5):
            events = [event async for event in stream]
    assert events == []


async def test_a_mid_run_subscriber_gets_history_then_live_events_without_gaps() -> (
    None
):
    blocker = Blocker()
    model = ScriptedModel(answers(blocker))
    async with Supervisor(model) as sup:
        handle = await sup.submit(RunSpec(goal="three steps"))
        await blocker.wait_started()
        seen: list[replan.Event] = []
        at_subscription = handle.state.seq
        assert at_subscription >= 2

        async def subscribe() -> None:
            async for event in handle.events():
                seen.append(event)  # noqa: PERF401 (the test watches it grow)

        async with anyio.create_task_group() as tg:
            tg.start_soon(subscribe)
            await until(lambda: len(seen) >= at_subscription)
            # History first, up to where the run was when we subscribed.
            assert seqs(seen) == list(range(1, at_subscription + 1))
            blocker.release.set()
            with anyio.fail_after(10):
                result = await handle.result()
        # The subscriber's loop ended on its own after run_finished.
        journaled = await sup.store.read(handle.run_id)

    assert result.status is RunStatus.COMPLETED
    assert seqs(seen) == list(range(1, len(seen) + 1))
    assert len(seen) > at_subscription
    assert isinstance(seen[-1], RunFinished)
    assert seen == journaled


async def test_two_concurrent_subscribers_see_identical_sequences() -> None:
    blocker = Blocker()
    model = ScriptedModel(answers(blocker))
    async with Supervisor(model) as sup:
        handle = await sup.submit(RunSpec(goal="three steps"))
        streams: dict[str, list[replan.Event]] = {"one": [], "two": []}

        async def subscribe(name: str, after_seq: int) -> None:
            await until(lambda: handle.state.seq >= after_seq)
            async for event in handle.events():
                streams[name].append(event)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(subscribe, "one", 1)
                tg.start_soon(subscribe, "two", 3)
                await blocker.wait_started()
                await anyio.sleep(0.02)
                blocker.release.set()

    one, two = streams["one"], streams["two"]
    assert one == two
    assert seqs(one) == list(range(1, len(one) + 1))
    assert isinstance(one[-1], RunFinished)


# Cancellation and shutdown -------------------------------------------------


async def test_cancelling_a_run_ends_it_cancelled_and_cancels_its_blocked_task() -> (
    None
):
    blocker = Blocker(forever=True)
    model = ScriptedModel(answers(blocker))
    async with Supervisor(model) as sup:
        handle = await sup.submit(RunSpec(goal="three steps"))
        await blocker.wait_started()
        with anyio.fail_after(2):
            await handle.cancel()
        assert handle.status is RunStatus.CANCELLED
        result = await finish(handle)
        # The handler saw the cancellation: its finally ran.
        await until(lambda: blocker.cleaned_up, seconds=2)
        events = await collect(handle)

    assert result.status is RunStatus.CANCELLED
    assert result.stop_reason
    assert result.output is None
    assert blocker.started == 1
    assert isinstance(events[-1], RunFinished)
    assert events[-1].status is RunStatus.CANCELLED
    assert model.calls_for("executor", "synthesize") == []


async def test_cancelling_a_finished_run_changes_nothing() -> None:
    model = ScriptedModel(answers())
    async with Supervisor(model) as sup:
        handle = await sup.submit(RunSpec(goal="three steps"))
        result = await finish(handle)
        with anyio.fail_after(2):
            await handle.cancel()
        assert await finish(handle) == result
        events = await collect(handle)

    assert result.status is RunStatus.COMPLETED
    assert sum(isinstance(e, RunFinished) for e in events) == 1


async def test_leaving_the_supervisor_with_a_run_in_flight_fails_its_result() -> None:
    blocker = Blocker(forever=True)
    model = ScriptedModel(answers(blocker))
    async with Supervisor(model) as sup:
        handle = await sup.submit(RunSpec(goal="three steps"))
        await blocker.wait_started()

    # Nothing is left running: the blocked handler was cancelled on exit.
    assert blocker.cleaned_up == 1
    with anyio.fail_after(2), pytest.raises(SupervisorError):
        await handle.result()
    # The journal keeps the run, unfinished, to be resumed from.
    events = await sup.store.read(handle.run_id)
    assert events
    assert not any(isinstance(e, RunFinished) for e in events)


async def test_submitting_after_the_supervisor_exited_raises_supervisor_error() -> None:
    model = ScriptedModel(answers())
    async with Supervisor(model) as sup:
        pass
    with pytest.raises(SupervisorError):
        await sup.submit(RunSpec(goal="too late"))
    assert model.calls == []


async def test_an_error_in_the_async_with_body_comes_out_as_it_was_raised() -> None:
    """Not wrapped in an ExceptionGroup by the supervisor's own task group."""
    model = ScriptedModel(answers())
    with pytest.raises(ConfigurationError) as caught:
        async with Supervisor(model) as sup:
            await sup.submit({"goal": "g", "limits": {"max_replans": -1}})
    assert caught.value.field == "limits.max_replans"

    class Mine(Exception):
        pass

    async def body() -> RunHandle:
        async with Supervisor(model) as sup:
            handle = await sup.submit(RunSpec(goal="three steps"))
            raise Mine(handle)

    with pytest.raises(Mine) as raised:
        await body()
    (handle,) = raised.value.args
    # The run in flight was stopped with the supervisor, not left running.
    with anyio.fail_after(2), pytest.raises(SupervisorError):
        await handle.result()


class Unlistable(DelegatingStore):
    """A journal that cannot list its runs (a failing disk)."""

    async def list_runs(self, **options: Any) -> list[RunSummary]:
        raise OSError(5, "Input/output error")


async def test_a_journal_failing_as_runs_resume_on_start_comes_out_as_raised() -> None:
    # Not wrapped in one ExceptionGroup per task group it passed through.
    model = ScriptedModel(answers())
    store = Unlistable(MemoryStore())
    with pytest.raises(OSError, match="Input/output error"):
        async with Supervisor(model, store, resume=True):
            pass
    sup = Supervisor(model, store, resume=True)
    async with anyio.create_task_group() as tg:
        with pytest.raises(OSError, match="Input/output error"):
            await tg.start(sup.serve)
    assert all(pool.stopped for pool in sup.pool_statistics())
    # Nothing was left holding the journal: another supervisor serves on it.
    async with Supervisor(model, store) as other:
        result = await finish(await other.submit(RunSpec(goal="g")))
    assert result.status is RunStatus.COMPLETED


class FullOnce(DelegatingStore):
    """A journal whose next append fails as on a full disk, then has room."""

    full = True

    async def append(
        self, run_id: str, events: Sequence[Event], summary: RunSummary
    ) -> None:
        if self.full:
            self.full = False
            raise OSError(28, "No space left on device")
        await self.inner.append(run_id, events, summary)


async def test_a_run_the_journal_refuses_to_take_is_refused_naming_its_id() -> None:
    store = FullOnce(MemoryStore())
    async with Supervisor(ScriptedModel(answers()), store) as sup:
        with pytest.raises(JournalUnavailable, match="No space left") as refused:
            await sup.submit(RunSpec(goal="g"))
        run_id = refused.value.run_id
        assert f"run {run_id} was not started" in str(refused.value)
        assert not sup.drives(run_id)
        assert await store.get_run(run_id) is None
        # The supervisor serves on: the next run, once there is room, runs.
        result = await finish(await sup.submit(RunSpec(goal="g")))
    assert result.status is RunStatus.COMPLETED


async def test_a_stopped_supervisor_says_it_does_not_serve_again() -> None:
    sup = Supervisor(ScriptedModel(answers()))
    async with sup:
        pass
    with pytest.raises(SupervisorError, match="has stopped"):
        async with sup:
            pass


async def test_a_role_crashing_past_its_restart_intensity_fails_the_run() -> None:
    def crash(request: ModelRequest) -> Any:
        raise RuntimeError("the planner fell over")

    model = ScriptedModel(crash)
    spec = RunSpec(goal="three steps", limits=Limits(max_task_attempts=5))
    async with Supervisor(model, max_restarts=1, restart_period_s=60) as sup:
        handle = await sup.submit(spec)
        result = await finish(handle)

    assert result.status is RunStatus.FAILED
    assert "planner" in (result.stop_reason or "")
    # One crash is survived (a restart); the second stops the role for good.
    assert len(model.calls_for("planner", "plan")) == 2
    assert result.tasks == []


# Configuration errors -------------------------------------------------------


def test_a_negative_max_replans_names_the_field() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Limits(max_replans=-1)
    assert caught.value.field == "max_replans"
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_deadline_that_is_not_finite_names_the_field(value: float) -> None:
    # NaN passes no bound check: without the finiteness rule it would slip
    # through as "no deadline" or overflow a date later.
    with pytest.raises(ConfigurationError) as caught:
        Limits(deadline_s=value)
    assert caught.value.field == "deadline_s"
    assert "finite" in caught.value.problem


def test_reading_a_spec_from_a_dict_or_json_names_the_field() -> None:
    with pytest.raises(ConfigurationError) as caught:
        RunSpec.model_validate_json('{"goal": "g", "limits": {"max_replans": -1}}')
    assert caught.value.field == "limits.max_replans"
    with pytest.raises(ConfigurationError) as caught:
        Limits.model_validate({"max_concurrency": 0})
    assert caught.value.field == "max_concurrency"
    assert RunSpec.model_validate_json('{"goal": "g"}').goal == "g"


def test_an_empty_goal_names_the_field() -> None:
    with pytest.raises(ConfigurationError) as caught:
        RunSpec(goal="")
    assert caught.value.field == "goal"


def test_a_blank_goal_names_the_field() -> None:
    with pytest.raises(ConfigurationError) as caught:
        RunSpec(goal="   ")
    assert caught.value.field == "goal"


def test_a_bad_nested_limit_names_the_dotted_field() -> None:
    with pytest.raises(ConfigurationError) as caught:
        RunSpec(goal="g", limits={"max_concurrency": 0})  # type: ignore[arg-type]
    assert caught.value.field == "limits.max_concurrency"


def test_a_dependency_cycle_in_the_tasks_names_the_tasks_field() -> None:
    cycle = [
        TaskDraft(key="a", description="a", depends_on=["b"]),
        TaskDraft(key="b", description="b", depends_on=["a"]),
    ]
    with pytest.raises(ConfigurationError) as caught:
        RunSpec(goal="g", tasks=cycle)
    assert caught.value.field == "tasks"


def test_a_worker_pool_of_size_zero_is_a_configuration_error() -> None:
    model = ScriptedModel(answers())
    with pytest.raises(ConfigurationError) as caught:
        Supervisor(model, workers={"executor": 0})
    assert caught.value.field == "workers.executor"


def _search(query: str) -> str:
    """Search the web."""
    return query


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"workers": {"executor": True}}, "workers.executor"),
        ({"workers": {"planner": 1.5}}, "workers.planner"),
        ({"workers": {"executor": float("nan")}}, "workers.executor"),
        ({"workers": {"planner": "two"}}, "workers.planner"),
        ({"workers": {"chef": 2}}, "workers.chef"),
        ({"workers": [("planner", 1)]}, "workers"),
        ({"mailbox_size": 2.5}, "mailbox_size"),
        ({"mailbox_size": float("nan")}, "mailbox_size"),
        ({"mailbox_size": False}, "mailbox_size"),
        ({"max_restarts": float("nan")}, "max_restarts"),
        ({"restart_period_s": float("nan")}, "restart_period_s"),
        ({"restart_period_s": float("inf")}, "restart_period_s"),
        ({"keep_finished": True}, "keep_finished"),
        ({"keep_finished": float("nan")}, "keep_finished"),
        ({"executor_temperature": float("nan")}, "executor_temperature"),
        ({"executor_temperature": -5}, "executor_temperature"),
        ({"evolver_temperature": 2.5}, "evolver_temperature"),
        ({"max_restarts": 1.5}, "max_restarts"),
        ({"evolver_temperature": "hot"}, "evolver_temperature"),
        # Any truthy value would resume every unfinished run.
        ({"resume": "false"}, "resume"),
        ({"resume": 1}, "resume"),
        ({"tools": _search}, "tools"),
        ({"tools": "search"}, "tools"),
        ({"tools": 42}, "tools"),
    ],
)
def test_a_bad_supervisor_argument_names_itself(
    arguments: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Supervisor(ScriptedModel(answers()), **arguments)
    assert caught.value.field == field


def test_one_tool_given_for_a_list_says_how_to_pass_it() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Supervisor(ScriptedModel(answers()), tools=_search)  # type: ignore[arg-type]
    assert caught.value.problem == "expected a list of tools, got one: pass tools=[...]"


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"model": None}, "model"),
        ({"model": answers()}, "model"),  # a handler, not a model around it
        ({"model": ScriptedModel}, "model"),  # the class, not a model
        ({"store": "runs.db"}, "store"),
        ({"task_runner": "run_it"}, "task_runner"),
    ],
    ids=[
        "no-model",
        "bare-handler",
        "model-class",
        "store-path",
        "runner-not-callable",
    ],
)
def test_a_supervisor_argument_of_the_wrong_kind_names_itself(
    arguments: dict[str, Any], field: str
) -> None:
    # Refused here, not as an AttributeError once a run is submitted.
    arguments.setdefault("model", ScriptedModel(answers()))
    with pytest.raises(ConfigurationError) as caught:
        Supervisor(**arguments)
    assert caught.value.field == field


async def test_a_journal_opened_read_only_is_refused_as_a_supervisor_store(
    tmp_path: Path,
) -> None:
    # Refused here, not as a PermissionError from the first submit().
    path = tmp_path / "runs.db"
    async with SQLiteStore(path):
        pass
    async with SQLiteStore(path, read_only=True) as store:
        for resume in (False, True):
            with pytest.raises(ConfigurationError) as caught:
                Supervisor(ScriptedModel(answers()), store, resume=resume)
            assert caught.value.field == "store"
            assert "read-only" in caught.value.problem


async def test_a_closed_store_is_refused_as_a_supervisor_store(tmp_path: Path) -> None:
    # It was refused only by the first submit(), as a journal failure whose
    # cause read "ClosedResourceError: ".
    sqlite = SQLiteStore(tmp_path / "runs.db")
    memory = MemoryStore()
    for store, name in (
        (sqlite, f"SQLiteStore({str(tmp_path / 'runs.db')!r})"),
        (memory, "MemoryStore()"),
    ):
        await store.aclose()
        with pytest.raises(ConfigurationError) as caught:
            Supervisor(ScriptedModel(answers()), store)
        assert caught.value.field == "store"
        assert caught.value.problem.startswith(f"{name}")
        assert "is closed" in caught.value.problem


async def test_good_supervisor_arguments_reach_the_pools() -> None:
    sup = Supervisor(
        ScriptedModel(answers()),
        workers={"executor": 3.0, "planner": "2"},  # type: ignore[dict-item]
        mailbox_size=5,
    )
    async with sup:
        sizes = {s.role: (s.workers, s.mailbox_size) for s in sup.pool_statistics()}
    assert sizes["executor"] == (3, 5)
    assert sizes["planner"] == (2, 5)
    assert sizes["reviewer"] == (8, 5)


async def test_the_pools_default_to_the_sizes_the_readme_gives() -> None:
    async with Supervisor(ScriptedModel(answers())) as sup:
        sizes = {s.role: s.workers for s in sup.pool_statistics()}
    assert sizes == {
        "planner": 8,
        "executor": 32,
        "reviewer": 8,
        "ranker": 8,
        "evolver": 8,
        "human_gate": 256,
    }


async def test_submitting_a_bad_dict_spec_fails_before_anything_runs() -> None:
    model = ScriptedModel(answers())
    store = MemoryStore()
    async with Supervisor(model, store) as sup:
        with pytest.raises(ConfigurationError) as caught:
            await sup.submit({"goal": "g", "pattern": "nope"})
        assert caught.value.field == "pattern"
        assert model.calls == []
        assert await store.list_runs() == []
        assert sup.handles() == []


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"goal": "g", "limits": {"max_replans": -1}}, "limits.max_replans"),
        # Past any date a clock can hold: refused, not an overflow mid-run.
        ({"goal": "g", "limits": {"deadline_s": 3e307}}, "limits.deadline_s"),
        ({"goal": "g", "limits": {"gate_timeout_s": 1e12}}, "limits.gate_timeout_s"),
        ({"goal": ""}, "goal"),
        ({"pattern": "contract"}, "goal"),
        (
            {
                "goal": "g",
                "tasks": [
                    {"key": "a", "description": "a", "depends_on": ["b"]},
                    {"key": "b", "description": "b", "depends_on": ["a"]},
                ],
            },
            "tasks",
        ),
        # Not a mapping at all.
        ("research SSMs", "spec"),
        (["goal"], "spec"),
        (None, "spec"),
    ],
)
async def test_submitting_a_bad_dict_names_the_offending_field(
    spec: Any, field: str
) -> None:
    model = ScriptedModel(answers())
    store = MemoryStore()
    async with Supervisor(model, store) as sup:
        with pytest.raises(ConfigurationError) as caught:
            await sup.submit(spec)
        assert await store.list_runs() == []
    assert caught.value.field == field
    assert model.calls == []


async def test_a_run_submitted_under_an_id_of_its_callers_keeps_it() -> None:
    store = MemoryStore()
    async with Supervisor(ScriptedModel(answers()), store) as sup:
        handle = await sup.submit(RunSpec(goal="g"), run_id="key-0123_ab")
        assert handle.run_id == "key-0123_ab"
        assert (await handle.result()).status is RunStatus.COMPLETED
        with pytest.raises(ConfigurationError, match="exists already") as again:
            await sup.submit(RunSpec(goal="g"), run_id="key-0123_ab")
        with pytest.raises(ConfigurationError) as bad:
            await sup.submit(RunSpec(goal="g"), run_id="../runs")
        assert [r.run_id for r in await store.list_runs()] == ["key-0123_ab"]
    assert again.value.field == bad.value.field == "run_id"


async def test_a_supervisor_forgets_the_oldest_finished_runs_past_keep_finished() -> (
    None
):
    async with Supervisor(ScriptedModel(answers()), keep_finished=2) as sup:
        handles, results = [], []
        for n in range(4):  # one after the other: they finish in this order
            handles.append(await sup.submit(RunSpec(goal=f"goal {n}")))
            results.append(await handles[-1].result())
        await until(lambda: len(sup.handles()) == 2)
        oldest = handles[0].run_id
        with pytest.raises(UnknownRunError):
            sup.get(oldest)
        # The journal keeps it; the handle a caller holds still works.
        assert await sup.replay(oldest) == results[0]
        assert await handles[0].result() == results[0]
        remembered = {handle.run_id for handle in sup.handles()}
        assert remembered == {handles[2].run_id, handles[3].run_id}


async def test_a_supervisor_keeps_its_last_thousand_finished_runs_by_default() -> None:
    # Explore runs of a goal with no words: each fails at once, no model call.
    async with Supervisor(ScriptedModel(answers())) as sup:
        handles = []
        for _ in range(1001):
            handles.append(await sup.submit(RunSpec(goal="?", kind="explore")))
            await handles[-1].result()
        await until(lambda: len(sup.handles()) == 1000)
        with pytest.raises(UnknownRunError):
            sup.get(handles[0].run_id)
        assert [h.run_id for h in sup.handles()] == [h.run_id for h in handles[1:]]


async def test_finished_runs_taken_up_by_resume_count_toward_keep_finished() -> None:
    store = MemoryStore()
    async with Supervisor(ScriptedModel(answers()), store) as first:
        run_ids = []
        for n in range(4):
            handle = await first.submit(RunSpec(goal=f"goal {n}"))
            await handle.result()
            run_ids.append(handle.run_id)
    async with Supervisor(ScriptedModel(answers()), store, keep_finished=2) as sup:
        for run_id in run_ids:
            resumed = await sup.resume(run_id)
            assert (await resumed.result()).status is RunStatus.COMPLETED
        assert [h.run_id for h in sup.handles()] == run_ids[2:]
        with pytest.raises(UnknownRunError):
            sup.get(run_ids[0])


async def test_forget_drops_a_finished_run_and_frees_its_keep_finished_place() -> None:
    async with Supervisor(ScriptedModel(answers()), keep_finished=2) as sup:
        handles, results = [], []
        for n in range(2):
            handles.append(await sup.submit(RunSpec(goal=f"goal {n}")))
            results.append(await handles[-1].result())
        await until(lambda: len(sup.handles()) == 2)
        kept, forgotten = handles
        sup.forget(forgotten.run_id)
        with pytest.raises(UnknownRunError):
            sup.get(forgotten.run_id)
        assert await sup.replay(forgotten.run_id) == results[1]
        # The forgotten run holds no place: the next run is kept beside the
        # first, none is dropped.
        later = await sup.submit(RunSpec(goal="goal 2"))
        await later.result()
        await until(lambda: later.run_id in {h.run_id for h in sup.handles()})
        assert [h.run_id for h in sup.handles()] == [kept.run_id, later.run_id]


async def test_forget_leaves_a_run_that_is_still_going() -> None:
    release = anyio.Event()

    async def slow(request: ModelRequest) -> TaskOutcome:
        await release.wait()
        return TaskOutcome(success=True, summary="ok")

    async with Supervisor(ScriptedModel(answers(slow))) as sup:
        handle = await sup.submit(RunSpec(goal="g"))
        sup.forget(handle.run_id)
        assert sup.get(handle.run_id).run_id == handle.run_id
        release.set()
        assert (await handle.result()).status is RunStatus.COMPLETED


def test_a_negative_keep_finished_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Supervisor(ScriptedModel(answers()), keep_finished=-1)
    assert caught.value.field == "keep_finished"


@pytest.mark.parametrize(
    ("limits", "field"),
    [({"max_replans": True}, "max_replans"), ({"deadline_s": False}, "deadline_s")],
)
def test_a_boolean_is_no_number_for_a_limit(
    limits: dict[str, bool], field: str
) -> None:
    # Lax validation would read true as 1 and false as 0.
    with pytest.raises(ConfigurationError) as caught:
        Limits.model_validate(limits)
    assert caught.value.field == field
    assert "not true or false" in caught.value.problem
    # Text that spells a number still reads (environment variables are text).
    assert Limits.model_validate({"max_replans": "3"}).max_replans == 3


def test_a_boolean_is_no_number_in_a_map_of_numbers() -> None:
    with pytest.raises(ConfigurationError) as caught:
        ExploreSettings(thresholds={"novelty": True})
    assert caught.value.field == "thresholds"
    assert "novelty: expected a number, not true or false" in caught.value.problem


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        # Lone UTF-16 surrogates: JSON can carry them, no journal can store them.
        ({"goal": "g", "context": ["fine", "\udfff"]}, "context.1"),
        ({"goal": "g", "metadata": {"\udc00": 1}}, "metadata"),
        ({"goal": "g", "metadata": {"a": [1, {"b": "\ud800"}]}}, "metadata.a.1.b"),
        (
            {"goal": "g", "kind": "explore", "explore": {"constraints": ["\udfff"]}},
            "explore.constraints.0",
        ),
    ],
    ids=["context", "metadata-key", "metadata-value", "explore"],
)
async def test_a_spec_with_a_string_no_journal_can_store_is_refused_naming_the_field(
    spec: dict[str, Any], field: str
) -> None:
    model = ScriptedModel(answers())
    store = MemoryStore()
    async with Supervisor(model, store) as sup:
        with pytest.raises(ConfigurationError) as from_dict:
            await sup.submit(spec)
        built = RunSpec.model_validate(spec)  # a valid model, all the same
        with pytest.raises(ConfigurationError) as from_model:
            await sup.submit(built)
        assert await store.list_runs() == []
    assert from_dict.value.field == field
    assert from_model.value.field == field
    assert "surrogate" in from_dict.value.problem
    assert model.calls == []


def nested(depth: int) -> dict[str, Any]:
    """Metadata whose objects and arrays nest ``depth`` levels deep."""
    value: Any = "leaf"
    for _ in range(depth - 1):
        value = [value]
    return {"deep": value}


@pytest.mark.parametrize("depth", [MAX_METADATA_DEPTH + 1, 200])
def test_metadata_nested_past_the_limit_is_refused_naming_the_field(
    depth: int,
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        RunSpec(goal="g", metadata=nested(depth))
    assert caught.value.field == "metadata"
    assert f"more than {MAX_METADATA_DEPTH} levels" in caught.value.problem


async def test_metadata_at_the_depth_limit_is_journaled_and_read_back(
    tmp_path: Path,
) -> None:
    metadata = nested(MAX_METADATA_DEPTH)
    path = tmp_path / "runs.db"
    async with SQLiteStore(path) as store:
        async with Supervisor(ScriptedModel(answers()), store) as sup:
            handle = await sup.submit({"goal": "g", "metadata": metadata})
            result = await finish(handle)
        assert result.status is RunStatus.COMPLETED
    async with SQLiteStore(path) as reopened:
        events = await reopened.read(handle.run_id)
    submitted = events[0]
    assert isinstance(submitted, RunSubmitted)
    assert submitted.spec.metadata == metadata
    assert isinstance(events[-1], RunFinished)


class FailingStore(DelegatingStore):
    """A journal that breaks when the first task's end is appended."""

    async def append(
        self, run_id: str, events: Sequence[replan.Event], summary: RunSummary
    ) -> None:
        if any(isinstance(e, TaskFinished) for e in events):
            raise RuntimeError("the disk is gone")
        await self.inner.append(run_id, events, summary)


async def test_cancelling_a_run_whose_driver_crashed_says_it_was_not_cancelled() -> (
    None
):
    model = ScriptedModel(answers())
    async with Supervisor(model, FailingStore(MemoryStore())) as sup:
        handle = await sup.submit(RunSpec(goal="g"))
        with anyio.fail_after(10), pytest.raises(SupervisorError):
            await handle.result()
        with anyio.fail_after(10), pytest.raises(SupervisorError) as caught:
            await handle.cancel()
        assert handle.status is RunStatus.RUNNING
    assert "was not cancelled" in str(caught.value)


class FailingOnce(DelegatingStore):
    """A journal that breaks at the first task's end, then works again."""

    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.failed = False

    async def append(
        self, run_id: str, events: Sequence[replan.Event], summary: RunSummary
    ) -> None:
        if not self.failed and any(isinstance(e, TaskFinished) for e in events):
            self.failed = True
            raise RuntimeError("the disk is full")
        await self.inner.append(run_id, events, summary)


async def test_a_handle_from_before_a_resume_cancels_the_run_driven_on() -> None:
    # The cancel reached the run's new driver, and the run ended cancelled;
    # the old handle waited on its own record and said "was not cancelled".
    blocker = Blocker()
    blocker.release.set()
    model = ScriptedModel(answers(blocker))
    async with Supervisor(model, FailingOnce(MemoryStore())) as sup:
        old = await sup.submit(RunSpec(goal="g"))
        with anyio.fail_after(10), pytest.raises(SupervisorError):
            await old.result()
        blocker.forever = True  # the run driven on stays at its first task
        new = await sup.resume(old.run_id)
        with anyio.fail_after(10):
            await old.cancel()
            result = await new.result()
    assert result.status is RunStatus.CANCELLED
