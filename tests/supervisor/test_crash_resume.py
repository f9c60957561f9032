"""A process killed at any journal write resumes its run and loses, or
repeats, nothing (the run and its lives: crash_worker.py)."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import anyio
import pytest

from replan import RunResult, RunStatus, TaskStatus
from replan.messages import (
    BriefIssued,
    CycleFinished,
    Event,
    GateOpened,
    GateResolved,
    HypothesesAdded,
    MilestoneReviewed,
    PlanCreated,
    ReplanApplied,
    RetryScheduled,
    RunFinished,
    RunSubmitted,
    TaskFinished,
    TaskInterrupted,
    TaskStarted,
)
from replan.store import SQLiteStore
from replan.supervisor import fold_journal

WORKER = Path(__file__).with_name("crash_worker.py")


async def lives(backend: str, scenario: str, root: Path, cases: list[str]) -> None:
    """Run every case in one worker process (each life a fork of it)."""
    command = [sys.executable, str(WORKER), backend, scenario, str(root), *cases]
    with anyio.fail_after(240):
        done = await anyio.run_process(command, check=False)
    assert done.returncode == 0, done.stderr.decode()


async def read_journal(path: Path) -> tuple[list[Event], list[tuple[str, bool]]]:
    """A journal's one run: its events, and its side-effect calls (key,
    whether the call is known to have returned)."""
    async with SQLiteStore(path, read_only=True) as store:
        runs = await store.list_runs()
        if not runs:
            return [], []
        [run] = runs
        events = await store.read(run.run_id)
        effects = await store.read_tool_effects(run.run_id)
    return events, [(e.key, e.content is not None) for e in effects]


def consistent(events: list[Event]) -> None:
    """No event of the journal repeats or contradicts another."""
    kinds = Counter(e.kind for e in events)
    assert kinds["run_submitted"] == 1
    plans = Counter(e.boundary for e in events if isinstance(e, PlanCreated))
    submitted = events[0]
    assert isinstance(submitted, RunSubmitted)
    assert plans[False] == (submitted.spec.kind == "plan"), plans
    assert plans[True] <= 1, plans  # a hybrid run's one boundary
    assert kinds["run_finished"] == 1
    assert isinstance(events[-1], RunFinished)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    # An attempt cut short by a crash is journaled interrupted on resume and
    # runs again under its number; none other starts twice.
    running: set[tuple[str, int]] = set()
    for event in events:
        if isinstance(event, TaskStarted):
            attempt = (event.task_id, event.attempt)
            assert attempt not in running, f"{attempt} started twice"
            running.add(attempt)
        elif isinstance(event, TaskInterrupted):
            running = {a for a in running if a[0] != event.task_id}
    ended = Counter(
        e.task_id for e in events if isinstance(e, TaskFinished | TaskInterrupted)
    )
    tries = Counter(e.task_id for e in events if isinstance(e, TaskStarted))
    assert all(ended[t] <= tries[t] for t in ended), (ended, tries)
    succeeded: set[str] = set()
    for event in events:
        if isinstance(event, TaskStarted):
            assert event.task_id not in succeeded, f"{event.task_id} ran again"
        if isinstance(event, TaskFinished) and event.outcome.success:
            assert event.task_id not in succeeded, f"{event.task_id} twice"
            succeeded.add(event.task_id)
    applied = Counter(e.version.version for e in events if isinstance(e, ReplanApplied))
    assert all(n == 1 for n in applied.values()), applied
    reviews = Counter(e.index for e in events if isinstance(e, MilestoneReviewed))
    assert all(n == 1 for n in reviews.values()), reviews
    answers = Counter(e.gate_id for e in events if isinstance(e, GateResolved))
    assert all(n == 1 for n in answers.values()), answers
    # An explore run adds each hypothesis once and ends each cycle once.
    added = Counter(
        h.id for e in events if isinstance(e, HypothesesAdded) for h in e.hypotheses
    )
    assert all(n == 1 for n in added.values()), added
    cycles = Counter(e.iteration for e in events if isinstance(e, CycleFinished))
    assert all(n == 1 for n in cycles.values()), cycles
    assert sum(isinstance(e, BriefIssued) for e in events) <= 1


def waits_kept(events: list[Event]) -> None:
    """A retry starts no sooner than its failure asked, and a gate's
    timeout applies no sooner than it expires, across any restart."""
    retry_at: dict[str, datetime] = {}
    expires: dict[str, datetime] = {}
    for event in events:
        if isinstance(event, RetryScheduled):
            retry_at[event.task_id] = event.retry_at
        elif isinstance(event, TaskStarted) and event.task_id in retry_at:
            wait = retry_at.pop(event.task_id)
            assert event.at >= wait, f"{event.task_id} retried before {wait}"
        elif isinstance(event, GateOpened) and event.request.expires_at:
            expires[event.request.gate_id] = event.request.expires_at
        elif isinstance(event, GateResolved) and event.resolution.by.startswith(
            "policy"
        ):
            assert event.at >= expires[event.gate_id], event.gate_id


def shape(result: RunResult) -> dict[str, object]:
    """What a run's end must keep however often its process died: all but
    ids, times, and the attempts a crash cut short (``task_executions``)."""
    return {
        "status": result.status,
        "stop_reason": result.stop_reason,
        "output": (result.output, result.sources),
        "tasks": [
            (t.key, t.status, t.attempts, t.result, t.version) for t in result.tasks
        ],
        "versions": [
            (v.trigger, v.added, v.removed, v.preserved, v.approved_by)
            for v in result.versions
        ],
        "replans": [(r.outcome, r.trigger) for r in result.replans],
        "iterations": result.iterations,
        "failures": [(f.role, f.task_id, f.error_type) for f in result.model_failures],
        "brief": result.brief,
    }


def sent(outbox: Path) -> Counter[str]:
    """Emails sent, by idempotency key."""
    lines = outbox.read_text().splitlines() if outbox.exists() else []
    return Counter(line.split(" ", 1)[1] for line in lines)


@dataclass(frozen=True)
class Lives:
    """What a case's lives left beside the journal."""

    codes: list[str]
    """Each life's exit code: 137 for those killed, 0 for the last."""
    emails: Counter[str]
    """Emails sent, by idempotency key."""
    emails_at_kill: list[Counter[str]]
    """Those sent by the time of each kill."""
    result: RunResult | None
    """The run's result, as the last life saw it end."""

    @classmethod
    def of(cls, folder: Path) -> Lives:
        errors = sorted(folder.glob("error-*"))
        assert not errors, errors[0].read_text()
        codes = (folder / "codes").read_text().split()
        ended = folder / "result.json"
        return cls(
            codes=codes,
            emails=sent(folder / "outbox"),
            emails_at_kill=[
                sent(folder / f"killed-{life}.outbox") for life in range(1, len(codes))
            ],
            result=(
                RunResult.model_validate_json(ended.read_text())
                if ended.exists()
                else None
            ),
        )


