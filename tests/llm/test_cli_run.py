"""``replan run`` against a Chat Completions server on 127.0.0.1."""

from __future__ import annotations

import json

import pytest
from chat_server import Logged, Reply, answer_type, chat_server, completion

from replan import Alignment, PlanProposal, Synthesis, TaskDraft, TaskOutcome, Verdict
from replan.cli import main


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
            return completion(Alignment(aligned=[True]))
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
