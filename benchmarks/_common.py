"""Shared pieces of the benchmarks: the W1 script, timing, memory, reporting.

Every workload uses :class:`replan.ScriptedModel` (no network), the SQLite
journal in a temporary directory, and no tracing (no tracer provider is
installed, so the OpenTelemetry API is a no-op). Nothing here runs at import.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import psutil  # type: ignore[import-untyped]

from replan import (
    Alignment,
    GatePolicy,
    Limits,
    ModelRequest,
    ModelResponse,
    PlanProposal,
    ReplanOutcome,
    RunResult,
    RunSpec,
    RunStatus,
    ScriptedModel,
    Synthesis,
    TaskDraft,
    TaskOutcome,
    TaskStatus,
    Trigger,
    Verdict,
)
from replan.store import SQLiteStore

MIN_REPETITIONS = 5
"""The fewest measured repetitions a figure may be the median of."""
BACKENDS = ("asyncio", "trio")

# The W1 shape: a 20-task chain, milestones after tasks 5, 10 and 15 (counted
# in execution order), replans at the first two milestones.
W1_TASKS = 20
W1_MILESTONES = frozenset({5, 10, 15})
W1_REPLAN_AT = frozenset({1, 2})
"""Milestone indexes (1-based) at which the reviewer asks for a replan."""


# Targets and reference figures ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Metric:
    """One reported figure, its target and the issue's reference figures."""

    key: str
    label: str
    unit: str
    fmt: str
    target: float | None = None
    higher_is_better: bool = False
    anyio_ref: str = ""
    autogen_ref: str = ""
    langgraph_ref: str = ""

    def show(self, value: float) -> str:
        return f"{value:{self.fmt}} {self.unit}".strip()

    def target_text(self) -> str:
        if self.target is None:
            return ""
        sign = ">=" if self.higher_is_better else "<="
        return f"{sign} {self.target:{self.fmt}} {self.unit}".strip()

    def verdict(self, value: float) -> str:
        if self.target is None:
            return ""
        met = value >= self.target if self.higher_is_better else value <= self.target
        return "met" if met else "MISSED"


METRICS = {
    m.key: m
    for m in (
        Metric(
            "w1_us_per_step",
            "W1 replan loop",
            "us/step",
            ".0f",
            target=120,
            anyio_ref="57",
            autogen_ref="208",
            langgraph_ref="675",
        ),
        Metric("w1_cpu_us_per_step", "W1 CPU per step", "us/step", ".0f"),
        Metric("callgrind_w1_minstr_per_run", "W1 instructions per run", "M", ".2f"),
        Metric("callgrind_w1_kinstr_per_step", "W1 instructions per step", "k", ".0f"),
        Metric("w1_peak_rss_mib", "W1 peak RSS", "MiB", ".1f"),
        Metric(
            "w2_efficiency_pct",
            "W2 fan-out efficiency",
            "%",
            ".1f",
            target=97,
            higher_is_better=True,
            anyio_ref="98",
            autogen_ref="96",
            langgraph_ref="94",
        ),
        Metric("w2_wall_s", "W2 wall time", "s", ".3f"),
        Metric(
            "w3_wall_s",
            "W3 200 concurrent runs",
            "s",
            ".2f",
            target=0.9,
            anyio_ref="0.54",
            autogen_ref="1.10",
            langgraph_ref="3.05",
        ),
        Metric("w3_cpu_s", "W3 CPU time", "s", ".2f"),
        Metric("w3_peak_rss_mib", "W3 peak RSS", "MiB", ".1f", target=80),
        Metric("w3_kib_per_run", "W3 memory per run", "KiB", ".0f"),
        Metric(
            "w4_msg_per_s",
            "W4 actor round trips",
            "msg/s",
            ",.0f",
            target=50_000,
            higher_is_better=True,
            anyio_ref="79k",
            autogen_ref="20k",
            langgraph_ref="-",
        ),
    )
}


