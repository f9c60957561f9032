"""The ``replan`` command line: ``run``, ``explore``, ``demo``, ``show``, ``runs``,
and the daemon's client commands (``submit``, ``watch``, ``gates``, ...).

``main`` returns the exit status instead of exiting, so tests call it
in-process: 0 on success, 1 for a run-time problem (a missing journal, an
unknown run, a demo run that did not complete), 2 for bad arguments. User
errors print one ``replan: error: ...`` line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shlex
import signal
import sqlite3
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn, TextIO

import anyio
from anyio.abc import TaskStatus

from . import _remote, _render
from ._cli_log import command_logging
from ._cli_prompt import follow
from ._cli_run import (
    RUN_SPEC_FLAGS,
    check_resume,
    run_goal,
    whole_number,
    without_credentials,
)
from ._cli_run import add_run_parser as _add_run_parser
from ._cli_signals import stop_signals
from ._demo import MAX_LATENCY_S, demo_model, demo_spec
from ._errors import ConfigurationError, JournalCorrupt
from ._explore_cli import (
    EXPLORE_SPEC_FLAGS,
    add_explore_parser,
    explore,
    explore_demo,
)
from ._version import __version__
from .llm import Model, Tool
from .messages import (
    RunResult,
    RunSpec,
    RunStatus,
)
from .store import MemoryStore, SQLiteStore, Store
from .supervisor import RunState, Supervisor, fold_journal
from .supervisor._exits import leaves
from .telemetry import TelemetrySetup, setup_if_asked
from .telemetry.setup import check_propagators

_ID = re.compile(r"[A-Za-z0-9_-]+")
_ID_OPTIONS = {
    ("run", "resume"): "--resume",
    ("explore", "resume"): "--resume",
    ("gates", "run_id"): "--run",
}
"""The ids given by an option rather than as an argument, by that option."""


class CommandError(Exception):
    """A problem to report as one line: ``replan: error: <message>``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Console:
    """Where output goes: results on ``out``, progress on ``progress``."""

    out: TextIO
    progress: TextIO

    def emit(self, lines: Sequence[str], *, to_progress: bool = False) -> None:
        stream = self.progress if to_progress else self.out
        for line in lines:
            print(_render.terminal_text(line), file=stream)
        stream.flush()


MAX_MESSAGE = 400
"""An error line is at most this many characters, ``replan: error: `` in."""


def main(argv: list[str] | None = None) -> int:
    """Run the ``replan`` command line and return its exit status."""
    _tolerant_output()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        _check(parser, args)
    except SystemExit as exc:  # argparse exits on --help and on bad arguments
        return 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 2
    if sys.stdout is None:  # ``replan ... >&-``
        return _failed(CommandError("cannot write the output: stdout is closed"))
    try:
        if args.command == "serve":
            return serve(args)  # the daemon configures logging itself
        with command_logging():
            return _command(args)
    except BaseException as exc:
        return _failed(exc)


def _command(args: argparse.Namespace) -> int:
    """Run a command other than ``serve``."""
    if args.command in _remote.COMMANDS:
        with _terminated_by_sigterm():
            return _remote.run(args)
    if args.command in ("show", "runs") and not args.db:
        with _terminated_by_sigterm():
            if args.command == "show":
                return _remote.show(args)
            return _remote.list_runs(args)
    return anyio.run(_interruptible, args)


@contextlib.contextmanager
def _terminated_by_sigterm() -> Iterator[None]:
    """SIGTERM ends a daemon client (``watch`` waits for a run's end) as
    it ends a local run: ``replan: terminated``, exit 143, rather than a
    silent death by the signal. Ctrl-C already raises KeyboardInterrupt."""

    def terminate(signum: int, frame: object) -> None:
        raise Terminated

    with _handling((signal.SIGTERM,), terminate):
        yield


@contextlib.contextmanager
def _handling(
    signals: Iterable[signal.Signals], handler: Callable[[int, object], None]
) -> Iterator[None]:
    """``handler`` takes ``signals`` for the block; the previous handlers
    are put back after it. Outside the main thread nothing changes: the
    caller's signals stay its own."""
    try:
        previous = {s: signal.signal(s, handler) for s in signals}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for s, before in previous.items():
            signal.signal(s, signal.SIG_DFL if before is None else before)


