"""Metrics through the OpenTelemetry metrics API, read with an in-memory reader."""

from __future__ import annotations

import itertools
from typing import Any

import anyio
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from scripts import (
    chain,
    first_then_continue,
    independent,
    replan_verdict,
    scripted,
    spec,
    with_finding,
)
from spans import Tree, attr, run_traced, until

from replan import (
    GateResolution,
    MemoryStore,
    ModelRequest,
    Supervisor,
    Task,
    TaskContext,
    TaskOutcome,
    TokenUsage,
    Trigger,
    Verdict,
)
from replan.telemetry import _names as n
from replan.telemetry._telemetry import GATE_WAIT_BUCKETS, TASK_DURATION_BUCKETS

USAGE = TokenUsage(input_tokens=10, output_tokens=4, calls=1)


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    found: list[Any] = []
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    found.extend(metric.data.data_points)
    return found


def by(points_: list[Any], *keys: str) -> dict[tuple[Any, ...], Any]:
    return {tuple(p.attributes[k] for k in keys): p for p in points_}


def always_replan(request: ModelRequest) -> Verdict:
    return replan_verdict(confidence=0.95)


async def test_runs_replans_tokens_and_task_durations_are_counted(
    provider: TracerProvider,
    meter_provider: MeterProvider,
    metric_reader: InMemoryMetricReader,
) -> None:
    model = scripted(execute=with_finding, milestone=always_replan, usage=USAGE)
    result = await run_traced(
        model,
        spec(chain(3), milestone_every=1, max_replans=1),
        provider,
        meter_provider,
    )
    runs = by(points(metric_reader, n.METRIC_RUNS), n.RUN_OUTCOME)
    assert {k: p.value for k, p in runs.items()} == {("completed",): 1}

    replans = by(
        points(metric_reader, n.METRIC_REPLANS), n.REPLAN_TRIGGER, n.REPLAN_OUTCOME
    )
    assert {k: p.value for k, p in replans.items()} == {
        ("contradiction", "applied"): 1,
        ("contradiction", "refused_ceiling"): 2,
    }

    tokens = by(
        points(metric_reader, n.METRIC_TOKENS), n.GEN_AI_AGENT_NAME, n.GEN_AI_TOKEN_TYPE
    )
    expected = {}
    for role, usage in result.usage.by_role.items():
        expected[(role, "input")] = usage.input_tokens
        expected[(role, "output")] = usage.output_tokens
    assert {k: p.value for k, p in tokens.items()} == expected
    assert expected[("executor", "input")] == 10 * (result.task_executions + 1)

    (durations,) = points(metric_reader, n.METRIC_TASK_DURATION)
    assert durations.attributes == {n.TASK_OUTCOME: "completed"}
    assert durations.count == result.task_executions == 3


async def test_task_durations_of_a_few_seconds_fall_in_different_buckets(
    provider: TracerProvider,
    meter_provider: MeterProvider,
    metric_reader: InMemoryMetricReader,
) -> None:
    async def execute(request: ModelRequest) -> TaskOutcome:
        task = request.context["task"]
        await anyio.sleep(0.05 if task.id == "t1" else 0.4)
        return TaskOutcome(success=True, summary="done")

    await run_traced(
        scripted(execute=execute), spec(independent(2)), provider, meter_provider
    )
    (durations,) = points(metric_reader, n.METRIC_TASK_DURATION)
    assert durations.count == 2
    assert list(durations.explicit_bounds) == list(TASK_DURATION_BUCKETS)
    assert [c for c in durations.bucket_counts if c] == [1, 1]
    assert durations.explicit_bounds[0] <= 0.05  # not the SDK's 0, 5, 10...
    # As documented: from 0.01 s, doubling, to about 11 minutes.
    bounds = list(durations.explicit_bounds)
    assert bounds[0] == 0.01
    assert all(b == 2 * a for a, b in itertools.pairwise(bounds))
    assert 10 * 60 < bounds[-1] < 11 * 60 + 30


async def test_a_gates_wait_is_measured_until_its_answer(
    meter_provider: MeterProvider, metric_reader: InMemoryMetricReader
) -> None:
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict(Trigger.SCOPE_SHIFT)),
    )
    async with Supervisor(model, MemoryStore(), meter_provider=meter_provider) as sup:
        handle = await sup.submit(
            spec(chain(2, milestone_at=[1]), gate_timeout_s=30, max_replans=1)
        )
        await until(sup.gates.pending)
        await anyio.sleep(0.1)
        (gate,) = sup.gates.pending()
        await sup.gates.resolve(gate.gate_id, GateResolution(decision="reject"))
        with anyio.fail_after(5):
            await handle.result()
    (waits,) = points(metric_reader, n.METRIC_GATE_WAIT)
    assert waits.attributes == {n.GATE_DECISION: "reject", n.GATE_OUTCOME: "resolved"}
    assert waits.count == 1
    assert 0.1 <= waits.sum < 5
    assert list(waits.explicit_bounds) == list(GATE_WAIT_BUCKETS)
    assert waits.explicit_bounds[-1] >= 86400  # a wait over a night is no outlier
    # As documented: from a second to a week.
    assert (waits.explicit_bounds[0], waits.explicit_bounds[-1]) == (1, 7 * 86400)