def report(figures: dict[str, float]) -> None:
    """Print each known figure with its target and whether it is met."""
    for key, value in figures.items():
        metric = METRICS.get(key)
        if metric is None:
            continue
        line = f"  {metric.label:<24} {metric.show(value):>14}"
        if metric.target is not None:
            line += f"   target {metric.target_text():<14} {metric.verdict(value)}"
        print(line)


# The scripted model for W1 and W3 ------------------------------------------------


def chain_drafts(
    count: int, *, first_position: int = 1, after: str | None = None, prefix: str = "s"
) -> list[TaskDraft]:
    """``count`` drafts, each depending on the one before.

    Args:
        count: how many drafts.
        first_position: the execution position (1-based) of the first draft;
            drafts landing on a position in ``W1_MILESTONES`` are milestones.
        after: the id of the task the first draft depends on, if any.
        prefix: the key prefix (keys must be unique within a proposal).
    """
    drafts: list[TaskDraft] = []
    for i in range(count):
        position = first_position + i
        before = drafts[-1].key if drafts else after
        drafts.append(
            TaskDraft(
                key=f"{prefix}{position}",
                description=f"step {position} of the chain",
                depends_on=[before] if before else [],
                milestone=position in W1_MILESTONES,
            )
        )
    return drafts


_OUTCOME = TaskOutcome(
    success=True, summary="step done", findings=["a fact worth reviewing"]
)
_CONTINUE = Verdict(decision="continue", rationale="the plan still holds")
_REPLAN = Verdict(
    decision="replan",
    trigger=Trigger.CONTRADICTION,
    rationale="a finding contradicts the remaining steps",
    confidence=1.0,
    corroborating_sources=5,
)
_SYNTHESIS = Synthesis(output="the chain is done")


def replan_loop_model(request: ModelRequest) -> Any:
    """The W1 script: answers every role from ``request.context``.

    Executor outcomes carry a finding, so the cheap heuristic cannot decide
    and the reviewer model is consulted at every milestone. The reviewer asks
    for a contradiction replan at milestones 1 and 2 and continues otherwise;
    the planner replaces the pending tasks one for one, chained after the last
    completed task, keeping milestones on execution positions 5, 10 and 15.
    """
    ctx = request.context
    match request.role, request.purpose:
        case "executor", "execute":
            return _OUTCOME
        case "reviewer", "milestone":
            return _REPLAN if ctx["milestone_index"] in W1_REPLAN_AT else _CONTINUE
        case "planner", "replan":
            done = ctx["completed"]
            drafts = chain_drafts(
                len(ctx["pending"]),
                first_position=len(done) + 1,
                after=done[-1].id if done else None,
                prefix=f"r{len(done)}-",
            )
            return PlanProposal(tasks=drafts, rationale="route around the finding")
        case "ranker", "alignment":
            return Alignment(aligned=[True] * len(ctx["proposed"]))
        case "executor", "synthesize":
            return _SYNTHESIS
    raise AssertionError(
        f"the W1 script has no answer for {request.role}/{request.purpose}"
    )


def replan_loop_spec() -> RunSpec:
    """The W1 run: a 20-task discovery chain; only flagged tasks and the end
    of the plan trigger reviews (``milestone_every`` is out of reach)."""
    return RunSpec(
        goal="walk a 20-step chain, replanning twice on the way",
        pattern="discovery",
        tasks=chain_drafts(W1_TASKS),
        limits=Limits(milestone_every=1000, max_task_executions=1000),
        # The default: only scope shifts wait for a person.
        gate_policy=GatePolicy(gate_on=frozenset({Trigger.SCOPE_SHIFT})),
    )


