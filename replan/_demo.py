"""The offline demo: a research run whose first plan goes stale.

A research agent is asked where efficient sequence modelling stands today. Its
first plan assumes the answer lies in transformer-efficiency papers; the first
search shows the field has largely moved on to state space models. Following
the plan to the letter would produce a tidy but misleading summary, so the
reviewer asks for a ``scope_shift`` replan, a person approves it at the gate,
and the run finishes on a plan that covers what the user actually needs.

Every answer comes from :func:`answer`, a plain function of the request, so the
run needs no API key and two runs give the same result (apart from the run id).
"""

from __future__ import annotations

from pydantic import BaseModel
from pydantic_core import to_json

from .llm import ModelRequest, ScriptedModel
from .messages import (
    Alignment,
    Comparison,
    Critique,
    PlanProposal,
    RunSpec,
    Synthesis,
    Task,
    TaskDraft,
    TaskOutcome,
    TokenUsage,
    Trigger,
    Verdict,
)

GOAL = (
    "Explain the current state of efficient sequence modelling to an engineer "
    "choosing an architecture for long-context workloads."
)

FIRST_PLAN = PlanProposal(
    tasks=[
        TaskDraft(
            key="search",
            description="Search recent papers on transformer efficiency",
            milestone=True,
        ),
        TaskDraft(
            key="extract",
            description="Extract key findings from the top results",
            depends_on=["search"],
        ),
        TaskDraft(
            key="themes",
            description="Identify common themes across the findings",
            depends_on=["extract"],
        ),
        TaskDraft(
            key="summary",
            description="Draft a summary of the field",
            depends_on=["themes"],
        ),
    ],
    rationale="Efficiency work on sequence models is assumed to be transformer work: "
    "find it, extract it, group it, summarise it.",
)

SOURCES_SSM = [
    "Gu, Goel, Re 2021: Efficiently Modeling Long Sequences with Structured "
    "State Spaces (S4), arXiv:2111.00396",
    "Gu, Dao 2023: Mamba: Linear-Time Sequence Modeling with Selective State "
    "Spaces, arXiv:2312.00752",
    "Dao, Gu 2024: Transformers are SSMs (Mamba-2), arXiv:2405.21060",
    "Lieber et al. 2024: Jamba, a hybrid Transformer-Mamba model, arXiv:2403.19887",
    "De et al. 2024: Griffin, gated linear recurrences mixed with local "
    "attention, arXiv:2402.19427",
]
SOURCES_ATTENTION = [
    "Dao et al. 2022: FlashAttention, IO-aware exact attention, arXiv:2205.14135",
    "Katharopoulos et al. 2020: Transformers are RNNs (linear attention), "
    "arXiv:2006.16236",
]

_SEARCH_FINDINGS = [
    "Most of the strongest recent results on efficient sequence modelling come "
    "from state space models (selective SSMs such as Mamba, structured SSMs "
    "such as S4), not from cheaper attention.",
    "Research groups are visibly shifting effort toward SSM and hybrid "
    "SSM-attention architectures (Jamba, Griffin, Mamba-2).",
    "Attention-efficiency papers (sparse or linear attention, faster kernels) "
    "are now a minority of the most relevant results.",
]

_SUMMARIES = {
    "search": "Screened recent work on efficient sequence models: the "
    "transformer framing misses where most of the progress now is.",
    "extract": "Extracted the main results of the top transformer-efficiency "
    "papers: sparse and linear attention, IO-aware kernels, KV-cache compression.",
    "themes": "Common themes: cut the quadratic cost of attention, or make exact "
    "attention cheaper on the hardware.",
    "summary": "Drafted a summary of transformer efficiency techniques.",
    "ssm_literature": "Traced the SSM line from S4 to Mamba and Mamba-2: "
    "linear-time recurrent inference, input-dependent state updates, "
    "hardware-aware scans.",
    "efficient_transformers": "Collected current efficient-attention results: "
    "FlashAttention kernels, linear attention, sliding-window and sparse patterns.",
    "compare": "SSMs lead on long-context throughput and memory; attention keeps "
    "the edge on exact in-context recall; hybrids interleave both.",
    "field_summary": "Drafted a summary of the field covering SSMs, efficient "
    "attention and hybrids, with the trade-offs between them.",
}

_OUTPUT_TOKENS = {
    "plan": 210,
    "replan": 260,
    "execute": 170,
    "synthesize": 330,
    "milestone": 95,
    "alignment": 40,
    "critique": 120,
    "compare": 30,
    "evolve": 250,
}


def demo_spec() -> RunSpec:
    """The demo's run: a discovery run whose first plan comes from the planner."""
    return RunSpec(
        goal=GOAL,
        pattern="discovery",
        context=["Audience: engineers who must pick a model family, not researchers."],
        metadata={"scenario": "goal-displacement"},
    )


MAX_LATENCY_S = 3600.0
"""The longest simulated model call ``replan demo --latency`` and the
daemon's ``model_latency_s`` take: an hour."""


def demo_model(latency_s: float = 0.0, keep_calls: int | None = None) -> ScriptedModel:
    """The scripted model that plays every role of the demo.

    Args:
        latency_s: seconds each model call takes, to watch the run unfold.
        keep_calls: see :class:`~replan.ScriptedModel` (the daemon keeps none).
    """
    return ScriptedModel(
        answer,
        latency_s=latency_s,
        usage=demo_usage,
        name="demo",
        keep_calls=keep_calls,
    )


