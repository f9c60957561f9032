"""W4: actor round trips per second through :class:`replan.actors.ActorPool`.

What is measured: a driver runs ``CALLERS`` concurrent caller tasks that share
``MESSAGES`` (100,000) requests; each caller asks an "echo" pool of
``WORKERS`` workers in a loop (``await pool.ask(i, run_id=..., deadline=...)``)
and waits for the reply before asking again. One request plus its reply is one
round trip. Every ask goes through the whole runtime path: envelope, bounded
mailbox, reply slot, a per-request deadline (timed by the pool's one deadline
timer, which would cancel the handler), the cancellation link between caller
and handler, the trace carrier (empty: no tracer provider is installed, as in
the other benchmarks) and the worker's crash handling. The figure is round
trips per second of wall time, the median of ``REPETITIONS`` (5) runs, each in
a fresh event loop.

Run: ``python benchmarks/w4_actor_roundtrip.py`` (asyncio is the headline
figure; trio is printed too).
"""

from __future__ import annotations

import statistics
import time

import anyio

from replan.actors import ActorContext, ActorPool

MESSAGES = 100_000
CALLERS = 8
WORKERS = 4
MAILBOX = 64
REPETITIONS = 5
TARGET = 50_000.0


class Echo:
    """Answers every request with itself."""

    async def handle(self, request: int, ctx: ActorContext) -> int:
        return request


async def _round_trips(messages: int) -> float:
    """Send ``messages`` requests through an echo pool; return msg/s."""
    pool: ActorPool[int, int] = ActorPool(
        "echo", Echo, workers=WORKERS, mailbox_size=MAILBOX
    )
    per_caller, extra = divmod(messages, CALLERS)

    async def caller(index: int, count: int) -> None:
        run_id = f"run-{index}"
        for request in range(count):
            deadline = anyio.current_time() + 60
            reply = await pool.ask(request, run_id=run_id, deadline=deadline)
            if reply != request:
                raise AssertionError(f"wrong reply {reply} for {request}")

    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)
        started = time.perf_counter()
        async with anyio.create_task_group() as callers:
            for index in range(CALLERS):
                callers.start_soon(caller, index, per_caller + (index < extra))
        elapsed = time.perf_counter() - started
        pool.stop("benchmark over")
    return messages / elapsed


def measure(backend: str, messages: int = MESSAGES) -> float:
    """Median msg/s over ``REPETITIONS`` fresh runs on ``backend``."""
    rates = [
        anyio.run(_round_trips, messages, backend=backend) for _ in range(REPETITIONS)
    ]
    return statistics.median(rates)


def main() -> dict[str, float]:
    """Measure on asyncio and trio; print and return the figures."""
    figures: dict[str, float] = {}
    for key, backend, label in (
        ("w4_msg_per_s", "asyncio", "W4 actor round trips"),
        ("w4_trio_msg_per_s", "trio", "W4 actor round trips (trio)"),
    ):
        figures[key] = measure(backend)
        print(f"{label}: {figures[key]:,.0f} msg/s (median of {REPETITIONS})")
    verdict = "meets" if figures["w4_msg_per_s"] >= TARGET else "MISSES"
    print(f"asyncio {verdict} the target of {TARGET:,.0f} msg/s")
    return figures


if __name__ == "__main__":
    main()
