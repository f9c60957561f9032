"""Plan runs on a SQLite journal whose process dies at a chosen journal write.

Run as ``python crash_worker.py BACKEND SCENARIO ROOT CASE...``. The
process imports replan once and, for each ``CASE``, forks a fresh process
per life of the run (the parent never runs an event loop, so each child
starts as a new process would), in the directory ``ROOT/CASE``:

* a ``CASE`` is ``-`` (no kill) or kill points joined by ``+``: ``7a`` dies
  just after the 7th journal write of that life commits, ``7b`` just
  before it starts, ``t150`` is killed (SIGKILL) 150 ms after it started;
  the first life submits the run, every later one resumes it
  (``Supervisor(..., resume=True)``), and a last life without a kill point
  drives it to its end;
* a journal write is an ``append`` or a record of the effect ledger
  (``record_effect``, ``record_tool_effect``), counted from 1 in each life;
* a life dies with ``os._exit(137)``: nothing is flushed or closed; the
  parent then copies the journal as the kill left it
  (``killed-<life>.db``), and the outbox (``killed-<life>.outbox``);
* every email the side-effect tool sends appends ``to key`` to ``outbox``;
* the last life writes the run's result (``result.json``), and each life
  that ends by itself the number of journal writes it made
  (``writes-<life>``) and nothing else; ``codes`` gets each life's exit code.

The run (``SPEC``, answered by ``answer``): five tasks, at most three at a
time. ``s1`` emails ana (a gate a person approves), ``s2`` fails
transiently once (its model asks to wait ``RETRY_AFTER_S``) and is
retried, ``s3`` is a milestone whose review shifts the scope: its replan
waits at a gate the script approves; the new plan's ``r1``
emails bob, and its milestone ``r3`` is reviewed into a second replan
(a contradiction, no gate). Every model call costs 10 + 5 tokens.

``SCENARIO`` (``SCENARIOS``) is ``script`` (the process approves every gate
as it opens), ``slow`` (the same, each model call taking 20 ms, so that
kills land while calls are in flight), ``policy`` (nobody answers: each
gate times out after ``POLICY_TIMEOUT_S`` and
``GatePolicy(on_timeout="approve")`` applies, also to a gate whose time ran
out while no process was alive), ``hybrid`` (``HYBRID_SPEC``: a
collection phase with an email and a task that needs approval, one
boundary, and a replan of the synthesis phase that drops its email) or
``explore`` (test_explore_resume's explore run of two cycles, evolving,
and a review gate).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import anyio
from explore_scripts import explore_spec
from test_explore_resume import two_cycles

from replan import (
    Alignment,
    GateError,
    GatePolicy,
    GateResolution,
    Limits,
    ModelRequest,
    ModelResponse,
    PlanProposal,
    RunSpec,
    ScriptedModel,
    Supervisor,
    Synthesis,
    TaskDraft,
    TaskOutcome,
    TokenUsage,
    TransientModelError,
    Trigger,
    UnknownRunError,
    Verdict,
    tool,
)
from replan.messages import Event, ToolCall
from replan.store import EffectRecord, RunSummary, SQLiteStore, ToolEffectRecord

KILLED = 137
RETRY_AFTER_S = 0.1
USAGE = TokenUsage(input_tokens=10, output_tokens=5)
SPEC = RunSpec(
    goal="map the market for solid-state batteries",
    pattern="discovery",
    tasks=[
        TaskDraft(key="s1", description="email ana the outline"),
        TaskDraft(key="s2", description="survey the makers"),
        TaskDraft(key="s3", description="size the market", depends_on=["s1", "s2"]),
        TaskDraft(key="s4", description="price the cells", depends_on=["s3"]),
        TaskDraft(key="s5", description="rank the makers", depends_on=["s3"]),
    ],
    limits=Limits(max_concurrency=3, milestone_every=100, max_task_attempts=3),
)
POLICY_TIMEOUT_S = 0.1
POLICY_SPEC = SPEC.model_copy(
    update={
        "limits": SPEC.limits.model_copy(update={"gate_timeout_s": POLICY_TIMEOUT_S}),
        "gate_policy": GatePolicy(on_timeout="approve"),
    }
)
HYBRID_SPEC = RunSpec(
    goal="map the market for solid-state batteries",
    pattern="hybrid",
    tasks=[
        TaskDraft(key="c1", description="email ana for prices"),
        TaskDraft(key="c2", description="collect volumes"),
        TaskDraft(
            key="c3",
            description="order the report",
            depends_on=["c1"],
            requires_approval=True,
        ),
        TaskDraft(key="c4", description="collect makers", depends_on=["c2"]),
    ],
    limits=Limits(max_concurrency=3, milestone_every=100, max_task_attempts=3),
)
SYNTHESIS = [
    TaskDraft(key="b1", description="model the market", milestone=True),
    TaskDraft(key="b2", description="email bob the model", depends_on=["b1"]),
    TaskDraft(key="b3", description="write the brief", depends_on=["b1"]),
]
MILESTONES = ("s3", "r3", "b1")
EMAILS = {"s1": "ana", "r1": "bob", "c1": "ana", "b2": "bob"}


def answer(request: ModelRequest) -> Any:
    """The model's answer, from the request's structured context alone."""
    ctx = request.context
    match (request.role, request.purpose):
        case ("executor", "execute"):
            task = ctx["task"]
            if task.key in EMAILS and not request.transcript:
                arguments = f'{{"to": "{EMAILS[task.key]}"}}'
                call = ToolCall(id="c1", name="send_email", arguments=arguments)
                return ModelResponse(tool_calls=[call])
            if task.key in ("s2", "c2") and task.attempts == 1:
                raise TransientModelError("429", retry_after=RETRY_AFTER_S)
            findings = [f"{task.key} found"] if task.key in MILESTONES else []
            return TaskOutcome(
                success=True, summary=f"{task.key} done", findings=findings
            )
        case ("executor", "synthesize"):
            return Synthesis(output="the brief", sources=["t1"])
        case ("reviewer", "milestone") if ctx["metadata"].get("hybrid"):
            done = {t.key for t in ctx["completed"]}
            if "b1" in done and "q1" not in done:
                return Verdict(
                    decision="replan",
                    trigger=Trigger.CONTRADICTION,
                    rationale="moved",
                    confidence=1.0,
                )
            return Verdict(decision="continue", rationale="on track")
        case ("planner", "boundary"):
            return PlanProposal(tasks=SYNTHESIS, rationale="synthesize")
        case ("reviewer", "milestone"):
            trigger = {1: Trigger.SCOPE_SHIFT, 2: Trigger.CONTRADICTION}.get(
                ctx["milestone_index"]
            )
            if trigger is None:
                return Verdict(decision="continue", rationale="on track")
            return Verdict(
                decision="replan", trigger=trigger, rationale="moved", confidence=1.0
            )
        case ("planner", "replan"):
            if ctx["trigger"] == Trigger.SCOPE_SHIFT:
                drafts = [
                    TaskDraft(key="r1", description="email bob the scope"),
                    TaskDraft(key="r2", description="survey recyclers"),
                    TaskDraft(
                        key="r3",
                        description="size recycling",
                        depends_on=["r1", "r2"],
                        milestone=True,
                    ),
                ]
            else:
                drafts = [
                    TaskDraft(key="q1", description="check the figures"),
                    TaskDraft(key="q2", description="write up", depends_on=["q1"]),
                ]
            return PlanProposal(tasks=drafts, rationale="revised")
        case ("ranker", "alignment"):
            return Alignment(aligned=[True] * len(ctx["proposed"]))
    raise AssertionError(f"unexpected {request.role}/{request.purpose}")


SCENARIOS = {
    "script": SPEC,
    "slow": SPEC,
    "policy": POLICY_SPEC,
    "hybrid": HYBRID_SPEC.model_copy(update={"metadata": {"hybrid": True}}),
    "explore": explore_spec(),
}


@tool(side_effect=True)
def send_email(to: str, idempotency_key: str) -> str:
    """Email someone (into the file ``REPLAN_TEST_OUTBOX`` names)."""
    with Path(os.environ["REPLAN_TEST_OUTBOX"]).open("a") as sent:
        sent.write(f"{to} {idempotency_key}\n")
    return f"sent to {to}"


def daemon_model(settings: object) -> ScriptedModel:
    """``answer`` for ``replan serve --model python:crash_worker:daemon_model
    --tool crash_worker:send_email``, each call taking 20 ms."""
    return ScriptedModel(answer, usage=USAGE, latency_s=0.02)


class Life:
    """What one process of the run does and where it dies."""

    def __init__(
        self, folder: Path, scenario: str, index: int, kill: str | None
    ) -> None:
        self.folder = folder
        self.scenario = scenario
        self.index = index
        at_write = kill is not None and kill[-1] in "ab"
        self.kill_at = int(kill[:-1]) if kill and at_write else 0
        self.before = at_write and kill is not None and kill.endswith("b")
        self.writes = 0

    def write_starts(self) -> None:
        self.writes += 1
        if self.before and self.writes == self.kill_at:
            die()

    def write_ended(self) -> None:
        if not self.before and self.writes == self.kill_at:
            die()


def die() -> NoReturn:
    os._exit(KILLED)


def journal(life: Life) -> SQLiteStore:
    class Dying(SQLiteStore):
        async def append(
            self, run_id: str, events: Sequence[Event], summary: RunSummary
        ) -> None:
            life.write_starts()
            await super().append(run_id, events, summary)
            life.write_ended()

        async def record_effect(self, run_id: str, record: EffectRecord) -> None:
            life.write_starts()
            await super().record_effect(run_id, record)
            life.write_ended()

        async def record_tool_effect(
            self, run_id: str, record: ToolEffectRecord
        ) -> None:
            life.write_starts()
            await super().record_tool_effect(run_id, record)
            life.write_ended()

    return Dying(life.folder / "j.db")


async def approve_gates(sup: Supervisor, run_id: str) -> None:
    """Approve every gate of the run as it opens (polled: a resumed run's
    gates open again without a new event)."""
    while True:
        for gate in sup.gates.pending(run_id):
            answer = GateResolution(decision="approve", by="ana")
            with contextlib.suppress(GateError):  # closed meanwhile
                await sup.gates.resolve(gate.gate_id, answer)
        await anyio.sleep(0.005)


async def live(life: Life) -> None:
    os.environ["REPLAN_TEST_OUTBOX"] = str(life.folder / "outbox")
    latency_s = 0.02 if life.scenario == "slow" else 0.0
    script = two_cycles() if life.scenario == "explore" else answer
    model = ScriptedModel(script, usage=USAGE, latency_s=latency_s)
    resume = life.index > 1
    async with (
        journal(life) as store,
        Supervisor(model, store, tools=[send_email], resume=resume) as sup,
    ):
        if resume:
            runs = await store.list_runs()
            if not runs:  # killed before the run's first append
                return
            [summary] = runs
            run_id = summary.run_id
            try:
                handle = sup.get(run_id)
            except UnknownRunError:  # it had ended: nothing to resume
                handle = None
        else:
            handle = await sup.submit(SCENARIOS[life.scenario])
            run_id = handle.run_id
        if handle is None:
            result = await sup.replay(run_id)
        else:
            async with anyio.create_task_group() as group:
                if life.scenario != "policy":
                    group.start_soon(approve_gates, sup, run_id)
                result = await handle.result()
                group.cancel_scope.cancel()
    (life.folder / "result.json").write_text(result.model_dump_json())


def one_life(life: Life, backend: str) -> NoReturn:
    """The child's whole life: the run, then an exit without cleanup."""
    code = 0
    try:
        anyio.run(live, life, backend=backend)
        (life.folder / f"writes-{life.index}").write_text(str(life.writes))
    except BaseException:
        (life.folder / f"error-{life.index}").write_text(traceback.format_exc())
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def snapshot(folder: Path, index: int) -> None:
    """Keep the journal as the kill left it (the database and its WAL), and
    the emails sent by then."""
    for suffix in ("", "-wal"):
        source = folder / f"j.db{suffix}"
        if source.exists():
            shutil.copyfile(source, folder / f"killed-{index}.db{suffix}")
    if (folder / "outbox").exists():
        shutil.copyfile(folder / "outbox", folder / f"killed-{index}.outbox")