def demo_usage(request: ModelRequest) -> TokenUsage:
    """Plausible token counts: about four characters of context per token."""
    prompt = to_json(request.context, fallback=str)
    return TokenUsage(
        input_tokens=150 + len(prompt) // 4,
        output_tokens=_OUTPUT_TOKENS.get(request.purpose, 60),
        calls=1,
    )


def answer(request: ModelRequest) -> BaseModel:
    """The demo's answer to any request (the ``ScriptedModel`` handler).

    Explore runs' requests get the explore demo's answers, so one scripted
    model serves both kinds of run (as the daemon's ``scripted:demo`` does).

    Raises:
        LookupError: the demo has no answer for this role and purpose.
    """
    context = request.context
    if context.get("run_kind") == "explore":
        from ._demo_explore import answer as explore_answer

        output: BaseModel = explore_answer(request)
        return output
    match request.role, request.purpose:
        case "planner", "plan":
            return FIRST_PLAN
        case "planner", "replan":
            return _revised_plan(context["completed"])
        case "planner", "boundary":
            return _synthesis_plan(context["completed"])
        case "executor", "execute":
            return _execute(context["task"])
        case "executor", "synthesize":
            return _synthesize(context["completed"])
        case "reviewer", "milestone":
            return _review(context["milestone_index"], context["pending"])
        case "reviewer", "critique":
            return Critique(scores={"alignment": 0.9}, critique="Keeps to the goal.")
        case "ranker", "alignment":
            return Alignment(
                aligned=[True] * len(context["proposed"]),
                rationale="Every proposed task serves the question as asked.",
            )
        case "ranker", "compare":
            return Comparison(winner="a", rationale="Equal; the first is kept.")
        case "evolver", "evolve":
            candidate: PlanProposal = context["candidate"]
            return candidate
    raise LookupError(
        f"the demo script has no answer for {request.role}/{request.purpose}"
    )


def _execute(task: Task) -> TaskOutcome:
    summary = _SUMMARIES.get(task.key, f"Done: {task.description}.")
    findings = _SEARCH_FINDINGS if task.key == "search" else []
    return TaskOutcome(success=True, summary=summary, findings=findings)


def _review(index: int, pending: list[Task]) -> Verdict:
    if index == 1 and pending:
        return Verdict(
            decision="replan",
            trigger=Trigger.SCOPE_SHIFT,
            rationale="The user asked about efficient sequence modelling, and the "
            "search shows that question is now answered mostly by state space "
            "models. Extracting and summarising only transformer papers would "
            "finish the plan but give a misleading picture of the field.",
            confidence=0.85,
            affected_tasks=[t.id for t in pending],
            corroborating_sources=3,
        )
    return Verdict(decision="continue", rationale="The plan still fits the goal.")


def _revised_plan(completed: list[Task]) -> PlanProposal:
    search = next(t.id for t in completed if t.key == "search")
    return PlanProposal(
        tasks=[
            TaskDraft(
                key="ssm_literature",
                description="Survey the state space model literature (S4, Mamba, "
                "Mamba-2) and what made selective SSMs competitive",
                depends_on=[search],
            ),
            TaskDraft(
                key="efficient_transformers",
                description="Collect the latest efficient-transformer results "
                "(attention kernels, linear and sparse attention)",
                depends_on=[search],
            ),
            TaskDraft(
                key="compare",
                description="Compare SSMs, efficient transformers and hybrid "
                "models on quality, long-context cost and recall",
                depends_on=["ssm_literature", "efficient_transformers"],
            ),
            TaskDraft(
                key="field_summary",
                description="Draft a summary of the current state of efficient "
                "sequence modelling, state space models included",
                depends_on=["compare"],
            ),
        ],
        rationale="Widen the scope from transformer efficiency to efficient "
        "sequence models: add the SSM literature and a comparison, keep the search.",
    )


def _synthesis_plan(completed: list[Task]) -> PlanProposal:
    """A hybrid run's boundary: the collected results, compared and summarised."""
    return PlanProposal(
        tasks=[
            TaskDraft(
                key="compare",
                description="Compare SSMs, efficient transformers and hybrid "
                "models on quality, long-context cost and recall",
                depends_on=[t.id for t in completed],
            ),
            TaskDraft(
                key="field_summary",
                description="Draft a summary of the current state of efficient "
                "sequence modelling, state space models included",
                depends_on=["compare"],
            ),
        ],
        rationale="The collected search already points past transformers: "
        "compare the model families it found, then summarise the field.",
    )


def _synthesize(completed: list[Task]) -> Synthesis:
    if any(t.key == "compare" for t in completed):
        return Synthesis(
            output="Efficient sequence modelling is no longer only about cheaper "
            "attention. Selective state space models (Mamba, Mamba-2), which grew "
            "out of the structured SSM work begun with S4, run in linear time "
            "with a fixed-size recurrent state and are competitive with "
            "transformers of similar size on language modelling. Efficient "
            "attention, helped by IO-aware kernels such as FlashAttention, is "
            "still preferred where exact recall over the context matters. "
            "Hybrids that interleave SSM and attention layers (Jamba, Griffin) "
            "are the current middle ground for long-context workloads.",
            sources=SOURCES_SSM + SOURCES_ATTENTION,
        )
    return Synthesis(
        output="Recent work on efficient transformers makes attention cheaper: "
        "IO-aware exact kernels (FlashAttention), linear and sparse attention, "
        "and KV-cache compression. (This summary follows the original plan and "
        "covers attention-based models only.)",
        sources=SOURCES_ATTENTION,
    )
