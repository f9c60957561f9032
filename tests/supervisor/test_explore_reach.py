"""An explore run whose model cannot be reached ends soon, naming the role."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from explore_scripts import ExploreScript, Idea, explore_spec, run_explore, scores

from replan import (
    MemoryStore,
    ModelRequest,
    OpenAIModel,
    RunStatus,
    ScriptedModel,
    Supervisor,
    TransientModelError,
)
from replan.supervisor import replay
from replan.supervisor._explore_reach import UNREACHABLE_ROUNDS, Reach
from replan.supervisor._run import summary_of

pytestmark = pytest.mark.anyio

STRONG = [
    Idea("Solo cooks leave because every recipe serves four", strength=0.9),
    Idea("Leftovers pile up and make planning feel wasteful", strength=0.7),
    Idea("Cooks without a weekly budget lose their reason to plan", strength=0.6),
]
DOUBTFUL = [scores(plausibility=0.2)]
WEAK = [
    Idea("Solo cooks leave because recipes serve four", DOUBTFUL, strength=0.9),
    Idea("Leftovers make the weekly plan feel wasteful", DOUBTFUL, strength=0.7),
]


def down(request: ModelRequest) -> Any:
    raise TransientModelError("http://127.0.0.1:9/v1/ (gpt-test): cannot connect")


def down_for(
    script: Callable[[ModelRequest], Any], failing: Callable[[ModelRequest], bool]
) -> Callable[[ModelRequest], Any]:
    """``script``, except that the calls ``failing`` picks fail transiently."""

    def answer(request: ModelRequest) -> Any:
        if failing(request):
            down(request)
        return script(request)

    return answer


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_model_never_reached_ends_the_run_after_its_first_cycle() -> None:
    outcome = await run_explore(explore_spec(max_iterations=20), down)
    result, brief = outcome.result, outcome.result.brief
    assert result.status is RunStatus.FAILED
    assert result.stop_reason is not None
    assert result.stop_reason.startswith(
        "the model could not be reached: every planner call in the evidence "
        "step and cycle 1 failed after its retries (last: planner/hypotheses: "
        "planner failed 2 time(s); last: planner: TransientModelError: "
    )
    assert "cannot connect" in result.stop_reason
    assert result.iterations == 1
    # gaps and hypotheses, each asked max_task_attempts times
    assert [c.purpose for c in outcome.model.calls] == ["gaps"] * 2 + ["hypotheses"] * 2
    assert brief is not None
    assert brief.status == "failed"
    assert result.stop_reason in brief.summary
    assert len(brief.errors) == 2
    assert outcome.replayed == result


async def test_an_endpoint_on_a_closed_port_ends_the_run_within_seconds() -> None:
    port = closed_port()
    url = f"http://127.0.0.1:{port}/v1"
    options = {"max_retries": 1, "backoff_s": 0.01, "max_backoff_s": 0.05}
    async with OpenAIModel("gpt-test", base_url=url, api_key="k", **options) as model:
        started = time.monotonic()
        with anyio.fail_after(20):
            async with Supervisor(model=model, store=MemoryStore()) as sup:
                handle = await sup.submit(explore_spec(max_iterations=20))
                result = await handle.result()
        elapsed = time.monotonic() - started
    assert result.status is RunStatus.FAILED
    assert result.stop_reason is not None
    assert "the model could not be reached: every planner call" in result.stop_reason
    assert f"127.0.0.1:{port}" in result.stop_reason
    assert "cannot connect" in result.stop_reason
    assert result.iterations == 1
    assert elapsed < 10


async def test_a_model_lost_mid_run_ends_it_after_two_fruitless_cycles() -> None:
    """Cycle 1 reviews and ranks weak hypotheses; from its evolve call on,
    every call fails: cycles 2 and 3 get nothing, and the run ends with the
    candidates it has, for a person to review."""
    script = ExploreScript(generated=WEAK)
    lost = anyio.Event()

    def failing(request: ModelRequest) -> bool:
        if request.purpose == "evolve":
            lost.set()
        return lost.is_set()

    outcome = await run_explore(
        explore_spec(max_iterations=10), down_for(script, failing)
    )
    result, brief = outcome.result, outcome.result.brief
    assert result.status is RunStatus.FAILED
    assert result.stop_reason is not None
    assert result.stop_reason.startswith(
        "the model could not be reached: every ranker and evolver call in "
        "cycle 2 and cycle 3 failed after its retries (last: evolver/evolve: "
    )
    assert result.iterations == 3
    assert brief is not None
    assert "ended early" in brief.summary
    assert [s.hypothesis.id for s in brief.selected]
    assert brief.status == "needs_review"  # the run's status is its cause's
    assert outcome.replayed == result


async def test_a_round_with_an_answer_starts_the_count_again() -> None:
    # The evidence step gets nothing and every comparison fails, but the
    # planner and the reviewers answer: the run goes on to its brief.
    script = ExploreScript(generated=STRONG)
    outcome = await run_explore(
        explore_spec(),
        down_for(script, lambda r: r.purpose in ("gaps", "compare")),
    )
    result, brief = outcome.result, outcome.result.brief
    assert result.status is RunStatus.COMPLETED
    assert brief is not None
    assert brief.status == "completed"
    assert any(e.startswith("planner/gaps: ") for e in brief.errors)
    assert any(e.startswith("ranker/compare: ") for e in brief.errors)


async def test_a_run_stopped_after_its_brief_ends_as_the_unreachable_run_did() -> None:
    baseline = await run_explore(explore_spec(max_iterations=20), down)
    *events, finished = baseline.journal
    assert finished.kind == "run_finished"
    store = MemoryStore()
    run_id = baseline.result.run_id
    await store.append(run_id, events, summary_of(replay(events)))
    model = ScriptedModel(ExploreScript(generated=STRONG))
    with anyio.fail_after(10):
        async with Supervisor(model, store, resume=True) as sup:
            result = await sup.get(run_id).result()
    assert model.calls == []
    assert result == baseline.result


def test_a_round_that_asked_nothing_leaves_the_count_as_it_is() -> None:
    reach = Reach()
    reach.asked()
    reach.failed("planner", "planner/gaps: down")
    assert reach.end_round("the evidence step") is None
    assert reach.end_round("cycle 1") is None  # replayed: no call
    for _ in range(2):
        reach.asked()
        reach.failed("reviewer", "reviewer/critique: down")
    reason = reach.end_round("cycle 2")
    assert UNREACHABLE_ROUNDS == 2
    assert reason == (
        "the model could not be reached: every planner and reviewer call in "
        "the evidence step and cycle 2 failed after its retries "
        "(last: reviewer/critique: down)"
    )


def test_one_call_answered_or_failing_for_good_starts_the_count_again() -> None:
    reach = Reach()
    reach.asked()
    reach.failed("planner", "planner/gaps: down")
    assert reach.end_round("the evidence step") is None
    reach.asked()
    reach.asked()  # answered (or failed, but not transiently)
    reach.failed("planner", "planner/hypotheses: down")
    assert reach.end_round("cycle 1") is None
    reach.asked()
    reach.failed("planner", "planner/hypotheses: down")
    assert reach.end_round("cycle 2") is None


NOT_FOUND = "failed: http://127.0.0.1:9/v1/ (gpt-test): HTTP 404: Not Found"


def test_two_rounds_of_calls_failing_alike_end_the_run_naming_the_error() -> None:
    reach = Reach()
    reach.asked()
    reach.unusable("planner", [f"planner/gaps: {NOT_FOUND}"] * 2)
    assert reach.end_round("the evidence step") is None  # one round: a blip
    reach.asked()
    reach.unusable("planner", [f"planner/hypotheses: {NOT_FOUND}"] * 2)
    assert reach.end_round("cycle 1") == (
        "the model endpoint gave no usable answer: every planner call in the "
        "evidence step and cycle 1 failed the same way "
        f"(last: planner/hypotheses: {NOT_FOUND})"
    )


@pytest.mark.parametrize(
    "second",
    [
        # Another error: no endpoint answering alike.
        ["planner/hypotheses: failed: http://127.0.0.1:9/v1/ (gpt-test): HTTP 502"],
        # A model's answer, malformed the same way: a model answered.
        ["planner/hypotheses: malformed output: not a valid HypothesisBatch"] * 2,
        # The call's answers failed each in its own way.
        [f"planner/hypotheses: {NOT_FOUND}", "planner/hypotheses: failed: HTTP 500"],
    ],
    ids=["another-error", "malformed", "mixed"],
)
def test_rounds_failing_otherwise_than_alike_leave_the_run_going(
    second: list[str],
) -> None:
    reach = Reach()
    reach.asked()
    reach.unusable("planner", [f"planner/gaps: {NOT_FOUND}"])
    assert reach.end_round("the evidence step") is None
    reach.asked()
    reach.unusable("planner", second)
    assert reach.end_round("cycle 1") is None


def test_a_round_with_one_answer_among_alike_failures_starts_the_count_again() -> None:
    reach = Reach()
    for name in ("the evidence step", "cycle 1", "cycle 2"):
        reach.asked()
        reach.asked()  # answered
        reach.unusable("reviewer", [f"reviewer/critique: {NOT_FOUND}"])
        assert reach.end_round(name) is None


async def test_a_model_answering_every_call_with_the_same_wrong_type_goes_on() -> None:
    # A model's answers, however alike and malformed, are no endpoint that
    # is not a model: the run goes through its cycles as before.
    outcome = await run_explore(
        explore_spec(max_iterations=4),
        lambda request: {"not": "a batch"},
    )
    result = outcome.result
    assert result.status is RunStatus.FAILED
    assert result.iterations == 4
    assert (result.stop_reason or "").startswith("no usable candidates (the last of ")
    assert "malformed output" in (result.stop_reason or "")
