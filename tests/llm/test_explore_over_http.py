"""Whole explore runs through OpenAIModel and a Chat Completions server on 127.0.0.1."""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest
from chat_server import Logged, Reply, answer_type, chat_server, completion, error

from replan import (
    Comparison,
    ContextAnalysis,
    Critique,
    ExploreSettings,
    Hypothesis,
    HypothesisBatch,
    Limits,
    RunResult,
    RunSpec,
    RunStatus,
    Supervisor,
    ValidationBatch,
    ValidationPlan,
)
from replan.llm import OpenAIModel
from replan.messages import LENSES

GOAL = "Why do cooks stop using the meal-planning app after week three?"
CONTEXT = ["41% of cooks are inactive by day 21.", "Tickets ask about leftovers."]
IDEAS = [
    "Solo cooks leave because every recipe serves four",
    "Leftovers make the weekly plan feel wasteful",
    "Cooks without a budget lose their reason to plan",
]


def explorer(logged: Logged) -> Reply:
    """Answers every explore purpose by the output type asked for."""
    kind = answer_type(logged)
    answer: Any
    if kind == "ContextAnalysis":
        answer = ContextAnalysis(gaps=["no data on household size"])
    elif kind == "HypothesisBatch":
        answer = HypothesisBatch(
            hypotheses=[Hypothesis(statement=s, evidence_refs=["E1"]) for s in IDEAS]
        )
    elif kind == "Critique":
        answer = Critique(scores={**dict.fromkeys(LENSES, 0.8), "confidence": 0.9})
    elif kind == "Comparison":
        answer = Comparison(winner="a")
    elif kind == "ValidationBatch":
        selected = logged.text.partition("Selected hypotheses:")[2]
        answer = ValidationBatch(
            plans=[
                ValidationPlan(hypothesis_id=h, next_step="test", success_signal="s")
                for h in dict.fromkeys(re.findall(r"\bH\d+\b", selected))
            ]
        )
    else:
        raise AssertionError(f"an explore run asked for {kind!r}")
    return completion(answer)


def spec(max_iterations: int = 3, **settings: Any) -> RunSpec:
    return RunSpec(
        goal=GOAL,
        kind="explore",
        context=CONTEXT,
        limits=Limits(max_iterations=max_iterations),
        explore=ExploreSettings(**{"select": 2, "seed": 7, **settings}),
    )


async def explore(model: OpenAIModel, run: RunSpec) -> RunResult:
    async with model, Supervisor(model=model) as sup:
        with anyio.fail_after(30):
            handle = await sup.submit(run)
            return await handle.result()


def model_for(server_url: str, **options: Any) -> OpenAIModel:
    options = {"max_retries": 1, "backoff_s": 0.01, **options}
    return OpenAIModel("gpt-test", base_url=server_url, **options)


async def test_hypotheses_are_asked_at_the_explore_settings_temperature() -> None:
    with chat_server(explorer) as server:
        result = await explore(model_for(server.base_url), spec(temperature=1.1))
        requests = server.chat_requests()
    assert result.status is RunStatus.COMPLETED, result.stop_reason
    by_kind: dict[str, set[float]] = {}
    for sent in requests:
        by_kind.setdefault(answer_type(sent), set()).add(sent.body["temperature"])
    assert by_kind.pop("HypothesisBatch") == {1.1}
    assert set(by_kind) >= {"ContextAnalysis", "Critique", "Comparison"}
    assert all(temperatures == {0} for temperatures in by_kind.values())


async def test_an_answer_invalid_after_the_adapters_reask_is_not_asked_again() -> None:
    def gaps_invalid(logged: Logged) -> Reply:
        if answer_type(logged) == "ContextAnalysis":
            return completion('{"gaps": "not a list"}', usage=(100, 10, 0))
        return explorer(logged)

    with chat_server(gaps_invalid) as server:
        result = await explore(model_for(server.base_url), spec())
        requests = server.chat_requests()
    assert result.status is RunStatus.COMPLETED, result.stop_reason
    gaps = [r for r in requests if answer_type(r) == "ContextAnalysis"]
    assert len(gaps) == 2  # the answer, and the adapter's re-ask with its problem
    assert "could not be used" in gaps[1].messages[-1]["content"]
    assert result.brief is not None
    errors = [e for e in result.brief.errors if e.startswith("planner/gaps")]
    assert len(errors) == 1
    # With what was wrong, not a line ending in "even after a re-ask:".
    assert errors[0].endswith(
        "even after a re-ask: - gaps: Input should be a valid array"
    )
    assert result.usage.by_role["planner"].input_tokens >= 2 * 100


