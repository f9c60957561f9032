"""Following a run at the terminal and asking about its gates there.

What ``replan demo``, ``run`` and ``explore`` share: the run's events are
printed as they come, and each gate is asked at the prompt while the events
go on being followed, so that a gate settled otherwise (its timeout, the
run's deadline or end) stops being asked.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskGroup

from . import _render
from ._cli_log import held as logs_held
from ._errors import GateError
from .messages import GateOpened, GateRequest, GateResolution, GateResolved
from .supervisor import RunHandle, RunState, Supervisor, apply

if TYPE_CHECKING:
    from .cli import Console

PROMPT = "Approve this change? [y/N/e(dit not supported here)] "


async def follow(
    sup: Supervisor, handle: RunHandle, console: Console, *, yes: bool
) -> None:
    """Print one entry per event; ask about each gate as it opens.

    The events go on being followed while a question waits for its answer,
    so that a gate settled otherwise meanwhile (its timeout, the run's
    deadline, the run's end) stops being asked.
    """
    state: RunState | None = None
    gates = _GateQuestions(sup, console, yes=yes)
    async with anyio.create_task_group() as tg:
        async for event in handle.events():
            state = apply(state, event)
            if isinstance(event, GateResolved):
                gates.settled(event.gate_id, event.resolution)
            gates.show(_render.event_lines(event, state))
            if isinstance(event, GateOpened):
                gates.opened(event.request, tg)
        gates.run_ended()


class _GateQuestions:
    """A run's gates, asked at the terminal one at a time.

    While a question waits for its answer, the run's progress is held back
    (it would break into the question) and printed after it. A gate settled
    by anything else meanwhile is asked no more: its question stops
    waiting, one line says why, and the command goes on.
    """

    def __init__(self, sup: Supervisor, console: Console, *, yes: bool) -> None:
        self._sup = sup
        self._console = console
        self._yes = yes
        self._stdin = StdinLines()
        self._terminal = anyio.Lock()
        self._unanswered: dict[str, anyio.CancelScope] = {}
        """The gates asked, or waiting their turn, that have no answer yet."""
        self._asking: str | None = None
        """The gate whose question is on the terminal now."""
        self._held: list[str] = []
        self._run_id = ""

    def show(self, lines: Sequence[str]) -> None:
        """Print progress lines now, or after the question on the terminal."""
        if self._asking is None:
            self._console.emit(lines, to_progress=True)
        else:
            self._held.extend(lines)

    def opened(self, request: GateRequest, tg: TaskGroup) -> None:
        self._run_id = request.run_id
        scope = self._unanswered[request.gate_id] = anyio.CancelScope()
        tg.start_soon(self._ask, request, scope)

    def settled(self, gate_id: str, resolution: GateResolution) -> None:
        """The run journaled the gate's resolution: stop asking about it,
        unless the answer was given here."""
        scope = self._unanswered.pop(gate_id, None)
        if scope is None:
            return
        scope.cancel()
        if self._asking == gate_id:
            gate = self._short(gate_id)
            if resolution.by == "policy:timeout":
                why = f"gate {gate} timed out: {_PAST[resolution.decision]} by policy"
            else:
                why = (
                    f"gate {gate} was resolved meanwhile "
                    f"({resolution.decision} by {resolution.by}): no answer needed"
                )
            self._stop_asking(why)

    def run_ended(self) -> None:
        """No gate waits for an answer once the run's events have ended."""
        for gate_id, scope in list(self._unanswered.items()):
            scope.cancel()
            if self._asking == gate_id:
                gate = self._short(gate_id)
                self._stop_asking(f"gate {gate} needs no answer: the run ended")
        self._unanswered.clear()

    def _short(self, gate_id: str) -> str:
        return _render.short_gate_id(gate_id, self._run_id)

    def _stop_asking(self, why: str) -> None:
        # The question waits on its line, with no newline after it.
        self._asking = None
        held, self._held = self._held, []
        self._console.emit(["", why, *held], to_progress=True)

    async def _ask(self, request: GateRequest, scope: anyio.CancelScope) -> None:
        with scope:
            async with self._terminal:
                self._asking = request.gate_id
                try:
                    with logs_held():  # the library's log lines wait too
                        resolution = await _decide(
                            request, self._console, self._stdin.read, yes=self._yes
                        )
                finally:
                    if self._asking == request.gate_id:
                        self._asking = None
                        held, self._held = self._held, []
                        self._console.emit(held, to_progress=True)
            if self._unanswered.pop(request.gate_id, None) is None:
                return  # settled otherwise meanwhile, and said so
            try:
                await resolve(self._sup, request, resolution)
            except GateError:  # its timeout, or the run's end, came first
                gate = self._short(request.gate_id)
                self.show([f"the answer to gate {gate} came too late: not taken"])


_PAST = {"approve": "approved", "reject": "rejected", "edit": "edited"}


async def _decide(
    request: GateRequest,
    console: Console,
    read_line: Callable[[], Awaitable[str]],
    *,
    yes: bool,
) -> GateResolution:
    if yes:
        return GateResolution(decision="approve", by="cli --yes")
    question, edited = PROMPT, "a plan"
    if request.tool_call is not None:
        question = question.replace(
            "this change",
            f"the {request.tool_call.name} call of task {request.task_id}",
        )
        edited = "a tool call"
    elif request.hypotheses is not None:
        question = question.replace("this change", "this selection")
        edited = "the selection"
    elif request.task_id is not None:
        question = question.replace("this change", f"task {request.task_id}")
        edited = "a task"
    while True:
        print(
            _render.terminal_text(question), end="", file=console.progress, flush=True
        )
        try:
            reply = await read_line()
        except EOFError:
            print(file=console.progress)
            return GateResolution(decision="reject", by="cli", note="no answer")
        if not _interactive():
            # Piped: show it.
            print(_render.terminal_text(reply), file=console.progress, flush=True)
        match reply.strip().lower():
            case "y" | "yes":
                return GateResolution(decision="approve", by="cli")
            case "" | "n" | "no":
                return GateResolution(decision="reject", by="cli")
            case "e" | "edit":
                note = f"editing {edited} is not supported here: answer y or n"
            case _:
                note = "please answer y or n"
        console.emit([note], to_progress=True)


_GIVEN_UP = object()


class StdinLines:
    """Lines of stdin for the questions, read on a daemon thread.

    A question stops waiting at once (Ctrl-C, or its gate settled
    otherwise), where a thread blocked in ``input()`` could not be
    stopped: the thread is left reading, and holds up no exit. The line it
    reads goes to the question waiting when it comes, or nowhere: an
    answer typed for a question that was withdrawn answers no other one.
    A missing or closed stdin reads as end of input.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reading = False
        self._waiting: queue.SimpleQueue[object] | None = None

    async def read(self) -> str:
        """The next line of stdin, without its newline; EOFError at the end."""
        mine: queue.SimpleQueue[object] = queue.SimpleQueue()
        with self._lock:
            self._waiting = mine
            if not self._reading:  # else the line being read comes here
                self._reading = True
                threading.Thread(
                    target=self._read, name="replan prompt", daemon=True
                ).start()
        try:
            line = await anyio.to_thread.run_sync(mine.get, abandon_on_cancel=True)
        finally:
            with self._lock:
                if self._waiting is mine:
                    self._waiting = None
            mine.put(_GIVEN_UP)  # frees the worker thread if this was cancelled
        if isinstance(line, BaseException):
            raise line
        assert isinstance(line, str)
        return line

    def _read(self) -> None:
        line: object
        try:
            line = _stdin_line()
        except (RuntimeError, OSError, ValueError):  # no stdin at all
            line = EOFError()
        except BaseException as exc:
            line = exc
        with self._lock:
            self._reading = False
            waiting, self._waiting = self._waiting, None
        if waiting is not None:
            waiting.put(line)


def _stdin_line() -> str:
    """The next line of stdin, without its newline; EOFError at the end.

    A real stdin is read a byte at a time with ``os.read``: a thread blocked
    there holds no lock of ``sys.stdin``'s buffer, which the interpreter
    needs at exit (``input()`` holds it whenever stdin or stdout is not a
    terminal, and exiting after Ctrl-C then aborts). Bytes that do not
    decode become U+FFFD, so such a line is asked again rather than taken
    as the end of input. A stdin with no file descriptor (a test's
    StringIO) is read with ``input()``.
    """
    stdin = sys.stdin
    if stdin is None:
        raise EOFError
    try:
        fd = stdin.fileno()
    except (AttributeError, OSError, ValueError):
        return input()
    line = bytearray()
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            if not line:
                raise EOFError
            break
        line += byte
    encoding = getattr(stdin, "encoding", None) or "utf-8"
    return line.decode(encoding, errors="replace").removesuffix("\n")


def _interactive() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


async def resolve(
    sup: Supervisor, request: GateRequest, resolution: GateResolution
) -> None:
    # The run registers the gate right after journaling gate_opened; give it
    # the moment it needs before answering.
    for _ in range(100):
        if sup.gates.get(request.gate_id) is not None:
            break
        await anyio.sleep(0.01)
    await sup.gates.resolve(request.gate_id, resolution)
