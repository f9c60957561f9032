"""The command line at its edges: odd output streams, odd arguments, odd
spec files; each failure is one line with the documented exit status."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import anyio
import pytest

from replan.cli import main


def _replan(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replan", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    """A journal holding a demo run and an explore run."""
    db = tmp_path / "runs.db"
    assert main(["demo", "--yes", "--json", "--db", str(db)]) == 0
    assert main(["demo", "--explore", "--yes", "--json", "--db", str(db)]) == 0
    return db


def test_an_ascii_only_stdout_gets_a_substitute_not_a_crash(journal: Path) -> None:
    listed = _replan("runs", "--db", str(journal), PYTHONIOENCODING="ascii")
    assert listed.returncode == 0, listed.stderr
    assert "?" in listed.stdout  # the ellipsis of a long goal

    brief = _replan("demo", "--explore", "--yes", PYTHONIOENCODING="ascii")
    assert brief.returncode == 0, brief.stderr
    assert brief.stderr == ""


def test_explore_runs_are_listed_and_shown_as_explore(
    journal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["runs", "--db", str(journal)]) == 0
    shapes = [line.split()[2] for line in capsys.readouterr().out.splitlines()]
    assert shapes == ["explore", "discovery"]

    assert main(["runs", "--db", str(journal), "--limit", "1"]) == 0
    explore_id = capsys.readouterr().out.split()[0]
    assert main(["show", explore_id, "--db", str(journal)]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert "kind     explore" in shown
    assert not any(line.startswith("pattern") for line in shown)


def test_the_journal_hint_can_be_pasted_into_a_shell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "my runs.db"
    assert main(["demo", "--yes", "--db", str(db)]) == 0
    hint = capsys.readouterr().out.splitlines()[-1]
    assert hint.startswith("journal: replan show ")

    argv = shlex.split(hint.removeprefix("journal: replan "))
    assert argv[-1] == str(db)
    assert main(argv) == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--yes", "--db", ""], "demo: --db needs a file path"),
        (["run", "g", "--db", ""], "run: --db needs a file path"),
        (["explore", "g", "--db", ""], "explore: --db needs a file path"),
        (["runs", "--db", ""], "runs: --db needs a file path"),
        (["show", "abc", "--db", ""], "show: --db needs a file path"),
        (
            ["runs", "--db", "postgresql://replan@db.internal/agents"],
            "runs: --db takes a SQLite journal file; a PostgreSQL journal",
        ),
        (["show", "abc", "--db", "postgres://h/db"], "show: --db takes a SQLite"),
        (
            ["runs", "--db", "host=db.internal dbname=agents"],
            "runs: --db takes a SQLite journal file; a PostgreSQL",
        ),
        (["show", "abc", "--db", "dbname=agents"], "show: --db takes a SQLite"),
        (["run", "g", "--db", " user=replan host=db"], "run: --db takes a SQLite"),
        (["show", "", "--db", "x.db"], "show: RUN_ID cannot be empty"),
        (["show", " ", "--url", "http://127.0.0.1:9"], "show: RUN_ID cannot be empty"),
        (["approve", "", "--url", "http://127.0.0.1:9"], "approve: GATE_ID cannot"),
        (["watch", "", "--url", "http://127.0.0.1:9"], "watch: RUN_ID cannot be"),
        (["run", "--resume", "", "--db", "x.db"], "run: --resume cannot be empty"),
        (["explore", "--resume", " ", "--db", "x.db"], "explore: --resume cannot be"),
        (["run", "--resume", "a/b", "--db", "x.db"], "run: --resume 'a/b' is no id"),
        (["gates", "--run", "", "--url", "http://127.0.0.1:9"], "gates: --run cannot"),
        (["gates", "--run", "a/b", "--url", "http://127.0.0.1:9"], "gates: --run 'a/b"),
        (
            ["runs", "--db", "x.db", "--limit", "9" * 20],
            "argument --limit: must be at most",
        ),
        (
            ["runs", "--db", "x.db", "--limit", "0"],
            "argument --limit: must be at least 1:",
        ),
        (
            ["runs", "--db", "x.db", "--limit", "1000001"],
            "argument --limit: must be at most 1000000:",
        ),
        (
            ["runs", "--db", "x.db", "--url", "http://127.0.0.1:9"],
            "runs: give --db PATH or --url URL, not both",
        ),
        (
            ["show", "abc", "--url", "http://127.0.0.1:9", "--db", "x.db"],
            "show: give --db PATH or --url URL, not both",
        ),
        (["submit", "--url", "http://127.0.0.1:9"], "give a SPEC file or --goal"),
        (["submit", "", "--url", "http://127.0.0.1:9"], "submit: SPEC cannot be empty"),
        (
            ["explore", "q", "--model", "scripted:demo", "--context", "a.txt", " "],
            "explore: --context cannot be empty",
        ),
        (["submit", "--goal", "g"], "give --url URL or set REPLAN_URL"),
        (["watch", "abc"], "give --url URL or set REPLAN_URL"),
        (["approve", "g1"], "give --url URL or set REPLAN_URL"),
        (["cancel", "abc"], "give --url URL or set REPLAN_URL"),
    ],
)
def test_bad_arguments_exit_2_in_one_error_line(
    argv: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REPLAN_URL", raising=False)

    assert main(argv) == 2

    errors = [
        line
        for line in capsys.readouterr().err.splitlines()
        if not line.startswith("usage:")
    ]
    assert len(errors) == 1
    assert errors[0].startswith(f"replan: error: {message}")
    assert list(tmp_path.iterdir()) == []  # no journal was made


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"goal": "g", "limits": {"deadline_s": NaN}}', "limits.deadline_s"),
        ('{"goal": "g", "limits": {"token_budget": Infinity}}', "limits.token_budget"),
        ('{"goal": "g", "limits": {"deadline_s": -1e400}}', "limits.deadline_s"),
        ('{"goal": "g", "tasks": [{"id": "t1"}, {"x": 1e400}]}', "tasks.1.x"),
    ],
)
def test_a_spec_with_a_number_json_cannot_carry_names_the_field(
    text: str, field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(text)

    assert main(["submit", str(spec), "--url", "http://127.0.0.1:9"]) == 2

    assert capsys.readouterr().err == (
        f"replan: error: cannot read the spec {spec}: {field} is not a finite "
        "number (no NaN, Infinity or number too large for a float)\n"
    )


def test_a_closed_stdout_is_one_error_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["sh", "-c", 'exec "$0" -m replan demo --yes >&-', sys.executable],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert proc.returncode == 1
    assert proc.stderr == "replan: error: cannot write the output: stdout is closed\n"


@pytest.mark.parametrize(
    ("failure", "line"),
    [
        pytest.param(
            ValueError("1 validation error\n  Invalid JSON\n    see https://x"),
            "replan: error: unexpected ValueError: 1 validation error Invalid JSON "
            "see https://x\n",
            id="many-lines",
        ),
        pytest.param(
            ValueError("x" * 5000),
            f"replan: error: unexpected ValueError: {'x' * 361}…\n",
            id="long",
        ),
    ],
)
def test_every_failure_message_is_one_bounded_line(
    failure: BaseException,
    line: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("REPLAN_DEBUG", raising=False)

    def fail(*args: object, **kwargs: object) -> NoReturn:
        raise failure

    monkeypatch.setattr(anyio, "run", fail)

    assert main(["demo", "--yes"]) == 1
    err = capsys.readouterr().err
    assert err == line
    assert len(err.rstrip("\n")) <= 400


def test_the_spec_on_stdin_is_read_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({"goal": 1e400})))

    assert main(["submit", "-", "--url", "http://127.0.0.1:9"]) == 2
    assert "cannot read the spec -: goal is not a finite number" in (
        capsys.readouterr().err
    )


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_an_endless_spec_is_refused_not_read_until_memory_runs_out(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    from replan import _remote

    assert main(["submit", "/dev/zero", "--url", "http://127.0.0.1:9"]) == 2
    assert capsys.readouterr().err == (
        "replan: error: cannot read the spec /dev/zero: it is larger than 64 MiB, "
        "the most a daemon takes\n"
    )

    monkeypatch.setattr(_remote, "MAX_SPEC_BYTES", 100)
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({"goal": "x" * 100})))
    assert main(["submit", "-", "--url", "http://127.0.0.1:9"]) == 2
    assert "cannot read the spec -: it is larger than" in capsys.readouterr().err


def test_a_model_module_that_exits_as_it_is_imported_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("replan.daemon")
    (tmp_path / "model_exits_at_import.py").write_text("raise SystemExit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    code = main(
        ["serve", "--model", "python:model_exits_at_import:MODEL", "--port", "0",
         "--data-dir", str(tmp_path / "data")]
    )  # fmt: skip

    assert code == 2
    assert capsys.readouterr().err == (
        "replan: error: model: importing model_exits_at_import raised SystemExit(3)\n"
    )


def test_a_logged_error_is_one_short_line_without_its_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import logging

    from replan._cli_log import command_logging

    monkeypatch.delenv("REPLAN_DEBUG", raising=False)
    log = logging.getLogger("replan.supervisor")
    with command_logging():
        try:
            raise OSError("disk full")
        except OSError:
            log.exception("run r1 crashed")
        log.warning("a\nwarning")
        log.info("not shown")
    log.warning("after the command: not shown")
    assert capsys.readouterr().err.splitlines() == [
        "replan: error: run r1 crashed: OSError: disk full",
        "replan: warning: a warning",
    ]


@pytest.mark.parametrize(
    ("argv", "usage", "unknown"),
    [
        (["demo", "--bogus"], "usage: replan demo ", "--bogus"),
        (["runs", "--db", "x.db", "extra"], "usage: replan runs ", "extra"),
        (["run", "goal", "--nope", "1"], "usage: replan run ", "--nope 1"),
        (["--bogus", "demo"], "usage: replan [-h]", "--bogus"),
        # A prefix of a flag's name is no flag: --ye was taken for --yes.
        (["demo", "--ye"], "usage: replan demo ", "--ye"),
        (["runs", "--d", "x.db"], "usage: replan runs ", "--d x.db"),
    ],
)
def test_an_unknown_argument_shows_the_usage_of_its_command(
    argv: list[str], usage: str, unknown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(usage)
    assert err.endswith(f"\nreplan: error: unrecognized arguments: {unknown}\n")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["demo", "one\ntwo\x1b]0;retitled\x07"],
            "replan: error: unrecognized arguments: one two?]0;retitled?",
        ),
        (
            ["demo", "--latency", "x" * 5000],
            f"replan: error: argument --latency: not a number: '{'x' * 349}…",
        ),
        (
            ["runs", "--db", "x.db", "http://ana:secret@example.com"],
            "replan: error: unrecognized arguments: http://example.com",
        ),
    ],
)
def test_a_bad_argument_is_one_bounded_line_whatever_it_holds(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.endswith(f"\n{line}\n")
    assert len(err.splitlines()[-1]) <= 400


def test_log_lines_wait_for_the_question_at_the_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import logging

    from replan._cli_log import command_logging, held

    monkeypatch.delenv("REPLAN_DEBUG", raising=False)
    log = logging.getLogger("replan.llm")
    with command_logging():
        with held():
            sys.stderr.write("Approve this change? [y/N] ")
            log.warning("no usage")
            try:
                raise TimeoutError
            except TimeoutError:
                log.exception("a call")
            sys.stderr.write("y\n")
        log.warning("after")
    assert capsys.readouterr().err.splitlines() == [
        "Approve this change? [y/N] y",
        "replan: warning: no usage",
        "replan: error: a call: TimeoutError",
        "replan: warning: after",
    ]