async def test_a_replan_a_gate_timeout_rejected_is_labelled_rejected_by_policy(
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    meter_provider: MeterProvider,
    metric_reader: InMemoryMetricReader,
) -> None:
    model = scripted(
        execute=with_finding,
        milestone=first_then_continue(replan_verdict(Trigger.SCOPE_SHIFT)),
    )
    result = await run_traced(
        model,
        spec(chain(2, milestone_at=[1]), gate_timeout_s=0.05),
        provider,
        meter_provider,
    )
    assert [r.outcome.value for r in result.replans] == ["rejected_by_policy"]
    replans = by(
        points(metric_reader, n.METRIC_REPLANS), n.REPLAN_TRIGGER, n.REPLAN_OUTCOME
    )
    assert {k: p.value for k, p in replans.items()} == {
        ("scope_shift", "rejected_by_policy"): 1
    }
    replan = Tree(exporter.get_finished_spans()).one(n.SPAN_REPLAN)
    assert attr(replan, n.REPLAN_OUTCOME) == "rejected_by_policy"
    waited = Tree(exporter.get_finished_spans()).one(n.SPAN_GATE)
    assert attr(waited, n.GATE_DECIDED_BY) == "policy:timeout"
    assert attr(waited, n.GATE_OUTCOME) == "timed_out"
    (waits,) = points(metric_reader, n.METRIC_GATE_WAIT)
    assert waits.attributes == {n.GATE_DECISION: "reject", n.GATE_OUTCOME: "timed_out"}


async def test_the_mailbox_depth_gauge_shows_requests_waiting_per_role(
    meter_provider: MeterProvider, metric_reader: InMemoryMetricReader
) -> None:
    release = anyio.Event()
    running = 0

    async def blocked(task: Task, ctx: TaskContext) -> TaskOutcome:
        nonlocal running
        running += 1
        await release.wait()
        return TaskOutcome(success=True, summary="done")

    async with Supervisor(
        scripted(),
        MemoryStore(),
        task_runner=blocked,
        workers={"executor": 1},
        meter_provider=meter_provider,
    ) as sup:
        handle = await sup.submit(spec(independent(3), max_concurrency=3))
        executor = sup._roles.executor  # type: ignore[union-attr]
        await until(lambda: running and executor.statistics().mailbox_depth == 2)
        depth = by(points(metric_reader, n.METRIC_MAILBOX_DEPTH), n.ACTOR_ROLE)
        release.set()
        with anyio.fail_after(5):
            await handle.result()
    assert depth[("executor",)].value == 2
    assert depth[("planner",)].value == 0
    assert set(depth) == {
        (role,)
        for role in (
            "planner",
            "executor",
            "reviewer",
            "ranker",
            "evolver",
            "human_gate",
        )
    }
    # A stopped supervisor reports no mailboxes.
    assert points(metric_reader, n.METRIC_MAILBOX_DEPTH) == []


async def test_every_supervisor_on_a_meter_provider_reports_its_mailboxes(
    meter_provider: MeterProvider, metric_reader: InMemoryMetricReader
) -> None:
    release = anyio.Event()
    running = 0

    async def blocked(task: Task, ctx: TaskContext) -> TaskOutcome:
        nonlocal running
        running += 1
        await release.wait()
        return TaskOutcome(success=True, summary="done")

    def supervisor() -> Supervisor:
        return Supervisor(
            scripted(),
            MemoryStore(),
            task_runner=blocked,
            workers={"executor": 1},
            meter_provider=meter_provider,
        )

    # One supervisor after another (an application that restarts its own),
    # then two at once: each one's waiting requests are reported.
    async with supervisor():
        pass
    async with supervisor() as first, supervisor() as second:
        handles = [
            await sup.submit(spec(independent(3), max_concurrency=3))
            for sup in (first, second)
        ]
        pools = [sup._roles.executor for sup in (first, second)]  # type: ignore[union-attr]
        await until(
            lambda: (
                running == 2 and all(p.statistics().mailbox_depth == 2 for p in pools)
            )
        )
        depth = by(points(metric_reader, n.METRIC_MAILBOX_DEPTH), n.ACTOR_ROLE)
        release.set()
        with anyio.fail_after(5):
            for handle in handles:
                await handle.result()
    assert depth[("executor",)].value == 4
    assert depth[("planner",)].value == 0
    assert points(metric_reader, n.METRIC_MAILBOX_DEPTH) == []


