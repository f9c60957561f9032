from __future__ import annotations

from ..llm import Model
from ..messages import (
    EvolveReply,
    EvolveRequest,
    ExploreReply,
    ExploreRequest,
    PlanProposal,
)
from ._calls import call_model, explore_call
from ._runtime import ActorContext


class Evolver:
    """Refines the strongest candidate using the critiques it received."""

    def __init__(self, model: Model, temperature: float) -> None:
        self._model = model
        self._temperature = temperature

    async def handle(
        self, request: EvolveRequest | ExploreRequest, ctx: ActorContext
    ) -> EvolveReply | ExploreReply:
        if isinstance(request, ExploreRequest):
            return await explore_call(
                self._model, "evolver", request, ctx, self._temperature
            )
        context = dict(request.context)
        context.update(candidate=request.candidate, critiques=request.critiques)
        proposal, call = await call_model(
            self._model,
            role="evolver",
            purpose="evolve",
            output_type=PlanProposal,
            context=context,
            temperature=self._temperature,
            run_id=ctx.run_id,
        )
        return EvolveReply(proposal=proposal, calls=[call])
