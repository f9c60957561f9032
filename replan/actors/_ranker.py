from __future__ import annotations

from itertools import combinations
from typing import assert_never

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
)
from ._calls import Allowance, call_model, explore_call
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
                alignment, call = await call_model(
                    self._model,
                    role="ranker",
                    purpose="alignment",
                    output_type=Alignment,
                    context=request.context,
                    temperature=0.0,
                    run_id=ctx.run_id,
                )
                return AlignmentReply(alignment=alignment, calls=[call])
            case RankRequest():
                return await self._tournament(request, ctx)
            case _:
                assert_never(request)

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
