"""How the OpenAI adapter retries: which failures, how long to wait.

429, 5xx, 408/409, connection errors and timeouts are retried with
exponential backoff and jitter, waiting what a ``Retry-After`` header asks
for; past the retry count they surface as :class:`TransientModelError`, so the
supervisor retries the task instead of replanning; its ``retry_after`` says
how long the server asked to wait, and the task's retry waits that long. 401/403 raise
:class:`ModelAuthenticationError` on the first answer.

A connection error says which side of the connection failed: ``cannot
connect (...)`` when none was made (refused, unknown host, TLS), ``connected,
but ...`` when the server took the request and then dropped the connection or
sent an answer that could not be decoded. A 401 or 403 that came after a
redirect to another host says so: the HTTP client sends no credentials
across hosts, so that host got no key to reject.

A redirect that goes on redirecting is no passing trouble: like a redirect
with no ``Location``, or a 301, 302 or 303 (which the HTTP client follows
as a GET without the request's body, whatever the page it leads to answers:
an error, or a login page's 200), it fails at once as a :class:`ModelError`
that names the base URL.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anyio
import openai

from .._errors import (
    ModelAuthenticationError,
    ModelError,
    TransientModelError,
)
from ._numbers import finite_number, whole_number
from ._urls import without_credentials

T = TypeVar("T")

RETRYABLE_STATUS = frozenset({408, 409, 429})
_DROPPED = frozenset({"ReadError", "WriteError", "CloseError", "RemoteProtocolError"})
"""The server dropped a connection it had made ("Server disconnected without
sending a response"); httpx and httpx2 name their exceptions alike."""


class BackoffPolicy:
    """Retry count and waits.

    Args:
        max_retries: retries after the first attempt (0: none).
        backoff_s: the first wait; it doubles with each retry.
        max_backoff_s: no wait is longer; a ``Retry-After`` asking for more
            ends the retries at once (the call is reported transient).

    A ``Retry-After`` holds for every call made with the policy to the same
    endpoint and model, not only the one it answered: until the time the server
    asked for, a call waits it out before sending when the rest is within
    ``max_backoff_s``, and fails as transient without sending otherwise, so
    that the retries of the tasks and roles behind the calls do not ask a
    server again while it said to wait.

    Raises:
        ConfigurationError: a count that is not a whole number from 0, or a
            wait that is not a finite number from 0 (NaN would wait forever).
    """

    def __init__(
        self, max_retries: int = 3, backoff_s: float = 0.5, max_backoff_s: float = 30.0
    ) -> None:
        self.max_retries = whole_number("max_retries", max_retries, minimum=0)
        self.backoff_s = finite_number("backoff_s", backoff_s, minimum=0)
        self.max_backoff_s = finite_number("max_backoff_s", max_backoff_s, minimum=0)
        self._not_before: dict[str, float] = {}
        """Per endpoint and model, the ``time.monotonic()`` before which no
        call is sent (a Retry-After)."""

    def hold_off(self, where: str, seconds: float) -> None:
        """The server at ``where`` asked to wait ``seconds``."""
        until = time.monotonic() + seconds
        if until > self._not_before.get(where, 0.0):
            self._not_before[where] = until

    def wait_asked(self, where: str) -> float:
        """Seconds left of the wait the server at ``where`` asked for."""
        until = self._not_before.get(where)
        if until is None:
            return 0.0
        left = until - time.monotonic()
        if left <= 0:
            del self._not_before[where]
            return 0.0
        return left

    def delay(self, retry: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number ``retry`` (from 0)."""
        if retry_after is not None:
            return float(retry_after)
        ceiling = min(self.max_backoff_s, self.backoff_s * 2**retry)
        # Equal jitter: never less than half the backoff, never in lockstep.
        return float(ceiling / 2 + random.uniform(0, ceiling / 2))


async def with_retries(
    call: Callable[[], Awaitable[T]], policy: BackoffPolicy, where: str
) -> T:
    """Run ``call`` until it succeeds or fails for good.

    Args:
        where: the endpoint and model, for error messages.

    Raises:
        ModelAuthenticationError: 401 or 403.
        TransientModelError: retries used up on a retryable failure.
        ModelError: a redirect that loops, has nowhere to go, or would
            send the request on as a GET.
        openai.APIStatusError: any other HTTP error (the caller maps it).
    """
    retry = 0
    while True:
        asked = policy.wait_asked(where)
        if asked > policy.max_backoff_s:
            raise TransientModelError(
                f"{where}: not sent: the server asked to wait {asked:.3g}s more "
                f"(Retry-After), more than max_backoff_s={policy.max_backoff_s:g}",
                retry_after=asked,
            )
        if asked:
            await anyio.sleep(asked)
        try:
            return await call()
        except openai.APIStatusError as exc:
            moved = redirected_as_get(exc.response)
            if moved is not None:
                raise ModelError(f"{where}: {moved}: check the base URL") from None
            if isinstance(
                exc, openai.AuthenticationError | openai.PermissionDeniedError
            ):
                hosts = _credentials_left_behind(exc.response)
                if hosts is not None:
                    origin, target = hosts
                    raise ModelAuthenticationError(
                        f"{where}: HTTP {exc.status_code} from {target} "
                        f"({_message(exc)}) after a redirect from {origin}: the "
                        "HTTP client sends no credentials to another host, so "
                        f"{target} got no key: if it is the endpoint, give its "
                        "URL as the base URL"
                    ) from None
                raise ModelAuthenticationError(
                    f"{where} rejected the credentials ({exc.status_code}: "
                    f"{_message(exc)}): set OPENAI_API_KEY (or pass api_key) to a "
                    "key this endpoint accepts"
                ) from None
            if exc.status_code < 500 and exc.status_code not in RETRYABLE_STATUS:
                raise
            problem = f"HTTP {exc.status_code}: {_message(exc)}"
            retry_after = _retry_after(exc.response.headers)
            if retry_after:
                policy.hold_off(where, retry_after)
        except (openai.APITimeoutError, TimeoutError):
            problem = "the request timed out"
            retry_after = None
        except openai.APIConnectionError as exc:
            problem = connection_problem(exc)
            if _redirected_too_often(exc):
                raise ModelError(f"{where}: {problem}: check the base URL") from None
            retry_after = None
        if retry >= policy.max_retries:
            raise TransientModelError(
                f"{where}: {problem} (after {retry + 1} attempt(s))",
                retry_after=policy.wait_asked(where) or None,
            ) from None
        if retry_after is not None and retry_after > policy.max_backoff_s:
            raise TransientModelError(
                f"{where}: {problem}; the server asks to wait {retry_after:g}s, "
                f"more than max_backoff_s={policy.max_backoff_s:g}",
                retry_after=retry_after,
            ) from None
        if retry_after is None:
            await anyio.sleep(policy.delay(retry, retry_after))
        # else: the wait the server asked for is taken before the next send
        retry += 1


def redirected_as_get(response: Any) -> str | None:
    """What happened when the request was redirected by a 301, 302 or 303,
    which the HTTP client follows as a GET without the request's body (the
    answer, a 405 or a login page say, is not the endpoint's); None when it
    was not."""
    chain = [*(getattr(response, "history", None) or []), response]
    for redirect, followed in itertools.pairwise(chain):
        if redirect.request.method != followed.request.method:
            target = without_credentials(str(followed.request.url))
            return (
                f"HTTP {redirect.status_code}: redirected to {target}, where the "
                f"request would go as a {followed.request.method} without its body"
            )
    return None


def _credentials_left_behind(response: Any) -> tuple[str, str] | None:
    """The hosts (origins) before and after a redirect that took the request
    to another one, where the HTTP client sent it without the credentials it
    carried (its ``Authorization``); None when none was left behind."""
    chain = [*(getattr(response, "history", None) or []), response]
    first, last = chain[0].request, chain[-1].request
    if "authorization" not in first.headers or "authorization" in last.headers:
        return None
    return _origin(first.url), _origin(last.url)


def _origin(url: object) -> str:
    """A URL's scheme, host and port, without its credentials or path."""
    parts = urlsplit(str(url))
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    port = f":{parts.port}" if parts.port is not None else ""
    return f"{parts.scheme}://{host}{port}"


def _redirected_too_often(exc: openai.APIConnectionError) -> bool:
    cause = exc.__cause__ or exc
    return any(kind.__name__ == "TooManyRedirects" for kind in type(cause).__mro__)


def connection_problem(exc: openai.APIConnectionError) -> str:
    """What went wrong with the connection, for a message: ``cannot connect``
    only when no connection was made."""
    cause = exc.__cause__ or exc
    detail = str(cause) or type(cause).__name__
    names = {kind.__name__ for kind in type(cause).__mro__}
    if names & _DROPPED:
        return (
            "connected, but the server dropped the connection before a complete "
            f"answer ({detail})"
        )
    if "DecodingError" in names:
        return f"connected, but the answer could not be decoded ({detail})"
    if "TooManyRedirects" in names:
        return f"connected, but the server redirected too often ({detail})"
    if "LocalProtocolError" in names:  # an illegal header value, say
        return f"the request could not be sent ({detail})"
    return f"cannot connect ({detail})"


def status_error(exc: openai.APIStatusError, where: str) -> ModelError:
    """A non-retryable HTTP error as a model error naming the likely fix."""
    hint = ""
    if exc.status_code == 404:
        hint = ": check the model name and the base URL"
    elif 300 <= exc.status_code < 400:  # a redirect with nowhere to go
        hint = ": check the base URL"
    return ModelError(f"{where}: HTTP {exc.status_code}: {_message(exc)}{hint}")


MESSAGE_CHARS = 1_000
"""The most characters of a server's error message kept in an error: some
proxies quote the whole request in theirs, which would otherwise fill the
journal, the task's reason and the command's error line."""


def _message(exc: openai.APIStatusError) -> str:
    body = exc.body
    message = exc.message
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            message = str(inner["message"])
        elif isinstance(inner, str):
            message = inner
    if len(message) <= MESSAGE_CHARS:
        return message
    left = len(message) - MESSAGE_CHARS
    return f"{message[:MESSAGE_CHARS]}... ({left} more characters)"


MAX_RETRY_AFTER_S = 86_400.0
"""The longest wait a ``Retry-After`` holds calls for: a day. A server's
date years ahead (a clock or proxy gone wrong) must not hold a model for the
life of the process."""


def _retry_after(headers: object) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (seconds or a date),
    at most :data:`MAX_RETRY_AFTER_S`; a value that is no finite wait is none."""
    get = getattr(headers, "get", None)
    if get is None:
        return None
    millis = get("retry-after-ms")
    if millis is not None:
        try:
            return _bounded(float(millis) / 1000)
        except ValueError:
            pass
    value = get("retry-after")
    if value is None:
        return None
    try:
        return _bounded(float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return _bounded((when - datetime.now(UTC)).total_seconds())


def _bounded(seconds: float) -> float | None:
    if not math.isfinite(seconds):
        return None  # "inf", "nan": no wait anyone could mean
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)
