from __future__ import annotations

from ..llm import Model
from ..messages import EvolveReply, EvolveRequest, PlanProposal
from ._calls import call_model
from ._runtime import ActorContext


class Evolver:
    """Refines the strongest candidate using the critiques it received."""

    def __init__(self, model: Model, temperature: float) -> None:
        self._model = model
        self._temperature = temperature

    async def handle(self, request: EvolveRequest, ctx: ActorContext) -> EvolveReply:
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
