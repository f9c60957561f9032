"""OpenAIModel against a real Chat Completions server on 127.0.0.1."""

from __future__ import annotations

from chat_server import chat_server, completion

from replan import ModelRequest, PlanProposal, TaskDraft
from replan.llm import OpenAIModel


def plan_request(**context: object) -> ModelRequest:
    return ModelRequest(
        role="planner",
        purpose="plan",
        output_type=PlanProposal,
        context={"goal": "map the battery market", "metadata": {}, **context},
    )


async def test_a_structured_answer_is_parsed_into_the_requests_output_type() -> None:
    proposal = PlanProposal(
        tasks=[TaskDraft(key="search", description="search the news")],
        rationale="one search is enough",
    )
    with chat_server() as server:
        server.reply(completion(proposal, usage=(120, 30, 20)))
        async with OpenAIModel("gpt-test", base_url=server.base_url) as model:
            response = await model.generate(plan_request())
        [sent] = server.chat_requests()
    assert response.output == proposal
    assert response.prompt_version == "planner.plan@1"
    assert response.usage.input_tokens == 120
    assert response.usage.output_tokens == 30
    assert response.usage.cached_tokens == 20
    assert sent.body["model"] == "gpt-test"
    assert sent.body["temperature"] == 0
    schema = sent.body["response_format"]["json_schema"]
    assert schema["name"] == "PlanProposal"
    assert schema["strict"] is True
    assert "kind" not in schema["schema"]["properties"]
    assert "map the battery market" in sent.text
