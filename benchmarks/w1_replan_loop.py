"""W1: the replan loop — supervisor overhead per executed task.

What is measured: one discovery run of a 20-task chain (each task depends on
the one before) with milestones after tasks 5, 10 and 15. The reviewer asks
for a contradiction replan at milestones 1 and 2 (the planner replaces the
pending tasks one for one, the ranker finds them aligned, no gate: only scope
shifts are gated) and continues at milestone 3 and at the end of the plan.
Model latency is zero, so the wall time is all replan: dispatch, the actor
round trips, the journal (SQLite, one commit per append), state folding,
reviews, replans and the synthesis.

The figure is microseconds per executed task: the wall time from ``submit``
to ``result`` divided by the tasks executed (20), median of the repetitions.
Each repetition gets a fresh supervisor and a fresh journal file; one warm-up
run comes first. Every result is checked (completed, 2 applied replans, 20
tasks completed). Peak RSS is the process's ``ru_maxrss``.

Run: ``python benchmarks/w1_replan_loop.py [--backend trio] [--repetitions N]``
"""

from __future__ import annotations

import anyio
from _common import (
    BenchModel,
    check_repetitions,
    check_replan_loop,
    cpu_now,
    median,
    now,
    peak_rss_mib,
    replan_loop_model,
    replan_loop_spec,
    report,
    run_script,
    settle,
    sqlite_journal,
)

from replan import RunSpec, Supervisor

REPETITIONS = 21


async def one_run(spec: RunSpec) -> tuple[float, float]:
    """Run W1 once on a fresh supervisor and journal.

    Returns:
        Wall and CPU microseconds per executed task.
    """
    model = BenchModel(replan_loop_model)
    async with sqlite_journal() as store, Supervisor(model=model, store=store) as sup:
        settle()
        started, cpu_started = now(), cpu_now()
        handle = await sup.submit(spec)
        result = await handle.result()
        elapsed, cpu = now() - started, cpu_now() - cpu_started
    check_replan_loop(result)
    steps = result.task_executions
    return elapsed / steps * 1e6, cpu / steps * 1e6


async def measure(repetitions: int) -> list[tuple[float, float]]:
    spec = replan_loop_spec()
    await one_run(spec)  # warm-up: first-use costs of pydantic, sqlite, imports
    return [await one_run(spec) for _ in range(repetitions)]


def main(backend: str = "asyncio", repetitions: int | None = None) -> dict[str, float]:
    """Measure W1 on ``backend``; print and return the figures."""
    repetitions = check_repetitions(REPETITIONS if repetitions is None else repetitions)
    samples = anyio.run(measure, repetitions, backend=backend)
    walls = [wall for wall, _ in samples]
    figures = {
        "w1_us_per_step": median(walls),
        "w1_cpu_us_per_step": median([cpu for _, cpu in samples]),
        "w1_peak_rss_mib": peak_rss_mib(),
    }
    print(
        f"W1 replan loop ({backend}, median of {repetitions}; "
        f"samples {min(walls):.0f}..{max(walls):.0f} us/step)"
    )
    report(figures)
    return figures


if __name__ == "__main__":
    run_script(main, "W1: supervisor overhead per task in a replanning run")
