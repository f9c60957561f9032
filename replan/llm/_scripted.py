from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from pydantic import BaseModel

from ..messages import TokenUsage
from ._port import ModelRequest, ModelResponse

ScriptHandler = Callable[[ModelRequest], Any]
"""``handler(request)`` (sync or async) returning the output model, a dict to
validate into ``request.output_type``, or a whole :class:`ModelResponse`
(one with ``tool_calls`` asks the executor to run tools first)."""


class ScriptedModel:
    """A model whose answers come from a plain function: exact and offline.

    Tests, the offline demo and the benchmarks use it. Every request is kept
    in :attr:`calls`, so a test can count what each role was asked.

    Args:
        handler: produces the answer for each request.
        latency_s: seconds each call sleeps before answering.
        usage: tokens to report per call, or a function of the request.
        name: the model name reported in responses.
    """

    def __init__(
        self,
        handler: ScriptHandler,
        *,
        latency_s: float = 0.0,
        usage: TokenUsage | Callable[[ModelRequest], TokenUsage] | None = None,
        name: str = "scripted",
    ) -> None:
        self._handler = handler
        self._latency_s = latency_s
        self._usage = usage
        self.name = name
        self.provider_name = "scripted"
        self.calls: list[ModelRequest] = []

    def model_for(self, role: str) -> str:
        """The model name reported for ``role`` (one name for every role)."""
        return self.name

    def calls_for(self, role: str, purpose: str | None = None) -> list[ModelRequest]:
        """The requests made so far by ``role`` (and ``purpose``, if given)."""
        return [
            c
            for c in self.calls
            if c.role == role and (purpose is None or c.purpose == purpose)
        ]

    async def generate(self, request: ModelRequest) -> ModelResponse:
        self.calls.append(request)
        started = time.perf_counter()
        if self._latency_s:
            await anyio.sleep(self._latency_s)
        answer = self._handler(request)
        if inspect.isawaitable(answer):
            answer = await _await(answer)
        if isinstance(answer, ModelResponse):
            return answer
        output = _coerce(answer, request)
        return ModelResponse(
            output=output,
            usage=self._usage_for(request),
            model=self.name,
            latency_s=time.perf_counter() - started,
        )

    def _usage_for(self, request: ModelRequest) -> TokenUsage:
        if self._usage is None:
            return _ONE_CALL
        if isinstance(self._usage, TokenUsage):
            return self._usage
        return self._usage(request)


_ONE_CALL = TokenUsage(calls=1)
"""A call's usage when none is scripted (immutable, so shared)."""


async def _await(answer: Awaitable[Any]) -> Any:
    return await answer


def _coerce(answer: Any, request: ModelRequest) -> BaseModel:
    if isinstance(answer, request.output_type):
        return answer
    if isinstance(answer, dict):
        return request.output_type.model_validate(answer)
    raise TypeError(
        f"scripted answer for {request.role}/{request.purpose} must be a "
        f"{request.output_type.__name__}, a dict or a ModelResponse, "
        f"not {type(answer).__name__}"
    )