async def test_an_attempt_whose_executor_crashed_is_counted_and_traced_as_crashed(
    provider: TracerProvider,
    meter_provider: MeterProvider,
    metric_reader: InMemoryMetricReader,
    exporter: InMemorySpanExporter,
) -> None:
    async def crash_once(task: Task, ctx: TaskContext) -> TaskOutcome:
        if ctx.attempt == 1:
            raise RuntimeError("the runner broke")
        return TaskOutcome(success=True, summary="done")

    async with Supervisor(
        scripted(),
        MemoryStore(),
        task_runner=crash_once,
        tracer_provider=provider,
        meter_provider=meter_provider,
    ) as sup:
        with anyio.fail_after(10):
            await (await sup.submit(spec(chain(1)))).result()
    durations = by(points(metric_reader, n.METRIC_TASK_DURATION), n.TASK_OUTCOME)
    assert {k: p.count for k, p in durations.items()} == {
        ("crashed",): 1,
        ("completed",): 1,
    }
    executors = [  # the task's attempts, not the synthesis
        s
        for s in exporter.get_finished_spans()
        if s.name == "invoke_agent executor" and n.TASK_ID in (s.attributes or {})
    ]
    outcomes = sorted(
        (s.attributes or {}).get(n.TASK_OUTCOME, "none") for s in executors
    )
    assert outcomes == ["completed", "crashed"]
    # The span records the runner's own exception.
    (crashed,) = (s for s in executors if s.attributes[n.TASK_OUTCOME] == "crashed")
    assert crashed.attributes is not None
    assert crashed.attributes[n.ERROR_TYPE] == "RuntimeError"


async def test_a_transient_then_a_lasting_failure_are_counted_and_traced_apart(
    provider: TracerProvider,
    meter_provider: MeterProvider,
    metric_reader: InMemoryMetricReader,
    exporter: InMemorySpanExporter,
) -> None:
    def execute(request: ModelRequest) -> TaskOutcome:
        transient = request.context["attempt"] == 1
        return TaskOutcome(success=False, transient=transient, reason="no luck")

    await run_traced(
        scripted(execute=execute),
        spec(chain(1), max_task_attempts=2),
        provider,
        meter_provider,
    )
    durations = by(points(metric_reader, n.METRIC_TASK_DURATION), n.TASK_OUTCOME)
    assert {k: p.count for k, p in durations.items()} == {
        ("transient_failure",): 1,
        ("failed",): 1,
    }
    attempts = {
        attr(s, n.TASK_ATTEMPT): attr(s, n.TASK_OUTCOME)
        for s in exporter.get_finished_spans()
        if s.name == "invoke_agent executor" and n.TASK_ID in (s.attributes or {})
    }
    assert attempts == {1: "transient_failure", 2: "failed"}


async def test_totals_count_every_run_with_no_metrics_sdk_past_keep_finished() -> None:
    # No meter provider: the OpenTelemetry API is a no-op, and the
    # supervisor keeps one finished run in memory; its totals still count
    # every run, replan and token, as the metrics would.
    model = scripted(execute=with_finding, milestone=always_replan, usage=USAGE)
    results = []
    with anyio.fail_after(10):
        async with Supervisor(model, MemoryStore(), keep_finished=1) as sup:
            assert sup.totals().runs_ended == {}
            for _ in range(3):
                handle = await sup.submit(
                    spec(chain(3), milestone_every=1, max_replans=1)
                )
                results.append(await handle.result())
            totals = sup.totals()
    assert len(sup.handles()) <= 1
    assert totals.runs_ended == {"completed": 3}
    assert totals.replans == {
        ("contradiction", "applied"): 3,
        ("contradiction", "refused_ceiling"): 6,
    }
    expected: dict[tuple[str, str], int] = {}
    for result in results:
        for role, usage in result.usage.by_role.items():
            key_in, key_out = (role, "input"), (role, "output")
            expected[key_in] = expected.get(key_in, 0) + usage.input_tokens
            expected[key_out] = expected.get(key_out, 0) + usage.output_tokens
    counted = {k: v for k, v in totals.tokens.items() if k in expected}
    assert counted == expected
    assert expected[("executor", "input")] > 0