async def check_case(folder: Path, baseline: RunResult) -> None:
    """Everything a case's killed lives left holds in the run's end."""
    lives = Lives.of(folder)
    codes, emails, result = lives.codes, lives.emails, lives.result
    assert codes[-1] == "0", codes
    assert set(codes[:-1]) <= {"137"}, codes
    events, effects = await read_journal(folder / "j.db")
    if not events:  # killed before the run's first append: no run, no email
        assert not emails
        return
    assert result is not None
    consistent(events)
    waits_kept(events)
    assert fold_journal(result.run_id, events).result() == result
    assert shape(result) == shape(baseline)
    assert sorted(emails) == sorted(key for key, _ in effects)
    # An email whose tool returned but whose result the kill kept from the
    # ledger may go again (its call never returned, as far as the run knows).
    assert set(emails.values()) <= {1, 2}
    final = {t.id: t for t in result.tasks}
    for life in range(1, len(codes)):
        killed, recorded = await read_journal(folder / f"killed-{life}.db")
        for key, returned in recorded:
            if returned:  # known to have been sent: never sent again
                assert emails[key] == lives.emails_at_kill[life - 1][key], (
                    life,
                    key,
                    emails,
                )
        if not killed:
            continue
        # What a kill left is never rewritten: the run went on from there.
        assert events[: len(killed)] == killed, life
        before = fold_journal(result.run_id, killed).result()
        for task in before.tasks:
            if task.status is TaskStatus.COMPLETED:
                assert final[task.id].status is TaskStatus.COMPLETED
                assert final[task.id].result == task.result, task.id
        for role, used in before.usage.by_role.items():
            now = result.usage.by_role[role]
            assert now.input_tokens >= used.input_tokens, (life, role)
            assert now.output_tokens >= used.output_tokens, (life, role)
            assert now.calls >= used.calls, (life, role)


