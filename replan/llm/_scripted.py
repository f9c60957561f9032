from __future__ import annotations

import inspect
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from pydantic import BaseModel, ValidationError

from .._errors import ConfigurationError, ModelOutputError
from ..messages import TokenUsage
from ._numbers import finite_number, whole_number
from ._port import ModelRequest, ModelResponse

ScriptHandler = Callable[[ModelRequest], Any]
"""``handler(request)`` (sync or async) returning the output model, a dict to
validate into ``request.output_type``, or a whole :class:`ModelResponse`
(one with ``tool_calls`` asks the executor to run tools first)."""


class ScriptedModel:
    """A model whose answers come from a plain function: exact and offline.

    Tests, the offline demo and the benchmarks use it. Every request is kept
    in :attr:`calls`, so a test can count what each role was asked (the
    latest ``keep_calls`` only, when given: a long-lived process serving
    with it keeps none).

    Args:
        handler: produces the answer for each request.
        latency_s: seconds each call sleeps before answering.
        usage: tokens to report per call, or a function of the request. A
            malformed answer costs them too: as a real model's would.
        name: the model name reported in responses.
        keep_calls: how many of the latest requests :attr:`calls` keeps;
            None (the default) keeps every one.

    Raises:
        ConfigurationError: ``handler`` that is not callable, ``latency_s``
            that is no finite number from 0, or ``keep_calls`` that is no
            whole number from 0.

    An answer of the wrong type, or a dict that does not validate into
    ``request.output_type``, raises :class:`ModelOutputError` with the call's
    ``usage``, as a model adapter reports an answer it cannot use.
    """

    def __init__(
        self,
        handler: ScriptHandler,
        *,
        latency_s: float = 0.0,
        usage: TokenUsage | Callable[[ModelRequest], TokenUsage] | None = None,
        name: str = "scripted",
        keep_calls: int | None = None,
    ) -> None:
        if not callable(handler):
            # Else every call failed as a crash of the role.
            raise ConfigurationError(
                "handler", f"must be a function of the request, not {handler!r}"
            )
        if keep_calls is not None:
            keep_calls = whole_number("keep_calls", keep_calls, minimum=0)
        # Checked here: a sleep of NaN or below 0 fails every call later.
        latency_s = finite_number("latency_s", latency_s, minimum=0)
        # As are a usage and a name no response can carry.
        if usage is not None and not (isinstance(usage, TokenUsage) or callable(usage)):
            raise ConfigurationError(
                "usage",
                f"must be a TokenUsage or a function of the request, not {usage!r}",
            )
        if not isinstance(name, str):
            raise ConfigurationError("name", f"must be text, not {name!r}")
        self._handler = handler
        self._keep = keep_calls
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
        keep = self._keep
        if keep is None:
            self.calls.append(request)
        elif keep:
            calls = self.calls
            calls.append(request)
            if len(calls) >= 2 * keep:  # trimmed now and then, not each call
                del calls[:-keep]
        started = time.perf_counter()
        if self._latency_s:
            await anyio.sleep(self._latency_s)
        answer = self._handler(request)
        # Nearly every answer is a message: isawaitable() would check it
        # against the Awaitable ABC, about 2 us a call.
        if not isinstance(answer, BaseModel) and inspect.isawaitable(answer):
            answer = await _await(answer)
        if isinstance(answer, ModelResponse):
            return answer
        usage = self._usage_for(request)
        try:
            output = _coerce(answer, request)
        except (TypeError, ValidationError) as exc:
            raise ModelOutputError(
                _problem(exc, request),
                usage=usage,
                raw_output=_shown(answer),
            ) from exc
        return ModelResponse(
            output=output,
            usage=usage,
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


def _problem(exc: TypeError | ValidationError, request: ModelRequest) -> str:
    if isinstance(exc, TypeError):
        return str(exc)
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "output"
    more = exc.error_count() - 1
    return (
        f"scripted answer for {request.role}/{request.purpose} is not a valid "
        f"{request.output_type.__name__}: {where}: {first['msg']}"
        + (f" (and {more} more)" if more else "")
    )


def _shown(answer: Any) -> str | None:
    """A malformed dict answer as JSON text, as a real model's would be kept."""
    if not isinstance(answer, dict):
        return None
    return json.dumps(answer, default=repr)