def kill_after(pid: int, delay_s: float) -> int:
    """SIGKILL the life ``delay_s`` after it started, wherever it is (in a
    commit, a thread, a model call); its exit code (137 once killed)."""
    deadline = time.monotonic() + delay_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.002)
    os.kill(pid, signal.SIGKILL)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return KILLED if code == -signal.SIGKILL else code


def run_case(backend: str, scenario: str, root: Path, case: str) -> None:
    folder = root / case
    folder.mkdir()
    kills: list[str | None] = [k for k in case.split("+") if k != "-"]
    codes: list[str] = []
    for index, kill in enumerate([*kills, None], start=1):
        life = Life(folder, scenario, index, kill)
        pid = os.fork()
        if pid == 0:
            one_life(life, backend)
        if kill is not None and kill.startswith("t"):
            code = kill_after(pid, int(kill[1:]) / 1000)
        else:
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        codes.append(str(code))
        if code == KILLED:
            snapshot(folder, index)
        elif code != 0 or kill is not None:
            break  # it failed, or ended before its kill point
    (folder / "codes").write_text(" ".join(codes))


def main(argv: list[str]) -> None:
    backend, scenario, root, *cases = argv
    for case in cases:
        run_case(backend, scenario, Path(root), case)
        sys.stdout.write(f"{case}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
