"""The exceptions replan raises.

::

    ReplanError                      base of everything below
    ├── ConfigurationError           bad RunSpec / Limits / Supervisor arguments;
    │   │                            raised before anything runs (also a ValueError)
    │   └── MissingPromptError       no prompt template for a role and purpose
    ├── SupervisorError              the supervisor is not running or is shutting down
    │   └── RunDrivenElsewhere       another supervisor drives the run (a GateError too)
    ├── UnknownRunError              no run with that id (also a KeyError)
    ├── GateError                    no pending gate with that id, or a bad resolution
    │   ├── GateAlreadyResolved      the gate has its answer already
    │   └── ResolutionRefused        the answer does not fit the gate (names the field)
    ├── JournalConflict              an append did not continue a run's journal
    │   └── LeaseLost                another supervisor took the run's lease meanwhile
    ├── JournalUnavailable           a run's first write failed: the run was not started
    ├── JournalCorrupt               a stored event or run row cannot be read back
    ├── ToolArgumentsError           a model's arguments do not fit the tool (also a
    │                                ValueError)
    ├── ActorError                   a request to an actor did not produce a reply
    │   ├── ActorCrashed             the handler raised; carries the typed failure
    │   ├── ActorStopped             stopped (shutdown, or too many restarts)
    │   └── ActorTimeout             the envelope's deadline passed
    └── ModelError                   a model call failed (keeps its usage, raw text)
        ├── TransientModelError      a retry may help: retried, never replanned
        ├── BudgetExhausted          the run's token budget is spent
        ├── ModelAuthenticationError bad credentials: the run stops at once
        ├── ModelRefusal             the model refused, or a content filter stopped it
        └── ModelOutputError         the answer did not validate, even after one re-ask

Run-time outcomes (a refused replan, a reached limit, an aborted plan) are not
exceptions: they end the run with a status and a ``stop_reason``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

    from .messages import ActorFailure, ModelFailure, TokenUsage


class ReplanError(Exception):
    """Base class of every exception raised by replan."""


class ConfigurationError(ReplanError, ValueError):
    """A run specification or setting is invalid.

    Attributes:
        field: dotted path of the offending field (``limits.max_replans``).
        problem: what is wrong with it.
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field
        self.problem = problem

    @classmethod
    def from_validation(cls, exc: ValidationError) -> ConfigurationError:
        """Build from a pydantic error, naming the first offending field."""
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        problem = first["msg"].removeprefix("Value error, ")
        inner = first.get("ctx", {}).get("error")
        if isinstance(inner, ConfigurationError):
            # A nested settings model (Limits inside RunSpec) already named
            # its field: join the two paths.
            field = f"{field}.{inner.field}" if field else inner.field
            problem = inner.problem
        more = exc.error_count() - 1
        if more:
            problem += f" (and {more} more problem{'s' if more > 1 else ''})"
        return cls(field, problem)


class SupervisorError(ReplanError):
    """The supervisor cannot take the request (not started, or stopping)."""


class UnknownRunError(ReplanError, KeyError):
    """No run with this id is known to the supervisor or its store."""

    def __str__(self) -> str:
        return f"unknown run {self.args[0]!r}"


class GateError(ReplanError):
    """A gate id is unknown or already resolved, or the resolution is invalid."""


class GateAlreadyResolved(GateError):
    """The gate has its answer already (another person's, or its timeout's)."""


class RunDrivenElsewhere(SupervisorError, GateError):
    """Another supervisor (another daemon, another process) holds the run's
    lease and drives it: resume it, answer its gates, or cancel it there.

    A :class:`GateError` too, so that code answering gates catches it where
    it catches an unknown gate.

    Attributes:
        run_id: the run.
        holder: who drives it (``host:pid``, see ``PostgresStore``).
    """

    def __init__(self, run_id: str, holder: str) -> None:
        super().__init__(
            f"run {run_id} is driven by another supervisor ({holder}): "
            "resume it, answer its gates or cancel it there"
        )
        self.run_id = run_id
        self.holder = holder