def check_replan_loop(result: RunResult) -> None:
    """Raise unless a W1 run ended as the workload intends."""
    applied = sum(r.outcome is ReplanOutcome.APPLIED for r in result.replans)
    completed = sum(t.status is TaskStatus.COMPLETED for t in result.tasks)
    problems = []
    if result.status is not RunStatus.COMPLETED:
        problems.append(f"status {result.status} ({result.stop_reason})")
    if applied != 2 or len(result.replans) != 2:
        problems.append(f"{applied} applied of {len(result.replans)} replans, not 2")
    if completed != W1_TASKS or result.task_executions != W1_TASKS:
        problems.append(
            f"{completed} tasks completed in {result.task_executions} executions"
        )
    if result.iterations != 4:
        problems.append(f"{result.iterations} milestone reviews, not 4")
    if problems:
        raise AssertionError("W1 run went wrong: " + "; ".join(problems))


class BenchModel(ScriptedModel):
    """A :class:`ScriptedModel` that keeps no record of its calls.

    ``ScriptedModel.calls`` keeps every request (with its context) for tests
    to inspect; over thousands of calls that would be the test double's
    memory and GC load, not replan's, so the benchmarks drop it.
    """

    async def generate(self, request: ModelRequest) -> ModelResponse:
        try:
            return await super().generate(request)
        finally:
            self.calls.clear()


# The journal ------------------------------------------------------------------


JOURNAL = {"synchronous": "NORMAL"}
"""The journal's settings (``--synchronous`` sets them for a script's run)."""


@asynccontextmanager
async def sqlite_journal() -> AsyncIterator[SQLiteStore]:
    """A fresh SQLite journal in a temporary directory, closed on exit."""
    with tempfile.TemporaryDirectory(prefix="replan-bench-") as directory:
        synchronous = "FULL" if JOURNAL["synchronous"] == "FULL" else "NORMAL"
        store = SQLiteStore(
            os.path.join(directory, "journal.db"), synchronous=synchronous
        )
        try:
            yield store
        finally:
            await store.aclose()


# Timing and memory --------------------------------------------------------------


def settle() -> None:
    """Collect garbage before a timed window, outside it.

    A stopped supervisor leaves its pool workers in reference cycles (~16k
    objects for the default pools) that only the cycle collector frees. Left
    alone, earlier repetitions' garbage makes a gen-2 collection land in a
    later repetition's window at random: one collection costs tens of ms, as
    much as a whole W1 run. Collections the timed work itself causes still
    count.
    """
    gc.collect()


def now() -> float:
    return time.perf_counter()


def cpu_now() -> float:
    """CPU seconds of this process: unlike wall time, blind to other
    processes competing for the two cores (the machine is shared)."""
    return time.process_time()


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def rss_mib() -> float:
    """The resident set size now."""
    return float(psutil.Process().memory_info().rss) / 2**20


def peak_rss_mib() -> float:
    """The process's peak resident set size so far (``ru_maxrss``).

    Clean per workload only in a fresh process: ``run_all.py`` runs each
    workload in its own, and so does running a script alone.
    """
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


# Command line -------------------------------------------------------------------


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options every workload takes: ``--backend``, ``--repetitions`` and
    ``--synchronous``."""
    parser.add_argument("--backend", choices=BACKENDS, default="asyncio")
    parser.add_argument(
        "--synchronous",
        choices=("NORMAL", "FULL"),
        default="NORMAL",
        help="the SQLite journal's synchronous setting (FULL: an fsync per "
        "commit; the figures and targets are for NORMAL, the default)",
    )
    parser.add_argument(
        "--repetitions",
        type=_positive,
        default=None,
        help="measured repetitions; figures are medians (default: the "
        f"workload's own, at least {MIN_REPETITIONS})",
    )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def check_repetitions(repetitions: int) -> int:
    if repetitions < 1:
        raise ValueError("repetitions must be at least 1")
    return repetitions


def run_script(main: Callable[..., dict[str, float]], description: str) -> None:
    """What ``python benchmarks/wN_*.py`` does: parse options, run, report."""
    parser = argparse.ArgumentParser(description=description)
    add_options(parser)
    args = parser.parse_args()
    JOURNAL["synchronous"] = args.synchronous
    main(backend=args.backend, repetitions=args.repetitions)
