"""``replan run`` against a Chat Completions server on 127.0.0.1."""

from __future__ import annotations

import io
import json
import os
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

import anyio
import httpx
import pytest
from chat_server import Logged, Reply, answer_type, chat_server, completion, error

from replan import Alignment, PlanProposal, Synthesis, TaskDraft, TaskOutcome, Verdict
from replan._cli_run import _provider, unreachable_message
from replan.cli import main
from replan.messages import ModelFailure, RunResult, RunStatus, Usage


def script(logged: Logged) -> Reply:
    match answer_type(logged):
        case "PlanProposal":
            return completion(
                PlanProposal(
                    tasks=[
                        TaskDraft(key="scan", description="scan the trade press"),
                        TaskDraft(key="rank", description="rank", depends_on=["scan"]),
                    ]
                )
            )
        case "TaskOutcome":
            return completion(TaskOutcome(success=True, summary="two makers ship"))
        case "Verdict":
            return completion(Verdict(decision="continue"))
        case "Alignment":
            return completion(Alignment(aligned=[True] * 10))  # one per task
        case _:
            return completion(Synthesis(output="Two makers ship cells at scale."))


@pytest.fixture(autouse=True)
def _no_ambient_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "REPLAN_MODEL"):
        monkeypatch.delenv(name, raising=False)


def test_run_json_prints_the_result_with_progress_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with chat_server(script) as server:
        code = main(
            ["run", "Who ships solid-state cells?", "--model", "m", "--base-url",
             server.base_url, "--max-replans", "1", "--yes", "--json"]
        )  # fmt: skip
        sent = server.chat_requests()
    captured = capsys.readouterr()
    assert code == 0
    result = json.loads(captured.out)
    assert result["status"] == "completed"
    assert result["output"] == "Two makers ship cells at scale."
    assert result["usage"]["by_role"]["executor"]["calls"] == 3  # 2 tasks, synthesis
    assert "plan v1: 2 tasks" in captured.err
    assert "run finished: completed" in captured.err
    assert {r.body["model"] for r in sent} == {"m"}
    assert sent[0].headers["authorization"] == "Bearer not-needed"


def test_the_library_warnings_reach_stderr_once_as_one_line_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def no_usage(logged: Logged) -> Reply:
        reply = script(logged)
        reply.body.pop("usage")
        return reply

    with chat_server(no_usage) as server:
        code = main(
            ["run", "Who ships solid-state cells?", "--model", "m", "--base-url",
             server.base_url, "--yes", "--json"]
        )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0
    assert json.loads(captured.out)["status"] == "completed"  # stdout stays JSON
    warnings = [line for line in captured.err.splitlines() if "no token usage" in line]
    assert warnings == [
        f"replan: warning: {server.base_url}/ (m) reports no token usage: its calls "
        "count 0 tokens, so a token_budget does not bound them and they cost 0"
    ]
    # The handler goes with the command: a second one does not print twice.
    with chat_server(no_usage) as server:
        assert main(["run", "x", "--model", "m", "--base-url", server.base_url]) == 0
    assert capsys.readouterr().err.count("no token usage") == 1


