from __future__ import annotations

from typing import assert_never

from .._errors import ModelError
from ..llm import Model
from ..messages import (
    Critique,
    CritiqueReply,
    CritiqueRequest,
    ExploreReply,
    ExploreRequest,
    ModelCall,
    ReviewReply,
    ReviewRequest,
    Verdict,
)
from ._calls import Allowance, call_model, explore_call, spent_before
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
                calls: list[ModelCall] = []
                allowance = Allowance(request.token_allowance)
                for index, candidate in enumerate(request.candidates):
                    if allowance.spent:
                        return CritiqueReply(
                            critiques=critiques, calls=calls, cut_short=True
                        )
                    context = dict(request.context)
                    context.update(candidate=candidate, candidate_index=index)
                    try:
                        critique, call = await call_model(
                            self._model,
                            role="reviewer",
                            purpose="critique",
                            output_type=Critique,
                            context=context,
                            temperature=0.0,
                            run_id=ctx.run_id,
                        )
                    except ModelError as exc:
                        spent_before(exc, calls)
                        raise
                    critiques.append(critique)
                    calls.append(call)
                    allowance.charge(call)
                return CritiqueReply(critiques=critiques, calls=calls)
            case _:
                assert_never(request)