def _tolerant_output() -> None:
    """Output that cannot be encoded (an ASCII-only stdout) becomes ``?``
    rather than failing the command."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(AttributeError, ValueError, OSError):
                reconfigure(errors="replace")


_DSN_PAIR = re.compile(
    r"\s*(host|hostaddr|port|dbname|user|password|passfile|service|sslmode"
    r"|options|application_name|connect_timeout)\s*=",
    re.IGNORECASE,
)
"""The start of a libpq connection string of keyword/value pairs."""


def _is_dsn(db: str) -> bool:
    """Whether ``--db`` names a PostgreSQL journal: a ``postgresql://`` URI,
    or keyword/value pairs (``host=... dbname=...``) no file is named."""
    if re.match(r"(?i)postgres(ql)?://", db):
        return True
    return _DSN_PAIR.match(db) is not None and not Path(db).exists()


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Argument errors argparse cannot see by itself."""
    db = getattr(args, "db", None)
    if db == "":
        parser.error(f"{args.command}: --db needs a file path")
    if db is not None and _is_dsn(db):
        # A DSN would be read as a (missing) file: a URI with its slashes
        # collapsed, keyword/value pairs as a file's name.
        parser.error(
            f"{args.command}: --db takes a SQLite journal file; a PostgreSQL "
            "journal is read through the daemon serving it (--url URL)"
        )
    if args.command == "run":
        check_resume(parser, args, RUN_SPEC_FLAGS, "GOAL")
    if args.command == "explore":
        check_resume(parser, args, EXPLORE_SPEC_FLAGS, "GOAL")
    # A blank path is Path(""), the current directory: "Is a directory: '.'".
    if args.command == "submit" and args.spec is not None and not args.spec.strip():
        parser.error(f"{args.command}: SPEC cannot be empty")
    if args.command == "explore" and any(not c.strip() for c in args.context or []):
        parser.error(f"{args.command}: --context cannot be empty")
    for name in ("run_id", "gate_id", "resume"):
        value = getattr(args, name, None)
        # Named as the help shows it: an option by its flag (`gates --run`).
        label = _ID_OPTIONS.get((args.command, name), name.upper())
        if value is not None and not value.strip():
            parser.error(f"{args.command}: {label} cannot be empty")
        if value is not None and not _ID.fullmatch(value):
            # Ids are hex and dashes; anything else would reach another URL.
            parser.error(
                f"{args.command}: {label} {value!r} is no id: "
                "ids hold letters, digits, '-' and '_' only"
            )
    if (
        args.command in ("show", "runs")
        and not args.db
        and not (args.url or os.environ.get("REPLAN_URL"))
    ):
        parser.error(f"{args.command}: give --db PATH or --url URL")
    if args.command in ("show", "runs") and args.db and args.url:
        # One would be left unread (REPLAN_URL alone gives way to --db).
        parser.error(f"{args.command}: give --db PATH or --url URL, not both")