async def test_a_reviewer_that_refuses_is_recorded_as_refusing_not_as_malformed() -> (
    None
):
    def refusing(logged: Logged) -> Reply:
        if answer_type(logged) == "Critique" and IDEAS[2] in logged.text:
            return completion(None, refusal="I will not judge budgets.")
        return explorer(logged)

    with chat_server(refusing) as server:
        result = await explore(model_for(server.base_url), spec())
    assert result.brief is not None
    refusals = [e for e in result.brief.errors if "I will not judge" in e]
    assert refusals
    assert all(e.startswith("reviewer/critique: refused: ") for e in refusals)
    assert not any("malformed" in e for e in refusals)


async def test_evidence_and_hypotheses_reach_the_prompts_as_text_not_python_reprs() -> (
    None
):
    with chat_server(explorer) as server:
        run = spec(2, select=5)  # never enough: the strongest are evolved
        result = await explore(model_for(server.base_url), run)
        requests = server.chat_requests()
    assert result.status is RunStatus.COMPLETED, result.stop_reason
    for sent in requests:
        assert "kind=" not in sent.text
        assert "- E1: 41% of cooks are inactive by day 21.\n- E2: Tickets" in sent.text
    [evolve, *_] = [r for r in requests if "evolver" in r.messages[0]["content"]]
    candidates = evolve.text.partition("Strongest hypotheses:\n")[2]
    first = candidates.splitlines()[0]
    assert first.startswith('{"id":"H')
    assert '"statement":"' in first
    reviews = evolve.text.partition("Their reviews:\n")[2]
    assert reviews.startswith('{"hypothesis_id":"H')
    [validation] = [r for r in requests if answer_type(r) == "ValidationBatch"]
    selected = validation.text.partition("Selected hypotheses:\n")[2]
    assert selected.startswith('{"id":"H')


async def test_a_critique_out_of_range_is_asked_again_with_its_problem_shown() -> None:
    def ten_point_scale(logged: Logged) -> Reply:
        if answer_type(logged) == "Critique" and "could not be used" not in (
            logged.text
        ):
            tens = {**dict.fromkeys(LENSES, 8.0), "confidence": 0.9}
            return completion(Critique(scores=tens))
        return explorer(logged)

    with chat_server(ten_point_scale) as server:
        result = await explore(model_for(server.base_url), spec())
        requests = server.chat_requests()
    assert result.status is RunStatus.COMPLETED, result.stop_reason
    assert result.brief is not None
    assert len(result.brief.selected) == 2  # every critique was used in the end
    reasked = [r for r in requests if "could not be used" in r.text]
    assert reasked
    assert all(answer_type(r) == "Critique" for r in reasked)
    assert "is outside 0..1" in reasked[0].messages[-1]["content"]


async def test_a_refused_critique_is_not_asked_again() -> None:
    # The same prompt, asked again, is refused again: a refusal costs one
    # request, not two.
    from replan.actors import ActorContext
    from replan.actors._calls import explore_call
    from replan.messages import ExploreRequest

    sent = 0

    def refusing(logged: Logged) -> Reply:
        nonlocal sent
        sent += 1
        return completion(None, refusal="I will not judge budgets.")

    with chat_server(refusing) as server:
        async with model_for(server.base_url) as model:
            reply = await explore_call(
                model,
                "reviewer",
                ExploreRequest(purpose="critique", context={"goal": "g"}),
                ActorContext("reviewer", "run", None),
                0.0,
            )
    assert sent == 1
    assert [e.split(": ")[1] for e in reply.errors] == ["refused"]
    assert len(reply.calls) == 1


