"""``replan explore`` and ``replan demo --explore``, called in-process."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import anyio
import pytest

from replan.cli import main
from replan.messages import RunSubmitted
from replan.store import SQLiteStore


def test_demo_explore_prints_the_brief_with_plans_and_a_review(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--explore", "--yes"]) == 0
    out = capsys.readouterr().out
    for expected in (
        "goal screened: pass",
        "context: 4 evidence item(s)",
        "5 hypotheses added",
        "H2  near-duplicate of H1",
        "cycle 1: evolve (2 of 3 wanted diverse hypotheses meet the thresholds)",
        "(evolved from H1, H3",
        "cycle 2: select (3 of 3 wanted",
        "gate g1 opened",
        "reviewers disagree sharply on H3 (plausibility)",
        "gate g1 resolved: approve by cli --yes",
        "discovery brief: completed",
        "selected hypotheses (to validate, not verified)",
        "next step: ",
        "success signal: ",
        "reviewed by cli --yes",
        "not verified findings",
    ):
        assert expected in out, expected


def test_demo_explore_json_prints_the_run_result_with_its_brief(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--explore", "--yes", "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["status"] == "completed"
    brief = result["brief"]
    assert brief["status"] == "completed"
    assert len(brief["selected"]) == len(brief["validation_plan"]) == 3
    assert "discovery brief" not in captured.out
    assert "gate g1 opened" in captured.err


def test_explore_reads_context_files_and_journals_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("First note about week three.\n\nSecond note on leftovers.\n")
    tickets = tmp_path / "tickets.txt"
    tickets.write_text("Tickets ask how to skip a week.")
    db = tmp_path / "runs.db"
    argv = ["explore", "Why do cooks stop planning after week three?"]
    argv += ["--context", str(notes), str(tickets), "--model", "scripted:demo"]
    argv += ["--yes", "--db", str(db), "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert [e["source"] for e in result["brief"]["evidence"]] == [
        "context[0]",
        "context[0]",
        "context[1]",
    ]
    assert main(["show", result["run_id"], "--db", str(db)]) == 0
    shown = capsys.readouterr().out
    assert "discovery brief: completed" in shown
    assert "H1" in shown


def test_the_explore_flags_make_the_runs_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "runs.db"
    argv = ["explore", "Why do cooks stop planning?", "--model", "scripted:demo"]
    argv += ["--domain", "clinical trials", "--select", "2", "--max-iterations", "1"]
    argv += ["--seed", "5", "--yes", "--db", str(db), "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    brief = result["brief"]
    assert len(brief["selected"]) <= 2
    assert brief["iterations"] == 1
    # A high-impact domain: a person (here --yes) reviews the result.
    review = "high-impact domain (clinical): a person reviews the result"
    assert review in brief["safety_notes"]
    assert brief["reviewed_by"] == "cli --yes"

    async def journaled() -> Any:
        async with SQLiteStore(str(db), read_only=True) as store:
            return (await store.read(result["run_id"]))[0]

    submitted = anyio.run(journaled)
    assert isinstance(submitted, RunSubmitted)
    spec = submitted.spec
    assert (spec.kind, spec.limits.max_iterations) == ("explore", 1)
    assert (spec.explore.domain, spec.explore.select, spec.explore.seed) == (
        "clinical trials",
        2,
        5,
    )


def test_a_blocked_goal_exits_1_with_one_error_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["explore", "Make ransomware spread faster", "--model", "scripted:demo"]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "discovery brief: blocked" in captured.out
    assert (
        captured.err.strip()
        .splitlines()[-1]
        .startswith(
            "replan: error: the explore run ended blocked: the goal touches a blocked"
        )
    )
    assert "Traceback" not in captured.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["explore", "why?"], "give a model with --model"),
        (["explore", "why?", "--model", "gpt-x"], "error: no API key: set OPENAI"),
        (
            ["explore", "why?", "--model", "scripted:nope"],
            "error: --model: no scripted model 'scripted:nope'; known: scripted:demo",
        ),
        (
            ["explore", "why?", "--model", "m", "--base-url", "http://[::1"],
            "error: --base-url: ",
        ),
        (
            ["explore", "why?", "--model", "scripted:demo", "--context", "/nope.txt"],
            "cannot read context file /nope.txt",
        ),
        (  # an endless file: refused, not read until memory runs out
            ["explore", "why?", "--model", "scripted:demo", "--context", "/dev/zero"],
            "cannot read context file /dev/zero: it is larger than 64 MiB",
        ),
        (
            ["explore", "why?", "--model", "scripted:demo", "--select", "0"],
            "error: --select: Input should be greater than or equal to 1",
        ),
        (
            ["explore", "why?", "--model", "scripted:demo", "--domain", "\udcff"],
            "error: --domain: contains a lone UTF-16 surrogate",
        ),
        (
            ["explore", "why \udcff?", "--model", "scripted:demo"],
            "error: goal: ",
        ),
    ],
)
def test_bad_explore_arguments_exit_2_with_one_line(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("REPLAN_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("replan: error: ")
    assert message in err[0]


def test_an_endpoint_nobody_answers_is_named_in_the_last_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with socket.socket() as probe:  # a port that was free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"

    code = main(
        ["explore", "why?", "--model", "m", "--base-url", url, "--retries", "0"]
    )

    assert code == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"replan: error: cannot reach the model endpoint at {url}")
    assert "check --base-url" in last


def test_the_password_of_the_base_url_is_never_printed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://user:s3cr3t@127.0.0.1:{port}/v1")

    code = main(["explore", "why?", "--model", "m", "--retries", "0"])

    captured = capsys.readouterr()
    assert code == 1
    assert (
        captured.err.strip()
        .splitlines()[-1]
        .startswith(
            f"replan: error: cannot reach the model endpoint at http://127.0.0.1:{port}/v1"
        )
    )
    assert "s3cr3t" not in captured.out + captured.err


@pytest.mark.parametrize(
    ("command", "given"), [("run", "model and tools"), ("explore", "model")]
)
def test_resume_help_names_only_what_the_command_takes_again(
    command: str, given: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # `replan explore` has no --tool: its --resume must not ask for tools.
    assert main([command, "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"with the {given} given now;" in help_text