def every_write(writes: int) -> list[str]:
    """Every write, killed before it and after it; then a few second (and
    third) kills of the resumed process."""
    once = [f"{n}{when}" for n in range(1, writes + 1) for when in "ba"]
    again = ["3a+4b", "9a+2b", "14a+9b", "20a+6b", "5a+5a+5a", "7b+3a", "22b+5a"]
    return [*once, *again]


def some_writes(writes: int) -> list[str]:
    """Every fourth write, before and after it in turn, and a second kill."""
    once = [f"{n}{'ba'[n % 2]}" for n in range(2, writes + 1, 4)]
    return [*once, "7a+5b"]


def some_moments(writes: int) -> list[str]:
    """SIGKILLs at moments spread over the run, and two series of them."""
    return [*(f"t{ms}" for ms in range(60, 500, 90)), "t150+t100", "t90+t90+t90"]


async def check_scenario(
    backend: str, scenario: str, root: Path, cases: Callable[[int], list[str]]
) -> None:
    """Run the scenario once without a kill, then each case, and check each."""
    await anyio.Path(root).mkdir()
    await lives(backend, scenario, root, ["-"])
    uninterrupted = root / "-"
    baseline = Lives.of(uninterrupted).result
    assert baseline is not None
    assert baseline.status is RunStatus.COMPLETED
    await check_case(uninterrupted, baseline)
    writes = int((uninterrupted / "writes-1").read_text())
    chosen = cases(writes)
    await lives(backend, scenario, root, chosen)
    failed: dict[str, str] = {}
    for case in chosen:
        try:
            await check_case(root / case, baseline)
        except AssertionError as exc:
            failed[case] = str(exc).splitlines()[0][:300] if str(exc) else repr(exc)
    assert not failed, failed


@pytest.mark.timeout(240)
async def test_a_run_killed_at_any_journal_write_resumes_and_ends_alike(
    anyio_backend: str, tmp_path: Path
) -> None:
    # Replans (one behind a gate a person approves), a retry that waits for
    # its Retry-After, two emails behind gates, three tasks at a time.
    await check_scenario(anyio_backend, "script", tmp_path / "script", every_write)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scenario", ["policy", "hybrid", "explore"])
async def test_a_run_killed_at_a_journal_write_resumes_and_ends_alike(
    anyio_backend: str, scenario: str, tmp_path: Path
) -> None:
    # policy: nobody answers, each gate's timeout approves (also one that
    # expired while no process was alive); hybrid: a collection phase with
    # a task that needs approval, one boundary, then a replan; explore: two
    # cycles of hypotheses, critiques and a tournament, then a review gate.
    await check_scenario(anyio_backend, scenario, tmp_path / scenario, some_writes)


@pytest.mark.timeout(120)
async def test_a_run_killed_at_any_moment_resumes_and_ends_alike(
    anyio_backend: str, tmp_path: Path
) -> None:
    # Model calls take 20 ms: a kill lands in a call, a commit, a thread.
    await check_scenario(anyio_backend, "slow", tmp_path / "slow", some_moments)
