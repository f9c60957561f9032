from __future__ import annotations

from ..llm import Model
from ..messages import (
    ExploreReply,
    ExploreRequest,
    PlanProposal,
    PlanReply,
    PlanRequest,
)
from ._calls import Allowance, explore_call
from ._runtime import ActorContext


class Planner:
    """Writes plans: the first one, revisions after a trigger, the hybrid boundary.

    Replanning runs at temperature 0: creativity there is how an agent
    invents its way out of a hard task.
    """

    def __init__(self, model: Model) -> None:
        self._model = model

    async def handle(
        self, request: PlanRequest | ExploreRequest, ctx: ActorContext
    ) -> PlanReply | ExploreReply:
        if isinstance(request, ExploreRequest):
            return await explore_call(self._model, "planner", request, ctx, 0.0)
        proposals: list[PlanProposal] = []
        allowance = Allowance(request.token_allowance)
        for index in range(request.candidates):
            if allowance.spent:
                return PlanReply(
                    proposals=proposals, calls=allowance.calls, cut_short=True
                )
            context = dict(request.context)
            if request.candidates > 1:
                context["candidate"] = index
                context["candidates"] = request.candidates
            proposal = await allowance.call(
                self._model,
                role="planner",
                purpose=request.purpose,
                output_type=PlanProposal,
                context=context,
                temperature=0.0,
                run_id=ctx.run_id,
            )
            proposals.append(proposal)
        return PlanReply(proposals=proposals, calls=allowance.calls)
