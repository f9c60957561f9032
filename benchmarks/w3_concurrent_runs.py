"""W3: 200 concurrent replan loops in one supervisor — throughput and memory.

What is measured: 200 W1 runs (a 20-task chain, milestones after tasks 5,
10 and 15, replans at the first two; see ``w1_replan_loop.py``) submitted
together to one supervisor sharing one SQLite journal; every model call
sleeps 10 ms (``BenchModel(latency_s=0.01)``: 29 calls per run, so a run
alone would take at least 0.29 s). Figures:

* wall time from the first ``submit`` to the last ``result``, median of the
  repetitions (each with a fresh supervisor and journal);
* peak RSS: the process's ``ru_maxrss`` over the whole workload;
* KiB per run: (``ru_maxrss`` after the first repetition - the RSS before it)
  / 200, i.e. the memory the 200 runs in flight added (their state, journal
  rows in SQLite's cache, tasks and buffers), first-use costs excluded by a
  one-run warm-up.

Pool sizes: the pool size is a role's global concurrency, and every run has
one task or one review in flight at a time, so every role gets 256 workers
(``Supervisor(workers={role: 256 ...})``): no run waits for a free worker.

Run: ``python benchmarks/w3_concurrent_runs.py [--backend trio]``
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
    rss_mib,
    run_script,
    settle,
    sqlite_journal,
)

from replan import RunResult, RunSpec, Supervisor

REPETITIONS = 5

RUNS = 200
LATENCY_S = 0.010
WORKERS = 256
ROLES = ("planner", "executor", "reviewer", "ranker", "evolver", "human_gate")


async def one_round(spec: RunSpec, runs: int) -> tuple[float, float]:
    """``runs`` concurrent W1 runs on a fresh supervisor; wall and CPU seconds."""
    results: list[RunResult] = []
    model = BenchModel(replan_loop_model, latency_s=LATENCY_S)
    async with (
        sqlite_journal() as store,
        Supervisor(
            model=model, store=store, workers=dict.fromkeys(ROLES, WORKERS)
        ) as sup,
    ):
        settle()
        started, cpu_started = now(), cpu_now()
        handles = [await sup.submit(spec) for _ in range(runs)]

        async def wait(index: int) -> None:
            results.append(await handles[index].result())

        async with anyio.create_task_group() as tg:
            for index in range(runs):
                tg.start_soon(wait, index)
        elapsed, cpu = now() - started, cpu_now() - cpu_started
    for result in results:
        check_replan_loop(result)
    if len(results) != runs:
        raise AssertionError(f"{len(results)} of {runs} runs returned")
    return elapsed, cpu


async def measure(repetitions: int) -> tuple[list[tuple[float, float]], float]:
    """(wall, CPU) seconds of the repetitions, and KiB per run from the first."""
    spec = replan_loop_spec()
    await one_round(spec, 1)  # warm-up: first-use costs, not per-run memory
    settle()
    before = rss_mib()
    rounds = [await one_round(spec, RUNS)]
    kib_per_run = (peak_rss_mib() - before) * 1024 / RUNS
    rounds += [await one_round(spec, RUNS) for _ in range(repetitions - 1)]
    return rounds, kib_per_run


def main(backend: str = "asyncio", repetitions: int | None = None) -> dict[str, float]:
    """Measure W3 on ``backend``; print and return the figures."""
    repetitions = check_repetitions(REPETITIONS if repetitions is None else repetitions)
    rounds, kib_per_run = anyio.run(measure, repetitions, backend=backend)
    walls = [wall for wall, _ in rounds]
    figures = {
        "w3_wall_s": median(walls),
        "w3_cpu_s": median([cpu for _, cpu in rounds]),
        "w3_peak_rss_mib": peak_rss_mib(),
        "w3_kib_per_run": kib_per_run,
    }
    print(
        f"W3 {RUNS} concurrent runs ({backend}, median of {repetitions}; "
        f"walls {', '.join(f'{w:.2f}' for w in walls)} s)"
    )
    report(figures)
    return figures


if __name__ == "__main__":
    run_script(main, "W3: 200 concurrent replanning runs in one supervisor")
