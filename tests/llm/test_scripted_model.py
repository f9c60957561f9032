from __future__ import annotations

from typing import Any

import anyio
import pytest

from replan import (
    Comparison,
    ConfigurationError,
    ContextAnalysis,
    Critique,
    Hypothesis,
    HypothesisBatch,
    MemoryStore,
    ModelOutputError,
    ModelRequest,
    RunSpec,
    ScriptedModel,
    Supervisor,
    Synthesis,
    TokenUsage,
    ValidationBatch,
)
from replan.messages import LENSES

USAGE = TokenUsage(input_tokens=7, output_tokens=3, calls=1)


def test_the_scripted_model_reports_a_provider_and_one_model_for_every_role() -> None:
    model = ScriptedModel(lambda request: None, name="fixture")
    assert model.provider_name == "scripted"
    assert {model.model_for(r) for r in ("planner", "executor", "reviewer")} == {
        "fixture"
    }


def compare() -> ModelRequest:
    return ModelRequest(role="ranker", purpose="compare", output_type=Comparison)


async def test_an_answer_that_does_not_validate_raises_with_the_calls_usage() -> None:
    model = ScriptedModel(lambda request: {"winner": "c"}, usage=USAGE)
    with pytest.raises(ModelOutputError) as caught:
        await model.generate(compare())
    assert caught.value.usage == USAGE
    assert str(caught.value).startswith(
        "scripted answer for ranker/compare is not a valid Comparison: winner: "
    )
    assert caught.value.raw_output == '{"winner": "c"}'
    assert len(model.calls) == 1


async def test_an_answer_of_the_wrong_type_raises_with_the_calls_usage() -> None:
    usage = TokenUsage(input_tokens=5, calls=1)
    model = ScriptedModel(lambda request: ContextAnalysis(), usage=lambda r: usage)
    with pytest.raises(ModelOutputError, match="must be a Comparison") as caught:
        await model.generate(compare())
    assert caught.value.usage == usage


async def test_a_malformed_answer_without_scripted_usage_still_counts_its_call() -> (
    None
):
    model = ScriptedModel(lambda request: "winner: a")
    with pytest.raises(ModelOutputError) as caught:
        await model.generate(compare())
    assert caught.value.usage == TokenUsage(calls=1)


IDEAS = ["Solo cooks leave because recipes serve four", "Leftovers feel wasteful"]


def a_ranker_answering_nonsense(request: ModelRequest) -> Any:
    match request.purpose:
        case "gaps":
            return ContextAnalysis()
        case "hypotheses":
            hypotheses = [Hypothesis(statement=s, evidence_refs=["E1"]) for s in IDEAS]
            return HypothesisBatch(hypotheses=hypotheses)
        case "critique":
            return Critique(scores=dict.fromkeys(LENSES, 0.8))
        case "compare":
            return {"winner": "c"}
        case "validation":
            return ValidationBatch()
    raise AssertionError(request.purpose)


async def test_a_rejected_scripted_answer_counts_toward_the_runs_usage() -> None:
    model = ScriptedModel(a_ranker_answering_nonsense, usage=USAGE)
    spec = RunSpec(
        goal="Find why cooks stop planning",
        kind="explore",
        context=["cooks of one leave", "leftovers pile up"],
        explore={"select": 1},
    )
    with anyio.fail_after(20):
        async with Supervisor(model=model, store=MemoryStore()) as sup:
            result = await (await sup.submit(spec)).result()
    ranker_calls = len(model.calls_for("ranker"))
    assert ranker_calls
    assert result.brief is not None
    assert any("ranker/compare: malformed output" in e for e in result.brief.errors)
    assert result.usage.by_role["ranker"] == TokenUsage(
        input_tokens=7 * ranker_calls,
        output_tokens=3 * ranker_calls,
        calls=ranker_calls,
    )
    assert result.usage.total.total_tokens == 10 * len(model.calls)


async def test_keep_calls_bounds_the_requests_kept() -> None:
    def answer(request: ModelRequest) -> Synthesis:
        return Synthesis(output=str(request.context["n"]))

    def request(n: int) -> ModelRequest:
        return ModelRequest(
            role="executor",
            purpose="synthesize",
            output_type=Synthesis,
            context={"n": n},
        )

    kept = ScriptedModel(answer, keep_calls=3)
    none = ScriptedModel(answer, keep_calls=0)
    every = ScriptedModel(answer)
    for n in range(20):
        for model in (kept, none, every):
            assert (await model.generate(request(n))).output == Synthesis(output=str(n))
    assert [c.context["n"] for c in kept.calls][-3:] == [17, 18, 19]
    assert len(kept.calls) < 6
    assert none.calls == []
    assert len(every.calls) == 20
    with pytest.raises(ValueError, match="keep_calls"):
        ScriptedModel(answer, keep_calls=-1)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"latency_s": float("nan")}, "latency_s"),
        ({"latency_s": -0.5}, "latency_s"),
        ({"latency_s": "1"}, "latency_s"),
        ({"keep_calls": 1.5}, "keep_calls"),
        ({"usage": 10}, "usage"),
        ({"usage": {"input_tokens": 10}}, "usage"),
        ({"name": None}, "name"),
    ],
    ids=str,
)
def test_an_option_no_call_could_use_is_a_configuration_error_at_once(
    options: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        ScriptedModel(lambda _: None, **options)
    assert caught.value.field == field


def test_a_handler_that_is_no_function_is_a_configuration_error_at_once() -> None:
    # Else each call failed as a crash of the role, which then stopped.
    with pytest.raises(ConfigurationError) as caught:
        ScriptedModel(3)  # type: ignore[arg-type]
    assert str(caught.value) == "handler: must be a function of the request, not 3"


def test_the_daemons_scripted_model_keeps_no_request() -> None:
    from replan.daemon import DaemonSettings
    from replan.daemon._models import build_model

    model = build_model(DaemonSettings(model="scripted:demo"))
    assert isinstance(model, ScriptedModel)
    assert model._keep == 0
