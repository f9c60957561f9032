"""The command line on journals it cannot use: damaged, or another
application's database."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from replan.cli import main


def test_show_names_the_damaged_event_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"
    assert main(["demo", "--yes", "--json", "--db", str(db)]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("UPDATE events SET payload = '{broken' WHERE seq = 3")
        conn.commit()

    assert main(["show", run_id[:8], "--db", str(db)]) == 1

    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(
        f"replan: error: {db}: run {run_id}: event 3 cannot be read (Invalid JSON"
    )
    assert captured.err.count("\n") == 1


def test_show_names_the_event_that_does_not_follow_a_deleted_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"
    assert main(["demo", "--yes", "--json", "--db", str(db)]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("DELETE FROM events WHERE seq = 4")
        conn.commit()

    assert main(["show", run_id, "--db", str(db)]) == 1

    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"replan: error: {db}: run {run_id}: event 5 (")
    assert "does not follow the events before it" in captured.err
    assert captured.err.count("\n") == 1


def test_a_run_refuses_to_journal_into_another_applications_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "app.db"
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.commit()
    before = db.read_bytes()

    assert main(["demo", "--yes", "--db", str(db)]) == 1

    assert capsys.readouterr().err == (
        f"replan: error: {db} holds another application's tables\n"
    )
    assert db.read_bytes() == before


def test_a_journal_path_in_a_missing_directory_is_an_argument_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "typo" / "runs.db"

    assert main(["demo", "--yes", "--db", str(db)]) == 2

    assert capsys.readouterr().err == (
        f"replan: error: --db: no directory {db.parent} to keep the journal in\n"
    )
    assert not db.parent.exists()
