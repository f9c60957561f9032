from __future__ import annotations

from typing import assert_never

from ..llm import Model
from ..messages import (
    Critique,
    CritiqueReply,
    CritiqueRequest,
    ExploreReply,
    ExploreRequest,
    ReviewReply,
    ReviewRequest,
    Verdict,
)
from ._calls import Allowance, call_model, explore_call
from ._runtime import ActorContext


class Reviewer:
    """Judges findings at milestones, and scores candidate plans on lenses."""

    def __init__(self, model: Model) -> None:
        self._model = model

    async def handle(
        self,
        request: ReviewRequest | CritiqueRequest | ExploreRequest,
        ctx: ActorContext,
    ) -> ReviewReply | CritiqueReply | ExploreReply:
        match request:
            case ExploreRequest():
                return await explore_call(self._model, "reviewer", request, ctx, 0.0)
            case ReviewRequest():
                verdict, call = await call_model(
                    self._model,
                    role="reviewer",
                    purpose="milestone",
                    output_type=Verdict,
                    context=request.context,
                    temperature=0.0,
                    run_id=ctx.run_id,
                )
                return ReviewReply(verdict=verdict, calls=[call])
            case CritiqueRequest():
                critiques: list[Critique] = []
                allowance = Allowance(request.token_allowance)
                for index, candidate in enumerate(request.candidates):
                    if allowance.spent:
                        return CritiqueReply(
                            critiques=critiques, calls=allowance.calls, cut_short=True
                        )
                    context = dict(request.context)
                    context.update(candidate=candidate, candidate_index=index)
                    critique = await allowance.call(
                        self._model,
                        role="reviewer",
                        purpose="critique",
                        output_type=Critique,
                        context=context,
                        temperature=0.0,
                        run_id=ctx.run_id,
                    )
                    critiques.append(critique)
                return CritiqueReply(critiques=critiques, calls=allowance.calls)
            case _:
                assert_never(request)
