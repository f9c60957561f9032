"""The prompt budget: long lists lose their oldest entries until a prompt fits."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from chat_server import chat_server, completion
from hypothesis import given
from hypothesis import strategies as st

from replan import (
    ConfigurationError,
    ModelRequest,
    Synthesis,
    Task,
    TaskDraft,
    TaskOutcome,
    Trigger,
    Verdict,
)
from replan.llm import OpenAIModel, PromptRegistry, PromptTemplate, render_value
from replan.llm._budget import ENTRY_MARK, fit_prompt, omission_note, prompt_chars
from replan.messages import TaskStatus

REGISTRY = PromptRegistry()
GOAL = "Find which solid-state battery makers ship cells at scale in 2025"
SMALL = PromptTemplate("test", "small", 1, "Be brief.", "Findings:\n{{findings}}")


def done(n: int, summary: str = "", *findings: str) -> Task:
    return Task(
        id=f"t{n}",
        key=f"k{n}",
        description=f"work of t{n}",
        status=TaskStatus.COMPLETED,
        result=TaskOutcome(
            success=True, summary=summary or f"result of t{n}", findings=list(findings)
        ),
    )


def pending(n: int) -> Task:
    return Task(id=f"t{n}", key=f"k{n}", description=f"planned t{n}")


def replan_context(tasks: int, findings: int) -> dict[str, Any]:
    return {
        "goal": GOAL,
        "context": ["EU makers only"],
        "completed": [
            done(n, f"the makers of report {n} " * 8, f"finding of t{n}")
            for n in range(tasks)
        ],
        "findings": [f"finding {n:04d}" for n in range(findings)],
        "pending": [pending(tasks), pending(tasks + 1)],
        "trigger": Trigger.CONTRADICTION,
        "verdict": Verdict(decision="replan", trigger=Trigger.CONTRADICTION),
    }


def user_text(messages: list[dict[str, Any]]) -> str:
    return str(messages[1]["content"])


def test_a_prompt_within_budget_is_exactly_the_unbounded_rendering() -> None:
    context = replan_context(tasks=30, findings=50)
    for role, purpose in REGISTRY.available():
        template = REGISTRY.get(role, purpose)
        whole = template.render(context)
        size = prompt_chars(whole)
        for budget in (None, size, size + 1, 10 * size):
            fitted = fit_prompt(template, context, budget)
            assert fitted.messages == whole
            assert fitted.omitted == {}
            assert fitted.chars == size


def test_a_list_over_budget_keeps_its_newest_entries_after_a_note_of_the_count() -> (
    None
):
    findings = [f"f{n:03d}" for n in range(100)]
    fitted = fit_prompt(SMALL, {"findings": findings}, 300)

    [dropped] = fitted.omitted.values()
    note = f"({dropped} earlier entries left out to fit the prompt)"
    kept = "\n".join(f"- {f}" for f in findings[dropped:])
    assert fitted.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": f"Findings:\n{note}\n{kept}"},
    ]
    assert fitted.omitted == {"findings": dropped}
    assert fitted.chars == prompt_chars(fitted.messages) <= 300
    # As few entries as possible were left out: one more kept would not fit.
    one_more = "\n".join(f"- {f}" for f in findings[dropped - 1 :])
    longer = f"Findings:\n{omission_note(dropped - 1)}\n{one_more}"
    assert len("Be brief.") + len(longer) > 300


def test_the_note_says_entry_for_one_and_entries_for_more() -> None:
    assert omission_note(1) == "(1 earlier entry left out to fit the prompt)"
    assert omission_note(12) == "(12 earlier entries left out to fit the prompt)"


def test_the_longest_lists_are_cut_and_short_ones_stay_whole() -> None:
    context = replan_context(tasks=200, findings=2_000)
    template = REGISTRY.get("planner", "replan")
    whole = prompt_chars(template.render(context))
    fitted = fit_prompt(template, context, 30_000)

    assert whole > 2 * 30_000
    assert fitted.chars <= 30_000
    assert set(fitted.omitted) == {"completed", "findings"}  # not the pending
    text = user_text(fitted.messages)
    tasks_out, findings_out = fitted.omitted["completed"], fitted.omitted["findings"]
    assert f"{omission_note(tasks_out)}\nt{tasks_out} [completed]" in text
    assert f"{omission_note(findings_out)}\n- finding {findings_out:04d}\n" in text
    assert "t199 [completed]" in text
    assert f"\nt{tasks_out - 1} [completed]" not in text
    assert "- finding 1999\n" in text
    assert f"- finding {findings_out - 1:04d}\n" not in text
    assert "t200 [pending] planned t200\nt201 [pending] planned t201" in text
    assert f"Original goal, verbatim:\n{GOAL}" in text
    # The two cut lists end up about the same size in the prompt.
    sections = text.split("\n\n")
    completed = next(s for s in sections if s.startswith("Completed tasks"))
    findings = next(s for s in sections if s.startswith("Findings so far"))
    assert abs(len(completed) - len(findings)) < 300


def test_a_prompt_too_long_anyway_is_sent_with_its_history_left_out() -> None:
    goal = "a goal far longer than the budget " * 200
    context = {**replan_context(tasks=5, findings=40), "goal": goal}
    template = REGISTRY.get("planner", "replan")
    fitted = fit_prompt(template, context, 2_000)

    assert fitted.omitted == {"completed": 5, "findings": 40}
    assert fitted.chars == prompt_chars(fitted.messages) > 2_000
    text = user_text(fitted.messages)
    assert f"Original goal, verbatim:\n{goal}\n" in text
    assert (
        "Completed tasks and their results (never change these):\n"
        f"{omission_note(5)}\n\nFindings so far, oldest first:\n{omission_note(40)}\n"
        "\nPending tasks your revision replaces:\nt5 [pending] planned t5\nt6 [pending]"
    ) in text
    assert "contradiction" in text  # the trigger and the verdict stay


def test_only_the_history_is_cut_however_long_the_other_lists() -> None:
    # The ranker answers one boolean per proposed task, and a reviewer names
    # pending tasks in affected_tasks: neither list may lose an entry.
    drafts = [
        TaskDraft(key=f"k{n}", description=f"step {n} " * 10) for n in range(1, 501)
    ]
    template = REGISTRY.get("ranker", "alignment")
    context = {"goal": GOAL, "proposed": drafts, "context": ["background " * 500]}
    fitted = fit_prompt(template, context, 10_000)
    assert fitted.omitted == {}
    assert fitted.messages == template.render(context)

    reviewer = REGISTRY.get("reviewer", "milestone")
    context = replan_context(tasks=20, findings=100)
    context["pending"] = [
        t.model_copy(update={"description": "long pending task " * 40})
        for t in context["pending"] * 200
    ]
    fitted = fit_prompt(reviewer, {**context, "milestone_index": 3}, 30_000)
    assert set(fitted.omitted) == {"completed", "findings"}
    assert user_text(fitted.messages).count("long pending task") == 400 * 40


def test_shortened_drafts_keep_their_numbers() -> None:
    drafts = [
        TaskDraft(key=f"k{n}", description=f"step {n} " * 10) for n in range(1, 501)
    ]
    template = REGISTRY.get("ranker", "alignment")
    fitted = fit_prompt(
        template, {"goal": GOAL, "proposed": drafts}, 10_000, frozenset({"proposed"})
    )

    dropped = fitted.omitted["proposed"]
    text = user_text(fitted.messages)
    assert f"{omission_note(dropped)}\n{dropped + 1}. k{dropped + 1}: step" in text
    # (The line after the list names the last answer's problem, when asked
    # again: left out here, as a blank line.)
    assert text.rstrip().endswith("\n500. k500: " + ("step 500 " * 10).rstrip())


def test_a_shortened_list_of_other_values_is_still_a_json_array() -> None:
    evidence = [{"id": f"e{n}", "text": f"observation {n} " * 5} for n in range(300)]
    template = PromptTemplate("test", "json", 1, "Judge.", "Evidence:\n{{evidence}}")
    fitted = fit_prompt(
        template, {"evidence": evidence}, 5_000, frozenset({"evidence"})
    )

    dropped = fitted.omitted["evidence"]
    note, array = user_text(fitted.messages).removeprefix("Evidence:\n").split("\n", 1)
    assert note == omission_note(dropped)
    assert json.loads(array) == evidence[dropped:]
    assert fitted.chars <= 5_000


def test_a_list_the_template_shows_twice_counts_twice() -> None:
    template = PromptTemplate(
        "test", "twice", 1, "Known:\n{{findings}}", "Again:\n{{findings}}"
    )
    findings = [f"finding {n}" for n in range(500)]
    fitted = fit_prompt(template, {"findings": findings}, 2_000)

    system, user = (m["content"] for m in fitted.messages)
    assert fitted.chars == len(system) + len(user) <= 2_000
    assert system.removeprefix("Known:") == user.removeprefix("Again:")
    assert user.endswith("- finding 499")


def test_a_huge_newest_result_is_cut_short_not_dropped_with_all_before_it() -> None:
    template = REGISTRY.get("executor", "synthesize")
    huge = "the newest result, at length " * 4_000  # ~120,000 characters
    completed = [done(n, f"result {n}") for n in range(5)] + [done(5, huge)]
    fitted = fit_prompt(template, {"goal": GOAL, "completed": completed}, 100_000)

    assert fitted.chars <= 100_000
    assert fitted.omitted == {}
    assert fitted.shortened == {"completed": 1}
    text = user_text(fitted.messages)
    for n in range(5):
        assert f"t{n} [completed] work of t{n}\n    result: result {n}\n" in text
    assert f"t5 [completed] work of t5\n    result: {huge[:1_000]}" in text
    assert ENTRY_MARK in text
    assert huge not in text


def test_the_items_of_a_json_array_are_left_out_never_cut_short() -> None:
    evidence = [{"id": f"e{n}", "text": "x" * 3_000} for n in range(10)]
    template = PromptTemplate("test", "json", 1, "Judge.", "Evidence:\n{{evidence}}")
    keys = frozenset({"evidence"})
    fitted = fit_prompt(template, {"evidence": evidence}, 8_000, keys)
    assert fitted.shortened == {}
    dropped = fitted.omitted["evidence"]
    text = user_text(fitted.messages).removeprefix("Evidence:\n")
    note, array = text.split("\n", 1)
    assert note == omission_note(dropped)
    assert json.loads(array) == evidence[dropped:]


# A property over random lists and budgets ---------------------------------------

RANDOM = PromptTemplate(
    "test",
    "random",
    1,
    "You review. Goal: {{goal}}",
    "Done:\n{{completed}}\n\nFindings:\n{{findings}}\n\nTrigger: {{trigger}}",
)
words = st.text(st.characters(codec="utf-8"), max_size=60)


def numbered(parts: list[Any], repeat: int) -> list[tuple[int, Any]]:
    """``parts`` repeated, each entry with its own number, so that no two
    entries of a list are alike."""
    return list(enumerate(parts * repeat))


finding_lists = st.builds(
    lambda parts: [f"{n}: {text}" for n, text in parts],
    st.builds(numbered, st.lists(words, max_size=6), st.integers(1, 40)),
)
task_lists = st.builds(
    lambda parts: [done(n, summary or "none", *found) for n, (summary, found) in parts],
    st.builds(
        numbered,
        st.lists(st.tuples(words, st.lists(words, max_size=2)), max_size=4),
        st.integers(1, 15),
    ),
)
goals = st.builds(lambda text, repeat: text * repeat, words, st.integers(0, 500))


def section(values: list[Any], dropped: int) -> str:
    """A list as the budget should leave it: a suffix after a note."""
    if not dropped:
        return render_value(values)
    if dropped == len(values):
        return omission_note(dropped)
    return f"{omission_note(dropped)}\n{render_value(values[dropped:])}"


@given(
    goal=goals,
    completed=task_lists,
    findings=finding_lists,
    budget=st.integers(1_000, 20_000),
)
def test_a_fitted_prompt_fits_or_has_every_list_left_out_and_keeps_suffixes(
    goal: str, completed: list[Task], findings: list[str], budget: int
) -> None:
    context = {
        "goal": goal,
        "completed": completed,
        "findings": findings,
        "trigger": Trigger.SCOPE_SHIFT,
    }
    fitted = fit_prompt(RANDOM, context, budget)

    dropped = {key: fitted.omitted.get(key, 0) for key in ("completed", "findings")}
    assert fitted.messages == [
        {"role": "system", "content": f"You review. Goal: {render_value(goal)}"},
        {
            "role": "user",
            "content": f"Done:\n{section(completed, dropped['completed'])}\n\n"
            f"Findings:\n{section(findings, dropped['findings'])}\n\n"
            "Trigger: scope_shift",
        },
    ]
    assert fitted.chars == prompt_chars(fitted.messages)
    everything_left_out = dropped == {
        "completed": len(completed),
        "findings": len(findings),
    }
    assert fitted.chars <= budget or everything_left_out
    if prompt_chars(RANDOM.render(context)) <= budget:
        assert fitted.omitted == {}


# Through OpenAIModel, to a real Chat Completions server ---------------------------


def milestone_request(findings: int, **fields: Any) -> ModelRequest:
    return ModelRequest(
        role="reviewer",
        purpose="milestone",
        output_type=Verdict,
        run_id="r1",
        context={
            "goal": GOAL,
            "milestone_index": 3,
            "completed": [done(n) for n in range(20)],
            "findings": [
                f"finding {n:04d}: cell maker {n} ships pouch cells to one customer"
                for n in range(findings)
            ],
            "pending": [pending(20)],
        },
        **fields,
    )


async def test_a_long_history_reaches_the_server_within_the_budget_newest_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    request = milestone_request(2_000)
    template = PromptRegistry().get("reviewer", "milestone")
    assert prompt_chars(template.render(request.context)) > 130_000
    with chat_server() as server:
        server.reply(completion(Verdict(decision="continue")))
        async with OpenAIModel("gpt-test", base_url=server.base_url) as model:
            assert model.max_prompt_chars == 100_000  # on by default
            with caplog.at_level(logging.DEBUG, logger="replan.llm"):
                response = await model.generate(request)
            rendered = model.prompt_messages(request)
        [sent] = server.chat_requests()

    assert response.output == Verdict(decision="continue")
    system, user = sent.messages
    assert user == rendered[1]
    assert system["content"].startswith(rendered[0]["content"])
    assert len(rendered[0]["content"]) + len(user["content"]) <= 100_000
    text = user["content"]
    kept = text.count("\n- finding ")
    assert f"({2_000 - kept} earlier entries left out to fit the prompt)" in text
    assert "- finding 1999: cell maker 1999" in text
    assert "finding 0000" not in text
    assert "t0 [completed] work of t0" in text  # the short list stays whole
    [record] = caplog.records
    assert record.levelno == logging.DEBUG
    assert record.getMessage() == (
        f"reviewer.milestone@1 prompt of run r1: left out the oldest "
        f"{2_000 - kept} of 2000 findings to fit 100000 characters"
    )


async def test_without_a_budget_the_whole_history_is_sent() -> None:
    with chat_server() as server:
        server.reply(completion(Verdict(decision="continue")))
        async with OpenAIModel(
            "gpt-test", base_url=server.base_url, max_prompt_chars=None
        ) as model:
            await model.generate(milestone_request(2_000))
        [sent] = server.chat_requests()
    text = sent.messages[1]["content"]
    assert "left out" not in text
    assert text.count("\n- finding ") == 2_000


async def test_a_requests_own_messages_are_sent_whole_whatever_the_budget(
    caplog: pytest.LogCaptureFixture,
) -> None:
    mine = [{"role": "user", "content": "every finding so far: " + "x" * 50_000}]
    with chat_server() as server:
        server.reply(completion(Verdict(decision="continue")))
        async with OpenAIModel(
            "gpt-test", base_url=server.base_url, max_prompt_chars=1_000
        ) as model:
            with caplog.at_level(logging.DEBUG, logger="replan.llm"):
                await model.generate(milestone_request(2_000, messages=mine))
        [sent] = server.chat_requests()
    assert sent.messages[1:] == mine
    assert caplog.records == []


async def test_a_goal_longer_than_the_budget_is_sent_whole_without_the_history(
    caplog: pytest.LogCaptureFixture,
) -> None:
    goal = "Map every maker of solid-state cells and what they ship. " * 40
    request = milestone_request(50)
    request = request.model_copy(update={"context": {**request.context, "goal": goal}})
    with chat_server() as server:
        server.reply(completion(Verdict(decision="continue")))
        async with OpenAIModel(
            "gpt-test", base_url=server.base_url, max_prompt_chars=1_000
        ) as model:
            with caplog.at_level(logging.DEBUG, logger="replan.llm"):
                await model.generate(request)
        [sent] = server.chat_requests()
    text = sent.messages[1]["content"]
    assert f"Goal:\n{goal}\n" in text
    assert (
        f"Completed tasks and their results:\n{omission_note(20)}\n\n"
        f"Findings so far, oldest first:\n{omission_note(50)}\n\n"
        "Pending tasks:\nt20 [pending] planned t20"
    ) in text
    [record] = caplog.records
    assert (
        "left out the oldest 20 of 20 completed, the oldest 50 of 50 findings to fit"
        in record.getMessage()
    )
    assert "; still 4" in record.getMessage()


@pytest.mark.parametrize("chars", [999, 0, -5])
def test_a_budget_below_a_thousand_characters_is_refused(chars: int) -> None:
    with pytest.raises(ConfigurationError, match="at least 1000") as caught:
        OpenAIModel("m", base_url="http://127.0.0.1:9/v1", max_prompt_chars=chars)
    assert caught.value.field == "max_prompt_chars"
    assert (
        OpenAIModel(
            "m", base_url="http://127.0.0.1:9/v1", max_prompt_chars=1_000
        ).max_prompt_chars
        == 1_000
    )


async def test_a_synthesis_that_loses_results_is_logged_as_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    completed = [done(n, f"result {n} " * 100) for n in range(300)]
    request = ModelRequest(
        role="executor",
        purpose="synthesize",
        output_type=Synthesis,
        run_id="r1",
        context={"goal": GOAL, "completed": completed},
    )
    with chat_server() as server:
        server.reply(completion(Synthesis(output="the answer")))
        async with OpenAIModel(
            "gpt-test", base_url=server.base_url, max_prompt_chars=20_000
        ) as model:
            with caplog.at_level(logging.WARNING, logger="replan.llm"):
                await model.generate(request)
        [sent] = server.chat_requests()
    assert "t299 [completed]" in sent.messages[1]["content"]
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith(
        "executor.synthesize@1 prompt of run r1: left out the oldest "
    )
