"""Large plans: how replan's cost per task grows with the number of tasks.

What is measured: one run of N independent tasks (no dependencies), for N
in 1,000, 4,000 and 16,000, and one run of a chain of N tasks (each
depending on the one before), for N in 1,000 and 4,000;
``max_concurrency=50``; model latency 0; ``milestone_every`` at its
maximum, so only the end of the plan is reviewed (outcomes carry no
findings, so the cheap heuristic decides it); the SQLite journal in a
fresh file per repetition. The figure is microseconds per executed task
(wall time from ``submit`` to ``result`` / N), median of 3 repetitions,
and the growth: the figure at 16,000 tasks over the one at 1,000 (4,000
over 1,000 for the chain).

A run's state is immutable and every event folds into a copy of it, so the
task table is copied once per event: some growth with N is the price of
that design. What must not grow with N is the work of deciding what runs
next (that work once walked every ready task of the plan after every
report, which made a 20,000-task run take 51 s; 8.5 s since), nor, in a
chain, the work of finding the one task that became ready (a walk over
every pending task after each report made a 4,000-task chain take 16.6 s;
2.5 s since).

Run: ``python benchmarks/scale.py [--backend trio] [--repetitions N]``
"""

from __future__ import annotations

from typing import Any

import anyio
from _common import (
    BenchModel,
    check_repetitions,
    median,
    now,
    run_script,
    settle,
    sqlite_journal,
)

from replan import (
    Limits,
    ModelRequest,
    RunResult,
    RunSpec,
    RunStatus,
    Supervisor,
    Synthesis,
    TaskDraft,
    TaskOutcome,
)

SIZES = (1_000, 4_000, 16_000)
CHAIN_SIZES = (1_000, 4_000)
REPETITIONS = 3
CONCURRENCY = 50

_OUTCOME = TaskOutcome(success=True, summary="done")
_SYNTHESIS = Synthesis(output="all done")


def answer(request: ModelRequest) -> Any:
    if request.purpose == "execute":
        return _OUTCOME
    if request.purpose == "synthesize":
        return _SYNTHESIS
    raise AssertionError(f"the scale run asks no {request.role}/{request.purpose}")


def spec(tasks: int, chain: bool = False) -> RunSpec:
    return RunSpec(
        goal=f"do {tasks} {'chained' if chain else 'independent'} things",
        tasks=[
            TaskDraft(
                key=f"k{i}",
                description=f"thing {i}",
                depends_on=[f"k{i - 1}"] if chain and i else [],
            )
            for i in range(tasks)
        ],
        limits=Limits(
            max_concurrency=CONCURRENCY,
            milestone_every=10_000,
            max_task_executions=1_000_000,
        ),
    )


def check(result: RunResult, tasks: int) -> None:
    if result.status is not RunStatus.COMPLETED or result.task_executions != tasks:
        raise AssertionError(
            f"the scale run went wrong: {result.status} ({result.stop_reason}), "
            f"{result.task_executions} of {tasks} tasks executed"
        )


async def one_run(run_spec: RunSpec, tasks: int) -> float:
    """One run on a fresh supervisor and journal; microseconds per task."""
    async with (
        sqlite_journal() as store,
        Supervisor(model=BenchModel(answer), store=store) as sup,
    ):
        settle()
        started = now()
        result = await (await sup.submit(run_spec)).result()
        elapsed = now() - started
    check(result, tasks)
    return elapsed / tasks * 1e6


async def measure(repetitions: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    for tasks in SIZES:
        run_spec = spec(tasks)
        samples = [await one_run(run_spec, tasks) for _ in range(repetitions)]
        figures[f"scale_{tasks}_us_per_task"] = median(samples)
    figures["scale_growth"] = (
        figures[f"scale_{SIZES[-1]}_us_per_task"]
        / figures[f"scale_{SIZES[0]}_us_per_task"]
    )
    for tasks in CHAIN_SIZES:
        run_spec = spec(tasks, chain=True)
        samples = [await one_run(run_spec, tasks) for _ in range(repetitions)]
        figures[f"scale_chain_{tasks}_us_per_task"] = median(samples)
    figures["scale_chain_growth"] = (
        figures[f"scale_chain_{CHAIN_SIZES[-1]}_us_per_task"]
        / figures[f"scale_chain_{CHAIN_SIZES[0]}_us_per_task"]
    )
    return figures


def main(backend: str = "asyncio", repetitions: int | None = None) -> dict[str, float]:
    """Measure the scaling on ``backend``; print and return the figures."""
    repetitions = check_repetitions(REPETITIONS if repetitions is None else repetitions)
    figures = anyio.run(measure, repetitions, backend=backend)
    print(f"Large plans ({backend}, median of {repetitions})")
    for tasks in SIZES:
        value = figures[f"scale_{tasks}_us_per_task"]
        print(f"  {tasks:>6,} independent tasks   {value:8.0f} us/task")
    print(
        f"  growth, {SIZES[-1]:,} over {SIZES[0]:,} tasks   "
        f"{figures['scale_growth']:6.1f}x"
    )
    for tasks in CHAIN_SIZES:
        value = figures[f"scale_chain_{tasks}_us_per_task"]
        print(f"  {tasks:>6,} chained tasks       {value:8.0f} us/task")
    print(
        f"  growth, chain of {CHAIN_SIZES[-1]:,} over {CHAIN_SIZES[0]:,}  "
        f"{figures['scale_chain_growth']:6.1f}x"
    )
    return figures


if __name__ == "__main__":
    run_script(main, "Large plans: cost per task as the plan grows")
