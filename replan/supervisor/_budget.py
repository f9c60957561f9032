"""The live token meter of each run, and the model wrapper that enforces it.

The journal's usage lags the calls in flight (a task's usage is recorded when
the task reports back). The meter counts every response as it arrives, so
that no model call starts once a run's budget is spent, even between the
steps of an executor's tool loop or among tasks running at once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from itertools import count
from typing import Any

import anyio

from .._errors import BudgetExhausted, ModelError
from ..llm import Model, ModelRequest, ModelResponse
from ..messages import TokenUsage

REQUEST_KEY = "request_id"
"""The ``ModelRequest.context`` key of a timed request (``call_timeout_s``):
the meter counts its calls' tokens by it."""


class RunMeter:
    """Tokens a run used, counted as responses arrive."""

    def __init__(self, budget: int | None, used: int = 0) -> None:
        self.budget = budget
        self.used = used
        self._attempts: dict[tuple[str, object], TokenUsage] = {}
        """Tokens of each task attempt in flight, by (task id, attempt)."""
        self._cut: set[tuple[str, object]] = set()
        """Attempts cut short (``task_timeout_s``), journaled with the tokens
        of their calls until then: a call of theirs that answers later is
        unreported."""
        self._requests: dict[object, TokenUsage] = {}
        """Tokens of each timed request in flight (see :meth:`watch`), by
        its ``REQUEST_KEY``."""
        self._unreported: dict[int, tuple[str, str, TokenUsage]] = {}
        """Role, purpose and tokens of answers a role holds for a reply it
        has not given yet (see :meth:`MeteredModel.unreported`), and of
        calls that answered after their request was cut short."""
        self._tickets = count()
        self.calls = 0
        """The run's model calls in flight."""
        self._settled: anyio.Event | None = None

    def left(self) -> int | None:
        return None if self.budget is None else self.budget - self.used

    def charge(self, usage: TokenUsage, request: ModelRequest | None = None) -> None:
        self.used += usage.total_tokens
        if request is None:
            return
        if request.task_id is not None:
            key = (request.task_id, request.context.get("attempt"))
            if self._cut and key in self._cut:
                ticket = next(self._tickets)
                self._unreported[ticket] = (request.role, request.purpose, usage)
                return
            spent = self._attempts.get(key)
            self._attempts[key] = usage if spent is None else spent + usage
        else:
            watched = request.context.get(REQUEST_KEY)
            if watched is None:
                return
            spent = self._requests.get(watched)
            if spent is not None:
                self._requests[watched] = spent + usage
            else:
                # Its request was cut short before the call answered (a
                # stop, the run's end, call_timeout_s): no reply will say it.
                ticket = next(self._tickets)
                self._unreported[ticket] = (request.role, request.purpose, usage)

    def call_ended(self) -> None:
        """One of the run's model calls (counted in :attr:`calls`) ended."""
        self.calls -= 1
        if not self.calls and self._settled is not None:
            self._settled.set()
            self._settled = None

    async def settled(self) -> None:
        """Return once none of the run's model calls is in flight."""
        while self.calls:
            if self._settled is None:
                self._settled = anyio.Event()
            await self._settled.wait()

    def watch(self, key: object) -> None:
        """Count the tokens of the calls made for the request ``key`` (its
        context's ``REQUEST_KEY``) until :meth:`take_request`."""
        self._requests[key] = TokenUsage()

    def take_request(self, key: object) -> TokenUsage:
        """The tokens a watched request's calls used, forgetting them: what
        a request cut short (``call_timeout_s``), whose reply never came,
        spent. A call answered later is not counted for it."""
        return self._requests.pop(key, None) or TokenUsage()

    def take_attempt(
        self, task_id: str, attempt: int, *, cut: bool = False
    ) -> TokenUsage | None:
        """The tokens an attempt's model calls used, forgetting them: what a
        timed-out attempt, whose reply never came, spent. ``cut``: the
        attempt was cut short, and a call of its may still answer."""
        if cut:
            self._cut.add((task_id, attempt))
        return self._attempts.pop((task_id, attempt), None)

    def hold(self, role: str, purpose: str, usage: TokenUsage) -> Callable[[], None]:
        """Keep ``usage`` as answered but not yet reported, until the
        returned function is called (the reply that reports it is made)."""
        ticket = next(self._tickets)
        self._unreported[ticket] = (role, purpose, usage)

        def reported() -> None:
            self._unreported.pop(ticket, None)

        return reported

    def take_unreported(self) -> list[tuple[str, str, TokenUsage]]:
        """What the answers of requests cut short before their reply (a
        stop, the run's end) used, by role and purpose, forgetting them."""
        totals: dict[tuple[str, str], TokenUsage] = {}
        for role, purpose, usage in self._unreported.values():
            key = (role, purpose)
            totals[key] = totals[key] + usage if key in totals else usage
        self._unreported.clear()
        return [(role, purpose, usage) for (role, purpose), usage in totals.items()]

    def spent_reason(self) -> str | None:
        """The stop reason once the budget is spent, else None."""
        if self.budget is not None and self.used >= self.budget:
            return f"token_budget: {self.used} of {self.budget} tokens used"
        return None