def _failed(exc: BaseException) -> int:
    """Report what ended the command as one line; return the exit status.

    A failure inside a run arrives wrapped in exception groups (the task
    groups it crossed): the innermost exceptions decide. Anything
    unexpected is still one line, never a traceback; ``REPLAN_DEBUG=1``
    re-raises it.
    """
    found = list(leaves(exc))
    if any(isinstance(e, KeyboardInterrupt) for e in found):
        print("replan: interrupted", file=sys.stderr)
        return 130
    if any(isinstance(e, Terminated) for e in found):
        print("replan: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    if any(isinstance(e, SystemExit) for e in found):
        raise exc
    if all(isinstance(e, BrokenPipeError) for e in found):
        # The reader went away (``replan show ... | head``): stop quietly, and
        # keep Python from complaining again when it flushes stdout at exit.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    first = next(e for e in found if not isinstance(e, BrokenPipeError))
    code = 1
    match first:
        case CommandError():
            message, code = str(first), first.code
        case _remote.RemoteError():
            message, code = str(first), first.code
        case ConfigurationError():
            # A setting the command was given that cannot be used, named (a
            # --db journal another supervisor holds to itself, a bad limit).
            message, code = str(first), 2
        case JournalCorrupt():
            message = str(first)
        case sqlite3.Error():
            message = f"the journal cannot be used: {first}"
        case OSError():
            message = str(first)  # e.g. the output cannot be written (disk full)
        case _:
            if os.environ.get("REPLAN_DEBUG"):
                raise exc
            message = f"unexpected {type(first).__name__}: {first}"
    with contextlib.suppress(OSError, ValueError, AttributeError):
        print(error_line(message), file=sys.stderr)
    return code


def error_line(message: str) -> str:
    """``replan: error: MESSAGE`` as one line a terminal shows as it is: line
    breaks folded, control characters as ``?``, at most MAX_MESSAGE long."""
    # A base URL's ``user:password@`` is sent, never shown.
    message = _render.terminal_text(without_credentials(" ".join(message.split())))
    line = f"replan: error: {message}"
    if len(line) > MAX_MESSAGE:
        line = line[: MAX_MESSAGE - 1] + "…"
    return line


class _Parser(argparse.ArgumentParser):
    """Every argument error reads ``replan: error: ...``, subcommands included.

    No flag is taken from a prefix of its name (``--ye`` for ``--yes``): a
    script that relies on one breaks when a later release adds a flag that
    shares the prefix, and a typo may name another flag.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        # The message quotes what was given (``unrecognized arguments: ...``),
        # which may be long or hold line breaks and escape sequences.
        self.exit(2, error_line(message) + "\n")

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: None = None
    ) -> argparse.Namespace:
        """As argparse's, but an argument no parser took after a command
        (``replan demo --bogus``) is refused with that command's usage,
        not the top level's."""
        argv = list(sys.argv[1:] if args is None else args)
        parsed, extras = self.parse_known_args(argv, namespace)
        if extras:
            self._parser_of(parsed, argv, extras[0]).error(
                f"unrecognized arguments: {' '.join(extras)}"
            )
        return parsed

    def _parser_of(
        self, parsed: argparse.Namespace, argv: list[str], extra: str
    ) -> argparse.ArgumentParser:
        """The parser of the command ``extra`` came after, or this one."""
        command = getattr(parsed, "command", None)
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and command in argv:
                if extra in argv and argv.index(extra) < argv.index(command):
                    break  # given before the command: a top-level one
                found = action.choices.get(command)
                if isinstance(found, argparse.ArgumentParser):
                    return found
        return self


def build_parser() -> argparse.ArgumentParser:
    """The ``replan`` argument parser, with one subparser per command."""
    parser = _Parser(
        prog="replan",
        description="Supervised actors for LLM agents that replan safely.",
    )
    parser.add_argument("--version", action="version", version=f"replan {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser(
        "demo",
        help="run the shipped research scenario offline (no API key)",
        description="Run a research agent whose first plan goes stale: watch the "
        "reviewer ask for a scope_shift replan and approve it at the human gate.",
    )
    demo.add_argument("--yes", action="store_true", help="approve every gate")
    demo.add_argument(
        "--json", action="store_true", help="print only the run result as JSON"
    )
    demo.add_argument(
        "--db", metavar="PATH", help="journal the run in this SQLite file"
    )
    demo.add_argument(
        "--latency",
        metavar="SECONDS",
        type=_latency,
        default=0.0,
        help="simulated seconds per model call (default 0)",
    )

    _add_run_parser(commands)

    show = commands.add_parser(
        "show", help="print a journaled run: tasks, plan versions and diffs"
    )
    show.add_argument("run_id", metavar="RUN_ID", help="a run id, or a unique prefix")
    show.add_argument("--db", metavar="PATH", help="the SQLite journal")
    show.add_argument("--json", action="store_true", help="print the result as JSON")
    _remote.add_url(show)

    _add_serve(commands)
    _remote.add_commands(commands)

    demo.add_argument(
        "--explore",
        action="store_true",
        help="run the explore scenario instead: hypotheses and a discovery brief",
    )
    add_explore_parser(commands)

    runs = commands.add_parser("runs", help="list the runs of a journal, newest first")
    runs.add_argument("--db", metavar="PATH", help="the SQLite journal")
    _remote.add_url(runs)
    runs.add_argument(
        "--limit",
        type=whole_number(1, 1_000_000),
        default=100,
        help="at most this many (default 100)",
    )
    return parser


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more seconds: {text!r}")
    return value


def _latency(text: str) -> float:
    value = _seconds(text)
    if value > MAX_LATENCY_S:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_LATENCY_S:g} seconds: {text!r}"
        )
    return value


