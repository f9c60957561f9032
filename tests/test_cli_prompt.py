"""The stdin a gate's question reads: a question that stops waiting leaves
its line to the next question, never to a question asked after it."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator

import anyio
import pytest

from replan._cli_prompt import StdinLines


@pytest.fixture
def stdin(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A pipe as stdin; yields the fd to write the user's lines to."""
    read_end, write_end = os.pipe()
    pipe = open(read_end, encoding="utf-8")  # noqa: SIM115 - closed below
    monkeypatch.setattr(sys, "stdin", pipe)
    try:
        yield write_end
    finally:
        os.close(write_end)  # a reader still waiting gets the end of input
        for thread in threading.enumerate():
            if thread.name == "replan prompt":
                thread.join(5)
        pipe.close()


async def test_a_question_stops_waiting_at_once_when_cancelled(stdin: int) -> None:
    lines = StdinLines()
    with anyio.move_on_after(0.2) as waited:
        await lines.read()
    assert waited.cancelled_caught


async def test_the_line_being_read_when_a_question_stopped_answers_the_next(
    stdin: int,
) -> None:
    lines = StdinLines()
    with anyio.move_on_after(0.1):
        await lines.read()

    async def answer_later() -> None:
        await anyio.sleep(0.1)
        readers = [t for t in threading.enumerate() if t.name == "replan prompt"]
        assert len(readers) == 1  # no two threads take turns at stdin
        os.write(stdin, b"y\n")

    async with anyio.create_task_group() as tg:
        tg.start_soon(answer_later)
        with anyio.fail_after(5):
            assert await lines.read() == "y"


async def test_an_answer_typed_while_no_question_waits_answers_none(
    stdin: int,
) -> None:
    lines = StdinLines()
    with anyio.move_on_after(0.1):
        await lines.read()
    os.write(stdin, b"y\n")  # too late for the question withdrawn
    for _ in range(100):  # until the reader has taken it
        if not any(t.name == "replan prompt" for t in threading.enumerate()):
            break
        await anyio.sleep(0.02)

    os.write(stdin, b"n\n")
    with anyio.fail_after(5):
        assert await lines.read() == "n"
