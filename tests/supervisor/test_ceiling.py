"""The replan ceiling: at most ``limits.max_replans`` replans are applied."""

from __future__ import annotations

import pytest
from scripts import (
    SYNTHESIS,
    chain,
    keep_going,
    replan_verdict,
    run_to_end,
    scripted,
    spec,
    with_finding,
)

from replan import (
    ModelRequest,
    ReplanOutcome,
    RunStatus,
    TaskStatus,
    Trigger,
    Verdict,
)
from replan.messages import GateOpened

APPLIED = ReplanOutcome.APPLIED
CEILING = ReplanOutcome.REFUSED_CEILING


def always_replan(request: ModelRequest) -> Verdict:
    return replan_verdict(rationale="a finding contradicts the plan", confidence=0.95)


@pytest.mark.parametrize("max_replans", [0, 1, 3])
async def test_a_reviewer_that_always_replans_gets_exactly_max_replans_applied(
    max_replans: int,
) -> None:
    model = scripted(execute=with_finding, milestone=always_replan)

    done = await run_to_end(
        model, spec(chain(6), milestone_every=1, max_replans=max_replans)
    )

    result = done.result
    # Every completion is a milestone: six reviews, six replan verdicts.
    assert len(model.calls_for("reviewer", "milestone")) == 6
    assert done.outcomes() == [APPLIED] * max_replans + [CEILING] * (6 - max_replans)
    assert result.replans_applied == max_replans
    assert len(model.calls_for("planner", "replan")) == max_replans
    assert [v.version for v in result.versions] == list(range(1, max_replans + 2))
    assert [r.version for r in result.replans if r.outcome is APPLIED] == list(
        range(2, max_replans + 2)
    )


@pytest.mark.parametrize("max_replans", [0, 1, 3])
async def test_a_run_past_its_replan_ceiling_still_completes_on_its_current_plan(
    max_replans: int,
) -> None:
    model = scripted(execute=with_finding, milestone=always_replan)

    done = await run_to_end(
        model, spec(chain(6), milestone_every=1, max_replans=max_replans)
    )

    result = done.result
    assert result.status is RunStatus.COMPLETED
    assert result.stop_reason is None
    assert result.output == SYNTHESIS
    assert len(model.calls_for("executor", "synthesize")) == 1
    # The refusals left the last applied plan alone: all of it ran.
    last = result.versions[-1].version
    last_plan = [t for t in result.tasks if t.version == last]
    assert last_plan
    assert all(t.status is TaskStatus.COMPLETED for t in last_plan)
    assert sum(t.status is TaskStatus.COMPLETED for t in result.tasks) == 6
    assert result.task_executions == 6
    for record in result.replans:
        if record.outcome is CEILING:
            assert str(max_replans) in record.reason
            assert record.version is None
    assert done.replayed == result


async def test_refused_replans_do_not_count_against_the_ceiling() -> None:
    verdicts = iter(
        [
            replan_verdict(trigger=None),  # refused_invalid
            replan_verdict(),  # applied: the only one allowed
            replan_verdict(),  # refused_ceiling
        ]
    )

    def milestone(request: ModelRequest) -> Verdict:
        return next(verdicts, None) or keep_going(request)

    model = scripted(execute=with_finding, milestone=milestone)

    done = await run_to_end(model, spec(chain(5), milestone_every=1, max_replans=1))

    assert done.outcomes() == [
        ReplanOutcome.REFUSED_INVALID,
        APPLIED,
        CEILING,
    ]
    assert len(model.calls_for("planner", "replan")) == 1
    assert done.result.status is RunStatus.COMPLETED


async def test_a_scope_shift_past_the_ceiling_is_refused_without_a_gate() -> None:
    # Scope shifts wait for a person by default; the ceiling comes first, so
    # nobody is asked about a change that could not be applied.
    scope_shift = replan_verdict(Trigger.SCOPE_SHIFT, rationale="the scope is wider")
    model = scripted(execute=with_finding, milestone=lambda r: scope_shift)

    done = await run_to_end(
        model, spec(chain(3), milestone_every=1, max_replans=0), timeout_s=5
    )

    assert done.outcomes() == [CEILING] * 3
    assert not [e for e in done.events if isinstance(e, GateOpened)]
    assert model.calls_for("planner", "replan") == []
    assert done.result.status is RunStatus.COMPLETED
