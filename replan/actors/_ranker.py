from __future__ import annotations

from itertools import combinations
from typing import assert_never

from .._errors import ModelOutputError
from ..llm import Model
from ..messages import (
    Alignment,
    AlignmentReply,
    AlignmentRequest,
    Comparison,
    ExploreReply,
    ExploreRequest,
    RankReply,
    RankRequest,
    TokenUsage,
)
from ._calls import Allowance, explore_call, with_problem
from ._runtime import ActorContext


class Ranker:
    """Checks proposals against the goal, and orders candidates by tournament."""

    def __init__(self, model: Model) -> None:
        self._model = model

    async def handle(
        self,
        request: AlignmentRequest | RankRequest | ExploreRequest,
        ctx: ActorContext,
    ) -> AlignmentReply | RankReply | ExploreReply:
        match request:
            case ExploreRequest():
                return await explore_call(self._model, "ranker", request, ctx, 0.0)
            case AlignmentRequest():
                return await self._alignment(request, ctx)
            case RankRequest():
                return await self._tournament(request, ctx)
            case _:
                assert_never(request)

    async def _alignment(
        self, request: AlignmentRequest, ctx: ActorContext
    ) -> AlignmentReply:
        """The goal-alignment check: one flag per proposed task, in order.

        An answer with fewer flags validates as an :class:`Alignment`, so
        no adapter asks again for it; it is asked once more here, with the
        count in ``answer_problem``, and a second such answer is a
        :class:`ModelOutputError`. Read as it stands, a missing flag would
        count as a task off the goal (refusing the replan as drift) on the
        strength of nothing the ranker said. Flags past the last task judge
        nothing and are left out (see :func:`drifted`).

        Raises:
            ModelError: as :func:`call_model`, with the tokens of both calls.
        """
        proposed = len(request.context.get("proposed") or ())
        allowance = Allowance(None)
        context = request.context
        problem = ""
        for _ in range(2):
            alignment = await allowance.call(
                self._model,
                role="ranker",
                purpose="alignment",
                output_type=Alignment,
                context=context,
                temperature=0.0,
                run_id=ctx.run_id,
            )
            if len(alignment.aligned) >= proposed:
                return AlignmentReply(alignment=alignment, calls=allowance.calls)
            problem = (
                f"aligned has {len(alignment.aligned)} flag(s) for {proposed} "
                "proposed task(s): give one per task, in order"
            )
            context = with_problem(request.context, problem)
        error = ModelOutputError(
            f"ranker/alignment: {problem}",
            usage=sum((c.usage for c in allowance.calls), TokenUsage()),
            final=True,
        )
        error.role, error.purpose = "ranker", "alignment"
        raise error

    async def _tournament(self, request: RankRequest, ctx: ActorContext) -> RankReply:
        """Round robin: every pair once; most wins first, ties by index."""
        n = len(request.candidates)
        wins = [0] * n
        comparisons: list[Comparison] = []
        allowance = Allowance(request.token_allowance)
        cut_short = False
        for i, j in combinations(range(n), 2):
            if allowance.spent:
                cut_short = True
                break
            context = dict(request.context)
            context.update(
                a=request.candidates[i],
                b=request.candidates[j],
                a_index=i,
                b_index=j,
            )
            comparison = await allowance.call(
                self._model,
                role="ranker",
                purpose="compare",
                output_type=Comparison,
                context=context,
                temperature=0.0,
                run_id=ctx.run_id,
            )
            wins[i if comparison.winner == "a" else j] += 1
            comparisons.append(comparison)
        order = sorted(range(n), key=lambda k: (-wins[k], k))
        return RankReply(
            order=order,
            wins=wins,
            comparisons=comparisons,
            calls=allowance.calls,
            cut_short=cut_short,
        )
