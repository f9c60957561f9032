"""The ``replan`` command line, called in-process and once as a real process.

These tests are synchronous: ``main`` runs its own event loop with anyio.run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import select
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import anyio
import pytest

from replan.cli import main


def run_json(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[dict[str, Any], str]:
    assert main(argv) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def test_demo_json_prints_only_the_run_result_and_progress_goes_to_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result, err = run_json(["demo", "--yes", "--json"], capsys)

    assert result["kind"] == "run_result"
    assert result["status"] == "completed"
    assert [r["outcome"] for r in result["replans"]] == ["applied"]
    assert "gate g1 opened" in err
    assert "run finished: completed" in err


def test_demo_shows_progress_gate_diff_versions_output_and_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--yes"]) == 0
    out = capsys.readouterr().out

    for expected in (
        "plan v1: 4 tasks",
        "task t1 completed",
        "milestone 1 reviewed by the model: replan (scope_shift, confidence 0.85",
        "gate g1 opened",
        "proposed change:",
        "gate g1 resolved: approve by cli --yes",
        "replan applied (scope_shift): plan v2, 3 removed, 4 added, 1 preserved",
        "milestone 2 reviewed by the heuristic: continue",
        "run finished: completed",
        "v2  scope_shift, approved by cli --yes",
        "- t2  Extract key findings from the top results",
        "+ t5  Survey the state space model literature",
        "= t1  Search recent papers on transformer efficiency",
        "usage by role",
    ):
        assert expected in out
    assert out.index("run finished") < out.index("plan versions")


def test_the_console_module_runs_the_demo_without_an_api_key() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    proc = subprocess.run(
        [sys.executable, "-m", "replan.cli", "demo", "--yes", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=45,
        check=False,
    )

    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "completed"
    assert [r["outcome"] for r in result["replans"]] == ["applied"]
    assert "Traceback" not in proc.stderr


def test_show_prints_both_plan_versions_and_the_diff_of_a_journaled_demo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "j.db")
    result, _ = run_json(["demo", "--yes", "--json", "--db", db], capsys)
    run_id = result["run_id"]

    assert main(["show", run_id, "--db", db]) == 0
    out = capsys.readouterr().out

    assert f"run      {run_id}" in out
    assert "status   completed" in out
    assert "t2  superseded  Extract key findings" in out
    assert "t5  completed   Survey the state space model literature" in out
    assert "v1  first plan" in out
    assert "v2  scope_shift, approved by cli --yes" in out
    assert "- t2  Extract key findings from the top results" in out
    assert "+ t8  Draft a summary of the current state" in out
    assert "= t1  Search recent papers on transformer efficiency" in out


def test_show_json_equals_the_result_of_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "j.db")
    result, _ = run_json(["demo", "--yes", "--json", "--db", db], capsys)

    shown, _ = run_json(["show", result["run_id"][:8], "--db", db, "--json"], capsys)

    assert shown == result


def test_a_journal_file_named_like_a_connection_string_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    # Made as ./user=ana.db: a path, where user=ana.db alone reads as a DSN.
    result, _ = run_json(["demo", "--yes", "--json", "--db", "./user=ana.db"], capsys)

    assert main(["runs", "--db", "user=ana.db"]) == 0
    assert capsys.readouterr().out.split()[0] == result["run_id"]


def test_runs_lists_each_journaled_run_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "j.db")
    first, _ = run_json(["demo", "--yes", "--json", "--db", db], capsys)
    second, _ = run_json(["demo", "--yes", "--json", "--db", db], capsys)

    assert main(["runs", "--db", db]) == 0
    lines = capsys.readouterr().out.splitlines()

    assert len(lines) == 2
    assert {line.split()[0] for line in lines} == {first["run_id"], second["run_id"]}
    assert all(line.split()[1:3] == ["completed", "discovery"] for line in lines)
    assert all("efficient sequence modelling" in line for line in lines)


def test_runs_lists_the_newest_100_unless_told_otherwise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from datetime import UTC, datetime, timedelta

    from replan import RunSpec
    from replan.messages import RunStatus, RunSubmitted
    from replan.store import RunSummary, SQLiteStore

    db = tmp_path / "j.db"
    t0 = datetime(2026, 1, 5, tzinfo=UTC)

    async def journal() -> None:
        async with SQLiteStore(db) as store:
            for n in range(101):
                at = t0 + timedelta(seconds=n)
                run_id = f"run-{n:03}"
                spec = RunSpec(goal=f"goal {n}")
                submitted = RunSubmitted(seq=1, at=at, run_id=run_id, spec=spec)
                row = RunSummary(
                    run_id=run_id,
                    goal=spec.goal,
                    kind="plan",
                    pattern=spec.pattern,
                    status=RunStatus.RUNNING,
                    created_at=at,
                    updated_at=at,
                    last_seq=1,
                )
                await store.append(run_id, [submitted], row)

    anyio.run(journal)
    assert main(["runs", "--db", str(db)]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == [f"run-{n:03}" for n in range(100, 0, -1)]
    assert main(["runs", "--db", str(db), "--limit", "101"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 101


def test_show_with_a_missing_journal_fails_in_one_line_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "nowhere" / "j.db"

    assert main(["show", "abc", "--db", str(db)]) == 1

    captured = capsys.readouterr()
    assert captured.err == f"replan: error: no journal at {db}\n"
    assert captured.out == ""
    assert not db.parent.exists()


@pytest.mark.parametrize(
    "command",
    [
        ["runs"],
        ["show", "abc"],
        ["demo", "--yes"],
        ["run", "g", "--model", "scripted:demo"],
        ["explore", "q", "--model", "scripted:demo"],
    ],
)
def test_a_db_that_is_a_directory_is_named_as_one(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Writers said "cannot open DIR: unable to open database file", SQLite's
    # words; readers "no journal at DIR".
    assert main([*command, "--db", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"replan: error: {tmp_path} is a directory, not a journal file\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_runs_with_a_missing_journal_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"

    assert main(["runs", "--db", str(db)]) == 1

    assert capsys.readouterr().err == f"replan: error: no journal at {db}\n"
    assert not db.exists()


def test_show_with_an_unknown_run_id_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "j.db")
    run_json(["demo", "--yes", "--json", "--db", db], capsys)

    assert main(["show", "nope", "--db", db]) == 1

    assert capsys.readouterr().err == f"replan: error: no run nope in {db}\n"


def test_a_file_that_is_not_a_journal_is_reported_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"
    db.write_text("not a database\n")

    assert main(["show", "abc", "--db", str(db)]) == 1

    err = capsys.readouterr().err
    assert err == (
        f"replan: error: {db} cannot be used as a replan journal: "
        "file is not a database\n"
    )


@pytest.mark.parametrize("command", [["runs"], ["show", "abc"]])
def test_reading_a_file_that_holds_no_journal_leaves_it_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    # An empty file and another application's database: looking must not
    # turn either into a journal (no WAL header, no replan tables).
    empty = tmp_path / "empty.db"
    empty.touch()
    foreign = tmp_path / "foreign.db"
    with contextlib.closing(sqlite3.connect(foreign)) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.commit()
    before = foreign.read_bytes()

    for db in (empty, foreign):
        assert main([*command, "--db", str(db)]) == 1
        err = capsys.readouterr().err
        assert err == f"replan: error: {db} holds no replan journal\n"

    assert empty.stat().st_size == 0
    assert foreign.read_bytes() == before


def test_answering_no_at_the_prompt_rejects_the_gate_and_keeps_the_plan(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))

    result, err = run_json(["demo", "--json"], capsys)

    assert "Approve this change? [y/N/e(dit not supported here)]" in err
    assert "gate g1 resolved: reject by cli" in err
    assert result["status"] == "completed"
    assert [r["outcome"] for r in result["replans"]] == ["rejected_by_human"]
    assert [v["version"] for v in result["versions"]] == [1]
    assert [t["status"] for t in result["tasks"]] == ["completed"] * 4


def test_answering_yes_at_the_prompt_approves_the_gate(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("edit\ny\n"))

    result, err = run_json(["demo", "--json"], capsys)

    assert "editing a plan is not supported here" in err
    assert [r["outcome"] for r in result["replans"]] == ["applied"]
    assert result["versions"][1]["approved_by"] == "cli"


def test_edit_at_an_explore_review_names_the_selection_not_a_plan(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("e\ny\n"))

    result, err = run_json(["demo", "--explore", "--json"], capsys)

    assert "Approve this selection? [y/N/e(dit not supported here)]" in err
    assert "editing the selection is not supported here: answer y or n" in err
    assert "a plan" not in err
    assert result["brief"]["status"] == "completed"


def test_the_end_of_input_at_the_prompt_rejects_the_gate(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))

    result, _ = run_json(["demo", "--json"], capsys)

    assert result["replans"][0]["outcome"] == "rejected_by_human"
    assert result["replans"][0]["reason"] == "rejected by cli: no answer"


def test_no_stdin_at_all_at_the_prompt_rejects_the_gate(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # ``replan demo <&-``: Python has no sys.stdin, and input() says so.
    monkeypatch.setattr(sys, "stdin", None)

    result, _ = run_json(["demo", "--json"], capsys)

    assert result["replans"][0]["reason"] == "rejected by cli: no answer"


def test_ctrl_c_at_the_prompt_ends_the_command_at_once() -> None:
    """In a real terminal: nothing waits for the line input() still reads."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the demo on the pseudo-terminal
        os.execv(sys.executable, [sys.executable, "-m", "replan", "demo"])
    try:
        seen = _read_until(fd, b"Approve this change?")
        assert b"Approve this change?" in seen
        _wait_reading_the_terminal(pid)
        os.write(fd, b"\x03")  # Ctrl-C, as the terminal sends it
        seen += _read_until(fd, b"interrupted")
        assert b"replan: interrupted" in seen
        deadline = time.monotonic() + 10  # it hung until Enter before
        while not os.waitpid(pid, os.WNOHANG)[0]:
            assert time.monotonic() < deadline, "still running after Ctrl-C"
            time.sleep(0.05)
        pid = 0
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)