class Terminated(BaseException):
    """SIGTERM ended the command (after it wound down): exit 143.

    A BaseException, as KeyboardInterrupt is, so that no handler on the
    way out takes it for a failure of the command.
    """


async def _interruptible(args: argparse.Namespace) -> int:
    """Run the command; Ctrl-C or SIGTERM cancels it, a second one stops at once.

    The first signal cancels the command, which then closes its supervisor
    and journal; a second one during that wind-down exits without waiting
    (the journal survives a crash). Left to the event loop, a second
    SIGINT raised ``KeyboardInterrupt`` wherever the cancellation stood and
    could leave it spinning, and SIGTERM (``docker stop``, ``timeout``)
    killed the command before it closed its journal.
    """
    work = anyio.CancelScope()
    stopped_by: int | None = None

    async def watch(
        *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        nonlocal stopped_by
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            task_status.started()
            async for signum in signals:
                if stopped_by is not None:
                    print(f"replan: {_STOPPED[signum]}", file=sys.stderr, flush=True)
                    os._exit(128 + signum)
                stopped_by = signum
                work.cancel()

    async with anyio.create_task_group() as tg:
        await tg.start(watch)
        try:
            with work:
                return await _dispatch(args)
        finally:
            tg.cancel_scope.cancel()
            if stopped_by == signal.SIGINT:
                raise KeyboardInterrupt
            if stopped_by == signal.SIGTERM:
                raise Terminated
    raise AssertionError("unreachable")  # pragma: no cover - mypy


_STOPPED = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


async def _dispatch(args: argparse.Namespace) -> int:
    if args.command in ("run", "explore", "demo"):
        # Progress on stdout, or on stderr when stdout carries the JSON.
        console = Console(sys.stdout, sys.stderr if args.json else sys.stdout)
        telemetry = _telemetry()
        try:
            if args.command == "run":
                return await run_goal(console, args)
            if args.command == "explore":
                return await explore(console, args)
            return await (explore_demo if args.explore else demo)(
                console,
                yes=args.yes,
                as_json=args.json,
                db=args.db,
                latency=args.latency,
            )
        finally:
            _flush(telemetry)
    console = Console(sys.stdout, sys.stderr)
    if args.command == "show":
        return await show(console, args.run_id, db=args.db, as_json=args.json)
    if args.command == "runs":
        return await list_runs(console, db=args.db, limit=args.limit)
    raise CommandError(f"unknown command {args.command!r}", code=2)


def _telemetry() -> TelemetrySetup:
    """Export spans as the ``OTEL_*`` variables say; console spans go to stderr.

    Unlike an application's default (OTLP), the CLI exports only when asked:
    ``OTEL_TRACES_EXPORTER`` or an ``OTEL_EXPORTER_OTLP_ENDPOINT``.
    """
    try:
        return setup_if_asked(console=sys.stderr)
    except ConfigurationError as exc:
        raise CommandError(f"{exc.field}: {exc.problem}", code=2) from None


TELEMETRY_FLUSH_S = 3.0
"""How long a command waits at its end to send its spans and metrics."""


def _flush(telemetry: TelemetrySetup) -> None:
    """Send what telemetry is buffered, waiting at most ``TELEMETRY_FLUSH_S``:
    a collector that is down must not hold the command's exit."""
    if not telemetry.shutdown(timeout_s=TELEMETRY_FLUSH_S):
        print(
            f"replan: telemetry not sent within {TELEMETRY_FLUSH_S:g}s "
            "(is the OTLP collector running?)",
            file=sys.stderr,
        )


# demo --------------------------------------------------------------------------


async def demo(
    console: Console, *, yes: bool, as_json: bool, db: str | None, latency: float
) -> int:
    """Run the demo scenario, following its events, and print how it went."""
    result = await supervise(
        console,
        demo_model(latency),
        demo_spec(),
        yes=yes,
        as_json=as_json,
        db=db,
        report=lambda state, _: _render.outcome_lines(state),
        again="replan run --model scripted:demo",
    )
    if result.status is not RunStatus.COMPLETED:
        reason = f": {result.stop_reason}" if result.stop_reason else ""
        raise CommandError(f"the demo run ended {result.status.value}{reason}")
    return 0


async def supervise(
    console: Console,
    model: Model,
    spec: RunSpec | None,
    *,
    yes: bool,
    as_json: bool,
    db: str | None,
    report: Callable[[RunState, RunResult], list[str]],
    tools: Sequence[Tool] = (),
    resume: str | None = None,
    kind: Literal["plan", "explore"] = "plan",
    again: str = "replan run",
) -> RunResult:
    """Run ``spec`` on a supervisor of its own: follow it live, answer its
    gates, then print the ``RunResult`` as JSON or the ``report`` lines.

    The journal is ``db`` (a SQLite file) when given, else in memory; the
    model is closed afterwards when it holds a connection. With ``resume``
    (a run id or a unique prefix; ``spec`` is None) the run of that ``kind``
    in ``db`` goes on from its journal instead. A run interrupted (Ctrl-C,
    SIGTERM) with a ``db`` is left unfinished there, and the command that
    goes on with it (``again``, ``--resume`` and ``--db``) is printed.
    """
    if resume is not None and (db is None or not await anyio.Path(db).is_file()):
        raise CommandError(f"--db: no journal at {db} to resume a run from", 2)
    store: Store = MemoryStore() if db is None else _open_store(db, create=True)
    run_id: str | None = None
    try:
        async with AsyncExitStack() as stack:
            aclose = getattr(model, "aclose", None)
            if aclose is not None:
                stack.push_async_callback(aclose)
            if resume is not None:
                assert isinstance(store, SQLiteStore)
                assert db is not None
                run_id = await _resumable(store, resume, db, kind)
            sup = await stack.enter_async_context(
                Supervisor(model=model, store=store, tools=tools)
            )
            try:
                if run_id is not None:
                    handle = await sup.resume(run_id)
                else:
                    assert spec is not None
                    # Named before it is submitted: a signal that lands once
                    # its first event is written, before the handle is
                    # returned, leaves a run in the journal to tell of.
                    run_id = uuid.uuid4().hex
                    handle = await sup.submit(spec, run_id=run_id)
                await follow(sup, handle, console, yes=yes)
                result = await handle.result()
            except anyio.get_cancelled_exc_class():
                if (
                    db is not None
                    and run_id is not None
                    and await _in_journal(store, run_id)
                ):
                    # The options given again: --yes and --json as well.
                    flags = "".join(
                        f" {flag}"
                        for flag, on in (("--yes", yes), ("--json", as_json))
                        if on
                    )
                    line = (
                        f"replan: run {run_id} is left unfinished in {db}; to go "
                        f"on with it: {again}{flags} --resume {run_id} "
                        f"--db {shlex.quote(db)}"
                    )
                    print(_render.terminal_text(line), file=sys.stderr, flush=True)
                raise
            state = handle.state
    finally:
        await store.aclose()
    if as_json:
        console.emit([_render.terminal_json(result.model_dump_json(indent=2))])
    else:
        console.emit(["", *report(state, result)])
        if db:
            hint = f"replan show {result.run_id} --db {shlex.quote(db)}"
            console.emit(["", f"journal: {hint}"])
    return result


async def _in_journal(store: Store, run_id: str) -> bool:
    """Whether the journal holds ``run_id`` (as the command is cancelled:
    shielded). A journal that cannot tell is taken to hold it: the line on
    how to go on costs nothing if the run is not there."""
    found = True
    with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
        found = await store.get_run(run_id) is not None
    return found


async def _resumable(
    store: SQLiteStore, prefix: str, db: str, kind: Literal["plan", "explore"]
) -> str:
    """The id of the run ``prefix`` names in ``db``, if it is of ``kind``."""
    run_id = await _find_run(store, prefix, db)
    summary = await store.get_run(run_id)
    if summary is not None and summary.kind != kind:
        command = "replan explore" if summary.kind == "explore" else "replan run"
        raise CommandError(
            f"run {run_id} is {'an explore' if summary.kind == 'explore' else 'a plan'}"
            f" run: resume it with {command} --resume",
            2,
        )
    return run_id


# serve -------------------------------------------------------------------------


def _add_serve(commands: Any) -> None:
    serve = commands.add_parser(
        "serve",
        help="run the HTTP API daemon (needs the daemon extra)",
        description="Serve the HTTP API: durable runs, human gates, event streams. "
        "Every option is also a REPLAN_* variable (REPLAN_PORT, REPLAN_API_TOKEN, "
        "...) or a key of the --config TOML file; options win, then variables.",
    )
    serve.add_argument(
        "--config", metavar="FILE", help="a TOML settings file (REPLAN_CONFIG)"
    )
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8470; 0: any free port)")
    serve.add_argument(
        "--port-file",
        metavar="PATH",
        help="write the address the daemon listens on (http://HOST:PORT) into "
        "PATH once it listens; removed as it exits",
    )
    serve.add_argument(
        "--data-dir",
        metavar="DIR",
        help="journal and token directory (default ./replan-data)",
    )
    serve.add_argument(
        "--model", help="scripted:demo (default), python:MODULE:NAME, openai:NAME"
    )
    serve.add_argument(
        "--model-latency",
        type=_latency,
        metavar="SECONDS",
        help="seconds each call of a scripted model takes (REPLAN_MODEL_LATENCY_S)",
    )
    serve.add_argument(
        "--tool",
        action="append",
        dest="tools",
        metavar="MODULE:NAME",
        help="an executor tool, or a list of them (repeat for more; "
        "REPLAN_TOOLS=a:b,c:d)",
    )
    serve.add_argument(
        "--workers",
        action="append",
        metavar="ROLE=N",
        help="global concurrency of a role (repeat: --workers executor=64; "
        "REPLAN_WORKERS=executor=64,planner=2)",
    )
    serve.add_argument(
        "--max-active-runs",
        type=whole_number(1, 1_000_000),
        metavar="N",
        help="unfinished runs at once; more submissions get 429 (default 1000)",
    )
    serve.add_argument(
        "--drain-grace",
        type=_seconds,
        metavar="SECONDS",
        help="on SIGTERM, how long calls in flight may take to finish "
        "(default 10; REPLAN_DRAIN_GRACE_S)",
    )
    serve.add_argument(
        "--retention",
        choices=["compact", "delete", "off"],
        help="what becomes of old finished runs (default compact)",
    )
    serve.add_argument(
        "--retention-age",
        type=_seconds,
        metavar="SECONDS",
        help="finished runs older than this are compacted or deleted "
        "(default 604800, 7 days; REPLAN_RETENTION_AGE_S)",
    )
    serve.add_argument(
        "--retention-interval",
        type=_seconds,
        metavar="SECONDS",
        help="how often retention looks for them "
        "(default 3600; REPLAN_RETENTION_INTERVAL_S)",
    )
    serve.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="default info",
    )


