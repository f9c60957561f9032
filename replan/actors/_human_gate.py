from __future__ import annotations

from typing import Protocol

from ..messages import GateRequest, GateResolution
from ._runtime import ActorContext


class GateWaiter(Protocol):
    async def wait(self, request: GateRequest) -> GateResolution: ...


class HumanGate:
    """Waits for a person's resolution of a gate, or applies the timeout policy.

    The waiting itself lives in the gate registry, where ``Supervisor.gates``
    lets a person see and answer it; this actor is the run's side of it.
    """

    def __init__(self, gates: GateWaiter) -> None:
        self._gates = gates

    async def handle(self, request: GateRequest, ctx: ActorContext) -> GateResolution:
        return await self._gates.wait(request)
