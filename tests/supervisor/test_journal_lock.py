"""The driver's journal lock: exclusive, first come first served, cancel-safe."""

from __future__ import annotations

import anyio
from anyio import wait_all_tasks_blocked

from replan.supervisor._run import _JournalLock


async def test_holders_never_overlap_and_waiters_go_in_arrival_order() -> None:
    lock = _JournalLock()
    inside: list[str] = []
    order: list[str] = []
    release = anyio.Event()

    async def hold(name: str) -> None:
        async with lock:
            inside.append(name)
            assert inside == [name]  # nobody else holds it
            order.append(name)
            if name == "first":
                await release.wait()
            else:
                await anyio.lowlevel.checkpoint()
            inside.remove(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold, "first")
        await wait_all_tasks_blocked()
        for name in ("second", "third", "fourth"):
            tg.start_soon(hold, name)
            await wait_all_tasks_blocked()
        release.set()
    assert order == ["first", "second", "third", "fourth"]


async def test_a_waiter_cancelled_in_the_queue_does_not_block_the_next() -> None:
    lock = _JournalLock()
    got: list[str] = []

    async def take(name: str) -> None:
        async with lock:
            got.append(name)

    async with anyio.create_task_group() as tg:
        await lock.__aenter__()
        tg.start_soon(take, "queued")
        await wait_all_tasks_blocked()
        async with anyio.create_task_group() as inner:
            inner.start_soon(take, "cancelled")
            await wait_all_tasks_blocked()
            inner.cancel_scope.cancel()
        tg.start_soon(take, "next")
        await wait_all_tasks_blocked()
        await lock.__aexit__(None, None, None)
    assert got == ["queued", "next"]


async def test_a_waiter_cancelled_as_it_is_handed_the_lock_passes_it_on() -> None:
    lock = _JournalLock()
    got: list[str] = []

    async def take(name: str) -> None:
        async with lock:
            got.append(name)

    async with anyio.create_task_group() as tg:
        await lock.__aenter__()
        async with anyio.create_task_group() as inner:
            inner.start_soon(take, "handed-then-cancelled")
            await wait_all_tasks_blocked()
            tg.start_soon(take, "after")
            await wait_all_tasks_blocked()
            # Cancel the first waiter, then hand it the lock before it runs.
            inner.cancel_scope.cancel()
            await lock.__aexit__(None, None, None)
    assert got == ["after"]
    async with lock:  # and it is free again
        pass