class MeteredModel:
    """Wraps the supervisor's model: checks and charges the run's meter."""

    def __init__(self, model: Model, meters: Mapping[str, RunMeter]) -> None:
        self.model = model
        self._meters = meters

    def __getattr__(self, name: str) -> Any:
        # provider_name, model_for, name...: whatever the model exposes.
        return getattr(self.model, name)

    def unreported(
        self,
        usage: TokenUsage,
        *,
        role: str,
        purpose: str,
        run_id: str | None,
        task_id: str | None = None,
        context: Mapping[str, Any],
    ) -> Callable[[], None] | None:
        """Count ``usage``, what answers a role holds for a reply still to
        come used (a malformed answer being asked again, the candidates
        before the next one), as the run's until the returned function is
        called: should the request be cut short before its reply (the
        supervisor stops, the run ends), the run journals it all the same.

        None when the run counts the request's calls already: a task
        attempt's (by task), a timed request's (by ``REQUEST_KEY``).
        """
        meter = self._meters.get(run_id) if run_id else None
        if meter is None or task_id is not None or REQUEST_KEY in context:
            return None
        return meter.hold(role, purpose, usage)

    async def generate(self, request: ModelRequest) -> ModelResponse:
        """Raises BudgetExhausted, without calling the model, once spent."""
        meter = self._meters.get(request.run_id) if request.run_id else None
        left = None
        if meter is not None:
            reason = meter.spent_reason()
            if reason is not None:
                raise BudgetExhausted(reason)
            left = meter.left()
        if left is not None:
            request = request.model_copy(update={"token_allowance": left})
        if meter is not None:
            meter.calls += 1
        try:
            answer = self.model.generate(request)
            if not inspect.isawaitable(answer):
                # A plain ``def generate``: awaited, its answer was a
                # TypeError of the role's, retried as a crash.
                raise ModelError(
                    f"{request.role}/{request.purpose}: the model's generate() "
                    f"returned {type(answer).__name__}, not an awaitable: "
                    "define it as `async def generate(self, request)`"
                )
            response = await answer
        except ModelError as exc:
            if exc.usage is not None:
                exc.usage = one_call_at_least(exc.usage)
                if meter is not None:
                    meter.charge(exc.usage, request)
            raise
        finally:
            if meter is not None:
                meter.call_ended()
        if not isinstance(response, ModelResponse):
            # A model of the user's own handing back its answer itself: every
            # call would fail alike, so it fails the call, not the role.
            raise ModelError(
                f"{request.role}/{request.purpose}: the model's generate() "
                f"returned {type(response).__name__}, not a ModelResponse"
            )
        usage = one_call_at_least(response.usage)
        if usage is not response.usage:
            response = response.model_copy(update={"usage": usage})
        if meter is not None:
            meter.charge(usage, request)
        return response


def one_call_at_least(usage: TokenUsage) -> TokenUsage:
    """``usage``, counting the call it came from.

    A model reports how many calls an answer took (two when its adapter
    asked again); one that reports none, as a hand-written ``TokenUsage``
    does, still made one, and the run's usage by role says so.
    """
    if usage.calls:
        return usage
    return usage.model_copy(update={"calls": 1})
