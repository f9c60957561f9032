from __future__ import annotations

from .._errors import ModelError
from ..llm import Model
from ..messages import (
    ExploreReply,
    ExploreRequest,
    ModelCall,
    PlanProposal,
    PlanReply,
    PlanRequest,
)
from ._calls import Allowance, call_model, explore_call, spent_before
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
        calls: list[ModelCall] = []
        allowance = Allowance(request.token_allowance)
        for index in range(request.candidates):
            if allowance.spent:
                return PlanReply(proposals=proposals, calls=calls, cut_short=True)
            context = dict(request.context)
            if request.candidates > 1:
                context["candidate"] = index
                context["candidates"] = request.candidates
            try:
                proposal, call = await call_model(
                    self._model,
                    role="planner",
                    purpose=request.purpose,
                    output_type=PlanProposal,
                    context=context,
                    temperature=0.0,
                    run_id=ctx.run_id,
                )
            except ModelError as exc:
                spent_before(exc, calls)
                raise
            proposals.append(proposal)
            calls.append(call)
            allowance.charge(call)
        return PlanReply(proposals=proposals, calls=calls)
