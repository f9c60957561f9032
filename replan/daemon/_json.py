"""Request bodies read with pydantic's JSON parser, not ``json.loads``.

``json.loads`` accepts a lone UTF-16 surrogate escape (``"\\udfff"``), which
is no text: nothing can encode it as UTF-8, so a journal cannot store it.
pydantic's parser refuses it, and the body gets a 400 naming ``body``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import pydantic_core
from fastapi import Request, Response
from fastapi.routing import APIRoute


class BodyNotJson(ValueError):
    """The body is not JSON a run could keep; the message says why."""


class StrictJsonRequest(Request):
    """A request whose ``json()`` is pydantic's parser over UTF-8."""

    _parsed: Any

    async def json(self) -> Any:
        if not hasattr(self, "_parsed"):
            # UnicodeDecodeError for a body that is not UTF-8 (the answer
            # says so); a leading byte-order mark is allowed, as json.loads
            # allows it.
            text = (await self.body()).decode("utf-8-sig")
            try:
                self._parsed = pydantic_core.from_json(text)
            except ValueError as exc:
                reason = str(exc)
                if reason.startswith("recursion limit exceeded"):
                    reason = f"it is nested too deeply ({reason})"
                raise BodyNotJson(reason) from None
        return self._parsed


class StrictJsonRoute(APIRoute):
    """A route that reads its JSON body with :class:`StrictJsonRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strictly(request: Request) -> Response:
            return await handler(StrictJsonRequest(request.scope, request.receive))

        return strictly
