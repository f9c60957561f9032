"""W2: fan-out — how close one run gets to its concurrency limit.

What is measured: one discovery run of 50 independent tasks with
``max_concurrency=10``; every executor call sleeps 50 ms, so the ideal wall
time is 5 waves x 50 ms = 0.25 s. Efficiency is 0.25 s / the wall time from
``submit`` to ``result``. Lost time is dispatch latency between waves, the
journal (SQLite, one commit per append), the end-of-plan review (the cheap
heuristic decides: outcomes carry no findings) and the synthesis (no latency:
only executor calls sleep, as the ideal counts the task waves alone).

The executor pool keeps its default size (32 workers per supervisor), more
than the 10 tasks in flight, so no pool size is set. Each repetition gets a
fresh supervisor and journal; one warm-up run comes first; the figure is the
median of the repetitions.

Run: ``python benchmarks/w2_fanout.py [--backend trio] [--repetitions N]``
"""

from __future__ import annotations

from typing import Any

import anyio
from _common import (
    BenchModel,
    check_repetitions,
    median,
    now,
    report,
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
    TaskStatus,
)

REPETITIONS = 9

TASKS = 50
CONCURRENCY = 10
LATENCY_S = 0.050
IDEAL_S = TASKS / CONCURRENCY * LATENCY_S

_OUTCOME = TaskOutcome(success=True, summary="fetched")
_SYNTHESIS = Synthesis(output="all fetched")


async def fanout_model(request: ModelRequest) -> Any:
    """Executor calls take ``LATENCY_S``; the synthesis answers at once."""
    match request.role, request.purpose:
        case "executor", "execute":
            await anyio.sleep(LATENCY_S)
            return _OUTCOME
        case "executor", "synthesize":
            return _SYNTHESIS
    raise AssertionError(f"W2 asks no {request.role}/{request.purpose}")


def fanout_spec() -> RunSpec:
    return RunSpec(
        goal="fetch 50 independent sources",
        pattern="discovery",
        tasks=[
            TaskDraft(key=f"fetch{i}", description=f"fetch source {i}")
            for i in range(1, TASKS + 1)
        ],
        limits=Limits(max_concurrency=CONCURRENCY, milestone_every=1000),
    )


def check(result: RunResult) -> None:
    completed = sum(t.status is TaskStatus.COMPLETED for t in result.tasks)
    if result.status is not RunStatus.COMPLETED or completed != TASKS:
        raise AssertionError(
            f"W2 run went wrong: {result.status} ({result.stop_reason}), "
            f"{completed} of {TASKS} tasks completed"
        )


async def one_run(spec: RunSpec) -> float:
    """Run W2 once on a fresh supervisor and journal; return the wall time."""
    model = BenchModel(fanout_model)
    async with sqlite_journal() as store, Supervisor(model=model, store=store) as sup:
        settle()
        started = now()
        handle = await sup.submit(spec)
        result = await handle.result()
        elapsed = now() - started
    check(result)
    return elapsed


async def measure(repetitions: int) -> list[float]:
    spec = fanout_spec()
    await one_run(spec)  # warm-up
    return [await one_run(spec) for _ in range(repetitions)]


def main(backend: str = "asyncio", repetitions: int | None = None) -> dict[str, float]:
    """Measure W2 on ``backend``; print and return the figures."""
    repetitions = check_repetitions(REPETITIONS if repetitions is None else repetitions)
    walls = anyio.run(measure, repetitions, backend=backend)
    wall = median(walls)
    figures = {"w2_efficiency_pct": IDEAL_S / wall * 100, "w2_wall_s": wall}
    print(
        f"W2 fan-out ({backend}, median of {repetitions}; "
        f"walls {', '.join(f'{w:.3f}' for w in walls)} s; ideal {IDEAL_S:.2f} s)"
    )
    report(figures)
    return figures


if __name__ == "__main__":
    run_script(main, "W2: fan-out efficiency of one run")
