"""Text from a run (a goal anyone with the token may send, a model's answer,
a tool's result, a server's error) never drives the terminal it is shown on."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest

from replan import (
    Alignment,
    ModelRequest,
    PlanProposal,
    RunSpec,
    ScriptedModel,
    Supervisor,
    Synthesis,
    TaskDraft,
    TaskOutcome,
    Verdict,
)
from replan.cli import main
from replan.store import SQLiteStore

# Set the window title, clear the screen, turn the text red; a C1 CSI.
ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[31m\x9b0m\r"
CONTROL = [chr(c) for c in (*range(9), *range(11, 32), *range(127, 160))]


def _answer(request: ModelRequest) -> Any:
    match request.role, request.purpose:
        case "planner", _:
            task = TaskDraft(key="search", description=f"search {ESCAPES}")
            return PlanProposal(tasks=[task])
        case "executor", "execute":
            return TaskOutcome(
                success=True, summary=f"found {ESCAPES}", findings=[ESCAPES]
            )
        case "executor", "synthesize":
            return Synthesis(output=f"answer {ESCAPES}")
        case "reviewer", _:
            return Verdict(decision="continue", rationale=ESCAPES)
        case _:
            return Alignment(aligned=[True] * len(request.context["proposed"]))


@pytest.fixture
def journal(tmp_path: Path) -> tuple[Path, str]:
    db = tmp_path / "runs.db"

    async def run() -> str:
        async with (
            SQLiteStore(db) as store,
            Supervisor(model=ScriptedModel(_answer), store=store) as sup,
        ):
            handle = await sup.submit(RunSpec(goal=f"survey {ESCAPES} models"))
            await handle.result()
            return handle.run_id

    return db, anyio.run(run)


def _no_control(text: str) -> None:
    found = sorted({c for c in text if c in CONTROL})
    assert not found, f"control characters reach the terminal: {found}"


def test_runs_and_show_print_control_characters_as_question_marks(
    journal: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    db, run_id = journal

    assert main(["runs", "--db", str(db)]) == 0
    listed = capsys.readouterr().out
    assert main(["show", run_id, "--db", str(db)]) == 0
    shown = capsys.readouterr().out

    _no_control(listed)
    _no_control(shown)
    assert "survey ?]0;pwned??[2J?[31m?0m models" in listed
    assert "search ?]0;pwned" in shown
    assert "answer ?]0;pwned" in shown


def test_json_output_keeps_the_text_as_it_was_journaled(
    journal: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    db, run_id = journal

    assert main(["show", run_id, "--db", str(db), "--json"]) == 0
    out = capsys.readouterr().out

    _no_control(out.replace("\n", ""))  # JSON escapes them
    assert json.loads(out)["goal"] == f"survey {ESCAPES} models"


class _Daemon(ThreadingHTTPServer):
    """Answers every request with ``answer``: (status, JSON body)."""

    daemon_threads = True

    def __init__(self, answer: tuple[int, Any]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer = answer


class _Handler(BaseHTTPRequestHandler):
    server: _Daemon

    def do_GET(self) -> None:
        status, body = self.server.answer
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def daemon(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    server = _Daemon(request.param)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    monkeypatch.setenv("REPLAN_API_TOKEN", "a-token-of-sixteen-chars")
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


RUN = {
    "run_id": "r1",
    "status": "running",
    "pattern": "discovery",
    "kind": "plan",
    "goal": f"survey {ESCAPES} models",
}


@pytest.mark.parametrize(
    "daemon", [(200, {"runs": [RUN], "next_offset": None})], indirect=True
)
def test_runs_from_a_daemon_print_control_characters_as_question_marks(
    daemon: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", "--url", daemon]) == 0

    out = capsys.readouterr().out
    _no_control(out)
    assert "survey ?]0;pwned" in out


@pytest.mark.parametrize(
    "daemon",
    [(409, {"detail": f"run r1 {ESCAPES} ended", "field": "run_id"})],
    indirect=True,
)
def test_an_error_line_prints_control_characters_as_question_marks(
    daemon: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["show", "r1", "--url", daemon]) == 1

    err = capsys.readouterr().err
    _no_control(err.removesuffix("\n"))
    assert err.startswith("replan: error: 409: run r1 ?]0;pwned")