async def test_a_rejected_key_ends_an_explore_run_after_one_request() -> None:
    with chat_server(lambda _: error(401, "Incorrect API key provided")) as server:
        model = model_for(server.base_url, api_key="sk-wrong", max_retries=3)
        result = await explore(model, spec(max_iterations=10))
        sent = len(server.chat_requests())
    assert sent == 1
    assert result.status is RunStatus.FAILED
    assert "OPENAI_API_KEY" in (result.stop_reason or "")
    assert [f.error_type for f in result.model_failures] == ["ModelAuthenticationError"]


NOT_A_MODEL = {
    "404": (lambda: error(404, "Not Found"), "HTTP 404: Not Found"),
    "html": (
        lambda: Reply(
            200, "<html><body>Sign in</body></html>", {"content-type": "text/html"}
        ),
        "a text body: <html><body>Sign in</body></html>",
    ),
    "no-completion": (lambda: Reply(200, {"hello": "world"}), "had no choices"),
}


@pytest.mark.parametrize("answer", list(NOT_A_MODEL), ids=list(NOT_A_MODEL))
async def test_an_endpoint_that_answers_every_call_alike_ends_the_run_naming_it(
    answer: str,
) -> None:
    # A wrong path, a login page, JSON that is no chat completion: every
    # call of the evidence step and the first cycle failed the same way, and
    # the run ends there, naming the answer and the base URL, instead of
    # going through its ten cycles to "no usable candidates".
    make, said = NOT_A_MODEL[answer]
    with chat_server(lambda _: make()) as server:
        result = await explore(model_for(server.base_url), spec(max_iterations=10))
        sent = len(server.chat_requests())
        where = server.base_url
    assert result.status is RunStatus.FAILED
    reason = result.stop_reason or ""
    assert reason.startswith(
        "the model endpoint gave no usable answer: every planner call in the "
        "evidence step and cycle 1 failed the same way (last: planner/hypotheses: "
        f"failed: {where}/ (gpt-test): "
    )
    assert said in reason
    assert sent == 4  # two calls, each asked once more
    assert result.brief is not None
    assert result.brief.status == "failed"
    assert all(": failed: " in e for e in result.brief.errors)
    assert not any("malformed" in e for e in result.brief.errors)


async def test_a_404_now_and_then_leaves_an_explore_run_going() -> None:
    # A proxy that misroutes a call, and its re-ask: the evidence step got
    # nothing but 404s. Recorded as failed, and the run goes on.
    sent = 0

    def misrouting(logged: Logged) -> Reply:
        nonlocal sent
        sent += 1
        if sent <= 2:
            return error(404, "no route")
        return explorer(logged)

    with chat_server(misrouting) as server:
        result = await explore(model_for(server.base_url), spec())
    assert result.status is RunStatus.COMPLETED, result.stop_reason
    assert result.brief is not None
    failed = [e for e in result.brief.errors if "HTTP 404" in e]
    assert [e.partition(": failed: ")[0] for e in failed] == ["planner/gaps"] * 2


async def test_an_endpoint_failing_the_hypotheses_calls_alike_is_named_in_the_end() -> (
    None
):
    # The gaps are answered, every hypotheses call gets a 404: the cycles
    # fail alike, and after two of them the run ends naming the 404.
    def no_hypotheses(logged: Logged) -> Reply:
        if answer_type(logged) == "HypothesisBatch":
            return error(404, "no such deployment")
        return explorer(logged)

    with chat_server(no_hypotheses) as server:
        one = await explore(model_for(server.base_url), spec(max_iterations=1))
        many = await explore(model_for(server.base_url), spec(max_iterations=10))
        sent = [answer_type(r) for r in server.chat_requests()]
    # One cycle: nothing to recommend, and the reason says why.
    assert one.status is RunStatus.FAILED
    assert (one.stop_reason or "").startswith(
        "no usable candidates (the last of 2 errors: planner/hypotheses: failed: "
    )
    assert "HTTP 404: no such deployment" in (one.stop_reason or "")
    # Ten: the evidence step was answered, cycles 1 and 2 were not.
    assert many.status is RunStatus.FAILED
    assert "every planner call in cycle 1 and cycle 2 failed the same way" in (
        many.stop_reason or ""
    )
    assert sent.count("HypothesisBatch") == 2 + 4