class ResolutionRefused(GateError):
    """The resolution does not fit the gate, or could not be journaled; the
    gate stays open.

    Attributes:
        field: the resolution's field the problem is about (``tasks``,
            ``hypotheses``, ``decision``, ``note``).
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class JournalConflict(ReplanError):
    """An append did not continue the run's journal at the next ``seq``.

    Two writers tried to extend the same run: the later one must stop.
    """


class LeaseLost(JournalConflict):
    """The run's lease is another supervisor's now (this one stalled past
    its expiry, and the other took the run over): this one's append is
    refused, and it lets go of the run.

    Attributes:
        run_id: the run.
        holder: who holds the lease now (``host:pid``), if anyone.
    """

    def __init__(self, message: str, *, run_id: str, holder: str | None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.holder = holder


class JournalUnavailable(ReplanError):
    """The journal could not take a run's first write (a full disk, a lost
    database connection): the run was not started.

    Whether the write reached the journal is not known (a database may have
    committed it before the connection was lost). If it did, the run is
    unfinished in the journal and ``Supervisor.resume()`` (the daemon's
    periodic scan) drives it; look it up by ``run_id`` before submitting the
    spec again, or the work may be done twice.

    Attributes:
        run_id: the id the run was given.
    """

    def __init__(self, message: str, *, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class JournalCorrupt(ReplanError):
    """The journal holds a row this replan cannot read back.

    The file was damaged or edited by hand (a row that is no event, a run
    status that does not exist). The message names the file, the run and,
    for an event, its ``seq``.

    Attributes:
        run_id: the run whose row is unreadable.
        seq: the unreadable event's ``seq``; None for the run's summary row.
    """

    def __init__(self, message: str, *, run_id: str, seq: int | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.seq = seq


class ActorError(ReplanError):
    """A request sent to an actor produced no reply."""

    def __init__(self, role: str, message: str) -> None:
        super().__init__(f"{role}: {message}")
        self.role = role


class ActorCrashed(ActorError):
    """The actor's handler raised; ``failure`` is the typed report."""

    def __init__(self, failure: ActorFailure) -> None:
        super().__init__(failure.role, f"{failure.error_type}: {failure.message}")
        self.failure = failure


class ActorStopped(ActorError):
    """The role no longer takes requests (shutdown, or too many restarts)."""


class ActorTimeout(ActorError):
    """The request's deadline passed before the actor replied."""


class ModelError(ReplanError):
    """A model call failed.

    Attributes:
        usage: tokens the failed call(s) still used (a rejected answer costs
            as much as an accepted one), or None.
        raw_output: the model's text when it could not be used, or None.
        role, purpose, task_id: where the call was made, once known.
    """

    fatal: bool = False
    """True when no retry or other run can succeed either: the run stops."""
    transient: bool = False

    def __init__(
        self,
        message: str,
        *,
        usage: TokenUsage | None = None,
        raw_output: str | None = None,
    ) -> None:
        super().__init__(message)
        self.usage = usage
        self.raw_output = raw_output
        self.role = ""
        self.purpose = ""
        self.task_id: str | None = None

    def failure(self) -> ModelFailure:
        """The typed report the journal keeps of this failure."""
        from .messages import ModelFailure, TokenUsage

        return ModelFailure(
            role=self.role,
            purpose=self.purpose,
            task_id=self.task_id,
            error_type=type(self).__name__,
            message=str(self),
            transient=self.transient,
            fatal=self.fatal,
            raw_output=self.raw_output,
            usage=self.usage or TokenUsage(),
        )


class TransientModelError(ModelError):
    """A model call failed in a way a retry may fix (rate limit, 5xx, timeout).

    Attributes:
        retry_after: seconds the server asked to wait before the next call
            (a ``Retry-After``), or None. A plan run's task, or a role's
            request, is not tried again before they have passed. A task
            function may raise one with it for a service of its own.
    """

    transient = True

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        usage: TokenUsage | None = None,
        raw_output: str | None = None,
    ) -> None:
        super().__init__(message, usage=usage, raw_output=raw_output)
        self.retry_after = retry_after

    def failure(self) -> ModelFailure:
        failure = super().failure()
        wait = self.retry_after
        if not isinstance(wait, int | float) or isinstance(wait, bool):
            return failure  # none, or no number of seconds
        if not wait > 0:  # 0, negative or NaN: no wait
            return failure
        return failure.model_copy(update={"retry_after_s": min(wait, MAX_WAIT_S)})


MAX_WAIT_S = 86_400.0
"""The longest wait a ``retry_after`` holds a retry for: a day."""


class BudgetExhausted(ModelError):
    """The run's token budget is spent: no further model call may start."""

    fatal = True


class ModelAuthenticationError(ModelError):
    """The endpoint rejected the credentials (401/403): retrying cannot help.

    The run ends ``failed`` after the first such answer, with a stop reason
    naming the fix.
    """

    fatal = True


class ModelRefusal(ModelError):
    """The model refused to answer, or a content filter stopped its answer.

    Attributes:
        reason: ``refusal`` or ``content_filter``.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        usage: TokenUsage | None = None,
        raw_output: str | None = None,
    ) -> None:
        super().__init__(message, usage=usage, raw_output=raw_output)
        self.reason = reason


class ModelOutputError(ModelError):
    """The answer did not validate, even after one re-ask with the error shown.

    ``raw_output`` keeps the last answer's text for the journal.

    Attributes:
        final: True when asking once more cannot help: the adapter asked
            again already with the problem shown (``OpenAIModel``), or
            the server cut the answer at its output limit. A caller that
            re-asks a malformed answer (an explore run) does not.
        no_completion: True when what came is no chat completion at all (a
            text body such as an HTML page, JSON without ``choices``): no
            model answered, whatever answered at the endpoint.
    """

    def __init__(
        self,
        message: str,
        *,
        usage: TokenUsage | None = None,
        raw_output: str | None = None,
        final: bool = False,
        no_completion: bool = False,
    ) -> None:
        super().__init__(message, usage=usage, raw_output=raw_output)
        self.final = final
        self.no_completion = no_completion