def serve(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM, SIGINT or SIGHUP; 0 after a clean drain.

    The daemon listens for the signals itself once it serves. Before that
    (the imports and the journal check take a few seconds) and after (as
    it sends its last spans), either one stops the command at once, as a
    second signal does, with nothing started or all of it journaled: exit
    0, not a death by the signal.
    """
    try:
        with _stopped_by_signals():
            return _serve(args)
    except BaseException as exc:
        stopped = [e for e in leaves(exc) if isinstance(e, StoppedBySignal)]
        if not stopped:
            raise
        print(f"replan: stopped by {stopped[0].signal_name}", file=sys.stderr)
        return 0


class StoppedBySignal(BaseException):
    """SIGTERM, SIGINT or SIGHUP reached ``replan serve`` while its daemon did not
    listen for them itself. A BaseException, so that nothing on the way out
    takes it for a failure of the command."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signal_name = signal.Signals(signum).name


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """SIGTERM, SIGINT and SIGHUP raise :class:`StoppedBySignal` until the daemon
    installs its own handlers (which put these back as they close)."""

    def stop(signum: int, frame: object) -> None:
        raise StoppedBySignal(signum)

    with _handling(stop_signals(), stop):
        yield


def _serve(args: argparse.Namespace) -> int:
    # The web framework reads OTEL_PROPAGATORS as it is imported (and fails
    # on a propagator that is not installed): checked first, for one line.
    try:
        check_propagators()
    except ConfigurationError as exc:
        raise CommandError(str(exc), 2) from None
    try:
        from .daemon import load_settings
        from .daemon import serve as serve_daemon
    except ImportError as exc:
        raise CommandError(
            f"the daemon needs its extra: pip install 'replan[daemon]' ({exc})", 2
        ) from None
    workers: dict[str, int] | None = None
    for item in args.workers or []:
        role, _, size = item.partition("=")
        if role.strip() in (workers or {}):
            raise CommandError(f"--workers: {role.strip()} is given twice", 2)
        try:
            workers = {**(workers or {}), role.strip(): int(size)}
        except ValueError:
            raise CommandError(f"--workers takes ROLE=N, not {item!r}", 2) from None
    try:
        settings = load_settings(
            args.config,
            host=args.host,
            port=args.port,
            port_file=args.port_file,
            data_dir=args.data_dir,
            model=args.model,
            model_latency_s=args.model_latency,
            tools=args.tools,
            workers=workers,
            max_active_runs=args.max_active_runs,
            drain_grace_s=args.drain_grace,
            retention=args.retention,
            retention_age_s=args.retention_age,
            retention_interval_s=args.retention_interval,
            log_level=args.log_level,
        )
        serve_daemon(settings)
    except ConfigurationError as exc:
        raise CommandError(str(exc), 2) from None
    return 0


# show and runs -----------------------------------------------------------------


async def show(console: Console, run_id: str, *, db: str, as_json: bool) -> int:
    """Print a journaled run rebuilt from its events."""
    store = _open_store(db, create=False)
    try:
        full_id = await _find_run(store, run_id, db)
        events = await store.read(full_id)
        if not events:
            raise CommandError(f"run {full_id} has no events in {db}")
        try:
            state = fold_journal(full_id, events)
            effects = await store.read_tool_effects(full_id)
        except JournalCorrupt as exc:
            raise CommandError(f"{db}: {exc}") from None
    finally:
        await store.aclose()
    if as_json:
        console.emit([_render.terminal_json(state.result().model_dump_json(indent=2))])
    else:
        console.emit(_render.run_report(state, effects))
    return 0


async def list_runs(console: Console, *, db: str, limit: int) -> int:
    """Print one line per run: id, status, pattern, goal."""
    store = _open_store(db, create=False)
    try:
        summaries = await store.list_runs(limit=limit)
    finally:
        await store.aclose()
    if not summaries:
        console.emit([f"no runs in {db}"], to_progress=True)
    for s in summaries:
        goal = " ".join(s.goal.split())
        if len(goal) > 60:
            goal = goal[:59] + "…"
        shape = s.kind if s.kind == "explore" else s.pattern
        console.emit([f"{s.run_id}  {s.status.value:<17} {shape:<9}  {goal}"])
    return 0


def _open_store(db: str, *, create: bool) -> SQLiteStore:
    """The journal at ``db``: to write runs into (``create``), or to read
    (``show``, ``runs``), which opens it read-only and so never changes it.

    A journal to write goes into a directory that exists: a mistyped path
    is an error, not a tree of new directories.
    """
    parent = Path(db).parent
    if create and not parent.is_dir():
        raise CommandError(f"--db: no directory {parent} to keep the journal in", 2)
    try:
        return SQLiteStore(db, read_only=not create)
    except ConfigurationError as exc:  # names the file already
        raise CommandError(exc.problem) from None
    except (OSError, sqlite3.Error) as exc:
        raise CommandError(f"cannot open the journal at {db}: {exc}") from None


async def _find_run(store: SQLiteStore, run_id: str, db: str) -> str:
    """The run id itself, or the one run whose id starts with ``run_id``."""
    if run_id and await store.get_run(run_id) is not None:
        return run_id
    matches = [
        s.run_id
        for s in await store.list_runs(limit=1_000_000)
        if run_id and s.run_id.startswith(run_id)
    ]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise CommandError(
            f"run id prefix {run_id} matches {len(matches)} runs in {db}"
        )
    raise CommandError(f"no run {run_id} in {db}")


if __name__ == "__main__":
    raise SystemExit(main())