@pytest.mark.parametrize(
    ("flags", "prompt_on"),
    [
        pytest.param([], "stdout", id="progress-to-a-file"),
        pytest.param(["--json"], "stderr", id="json-to-a-file"),
    ],
)
def test_ctrl_c_at_the_prompt_exits_130_when_stdin_and_stdout_are_no_terminal(
    flags: list[str], prompt_on: str, tmp_path: Path
) -> None:
    """stdin a pipe, stdout a file (``replan demo --json > out.json``)."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "replan", "demo", *flags],
            stdin=subprocess.PIPE,
            stdout=stdout,
            stderr=stderr,
        )
        try:
            prompt = out if prompt_on == "stdout" else err
            _wait_for_text(prompt, "Approve this change?")
            _wait_reading_the_terminal(proc.pid)
            proc.send_signal(signal.SIGINT)
            code = proc.wait(30)
        finally:
            proc.kill()
            proc.wait()
            assert proc.stdin is not None
            proc.stdin.close()
    assert code == 130
    assert err.read_text().endswith("replan: interrupted\n")
    assert "Fatal Python error" not in err.read_text()


def _wait_for_text(path: Path, text: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while text not in path.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {path}"
        time.sleep(0.02)


@pytest.mark.parametrize(
    "answer",
    [pytest.param(b"\xff\n", id="not-utf8"), pytest.param(b"\xc3\n", id="cut-short")],
)
def test_an_undecodable_answer_at_the_prompt_is_asked_again(answer: bytes) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "replan", "demo", "--json"],
        input=answer + b"y\n",
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"},
    )

    assert proc.returncode == 0, proc.stderr
    assert b"please answer y or n" in proc.stderr
    result = json.loads(proc.stdout)
    assert [r["outcome"] for r in result["replans"]] == ["applied"]


def _wait_reading_the_terminal(pid: int, seconds: float = 30) -> None:
    """Until one of the child's threads blocks in ``read(0, ...)`` (input())."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for call in Path(f"/proc/{pid}/task").glob("*/syscall"):
            with contextlib.suppress(OSError):
                if call.read_text().startswith("0 0x0 "):  # read, fd 0
                    return
        time.sleep(0.02)
    raise AssertionError("the prompt never read the terminal")