@pytest.mark.parametrize("command", ["run", "explore"])
@pytest.mark.parametrize("variable", ["openai:gpt-test", " openai:gpt-test\n"])
def test_a_model_named_openai_colon_name_as_for_the_daemon_asks_for_name(
    command: str, variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stripped first, as the model strips REPLAN_MODEL: an env file's spaces.
    monkeypatch.setenv("REPLAN_MODEL", variable)
    with chat_server(lambda _: error(500, "only the model name matters")) as server:
        main([command, "x", "--base-url", server.base_url, "--retries", "0"])
        sent = server.chat_requests()
    assert sent
    assert {r.body["model"] for r in sent} == {"gpt-test"}


def test_run_prints_a_summary_with_usage_and_cost(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPLAN_MODEL", "m")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with chat_server(script) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        code = main(["run", "Who ships solid-state cells?", "--yes"])
        sent = server.chat_requests()
    out = capsys.readouterr().out
    assert code == 0
    assert sent[0].headers["authorization"] == "Bearer sk-test"
    for expected in ("task t1 completed", "usage by role", "executor", "cost"):
        assert expected in out


def test_a_missing_api_key_is_one_line_naming_the_fix(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "anything", "--model", "gpt-4o-mini"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "replan: error: no API key: set OPENAI_API_KEY or pass --base-url "
        "for a local server\n"
    )


def test_a_missing_model_is_one_line_naming_the_fix(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "anything", "--base-url", "http://127.0.0.1:9/v1"]) == 2
    assert capsys.readouterr().err == (
        "replan: error: no model: pass --model NAME or set REPLAN_MODEL\n"
    )


def test_an_unreachable_endpoint_is_one_line_naming_the_fix(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with chat_server() as server:
        url = server.base_url  # closed when the block ends: nothing listens
    code = main(
        ["run", "anything", "--model", "m", "--base-url", url, "--retries", "0"]
    )
    err = capsys.readouterr().err.splitlines()
    assert code == 1
    assert err[-1].startswith(
        f"replan: error: cannot reach the model endpoint at {url}"
    )
    assert "check --base-url" in err[-1]


def test_a_bad_limit_names_its_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["run", "x", "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
         "--max-replans", "-1"]
    )  # fmt: skip
    assert code == 2
    assert capsys.readouterr().err.startswith("replan: error: --max-replans: ")


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--deadline", "nan"], "replan: error: --deadline: Input should be a finite"),
        (["--gate-timeout", "inf"], "replan: error: --gate-timeout: Input should be a"),
        (["--retries", "-3"], "replan: error: argument --retries: must be 0 or more"),
    ],
)
def test_a_limit_that_is_no_usable_number_is_refused(
    capsys: pytest.CaptureFixture[str], flags: list[str], expected: str
) -> None:
    code = main(
        ["run", "x", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", *flags]
    )
    assert code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(expected)


@pytest.mark.parametrize("command", ["run", "explore"])
def test_a_model_name_that_is_no_text_is_a_bad_argument(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # What a shell passes for bytes that are no UTF-8 (surrogateescape).
    code = main(
        [command, "x", "--model", "m\udcff", "--base-url", "http://127.0.0.1:9/v1"]
    )
    assert code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("replan: error: --model: 'm\\udcff' is no text")


def test_a_key_with_a_character_no_header_can_carry_is_one_line_not_shown(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-s\u00e9cret-key")
    code = main(["run", "x", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"])
    assert code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("replan: error: the key in OPENAI_API_KEY holds a")
    assert "cret-key" not in line


def run_with_findings(max_prompt_chars: str) -> tuple[int, list[Logged]]:
    """``replan run`` whose tasks report 200 findings each, with a prompt
    budget; its exit status and the requests the server got."""
    findings = [f"finding {n:03d}: " + "a maker ships cells " * 4 for n in range(200)]

    def many_findings(logged: Logged) -> Reply:
        if answer_type(logged) == "TaskOutcome":
            return completion(TaskOutcome(success=True, summary="s", findings=findings))
        return script(logged)

    with chat_server(many_findings) as server:
        code = main(
            ["run", "Who ships solid-state cells?", "--model", "m", "--base-url",
             server.base_url, "--max-prompt-chars", max_prompt_chars, "--yes",
             "--json"]
        )  # fmt: skip
        return code, server.chat_requests()


def test_max_prompt_chars_leaves_the_oldest_findings_out_of_the_review(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, sent = run_with_findings("6000")
    assert code == 0, capsys.readouterr().err
    reviews = [r for r in sent if answer_type(r) == "Verdict"]
    assert reviews
    for review in reviews:
        [system, user] = [m["content"] for m in review.messages[:2]]
        # The output format's instruction comes on top of the budget.
        system = system.split("\n\nReply with one JSON object")[0]
        assert len(system) + len(user) <= 6000
        assert "left out to fit the prompt" in user
        assert "finding 199: " in user  # the newest stay
        assert "finding 000: " not in user


def test_a_prompt_budget_below_a_thousand_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "x", "--model", "m", "--max-prompt-chars", "999"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "replan: error: argument --max-prompt-chars: "
        "must be at least 1000, or 0 for no bound: '999'"
    )


def test_a_prompt_budget_of_zero_sends_the_whole_history(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, sent = run_with_findings("0")
    assert code == 0, capsys.readouterr().err
    [review, *_] = [r for r in sent if answer_type(r) == "Verdict"]
    user = review.messages[1]["content"]
    assert "left out to fit the prompt" not in user
    assert "finding 000: " in user


def test_run_takes_tools_and_a_side_effect_call_is_approved_with_yes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import cli_tools

    cli_tools.SENT.clear()

    def with_email(logged: Logged) -> Reply:
        text = logged.text
        first = "scan the trade press" in text and "sent to ana" not in text
        if answer_type(logged) == "TaskOutcome" and first:
            return completion(tool_calls=[("c1", "send_email", {"to": "ana"})])
        return script(logged)

    with chat_server(with_email) as server:
        code = main(
            ["run", "Who ships solid-state cells?", "--model", "m", "--base-url",
             server.base_url, "--tool", "cli_tools:TOOLS", "--yes", "--json"]
        )  # fmt: skip
        sent = server.chat_requests()
    captured = capsys.readouterr()
    assert code == 0, captured.err
    run_id = json.loads(captured.out)["run_id"]
    assert [f"{run_id}:t1:s1c0"] == cli_tools.SENT
    offered = {t["function"]["name"] for t in sent[1].body.get("tools", [])}
    assert offered == {"send_email", "search"}
    assert any("sent to ana" in r.text for r in sent)  # the result reached the model


@pytest.mark.parametrize(
    ("tool", "problem"),
    [
        ("nowhere:send", "replan: error: --tool: cannot import nowhere:send: "),
        ("cli_tools", "replan: error: --tool: use module:name, not 'cli_tools'"),
        ("cli_tools:SENT", "replan: error: --tool: cli_tools:SENT: str is not a tool"),
    ],
)
def test_a_tool_run_cannot_use_is_one_line_naming_the_flag(
    capsys: pytest.CaptureFixture[str], tool: str, problem: str
) -> None:
    import cli_tools

    cli_tools.SENT[:] = ["a key"]
    code = main(
        ["run", "x", "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
         "--tool", tool]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(problem)
    assert len(err.splitlines()) == 1


def scope_shift(logged: Logged, asked: list[str]) -> Reply:
    """``script`` with a milestone, whose first review asks for a scope_shift
    replan: the run opens a gate."""
    if answer_type(logged) == "PlanProposal":
        return completion(
            PlanProposal(
                tasks=[
                    TaskDraft(key="scan", description="scan the trade press"),
                    TaskDraft(
                        key="rank",
                        description="rank",
                        depends_on=["scan"],
                        milestone=True,
                    ),
                ]
            )
        )
    if answer_type(logged) == "TaskOutcome":
        return completion(
            TaskOutcome(success=True, summary="s", findings=["a maker ships"])
        )
    if answer_type(logged) == "Verdict" and not asked:
        asked.append("replan")
        return completion(
            Verdict(decision="replan", trigger="scope_shift", rationale="moved on")
        )
    return script(logged)


@contextmanager
def stdin_nobody_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A pipe as stdin: a prompt waits on it until the test writes a line to
    the fd it yields; closed (end of input) afterwards."""
    read_end, write_end = os.pipe()
    stdin = open(read_end, encoding="utf-8")  # noqa: SIM115 - closed below
    monkeypatch.setattr(sys, "stdin", stdin)
    try:
        yield write_end
    finally:
        os.close(write_end)  # the prompt's reader, if still waiting, ends
        for thread in threading.enumerate():
            if thread.name == "replan prompt":
                thread.join(5)
        stdin.close()


@pytest.mark.parametrize(
    ("flags", "code", "note", "finished"),
    [
        pytest.param(
            ["--gate-timeout", "0.5"],
            0,
            "gate g1 timed out: rejected by policy",
            "run finished: completed",
            id="gate-timeout",
        ),
        pytest.param(
            ["--deadline", "1.5"],
            1,
            "gate g1 needs no answer: the run ended",
            "run finished: limit_reached",
            id="deadline",
        ),
    ],
)
def test_a_gate_settled_while_its_prompt_waits_stops_the_prompt_and_the_run_sums_up(
    flags: list[str],
    code: int,
    note: str,
    finished: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []
    with (
        stdin_nobody_writes(monkeypatch),
        chat_server(lambda logged: scope_shift(logged, asked)) as server,
    ):
        exit_code = main(
            ["run", "Who ships solid-state cells?", "--model", "m", "--base-url",
             server.base_url, *flags]
        )  # fmt: skip
    captured = capsys.readouterr()
    assert exit_code == code, captured.err
    assert captured.err == ""
    out = captured.out.splitlines()
    question = next(i for i, line in enumerate(out) if line.startswith("Approve"))
    assert out[question + 1] == note  # on a line of its own
    assert any(line.startswith(finished) for line in out[question:])
    assert "usage by role" in out
    assert "cost" in out


def test_an_answer_that_comes_after_the_gate_timed_out_is_not_taken(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from replan import _cli_prompt

    resolve = _cli_prompt.resolve

    async def late(*args: Any) -> None:
        await anyio.sleep(1.5)  # the gate times out meanwhile
        await resolve(*args)

    monkeypatch.setattr(_cli_prompt, "resolve", late)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    asked: list[str] = []
    with chat_server(lambda logged: scope_shift(logged, asked)) as server:
        code = main(
            ["run", "Who ships solid-state cells?", "--model", "m", "--base-url",
             server.base_url, "--gate-timeout", "0.3", "--json"]
        )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "the answer to gate g1 came too late: not taken" in captured.err
    result = json.loads(captured.out)
    assert result["status"] == "completed"
    assert [r["outcome"] for r in result["replans"]] == ["rejected_by_policy"]
    assert "policy:timeout" in result["replans"][0]["reason"]


def test_the_password_of_the_base_url_is_never_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Bound but not listening for the whole test: connections are refused,
    # and no other program can take the port meanwhile.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
        url = f"http://user:s3cr3t@127.0.0.1:{port}/v1"
        code = main(["run", "x", "--model", "m", "--base-url", url, "--retries", "0"])

    captured = capsys.readouterr()
    assert code == 1
    assert captured.err.splitlines()[-1].startswith(
        f"replan: error: cannot reach the model endpoint at http://127.0.0.1:{port}/v1"
    )
    assert "s3cr3t" not in captured.out + captured.err


@contextmanager
def server_that_hangs_up() -> Iterator[str]:
    """A server that takes each request and closes the connection without
    answering; yields its base URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        done.set()
        thread.join(5)
        listener.close()


def test_a_server_that_drops_the_connection_is_not_called_unreachable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with server_that_hangs_up() as url:
        code = main(["run", "x", "--model", "m", "--base-url", url, "--retries", "0"])

    last = capsys.readouterr().err.splitlines()[-1]
    assert code == 1
    assert last.startswith("replan: error: the run failed: ")
    # The client reports the hang-up as a protocol or a read error, as the
    # timing falls; the adapter's words are the same for both.
    assert "connected, but the server dropped the connection" in last
    assert "cannot reach" not in last


@pytest.mark.parametrize(
    ("message", "unreachable"),
    [
        ("U (m): cannot connect (All connection attempts failed) (after 1)", True),
        ("U (m): cannot connect ([Errno 111] Connection refused)", True),
        ("U (m): cannot connect ([Errno -2] Name or service not known)", True),
        (
            "U (m): cannot connect (Server disconnected without sending a response.)",
            False,
        ),
        ("U (m): connected, but the server dropped the connection (...)", False),
        ("U (m): HTTP 502: upstream: Connection refused", False),
    ],
)
def test_only_a_connection_never_made_is_called_unreachable(
    message: str, unreachable: bool
) -> None:
    result = RunResult(
        run_id="r",
        goal="g",
        pattern="discovery",
        status=RunStatus.FAILED,
        tasks=[],
        versions=[],
        replans=[],
        usage=Usage(),
        model_failures=[
            ModelFailure(
                role="planner",
                purpose="plan",
                error_type="TransientModelError",
                message=message,
            )
        ],
    )
    model = SimpleNamespace(base_url="http://u:pw@127.0.0.1:9/v1/")

    said = unreachable_message(result, model)  # type: ignore[arg-type]

    assert (said is not None) == bool(unreachable)
    if said is not None:
        assert said.startswith("cannot reach the model endpoint at http://127.0.0.1")


def test_a_tool_module_that_exits_as_it_is_imported_is_one_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    (tmp_path / "exits_at_import.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    code = main(
        ["run", "x", "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
         "--tool", "exits_at_import:TOOLS"]
    )  # fmt: skip

    assert code == 2
    assert capsys.readouterr().err == (
        "replan: error: --tool: importing exits_at_import raised SystemExit(3)\n"
    )


def test_a_base_url_that_is_no_url_is_one_line_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["run", "x", "--model", "m", "--base-url", "http://[::1"])

    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("replan: error: --base-url: ")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "failure",
    [httpx.InvalidURL("Invalid port: ':1'"), ValueError("Invalid port: ':1'")],
    ids=["InvalidURL", "ValueError"],
)
def test_a_base_url_the_client_refuses_is_one_line_naming_the_flag(
    failure: Exception,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import replan.llm

    def refuse(*args: object, **kwargs: object) -> NoReturn:
        raise failure

    monkeypatch.setattr(replan.llm, "OpenAIModel", refuse)

    code = main(["run", "x", "--model", "m", "--base-url", "http://u:pw@[::1:1"])

    assert code == 2
    assert capsys.readouterr().err == (
        "replan: error: --base-url: not a usable URL: Invalid port: ':1'\n"
    )


def test_an_unknown_scripted_model_is_one_line_naming_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "x", "--model", "scripted:nope"]) == 2
    assert capsys.readouterr().err == (
        "replan: error: --model: no scripted model 'scripted:nope'; "
        "known: scripted:demo\n"
    )


def test_run_with_the_scripted_demo_model_answers_offline(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPLAN_MODEL", "scripted:demo")

    code = main(["run", "Which models make sequence modelling cheap?", "--yes"])

    out = capsys.readouterr().out
    assert code == 0
    assert "gate g1 resolved: approve by cli --yes" in out
    assert "run finished: completed" in out


def test_an_explore_run_whose_server_drops_the_connection_names_its_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with server_that_hangs_up() as url:
        code = main(
            ["explore", "why?", "--model", "m", "--base-url", url, "--retries", "0"]
        )

    last = capsys.readouterr().err.splitlines()[-1]
    assert code == 1
    assert last.startswith("replan: error: the explore run ended failed: ")
    assert "connected, but the server dropped the connection" in last
    assert "cannot reach" not in last


def test_an_explore_run_against_a_wrong_path_ends_naming_the_404(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Its last line named no usable candidates; the 404 showed only in the
    # brief's errors above it. As replan run's does, it names the 404 and
    # the base URL, and the run ends after its first cycle.
    with chat_server(lambda _: error(404, "Not Found")) as server:
        url = server.base_url
        given = ["--model", "m", "--base-url", url, "--max-iterations", "10"]
        code = main(["explore", "why?", *given])
        sent = len(server.chat_requests())
    last = capsys.readouterr().err.splitlines()[-1]
    assert code == 1
    assert last.startswith(
        "replan: error: the explore run ended failed: the model endpoint gave "
        "no usable answer: every planner call in the evidence step and cycle 1 "
        f"failed the same way (last: planner/hypotheses: failed: {url}/ (m): "
        "HTTP 404: Not Found: check the model name and the base URL)"
    )
    assert sent == 4
    with chat_server(lambda _: error(404, "Not Found")) as server:
        assert main(["run", "why?", "--model", "m", "--base-url", server.base_url])
    assert capsys.readouterr().err.splitlines()[-1] == (
        "replan: error: the run failed: the planner could not answer (ModelError): "
        f"{server.base_url}/ (m): HTTP 404: Not Found: check the model name and "
        "the base URL"
    )


@pytest.mark.parametrize(
    ("flag", "variable", "provider"),
    [
        ("http://127.0.0.1:11434/v1", None, "ollama"),
        (None, "http://127.0.0.1:11434/v1", "ollama"),
        (None, " http://gpu-box:8000/v1\n", "vllm"),
        ("http://127.0.0.1:4000", "http://127.0.0.1:11434/v1", "litellm"),
        (None, None, "openai"),
        # The port alone tells: not a port that begins alike, nor a password.
        ("http://127.0.0.1:40000/v1", None, "openai"),
        ("http://ana:8000@gpu-box/v1", None, "openai"),
        ("http://127.0.0.1:99999/v1", None, "openai"),
    ],
)
def test_the_provider_is_told_from_the_base_url_the_model_uses(
    flag: str | None,
    variable: str | None,
    provider: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The flag wins over OPENAI_BASE_URL, as it does for the model itself.
    if variable is None:
        monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    else:
        monkeypatch.setenv("OPENAI_BASE_URL", variable)
    assert _provider(flag) == provider


@contextmanager
def sigterm_after_an_append(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Inside: the SQLite journal's appends each end in a SIGTERM to this
    process, as a person's Ctrl-C or a service stop would come."""
    import signal

    from replan.store import SQLiteStore

    append = SQLiteStore.append

    async def append_then_signal(self: SQLiteStore, *args: Any) -> None:
        await append(self, *args)
        os.kill(os.getpid(), signal.SIGTERM)
        await anyio.sleep(10)  # cancelled by the signal

    monkeypatch.setattr(SQLiteStore, "append", append_then_signal)
    try:
        yield
    finally:
        monkeypatch.setattr(SQLiteStore, "append", append)


def test_the_resume_line_gives_again_the_options_the_run_was_given(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import shlex

    db = tmp_path / "my runs.db"
    given = [
        "--model", "scripted:demo", "--provider", "my vllm",
        "--structured-output", "prompt", "--retries", "5", "--max-prompt-chars", "0",
        "--tool", "cli_tools:search", "--yes", "--json",
    ]  # fmt: skip
    with sigterm_after_an_append(monkeypatch):
        argv = ["run", "goal", *given, "--max-replans", "1", "--db", str(db)]
        assert main(argv) == 143
    monkeypatch.undo()
    hint = capsys.readouterr().err.splitlines()[-2]
    _, _, command = hint.partition("; to go on with it: ")
    words = shlex.split(command)
    run_id = words[words.index("--resume") + 1]
    assert words == [
        "replan", "run", *given, "--resume", run_id, "--db", str(db)
    ]  # fmt: skip
    # Pasted, it goes on with the run as it was asked for.
    assert main(words[1:]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "completed"


@pytest.mark.parametrize("command", ["run", "explore"])
def test_the_resume_line_names_the_model_and_endpoint_taken_from_the_environment(
    command: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # REPLAN_MODEL and OPENAI_BASE_URL gave them: the line left them out,
    # and in a shell without the variables it asked OpenAI for no model.
    import shlex

    db = tmp_path / "runs.db"
    answers = script if command == "run" else explore_answers
    with chat_server(answers) as server:
        monkeypatch.setenv("REPLAN_MODEL", " m\n")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
        url = server.base_url.replace("http://", "http://ana:pw@")
        monkeypatch.setenv("OPENAI_BASE_URL", url)
        with sigterm_after_an_append(monkeypatch):
            assert main([command, "goal", "--yes", "--db", str(db)]) == 143
        for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "REPLAN_MODEL"):
            monkeypatch.delenv(name)  # a fresh shell
        err = capsys.readouterr().err
        hint = err.splitlines()[-2]
        _, _, line = hint.partition("; to go on with it: ")
        words = shlex.split(line)
        run_id = words[words.index("--resume") + 1]
        assert words == [
            "replan", command, "--model", "m", "--base-url", server.base_url,
            "--yes", "--resume", run_id, "--db", str(db),
        ]  # fmt: skip
        assert "sk-secret" not in err
        assert "pw" not in hint
        assert main(words[1:]) == 0  # pasted, it goes on with the run
        sent = server.chat_requests()
    assert {r.body["model"] for r in sent} == {"m"}


def explore_answers(logged: Logged) -> Reply:
    from replan import (
        Comparison,
        ContextAnalysis,
        Critique,
        Hypothesis,
        HypothesisBatch,
        ValidationBatch,
    )
    from replan.messages import LENSES

    match answer_type(logged):
        case "ContextAnalysis":
            return completion(ContextAnalysis())
        case "HypothesisBatch":
            ideas = ["Solo cooks leave", "Leftovers pile up", "Budgets lapse"]
            batch = [Hypothesis(statement=s) for s in ideas]
            return completion(HypothesisBatch(hypotheses=batch))
        case "Critique":
            scores = {**dict.fromkeys(LENSES, 0.8), "confidence": 0.9}
            return completion(Critique(scores=scores))
        case "Comparison":
            return completion(Comparison(winner="a"))
        case _:
            return completion(ValidationBatch())