def _read_until(fd: int, marker: bytes, seconds: float = 30) -> bytes:
    seen = b""
    deadline = time.monotonic() + seconds
    while marker not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                seen += os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
    return seen


@pytest.mark.parametrize(
    ("failure", "code", "line"),
    [
        pytest.param(
            ExceptionGroup("x", [sqlite3.OperationalError("database is locked")]),
            1,
            "replan: error: the journal cannot be used: database is locked\n",
            id="journal-in-a-group",
        ),
        pytest.param(
            BaseExceptionGroup("x", [ExceptionGroup("y", [BrokenPipeError()])]),
            1,
            "",
            id="broken-pipe-in-nested-groups",
        ),
        pytest.param(
            BaseExceptionGroup("x", [KeyboardInterrupt(), ValueError("v")]),
            130,
            "replan: interrupted\n",
            id="interrupt-in-a-group",
        ),
        pytest.param(
            OSError(28, "No space left on device"),
            1,
            "replan: error: [Errno 28] No space left on device\n",
            id="output-full",
        ),
        pytest.param(
            ExceptionGroup("x", [LookupError("gone")]),
            1,
            "replan: error: unexpected LookupError: gone\n",
            id="anything-else",
        ),
    ],
)
def test_a_failure_inside_a_run_is_one_line_however_it_is_wrapped(
    failure: BaseException,
    code: int,
    line: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("REPLAN_DEBUG", raising=False)
    monkeypatch.setattr(os, "dup2", lambda *args: None)  # keep pytest's stdout

    def fail(*args: object, **kwargs: object) -> NoReturn:
        raise failure

    monkeypatch.setattr(anyio, "run", fail)

    assert main(["demo", "--yes"]) == code
    assert capsys.readouterr().err == line


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["bogus"], id="unknown-command"),
        pytest.param(["demo", "--nope"], id="unknown-flag"),
        pytest.param(["demo", "--latency", "-1"], id="negative-latency"),
        # The daemon's --model-latency takes an hour at most: the demo too.
        pytest.param(["demo", "--latency", "3601"], id="latency-over-an-hour"),
        pytest.param(["demo", "--latency", "1e300"], id="latency-1e300"),
        pytest.param(["serve", "--model-latency", "3601"], id="model-latency"),
        pytest.param(["show", "abc"], id="show-without-db"),
        pytest.param([], id="no-command"),
    ],
)
def test_bad_arguments_exit_2_with_a_usage_message(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2

    err = capsys.readouterr().err
    assert err.startswith("usage: replan")
    assert "replan: error: " in err
    assert "Traceback" not in err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0

    out = capsys.readouterr().out
    assert all(command in out for command in ("demo", "show", "runs"))


# A command whose wind-down hangs once cancelled (a journal on a stuck disk).
_HUNG_WIND_DOWN = """
import sys, anyio, replan.cli

async def dispatch(args):
    try:
        # The command runs: its signal handlers are in place.
        print("ready", file=sys.stderr, flush=True)
        await anyio.sleep_forever()
    finally:
        print("winding down", file=sys.stderr, flush=True)
        with anyio.CancelScope(shield=True):
            await anyio.sleep_forever()

replan.cli._dispatch = dispatch
sys.exit(replan.cli.main(["runs", "--db", sys.argv[1]]))
"""


def test_a_second_ctrl_c_stops_a_command_whose_wind_down_hangs(tmp_path: Path) -> None:
    err = tmp_path / "stderr"
    with err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", _HUNG_WIND_DOWN, str(tmp_path / "j.db")],
            stdin=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            _wait_for_text(err, "ready")
            proc.send_signal(signal.SIGINT)
            _wait_for_text(err, "winding down")
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(0.3)  # the first Ctrl-C lets it wind down
            proc.send_signal(signal.SIGINT)
            code = proc.wait(10)
        finally:
            proc.kill()
            proc.wait()
    assert code == 130
    assert err.read_text().endswith("winding down\nreplan: interrupted\n")


def test_two_ctrl_c_at_once_end_a_run_with_one_line_and_a_readable_journal(
    tmp_path: Path,
) -> None:
    # As when a wrapper (`uv run`) and the terminal both pass Ctrl-C on.
    db = tmp_path / "j.db"
    err = tmp_path / "stderr"
    with err.open("wb") as stderr:
        command = ["demo", "--yes", "--latency", "0.2", "--db", str(db)]
        proc = subprocess.Popen(
            [sys.executable, "-m", "replan", *command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            deadline = time.monotonic() + 30
            while not db.exists():  # the run has started
                assert time.monotonic() < deadline, "the demo never started"
                time.sleep(0.02)
            time.sleep(0.3)
            proc.send_signal(signal.SIGINT)
            time.sleep(0.001)
            proc.send_signal(signal.SIGINT)
            code = proc.wait(10)
        finally:
            proc.kill()
            proc.wait()
    # 130, or killed by the second SIGINT once the first was reported.
    assert code in (130, -signal.SIGINT)
    lines = err.read_text().splitlines()
    assert lines[-1] == "replan: interrupted"
    assert all(line.startswith("replan: run ") for line in lines[:-1])
    assert main(["runs", "--db", str(db)]) == 0


def test_sigterm_winds_a_run_down_like_ctrl_c_and_exits_143(tmp_path: Path) -> None:
    # What `docker stop`, `timeout` or a CI runner's cancel sends.
    db = tmp_path / "j.db"
    err = tmp_path / "stderr"
    with err.open("wb") as stderr:
        command = ["demo", "--yes", "--latency", "0.2", "--db", str(db)]
        proc = subprocess.Popen(
            [sys.executable, "-m", "replan", *command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            deadline = time.monotonic() + 30
            while not db.exists():  # the run has started
                assert time.monotonic() < deadline, "the demo never started"
                time.sleep(0.02)
            time.sleep(0.3)
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(10)
        finally:
            proc.kill()
            proc.wait()
    assert code == 143
    hint, last = err.read_text().splitlines()
    assert last == "replan: terminated"
    assert hint.startswith("replan: run ")
    # The journal was closed: SQLite removes the WAL with its last connection.
    assert not Path(f"{db}-wal").exists()
    assert main(["runs", "--db", str(db)]) == 0


def _interrupted_demo(db: Path, tmp_path: Path, progress: str, *flags: str) -> str:
    """Start ``replan demo`` journaling to ``db``, SIGTERM it once it printed
    ``progress``, and return the line it printed on how to go on."""
    err = tmp_path / "stderr"
    out = tmp_path / "stdout"
    with err.open("wb") as stderr, out.open("wb") as stdout:
        command = ["demo", "--yes", "--latency", "0.2", "--db", str(db), *flags]
        proc = subprocess.Popen(
            [sys.executable, "-m", "replan", *command],
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
        )
        try:
            _wait_for_text(out, progress)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) == 143
        finally:
            proc.kill()
            proc.wait()
    hint, last = err.read_text().splitlines()
    assert last == "replan: terminated"
    return hint


async def _journal(db: Path) -> tuple[list[Any], list[Any]]:
    from replan.store import SQLiteStore

    async with SQLiteStore(str(db), read_only=True) as store:
        (summary,) = await store.list_runs()
        return [summary], await store.read(summary.run_id)


def test_an_interrupted_run_goes_on_with_the_command_it_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"
    hint = _interrupted_demo(db, tmp_path, "task t1 completed")
    (summary,), before = anyio.run(_journal, db)
    assert summary.status == "running"
    command = (
        f"replan run --model scripted:demo --yes --resume {summary.run_id} --db {db}"
    )
    assert hint == (
        f"replan: run {summary.run_id} is left unfinished in {db}; "
        f"to go on with it: {command}"
    )
    done_before = {e.task_id for e in before if e.kind == "task_finished"}
    assert done_before

    assert main(command.split()[1:]) == 0
    assert f"journal: replan show {summary.run_id}" in capsys.readouterr().out
    (summary,), after = anyio.run(_journal, db)
    assert summary.status == "completed"
    assert after[: len(before)] == before
    started_again = {
        e.task_id for e in after[len(before) :] if e.kind == "task_started"
    }
    assert not started_again & done_before  # finished tasks are not run again


@pytest.mark.parametrize("written", [True, False], ids=["written", "not-written"])
def test_a_signal_as_the_run_is_submitted_prints_the_resume_line_if_it_is_journaled(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    written: bool,
) -> None:
    # SIGTERM came as the run's first event was written, before the command
    # had the run's handle: the run was in the journal, and no line said
    # how to go on with it.
    from replan.store import SQLiteStore

    append = SQLiteStore.append

    async def append_then_signal(self: SQLiteStore, *args: Any) -> None:
        if written:
            await append(self, *args)
        os.kill(os.getpid(), signal.SIGTERM)
        await anyio.sleep(10)  # cancelled by the signal
        raise AssertionError("the signal did not cancel the command")

    monkeypatch.setattr(SQLiteStore, "append", append_then_signal)
    db = tmp_path / "j.db"

    assert main(["demo", "--yes", "--db", str(db)]) == 143

    monkeypatch.undo()
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "replan: terminated"
    runs = anyio.run(_journal_runs, db)
    if not written:
        assert runs == []
        assert err == ["replan: terminated"]
        return
    (summary,) = runs
    command = (
        f"replan run --model scripted:demo --yes --resume {summary.run_id} --db {db}"
    )
    assert err == [
        f"replan: run {summary.run_id} is left unfinished in {db}; "
        f"to go on with it: {command}",
        "replan: terminated",
    ]


async def _journal_runs(db: Path) -> list[Any]:
    from replan.store import SQLiteStore

    async with SQLiteStore(str(db), read_only=True) as store:
        return await store.list_runs()


def test_an_interrupted_explore_run_goes_on_with_replan_explore(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"
    hint = _interrupted_demo(db, tmp_path, "hypotheses added", "--explore")
    (summary,), _ = anyio.run(_journal, db)
    command = f"replan explore --model scripted:demo --yes --resume {summary.run_id}"
    assert hint.endswith(f"to go on with it: {command} --db {db}")
    # A prefix is enough, as for replan show; a plan command refuses it.
    assert (
        main(
            [
                "run",
                "--model",
                "scripted:demo",
                "--resume",
                summary.run_id[:8],
                "--db",
                str(db),
            ]
        )
        == 2
    )
    assert "is an explore run: resume it with replan explore --resume" in (
        capsys.readouterr().err
    )
    resume = ["explore", "--model", "scripted:demo", "--yes"]
    assert main([*resume, "--resume", summary.run_id[:8], "--db", str(db)]) == 0
    (summary,), _ = anyio.run(_journal, db)
    assert summary.status == "completed"


def test_a_gate_left_open_asks_again_when_the_run_is_resumed(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from replan.store import SQLiteStore

    append = SQLiteStore.append

    async def signal_at_the_gate(
        self: SQLiteStore, run_id: str, events: Any, *rest: Any
    ) -> None:
        await append(self, run_id, events, *rest)
        if any(e.kind == "gate_opened" for e in events):
            os.kill(os.getpid(), signal.SIGTERM)
            await anyio.sleep(10)  # cancelled by the signal

    monkeypatch.setattr(SQLiteStore, "append", signal_at_the_gate)
    db = tmp_path / "j.db"
    argv = ["run", "map the market", "--model", "scripted:demo", "--db", str(db)]
    assert main(argv) == 143
    monkeypatch.undo()
    (summary,), events = anyio.run(_journal, db)
    assert summary.status == "waiting_for_human"
    assert events[-1].kind == "gate_opened"
    capsys.readouterr()

    resume = ["run", "--model", "scripted:demo", "--resume", summary.run_id]
    assert main([*resume, "--db", str(db), "--yes"]) == 0
    assert "gate g1 resolved: approve by cli --yes" in capsys.readouterr().out
    (summary,), _ = anyio.run(_journal, db)
    assert summary.status == "completed"


def test_a_finished_runs_resume_prints_its_result_and_runs_nothing_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "j.db"
    db = str(path)
    model = ["--model", "scripted:demo"]
    first, _ = run_json(
        ["run", "map the market", *model, "--yes", "--json", "--db", db], capsys
    )
    (_,), before = anyio.run(_journal, path)
    prefix = first["run_id"][:8]
    again, _ = run_json(
        ["run", *model, "--resume", prefix, "--db", db, "--json"], capsys
    )
    assert again == first
    (summary,), after = anyio.run(_journal, path)
    assert (summary.status, after) == ("completed", before)
    # The other kind of command refuses it, naming the one to use.
    assert main(["explore", *model, "--resume", prefix, "--db", db]) == 2
    assert capsys.readouterr().err.endswith(
        f"replan: error: run {first['run_id']} is a plan run: "
        "resume it with replan run --resume\n"
    )


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        pytest.param(
            ["run"], "run: give GOAL, or --resume RUN_ID --db PATH", id="none"
        ),
        pytest.param(
            ["run", "x", "--resume", "abc", "--db", "j.db"],
            "run: --resume takes the run's GOAL from the journal",
            id="both",
        ),
        pytest.param(
            ["run", "--resume", "abc"],
            "run: --resume needs --db PATH, the run's journal",
            id="no-db",
        ),
        pytest.param(
            ["run", "--resume", "abc", "--db", "j.db", "--pattern", "contract"],
            "run: --pattern cannot change a journaled run",
            id="pattern",
        ),
        pytest.param(
            ["run", "--resume", "abc", "--db", "j.db", "--deadline", "5"],
            "run: --deadline cannot change a journaled run",
            id="limit",
        ),
        pytest.param(
            ["explore", "--resume", "abc", "--db", "j.db", "--select", "2"],
            "explore: --select cannot change a journaled run",
            id="explore-setting",
        ),
        pytest.param(
            ["run", "--model", "scripted:demo", "--resume", "abc", "--db", "no.db"],
            "--db: no journal at no.db to resume a run from",
            id="no-journal",
        ),
    ],
)
def test_resume_refuses_what_it_cannot_do(
    argv: list[str],
    problem: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert problem in capsys.readouterr().err


def test_the_demo_latency_makes_every_model_call_sleep_that_long(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import types

    import replan.llm._scripted as scripted

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(scripted, "anyio", types.SimpleNamespace(sleep=sleep))
    result, _ = run_json(["demo", "--yes", "--json", "--latency", "0.5"], capsys)

    calls = sum(u["calls"] for u in result["usage"]["by_role"].values())
    assert slept == [0.5] * calls
    assert slept


def test_the_demo_latency_is_bounded_as_the_daemon_bounds_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--yes", "--latency", "3601"]) == 2
    err = capsys.readouterr().err
    assert "argument --latency: must be at most 3600 seconds: '3601'" in err
